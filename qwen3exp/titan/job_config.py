"""The conversion: a validated Experiment (+ resolved platform) -> torchtitan's `Trainer.Config`.

One pure, deterministic function, run in every rank (the qwen3 `Trainer.Config` holds closures and
cannot be pickled), and in the launcher only where the plan needs the config tree (kernel overrides:
their matches are computed on it, once per plan). torchtitan is imported inside the function only.
Its one side effect, registering the local dataset in torchtitan's dataset table, is idempotent.

torchtitan's own checks (`Trainer.Config.__post_init__`) run wherever the config is built:
`build_checked` turns what they raise into a ConfigError naming torchtitan. In a rank that is
before the trainer is built, so before any training step: the rank records the refusal
(`qwen3exp.titan.refusal`) and exits with code 2; the launcher, which watches for that file, stops
torchrun at once and ends the launch with the ConfigError.
"""

from __future__ import annotations

from pathlib import Path

from qwen3exp.assets import CORPUS_DIR
from qwen3exp.config.flavors import Arch
from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.data import ChatData, PreferenceData
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.plan import auto_layout, lora_base, model_files
from qwen3exp.platforms import PlatformFacts
from qwen3exp.run import rundir
from qwen3exp.titan import dataset, overrides
from qwen3exp.titan.model import qwen3_model_spec

TORCHTITAN_KEY = "(torchtitan Trainer.Config)"
"""The key of a problem torchtitan's own checks found (no single experiment key is to blame)."""
_TORCHTITAN_ERRORS = (ValueError, AssertionError, TypeError, KeyError)


def build_checked(exp: Experiment, facts: PlatformFacts, run_dir: Path):
    """`to_torchtitan`, with what torchtitan's own checks raise as a ConfigError."""
    try:
        return to_torchtitan(exp, facts, run_dir)
    except _TORCHTITAN_ERRORS as e:
        raise ConfigError([Problem(TORCHTITAN_KEY, type(e).__name__, str(e) or repr(e))]) from None


def override_claims(exp: Experiment, facts: PlatformFacts) -> list[dict]:
    """The kernel override claims of the plan (`qwen3exp.titan.overrides.check`): the Trainer.Config
    is built only when an override is active, once, with a placeholder run directory (only its
    model tree is matched; the ranks build the config they train with)."""
    return overrides.check(exp, facts, lambda: build_checked(exp, facts, Path("/nonexistent/pre-launch")))


def init_logging() -> None:
    """torchtitan's logger for a rank (its format and level), before the config is built."""
    from torchtitan.tools.logging import init_logger  # lazy: torchtitan is imported in the ranks only

    init_logger()


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
        case "chat" | "preference":
            return Path(exp.data.location)
        case "hf":  # only named: `dataset.register(hf=...)` reads the files it resolves to
            return Path(exp.data.name or exp.data.files or "")
    raise AssertionError(exp.data)


def to_torchtitan(exp: Experiment, facts: PlatformFacts, run_dir: Path):
    """torchtitan's `Trainer.Config` for the experiment (the model's config class: native or
    Transformers backend), every section set from the experiment and the platform's facts."""
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss  # lazy: torchtitan in the ranks
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw  # lazy: torchtitan in the ranks
    from torchtitan.config import CommConfig, CompileConfig  # lazy: torchtitan in the ranks
    from torchtitan.config.configs import DebugConfig  # lazy: torchtitan in the ranks
    from torchtitan.config.override import OverrideConfig  # lazy: torchtitan in the ranks
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader  # lazy: torchtitan in the ranks

    t = exp.training
    arch = resolve_arch(exp)
    config_cls, extra, model_spec = _model(exp, facts, arch)
    data = data_path(exp)
    text_field = exp.data.text_field if exp.data.source == "local" else "text"
    ac = _activation_checkpoint(t.activation_checkpoint)
    config = config_cls(
        **extra,
        model_spec=model_spec,
        hf_assets_path=str(hf_assets_path(exp)),
        tokenizer=dataset.tokenizer_config(exp, str(hf_assets_path(exp))),  # the separator data.eos chose
        dump_folder=str(run_dir),
        metrics=_metrics_config(exp, facts, run_dir),
        dataloader=HuggingFaceTextDataLoader.Config(
            dataset=dataset.register(
                str(data), text_field, held_out_fraction=exp.validation.held_out, hf=dataset.hf(exp.data)
            ),
            dataset_path=str(data),
            infinite=True,
        ),
        validator=validator_config(exp, data, text_field),
        optimizer=default_adamw(lr=t.lr, weight_decay=t.weight_decay),
        lr_scheduler=LRSchedulersContainer.Config(
            warmup_steps=t.warmup, decay_type=t.decay_type, min_lr_factor=t.min_lr_factor
        ),
        training=_training_config(exp),
        parallelism=_parallelism_config(exp),
        checkpoint=checkpoint_config(exp, Path(run_dir)),
        activation_checkpoint=ac,
        compile=CompileConfig(enable=t.compile, backend=facts.compile_backend),
        comm=(
            CommConfig(init_timeout_seconds=facts.comm_init_timeout_s) if facts.comm_init_timeout_s else CommConfig()
        ),
        debug=DebugConfig(seed=t.seed, deterministic=t.deterministic),
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=arch.vocab_size)),
        # kernels=... : torchtitan applies these in Trainer.__init__, checked before launch.
        override=OverrideConfig(imports=overrides.import_entries(exp.kernels)),
    )
    if isinstance(exp.data, (ChatData, PreferenceData)):  # qwen3exp's own loaders (pairs: and trainer, loss)
        from qwen3exp.titan import preference_trainer  # lazy: imports torchtitan

        return preference_trainer.own_loaders(config, exp, str(hf_assets_path(exp)), facts)
    return config


def _model(exp: Experiment, facts: PlatformFacts, arch: Arch):
    """(the Trainer.Config class, its backend's own fields, the model spec) of the experiment's backend."""
    from torchtitan.trainer import Trainer  # lazy: torchtitan in the ranks

    attention = auto_layout.attention_path(exp, facts)  # the kernel, and whether SDPA takes a mask
    match exp.model.backend:
        case "native":
            model_spec = qwen3_model_spec(
                arch,
                flavor=exp.model.flavor,
                attention=attention,
                force_sum_reductions=facts.force_sum_reductions,
                lora=exp.peft if exp.peft.kind == "lora" else None,
            )
            return Trainer.Config, {}, model_spec
        case "hf":
            from torchtitan.experiments.transformers_modeling_backend.configs import (  # lazy: torchtitan in the ranks
                TransformersBackendConfig,
            )

            from qwen3exp.titan.hf_model import hf_model_spec  # lazy: imports torchtitan, torch and transformers

            model_spec = hf_model_spec(
                attention=attention,
                force_sum_reductions=facts.force_sum_reductions,
                lora=exp.peft if exp.peft.kind == "lora" else None,
            )
            return TransformersBackendConfig, {"hf_model": model_files.hf_model_folder(exp)[0]}, model_spec
    raise AssertionError(exp.model)


def _activation_checkpoint(mode: str):
    """torchtitan's activation checkpointing config for training.activation_checkpoint (None: off)."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # lazy: torchtitan in the ranks

    match mode:
        case "none":
            return None
        case "selective":
            return SelectiveAC.Config()
        case "full":
            return FullAC.Config()
    raise AssertionError(mode)


def _metrics_config(exp: Experiment, facts: PlatformFacts, run_dir: Path):
    from qwen3exp.titan.metrics import JsonlMetricsProcessor  # lazy: imports torchtitan

    return JsonlMetricsProcessor.Config(
        log_freq=exp.metrics.log_freq,
        # Every rank's log file is plain text; the launcher colours only its own lines, on a TTY.
        disable_color_printing=True,
        enable_tensorboard=exp.metrics.tensorboard,
        enable_wandb=exp.metrics.wandb,
        jsonl_path=str(run_dir / rundir.METRICS),
        peak_flops_known=facts.peak_flops_per_rank is not None,
        # The trackers read the recorded experiment and its origin here; W&B writes to wandb/.
        run_dir=str(run_dir),
    )


def _training_config(exp: Experiment):
    from torchtitan.config import TrainingConfig  # lazy: torchtitan in the ranks

    t, p = exp.training, exp.parallelism
    return TrainingConfig(
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
    )


def _parallelism_config(exp: Experiment):
    from torchtitan.config import ParallelismConfig  # lazy: torchtitan in the ranks

    p = exp.parallelism
    return ParallelismConfig(
        data_parallel_replicate_degree=p.dp_replicate,
        data_parallel_shard_degree=p.dp_shard,
        tensor_parallel_degree=p.tp,
        pipeline_parallel_degree=p.pp,
        context_parallel_degree=p.cp,
        expert_parallel_degree=p.ep,
        # The Transformers backend accepts nothing else (it is torchtitan's default as well).
        spmd_backend="spmd_types",
    )


def validator_config(exp: Experiment, data: Path, text_field: str):
    """torchtitan's validator (`qwen3exp.titan.validator`): held-out loss and eval.samples at each validation."""
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader  # lazy: torchtitan in the ranks

    from qwen3exp.titan.validator import FinalStepValidator, sample_settings  # lazy: imports torchtitan

    v = exp.validation
    if not v.enable:
        return FinalStepValidator.Config(enable=False)
    path = Path(v.path) if v.path is not None else data
    return FinalStepValidator.Config(
        enable=True,
        freq=v.freq,
        steps=v.steps,
        last_step=exp.training.steps,
        **sample_settings(exp.eval, str(hf_assets_path(exp)), resolve_arch(exp).vocab_size),
        dataloader=HuggingFaceTextDataLoader.Config(
            dataset=dataset.register_validation(
                str(path), text_field, held_out_fraction=v.held_out, hf=dataset.hf(exp.data) if v.path is None else None
            ),
            dataset_path=str(path),
            infinite=True,
        ),
    )


def checkpoint_config(exp: Experiment, run_dir: Path):
    """torchtitan's checkpoint manager config for the experiment's checkpoint choices (qwen3exp's
    subclass: resumable saves and exports independent, `keep_latest_k` keeps exactly k, a resume is
    quiet, each save is signed). A dcp resume loads the newest checkpoint its ranks signed
    (`rundir.latest_checkpoint_step`, checked by the plan), named by its step: torchtitan by itself
    would load the newest one, signed or not; with one in the run directory torchtitan ignores the
    initial load (`checkpoint.load`), so a resumed fine-tune continues from its own step."""
    from qwen3exp.titan.checkpointing import KeepLatestCheckpointManager as CheckpointManager  # lazy: torchtitan

    c = exp.checkpoint
    if c.load == "none" and not c.save and not c.exports:
        return CheckpointManager.Config(enable=False, folder=rundir.CHECKPOINT)
    load: dict = {}
    if c.load != "none":
        path = model_files.weights_folder(exp) if c.load == "hf" else Path(str(c.path)).expanduser().resolve()
        load = dict(initial_load_path=str(path), initial_load_in_hf=c.load == "hf", initial_load_model_only=True)
    step = rundir.latest_checkpoint_step(run_dir) if c.save else None
    adapter = lora_adapter_json(exp) if c.exports else ""
    return CheckpointManager.Config(
        enable=True,
        folder=rundir.CHECKPOINT,
        # Without resumable saves torchtitan would still save at every `interval` and the last step:
        # keep_dcp=False skips them, and nothing is loaded from the run directory.
        interval=c.interval if c.save else exp.training.steps,
        keep_latest_k=c.keep_latest_k if c.save else 0,
        last_save_model_only=False,
        load_step=-1 if step is None else step,
        keep_dcp=c.save,
        export_root=str(Path(run_dir).resolve() / rundir.EXPORT) if c.exports else "",
        export_every=c.every_export or 0,
        export_dtype=c.dtype,
        adapter=adapter,
        merge_lora=c.merge_lora,
        **load,
    )


def lora_adapter_json(exp: Experiment) -> str:
    """A LoRA run's adapter_config.json keys (JSON) for its exports; "" without LoRA."""
    if exp.peft.kind != "lora":
        return ""
    from qwen3exp.titan import lora  # lazy: imports torchtitan

    return lora.adapter_json(exp.peft, lora_base.named_base(exp))
