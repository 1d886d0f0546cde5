"""The conversion: a validated Experiment (+ resolved platform) -> torchtitan's `Trainer.Config`.

One pure, deterministic function, run once in the launcher (so torchtitan's own checks fail before
any worker starts) and again in every rank (the qwen3 `Trainer.Config` holds closures and cannot be
pickled). torchtitan is imported inside the function only. Its one side effect, registering the
local dataset in torchtitan's dataset table, is idempotent.
"""

from __future__ import annotations

from pathlib import Path

from qwen3exp.plan import model_files
from qwen3exp.assets import CORPUS_DIR
from qwen3exp.config.flavors import Arch
from qwen3exp.platforms import PlatformFacts
from qwen3exp.config.schema import Experiment


def resolve_arch(exp: Experiment) -> Arch:
    """The model architecture: the flavor's numbers, or config.json's (flavor=auto, model=hf),
    with the experiment's reductions applied. The launcher checked the files before launch."""
    return model_files.resolve_arch(exp)


def hf_assets_path(exp: Experiment) -> Path:
    return model_files.assets_folder(exp)


def data_path(exp: Experiment) -> Path:
    match exp.data.source:
        case "bundled":
            return CORPUS_DIR
        case "local":
            return Path(exp.data.path)
    raise AssertionError(exp.data)


def to_torchtitan(exp: Experiment, facts: PlatformFacts, run_dir: Path):
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
    from torchtitan.config import CommConfig, CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.config.override import OverrideConfig
    from torchtitan.config.configs import DebugConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.trainer import Trainer

    from qwen3exp.run import rundir
    from qwen3exp.titan import overrides
    from qwen3exp.titan import dataset
    from qwen3exp.titan.metrics import JsonlMetricsProcessor

    t, p = exp.training, exp.parallelism
    arch = resolve_arch(exp)
    attention = facts.attention if exp.model.attention == "auto" else exp.model.attention
    match exp.model.backend:
        case "native":
            from qwen3exp.titan.model import qwen3_model_spec

            model_spec = qwen3_model_spec(arch, flavor=exp.model.flavor, attention=attention,
                                          force_sum_reductions=facts.force_sum_reductions)
            config_cls, extra = Trainer.Config, {}
        case "hf":
            from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig

            from qwen3exp.titan.hf_model import hf_model_spec

            model_spec = hf_model_spec(attention=attention, force_sum_reductions=facts.force_sum_reductions)
            config_cls = TransformersBackendConfig
            extra = {"hf_model": model_files.hf_model_folder(exp)[0]}
    data = data_path(exp)
    text_field = exp.data.text_field if exp.data.source == "local" else "text"
    match t.activation_checkpoint:
        case "none":
            ac = None
        case "selective":
            ac = SelectiveAC.Config()
        case "full":
            ac = FullAC.Config()
    config = config_cls(
        **extra,
        model_spec=model_spec,
        hf_assets_path=str(hf_assets_path(exp)),
        dump_folder=str(run_dir),
        metrics=JsonlMetricsProcessor.Config(
            log_freq=exp.metrics.log_freq,
            enable_tensorboard=exp.metrics.tensorboard,
            enable_wandb=exp.metrics.wandb,
            jsonl_path=str(run_dir / rundir.METRICS),
            peak_flops_known=facts.peak_flops_per_rank is not None,
        ),
        dataloader=HuggingFaceTextDataLoader.Config(
            dataset=dataset.register(str(data), text_field), dataset_path=str(data), infinite=True),
        optimizer=default_adamw(lr=t.lr, weight_decay=t.weight_decay),
        lr_scheduler=LRSchedulersContainer.Config(
            warmup_steps=t.warmup_steps, decay_type=t.decay_type, min_lr_factor=t.min_lr_factor),
        training=TrainingConfig(
            local_batch_size=t.local_batch_size,
            global_batch_size=t.global_batch_size,
            seq_len=t.seq_len,
            max_norm=t.max_norm,
            steps=t.steps,
            dtype=t.dtype,
            mixed_precision_param=t.mixed_precision_param,
            # torchtitan 0.3.0 captures forward+backward in a CUDA graph by default and refuses
            # pipeline parallelism with it ("CUDA graphs do not support pipeline parallelism yet", in
            # Trainer.Config). pp > 1 runs eagerly; pp = 1 keeps torchtitan's default.
            disable_cuda_graphs=p.pp > 1,
        ),
        parallelism=ParallelismConfig(
            data_parallel_replicate_degree=p.dp_replicate,
            data_parallel_shard_degree=p.dp_shard,
            tensor_parallel_degree=p.tp,
            pipeline_parallel_degree=p.pp,
            context_parallel_degree=p.cp,
            expert_parallel_degree=p.ep,
            # The Transformers backend accepts nothing else (it is torchtitan's default as well).
            spmd_backend="spmd_types",
        ),
        checkpoint=checkpoint_config(exp),
        activation_checkpoint=ac,
        compile=CompileConfig(enable=t.compile, backend=facts.compile_backend),
        comm=(CommConfig(init_timeout_seconds=facts.comm_init_timeout_s) if facts.comm_init_timeout_s
              else CommConfig()),
        debug=DebugConfig(seed=t.seed, deterministic=t.deterministic),
        loss=ChunkedLossWrapper.Config(
            loss_fn=CrossEntropyLoss.Config(global_vocab_size=arch.vocab_size)),
        # kernels=... : torchtitan applies these in Trainer.__init__, checked before launch.
        override=OverrideConfig(imports=overrides.import_entries(exp.kernels)),
    )
    return config


def checkpoint_config(exp: Experiment):
    """torchtitan's CheckpointManager.Config for the experiment's checkpoint kind."""
    from torchtitan.components.checkpoint import CheckpointManager

    from qwen3exp.run import rundir
    c, folder = exp.checkpoint, rundir.CHECKPOINT
    weights = model_files.weights_folder(exp)
    load = dict(initial_load_path=str(weights), initial_load_in_hf=True, initial_load_model_only=True)
    # No periodic saves: the only save is the last step (torchtitan always saves it).
    export = dict(interval=exp.training.steps, keep_latest_k=0, last_save_in_hf=True,
                  last_save_model_only=True)
    match c.kind:
        case "none":
            return CheckpointManager.Config(enable=False, folder=folder)
        case "dcp":
            # The last step is a full checkpoint too (optimizer, data position), so it resumes.
            return CheckpointManager.Config(enable=True, folder=folder, interval=c.interval,
                                            keep_latest_k=c.keep_latest_k, last_save_model_only=False)
        case "hf_load":
            return CheckpointManager.Config(enable=True, folder=folder, load_only=True, **load)
        case "hf_export":
            return CheckpointManager.Config(enable=True, folder=folder, export_dtype=c.dtype, **export)
        case "hf_roundtrip":
            return CheckpointManager.Config(enable=True, folder=folder, export_dtype=c.dtype, **load, **export)
    raise AssertionError(c)
