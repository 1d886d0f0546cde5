"""The contract: one validated, frozen `Experiment` per run.

Hydra composes YAML; this module decides what is a valid experiment. Everything here is plain data
and cheap to import (no torch, no torchtitan). Variants are discriminated unions keyed on a short
tag (`model.backend`, `platform.name`, ...); pydantic puts the tag into error locations, and
`validate_experiment` strips it so messages show the YAML key.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails, PydanticUndefined

from qwen3exp.config.flavors import FLAVORS, Arch
from qwen3exp.errors import MISSING, ConfigError, Problem, did_you_mean, one_of


class _Strict(BaseModel):
    # use_attribute_docstrings: the docstring under a field is its description, which error
    # messages quote as what is allowed (see `describe`). allow_inf_nan=False: `training.lr=inf`
    # or `nan` (which YAML and Hydra parse as floats) is refused in every float field of every
    # section; otherwise inf passes `gt=0` and rank 0 trains NaN losses.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, use_attribute_docstrings=True,
                              allow_inf_nan=False)


INT_MAX = 2**31 - 1
"""Every integer key's upper bound: counts, degrees, sizes and seeds all fit a signed 32-bit integer
(torch, torchtitan and the C extensions they call take C ints or longs; a value beyond 64 bits
passes a bare `int` and breaks a rank, after the workers started)."""
PosInt = Annotated[int, Field(gt=0, le=INT_MAX)]
MAX_NODES = 10_000
"""Nodes of one run: the plan builds (and prints) one torchrun command per node."""
MAX_PER_NODE = 1024
"""Ranks, devices, cores or threads of one node: no machine has more; a bigger value is a typo, and
the mesh check's divisor search over the world size would take seconds at 10^8."""
NodeCount = Annotated[int, Field(gt=0, le=MAX_NODES)]
PerNode = Annotated[int, Field(gt=0, le=MAX_PER_NODE)]
NonNegInt = Annotated[int, Field(ge=0, le=INT_MAX)]
Degree = Annotated[int, Field(ge=-1, le=INT_MAX)]


# --------------------------------------------------------------------------------------- model
class NativeModel(_Strict):
    """torchtitan's own Qwen3 implementation."""

    backend: Literal["native"] = "native"
    flavor: str = "tiny"
    """A torchtitan Qwen3 flavor (0.6B, 1.7B, 4B, 8B, 14B, 32B, 30B-A3B, 235B-A22B, debugmodel, ...),
    a qwen3exp flavor (tiny, tiny_moe), or `auto` to read the architecture from
    `hf_assets_path/config.json`. With an explicit flavor and a folder holding config.json, the two
    must describe the same architecture (checked before launch, every differing key named)."""
    hf_assets_path: str | None = None
    """Model reference (tokenizer files, and config.json / safetensors for checkpoints): a local
    folder, or a Hugging Face Hub id `org/name[@revision]` resolved offline from the local Hugging
    Face cache. None: the folder bundled with qwen3exp (tokenizer, vocab 2048, and the config.json
    of the `tiny` flavor)."""
    revision: str | None = None
    """Revision (branch, tag or commit) of a Hub id in hf_assets_path that has no `@revision` of its
    own. None: the cache's `main`."""
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    """Attention kernel. auto: the platform's choice (flex on CUDA, sdpa on CPU and Neuron)."""
    n_layers: PosInt | None = None
    """Keep only the first n layers of the flavor (the walkthrough's reduced MoE)."""
    num_experts: PosInt | None = None
    """MoE flavors only: use this many routed experts."""
    top_k: PosInt | None = None
    """MoE flavors only: route each token to this many experts."""

    @model_validator(mode="after")
    def _flavor_known(self) -> NativeModel:
        if self.flavor != "auto" and self.flavor not in FLAVORS:
            raise ValueError(
                _tagged("flavor", self.flavor, "unknown flavor", one_of(["auto", *FLAVORS]),
                        did_you_mean(self.flavor, list(FLAVORS)))
            )
        return self

    def arch(self) -> Arch | None:
        """The architecture when it is known without reading files (None for flavor=auto)."""
        if self.flavor == "auto":
            return None
        arch = FLAVORS[self.flavor]
        return arch.reduced(n_layers=self.n_layers, num_experts=self.num_experts, top_k=self.top_k)


class HFModel(_Strict):
    """Hugging Face Transformers v5 as torchtitan's modeling backend: `AutoModelForCausalLM` built
    from a local folder's config.json (offline)."""

    backend: Literal["hf"] = "hf"
    hf_assets_path: str | None = None
    """Model reference with tokenizer files, config.json and (for hf_load) safetensors: a local
    folder, or a Hugging Face Hub id `org/name[@revision]` resolved offline from the local Hugging
    Face cache. None: hf_model when it is set (the model's own tokenizer), else the folder bundled
    with qwen3exp (a `tiny`-sized Qwen3 config.json and the vocab-2048 tokenizer)."""
    hf_model: str | None = None
    """Model reference AutoConfig reads the architecture from: a local folder or a Hub id
    `org/name[@revision]` in the local Hugging Face cache (nothing is downloaded). None: hf_assets_path."""
    revision: str | None = None
    """Revision (branch, tag or commit) of the Hub ids in hf_model / hf_assets_path that have no
    `@revision` of their own. None: the cache's `main`."""
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    """Attention kernel. auto: the platform's choice (flex on CUDA, sdpa on CPU and Neuron)."""

    def arch(self) -> Arch | None:
        """Read from config.json before launch (None here: the schema touches no files)."""
        return None


Model = Annotated[NativeModel | HFModel, Field(discriminator="backend")]


# ------------------------------------------------------------------------------------ training
class Training(_Strict):
    steps: PosInt = 30
    seq_len: PosInt = 256
    local_batch_size: PosInt = 8
    global_batch_size: Annotated[int, Field(le=INT_MAX)] = -1
    """-1: local_batch_size x data-parallel degree (no gradient accumulation)."""
    lr: Annotated[float, Field(gt=0)] = 3e-3
    warmup_steps: NonNegInt | None = None
    """Linear warm-up steps. None: derived from `steps` (`warmup`: min(5, max(1, steps // 5))), so that
    a short smoke test (training.steps=3) needs no second override; an explicit value must fit."""
    decay_type: Literal["linear", "sqrt", "cosine"] = "cosine"
    min_lr_factor: Annotated[float, Field(ge=0, le=1)] = 0.1
    weight_decay: Annotated[float, Field(ge=0)] = 0.1
    max_norm: Annotated[float, Field(gt=0)] = 1.0
    seed: NonNegInt = 42
    deterministic: bool = False
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the parameters as stored (FSDP keeps float32 master weights by default)."""
    mixed_precision_param: Literal["float32", "bfloat16"] = "float32"
    """Dtype FSDP all-gathers parameters in for compute."""
    activation_checkpoint: Literal["none", "selective", "full"] = "none"
    compile: bool = False
    """torch.compile the model and loss (backend chosen by the platform)."""

    @property
    def warmup(self) -> int:
        """The warm-up the run uses: `warmup_steps`, or the value derived from `steps`."""
        return self.warmup_steps if self.warmup_steps is not None else min(5, max(1, self.steps // 5))

    @model_validator(mode="after")
    def _batch(self) -> Training:
        if self.global_batch_size == 0 or self.global_batch_size < -1:
            raise ValueError(_tagged("global_batch_size", self.global_batch_size,
                                     "must be positive, or -1 for local_batch_size x dp",
                                     "-1 or an integer > 0"))
        if self.warmup_steps is not None and self.warmup_steps > self.steps:
            raise ValueError(_tagged("warmup_steps", self.warmup_steps,
                                     f"exceeds training.steps ({self.steps})", f"0..{self.steps}"))
        return self


# --------------------------------------------------------------------------------- parallelism
class Parallelism(_Strict):
    dp_replicate: PosInt = 1
    dp_shard: Degree = -1
    """FSDP degree; -1 uses every rank left over after the other degrees."""
    tp: PosInt = 1
    pp: PosInt = 1
    cp: PosInt = 1
    ep: PosInt = 1

    @model_validator(mode="after")
    def _shard(self) -> Parallelism:
        if self.dp_shard == 0:
            raise ValueError(_tagged("dp_shard", 0, "must be -1 or positive", "-1 or an integer > 0"))
        return self


# ------------------------------------------------------------------------------------- kernels
FqnGlobs = Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]


class RopeKernel(_Strict):
    impl: Literal["torchtitan", "nki"] = "torchtitan"
    """torchtitan: the stock `CosSinRoPE`. nki: the `qwen3exp::rope` operator (nkilib `rope_hf` on
    Neuron, its PyTorch implementation elsewhere), swapped in by torchtitan's override registry."""
    fqns: FqnGlobs | None = None
    """Limit the override to these nodes (fnmatch globs on torchtitan FQNs, which start with
    `model_spec.model.`, e.g. `model_spec.model.layers.[01].attention.rope`); null: every layer."""


class MoeKernel(_Strict):
    impl: Literal["torchtitan", "nki"] = "torchtitan"
    """torchtitan: the stock `GroupedExperts`. nki: the blockwise `qwen3exp::moe_blockwise` operator
    (nkilib `moe_cte` / `blockwise_mm_bwd` on Neuron, its PyTorch implementation elsewhere)."""
    fqns: FqnGlobs | None = None
    """Limit the override to these nodes (torchtitan FQN globs); null: every MoE layer's experts."""
    block_size: PosInt = 128
    """Tokens per block of the blockwise kernel (Neuron: 128, 256, 512 or 1024)."""


class UserOverride(_Strict):
    target: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")]
    """`module.function` of a torchtitan `@override` factory (importable on every rank)."""
    fqns: FqnGlobs | None = None
    """Replace the factory's own node selection by these torchtitan FQN globs; null: keep it."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the factory (torchtitan's `(target, kwargs)` import entry)."""


class Kernels(_Strict):
    name: str = "default"
    """The kernels group option this came from (for the record)."""
    rope: RopeKernel = RopeKernel()
    moe: MoeKernel = MoeKernel()
    overrides: list[UserOverride] = Field(default_factory=list)
    """Your own torchtitan overrides, applied together with the ones above."""

    @property
    def active(self) -> bool:
        """Whether any torchtitan override is applied (the default kernels apply none)."""
        return self.rope.impl != "torchtitan" or self.moe.impl != "torchtitan" or bool(self.overrides)


# ---------------------------------------------------------------------------------- checkpoint
class _CheckpointKind(_Strict):
    """What a checkpoint kind does, as properties, so that code asks `exp.checkpoint.resumable`
    instead of comparing kind strings."""

    resumable: ClassVar[bool] = False
    """A rerun of the identical experiment into its run directory continues from the latest step."""
    loads_weights: ClassVar[bool] = False
    """Step 0 starts from published Hugging Face safetensors."""
    exports: ClassVar[bool] = False
    """The last step is saved as a Hugging Face folder and reloaded to verify it."""


class NoCheckpoint(_CheckpointKind):
    """No checkpoints: random init, nothing saved."""

    kind: Literal["none"] = "none"


class DcpCheckpoint(_CheckpointKind):
    """torchtitan distributed checkpoints (model, optimizer, lr schedule, data position) under
    `<run dir>/checkpoint/step-N`. A rerun into the same run directory with the identical
    experiment resumes from the latest step."""

    kind: Literal["dcp"] = "dcp"
    resumable: ClassVar[bool] = True
    interval: PosInt = 500
    """Save every `interval` steps (and always at the last step)."""
    keep_latest_k: NonNegInt = 2
    """Keep the newest k checkpoints; 0 keeps all (torchtitan refuses 1)."""

    @model_validator(mode="after")
    def _keep(self) -> DcpCheckpoint:
        if self.keep_latest_k == 1:
            raise ValueError(_tagged("keep_latest_k", 1,
                                     "torchtitan keeps at least 2 (the newest may still be writing)",
                                     "0 (keep all) or an integer >= 2"))
        return self


ExportDtype = Literal["float32", "bfloat16", "float16"]


class HFLoad(_CheckpointKind):
    """Start from published Hugging Face safetensors (model weights only) at step 0."""

    kind: Literal["hf_load"] = "hf_load"
    loads_weights: ClassVar[bool] = True
    path: str | None = None
    """Model reference with the safetensors (and model.safetensors.index.json when sharded): a local
    folder or a Hub id `org/name[@revision]` in the local Hugging Face cache. None: model.hf_assets_path."""
    revision: str | None = None
    """Revision of a Hub id in `path` that has no `@revision` of its own. None: the cache's `main`."""


class HFExport(_CheckpointKind):
    """Save the last step as a complete Hugging Face folder (weights, index, config.json, tokenizer
    files) under `<run dir>/checkpoint/step-N`, then reload it with AutoModelForCausalLM and fail
    the run unless only a tied lm_head.weight is missing."""

    kind: Literal["hf_export"] = "hf_export"
    exports: ClassVar[bool] = True
    dtype: ExportDtype = "bfloat16"
    """dtype of the exported weights."""
    max_shard_mb: PosInt = 5000
    """Exported safetensors are split into files of at most this many megabytes (10^6 bytes), with
    model.safetensors.index.json, unless the source checkpoint's own index decides the split."""


class HFRoundtrip(_CheckpointKind):
    """hf_load + hf_export + verification: load published safetensors at step 0, export the last
    step, verify the export reloads in AutoModelForCausalLM."""

    kind: Literal["hf_roundtrip"] = "hf_roundtrip"
    loads_weights: ClassVar[bool] = True
    exports: ClassVar[bool] = True
    path: str | None = None
    """Model reference with the safetensors to load: a local folder or a Hub id `org/name[@revision]`
    in the local Hugging Face cache. None: model.hf_assets_path."""
    revision: str | None = None
    """Revision of a Hub id in `path` that has no `@revision` of its own. None: the cache's `main`."""
    dtype: ExportDtype = "bfloat16"
    """dtype of the exported weights."""
    max_shard_mb: PosInt = 5000
    """Exported safetensors are split into files of at most this many megabytes (10^6 bytes), with
    model.safetensors.index.json, unless the source checkpoint's own index decides the split."""


Checkpoint = Annotated[NoCheckpoint | DcpCheckpoint | HFLoad | HFExport | HFRoundtrip,
                       Field(discriminator="kind")]


# ------------------------------------------------------------------------------------ platform
class AutoPlatform(_Strict):
    name: Literal["auto"] = "auto"
    """cuda if a GPU is visible, else neuron if torch_neuronx is installed, else cpu (each with the
    schema defaults of that platform; pick platform=cuda|neuron|cpu to set its keys)."""


class CpuPlatform(_Strict):
    name: Literal["cpu"] = "cpu"
    ranks_per_node: PerNode = 2
    """Ranks when launcher.nproc_per_node is null."""
    threads_per_rank: PerNode | None = None
    """torch intra-op threads per rank; None: cores / ranks (at least 1)."""
    memory_per_rank_gib: Annotated[float, Field(gt=0)] | None = None
    """Memory budget per rank for planning; None: physical memory / ranks."""


class CudaPlatform(_Strict):
    name: Literal["cuda"] = "cuda"
    gpus_per_node: PerNode | None = None
    """Ranks per node; None: the number of visible GPUs."""
    memory_per_gpu_gib: Annotated[float, Field(gt=0)] | None = None
    """Memory budget per rank for planning; None: the GPU's total memory."""
    assumed_gpus_per_node: PerNode = 8
    """Planning on a machine without a GPU (a dry run elsewhere): GPUs per node when gpus_per_node is null."""
    assumed_memory_gib: Annotated[float, Field(gt=0)] = 80.0
    """Planning on a machine without a GPU: memory per GPU when memory_per_gpu_gib is null."""


_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Hydra reads `+platform.runtime_env.NEURON_RT_NUM_CORES=4` as an int; environment values are text.
EnvValue = Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, int) and not isinstance(v, bool) else v)]


@dataclass(frozen=True)
class NeuronInstance:
    """Trainium instance facts, for planning without a device and for checking the device count
    (`qwen3exp.platforms.neuron`), and the instance types `platform.instance_type` accepts.

    Sources: AWS's Trainium2 architecture pages as summarised in the project's notes: a Trainium2
    chip has 8 physical NeuronCore-v3 and 96 GiB of HBM; a trn2.48xlarge has 16 chips, i.e. 128
    physical cores, which the runtime shows as 64 logical cores at LNC=2 (24 GiB each) and 128 at
    LNC=1 (12 GiB each). TorchNeuron (torch-neuronx 2.13/2.14 "native") supports Trn2 and Trn3
    only; Trn3 numbers are not in the notes, so Trn3 users set platform.cores_per_node and
    platform.hbm_per_core_gib on top of the closest entry."""

    chips: int
    physical_cores_per_chip: int
    hbm_per_chip_gib: float
    bf16_flops_per_physical_core: float
    """TensorEngine peak (torchtitan's table: 79 TFLOP/s per NeuronCore-v3)."""
    device_name: str
    """What torch.neuron.get_device_properties().name reports for the chip."""

    def logical_cores(self, lnc: int) -> int:
        return self.chips * self.physical_cores_per_chip // lnc

    def hbm_per_logical_core_gib(self, lnc: int) -> float:
        return self.hbm_per_chip_gib * lnc / self.physical_cores_per_chip


_TRN2 = NeuronInstance(chips=1, physical_cores_per_chip=8, hbm_per_chip_gib=96.0, bf16_flops_per_physical_core=79e12,
                       device_name="trn2")

INSTANCES: dict[str, NeuronInstance] = {
    "trn2.3xlarge": _TRN2,
    "trn2.48xlarge": replace(_TRN2, chips=16),
    "trn2u.48xlarge": replace(_TRN2, chips=16),
}


class NeuronPlatform(_Strict):
    name: Literal["neuron"] = "neuron"
    lnc: Literal[1, 2] = 2
    """Logical NeuronCore config (NEURON_LOGICAL_NC_CONFIG): physical NeuronCores per rank."""
    instance_type: str = "trn2.48xlarge"
    """Instance for the table values (chips, cores, HBM): used to plan without a device (dry run)
    and to check the device count against lnc."""
    cores_per_node: PerNode | None = None
    """Logical NeuronCores (= ranks) per node; None: the instance table (checked against the device
    count before a real launch)."""
    hbm_per_core_gib: Annotated[float, Field(gt=0)] | None = None
    """HBM per logical core for planning; None: the device's total_memory, else the instance table."""
    compile_cache_dir: str | None = None
    """Neuron compile cache (TORCH_NEURONX_NEFF_CACHE_DIR); None: neuron_cache/ in the run directory.
    A shared folder reuses compiled graphs across runs."""
    runtime_env: dict[str, EnvValue] = {}
    """More environment variables for every rank (NEURON_RT_*, NEURON_LAUNCH_BLOCKING, ...)."""

    @model_validator(mode="after")
    def _neuron(self) -> NeuronPlatform:
        import re

        problems = []
        if self.instance_type not in INSTANCES:
            problems.append(_tagged("instance_type", self.instance_type, "unknown Neuron instance type",
                                    one_of(INSTANCES), did_you_mean(self.instance_type, list(INSTANCES))
                                    or "pick the closest one and set platform.cores_per_node and "
                                       "platform.hbm_per_core_gib"))
        owned = {"NEURON_LOGICAL_NC_CONFIG": "platform.lnc",
                 "TORCH_NEURONX_NEFF_CACHE_DIR": "platform.compile_cache_dir"}
        for key in self.runtime_env:
            if not re.match(_ENV_NAME, key):
                problems.append(_tagged(f"platform.runtime_env.{key}", self.runtime_env[key],
                                        "not an environment variable name",
                                        "letters, digits and _ (not starting with a digit)"))
            elif key in owned:
                problems.append(_tagged(f"platform.runtime_env.{key}", self.runtime_env[key], f"is set by {owned[key]}",
                                        hint=f"set {owned[key]} instead"))
        if problems:
            raise ValueError("\n".join(problems))
        return self


Platform = Annotated[AutoPlatform | CpuPlatform | CudaPlatform | NeuronPlatform, Field(discriminator="name")]


# ---------------------------------------------------------------------------------------- data
class BundledData(_Strict):
    source: Literal["bundled"] = "bundled"
    """The small corpus shipped with qwen3exp (CPython standard-library docstrings)."""


class LocalData(_Strict):
    source: Literal["local"] = "local"
    path: str
    """A .jsonl file (one {"text": ...} per line), a .txt file (one document per blank-line
    separated paragraph), or a folder of such files."""
    text_field: str = "text"


Data = Annotated[BundledData | LocalData, Field(discriminator="source")]


# ---------------------------------------------------------------------------------- validation
class Validation(_Strict):
    """A held-out loss, measured by torchtitan's validator on documents no training step reads."""

    enable: bool = True
    freq: PosInt = 10
    """Validate at step 1, every `freq` steps and at the last step."""
    steps: PosInt = 2
    """Batches per validation (local_batch_size x seq_len tokens per data-parallel rank each)."""
    fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    """Without `path`: the share of the training documents held out, the same ones every run
    (ranked by a fixed hash of their position); training never reads them."""
    path: str | None = None
    """A separate validation file or folder (the formats of data.path); training then reads all of
    its own documents."""

    @property
    def held_out(self) -> float | None:
        """The fraction of the training data held out (None: a separate path, or no validation)."""
        return self.fraction if self.enable and self.path is None else None


# --------------------------------------------------------------------------------------- sweep
OBJECTIVES: dict[str, str] = {
    "val_loss": "minimize",
    "last_loss": "minimize",
    "tokens_per_second": "maximize",
}
"""What a job can return to a sweeper (from its summary.json), with the direction that is better."""


class Sweep(_Strict):
    objective: Literal["val_loss", "last_loss", "tokens_per_second"] | None = None
    """What each job returns to Hydra's sweeper (Optuna optimizes it; the end table ranks by it):
    val_loss (the last validation loss) and last_loss are minimized, tokens_per_second maximized.
    None: val_loss when validation is on, else last_loss."""
    parallel_jobs: PosInt = 1
    """Local jobs of one batch run at once (above 1: through hydra-joblib-launcher, after every job
    of the batch was checked); each job starts its own launcher.nproc_per_node ranks."""


# ------------------------------------------------------------------------------------ launcher
class LocalLauncher(_Strict):
    """torchrun on this machine; with nnodes > 1, one such launcher per node."""

    kind: Literal["local"] = "local"
    nnodes: NodeCount = 1
    nproc_per_node: PerNode | None = None
    """Ranks per node; None: the platform decides (cpu: platform.ranks_per_node)."""
    node_rank: NonNegInt | None = None
    """This node's index (0 writes summary.json); None: 0 on one node, else SLURM_NODEID from the
    environment (a launcher started by srun)."""
    rdzv_endpoint: str | None = None
    """host:port of the c10d rendezvous (on one node of the job); required when nnodes > 1."""
    max_restarts: NonNegInt = 0
    """torchrun restarts of all ranks after a rank fails."""
    stop_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    """After Ctrl-C/SIGTERM, seconds to wait for the ranks before killing them."""
    rdzv_timeout_s: PosInt = 300
    """Seconds a torchrun agent waits for the c10d rendezvous (the endpoint to answer, the other
    nodes to join) before the launch fails naming the endpoint."""

    @model_validator(mode="after")
    def _multinode(self) -> LocalLauncher:
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(_tagged("rdzv_endpoint", None, f"nnodes={self.nnodes} needs a rendezvous endpoint",
                                     "host:port reachable from every node",
                                     "e.g. launcher.rdzv_endpoint=node0:29500 on every node"))
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 <= int(port) < 65536:
                raise ValueError(_tagged("rdzv_endpoint", self.rdzv_endpoint, "not a host:port", "host:port",
                                         "e.g. 127.0.0.1:29500"))
        if self.node_rank is not None and self.node_rank >= self.nnodes:
            raise ValueError(_tagged("node_rank", self.node_rank, f"must be below nnodes ({self.nnodes})",
                                     f"0..{self.nnodes - 1}"))
        return self


SbatchValue = str | int | bool


class SlurmLauncher(_Strict):
    """One SLURM job per run (a job array per sweep) through hydra-submitit-launcher; inside the
    job, srun starts one torchrun agent per node with a c10d rendezvous on the first node."""

    kind: Literal["slurm"] = "slurm"
    nnodes: NodeCount = 1
    """Nodes per job (sbatch --nodes)."""
    nproc_per_node: PerNode | None = None
    """Ranks per node; None: the platform decides (cpu: platform.ranks_per_node)."""
    cpus_per_node: PerNode | None = None
    """CPU cores requested per node (the node's one task: sbatch --cpus-per-task); None: the
    cluster's default."""
    mem_gb: PosInt | None = None
    """Memory per node (sbatch --mem); None: the cluster's default."""
    gpus_per_node: NonNegInt | None = None
    """GPUs per node (sbatch --gpus-per-node); None: none requested."""
    partition: str | None = None
    """sbatch --partition; None: the cluster's default partition."""
    account: str | None = None
    """sbatch --account."""
    time_limit_min: PosInt = 60
    """sbatch --time, in minutes."""
    additional_parameters: dict[str, SbatchValue] = {}
    """More sbatch options, e.g. {exclusive: true, qos: high, constraint: trn2}."""
    setup: list[str] = []
    """Shell lines the job runs before Python starts (module load ..., source ...)."""
    array_parallelism: PosInt = 256
    """Sweep jobs (array tasks) allowed to run at once."""
    srun: bool | None = None
    """How the torchrun agents start in the job. None: torchrun directly on one node, srun (one
    agent per node) when nnodes > 1; true: srun also on one node."""
    max_restarts: NonNegInt = 0
    """torchrun restarts of all ranks after a rank fails."""
    stop_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    """After scancel/SIGTERM, seconds to wait for the ranks before killing them."""
    rdzv_timeout_s: PosInt = 300
    """Seconds a torchrun agent waits for the c10d rendezvous before the job fails naming it."""
    signal_delay_s: PosInt = 120
    """SLURM's pre-timeout signal (sbatch --signal=USR2@S, submitit's) comes this many seconds
    before the time limit: with checkpoint=dcp the ranks then save a checkpoint and stop."""
    requeue: bool = False
    """At the pre-timeout signal, after the checkpoint, requeue the job (same job id, same run
    directory); the requeued job resumes from that checkpoint. Needs checkpoint=dcp."""
    max_requeues: NonNegInt = 3
    """How many times a job may requeue itself (submitit's max_num_timeout)."""

    @model_validator(mode="after")
    def _agents(self) -> SlurmLauncher:
        if self.srun is False and self.nnodes > 1:
            raise ValueError(_tagged("srun", False, f"nnodes={self.nnodes} needs srun to start one agent per node",
                                     "null or true"))
        if self.srun is False and self.requeue:
            raise ValueError(_tagged("srun", False, "requeue=true needs srun: SLURM sends its pre-timeout signal "
                                     "to job steps only, not to the batch script's processes", "null or true"))
        if self.signal_delay_s >= self.time_limit_min * 60:
            raise ValueError(_tagged("signal_delay_s", self.signal_delay_s,
                                     f"must be below the time limit ({self.time_limit_min} min = "
                                     f"{self.time_limit_min * 60} s)", f"1..{self.time_limit_min * 60 - 1}"))
        return self


Launcher = Annotated[LocalLauncher | SlurmLauncher, Field(discriminator="kind")]


# ------------------------------------------------------------------------------------- metrics
class Metrics(_Strict):
    log_freq: PosInt = 1
    tensorboard: bool = True
    """TensorBoard event files under the run directory's tb/."""
    wandb: bool = False
    """Weights & Biases (opt-in): needs `wandb` installed and a login, or WANDB_MODE=offline."""
    wandb_project: Annotated[str, Field(min_length=1)] = "qwen3exp"
    """W&B project (the WANDB_PROJECT environment variable wins when set)."""


# ---------------------------------------------------------------------------------- experiment
NAME_MAX = 120


class Experiment(_Strict):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9._=,+-]+$")]
    """The run's name: one folder of the default run directory (outputs/<name>/<stamp>)."""
    dry_run: bool = False
    """true: validate, print the plan and start nothing."""
    verbose: bool = False
    """true (or `-v`): the launcher shows every line rank 0 prints, also torchtitan's info lines and
    the known warnings it leaves out by default (`qwen3exp.run.noise`). Changes nothing a run computes."""
    model: Model
    training: Training = Training()
    parallelism: Parallelism = Parallelism()
    kernels: Kernels = Kernels()
    checkpoint: Checkpoint = NoCheckpoint()
    platform: Platform = AutoPlatform()
    data: Data = BundledData()
    launcher: Launcher = LocalLauncher()
    metrics: Metrics = Metrics()
    validation: Validation = Validation()
    sweep: Sweep = Sweep()

    @property
    def objective(self) -> tuple[str, str]:
        """(metric, direction) each job returns to the sweeper (`sweep.objective`, resolved)."""
        metric = self.sweep.objective or ("val_loss" if self.validation.enable else "last_loss")
        return metric, OBJECTIVES[metric]

    @model_validator(mode="after")
    def _name(self) -> Experiment:
        # The pattern keeps / out; '.', '..' and very long names would still escape or break the
        # default run directory (outputs/.. is the repository root; a folder name has 255 bytes).
        if self.name in (".", "..") or len(self.name) > NAME_MAX:
            raise ValueError(_tagged("name", self.name if len(self.name) <= 40 else self.name[:40] + "...",
                                     "is not a safe single folder name" + (f" ({len(self.name)} characters)"
                                                                           if len(self.name) > NAME_MAX else ""),
                                     f"a single folder name: letters, digits and . _ = , + -, at most {NAME_MAX} "
                                     "characters, not . or .."))
        return self

    @model_validator(mode="after")
    def _objective(self) -> Experiment:
        if self.sweep.objective == "val_loss" and not self.validation.enable:
            raise ValueError(_tagged("sweep.objective", "val_loss", "needs a validation loss, and validation.enable "
                                     "is false", "last_loss or tokens_per_second, or validation.enable=true"))
        return self

    @model_validator(mode="after")
    def _cross(self) -> Experiment:
        problems = cross_field_problems(self.model, self.training, self.parallelism)
        if problems:
            raise ValueError("\n".join(_tagged(p.key, p.value, p.message, p.allowed, p.hint) for p in problems))
        return self


def cross_field_problems(model: Any, training: Training | None, parallelism: Parallelism | None) -> list[Problem]:
    """Rules between sections that need no files and no platform, for a native flavor (flavor=auto
    and model=hf read config.json: `model_files.check` applies the same rules before launch). A None
    section (one that did not validate) skips the rules that need it, so an unknown flavor does not
    hide a bad tp and a bad learning rate does not hide a too long sequence."""
    problems = sequence_problems(training, parallelism)
    if model is None or model.backend != "native" or model.flavor == "auto":
        return problems
    return problems + section_arch_problems(model, training, parallelism, FLAVORS[model.flavor],
                                            f"flavor {model.flavor}")


LOSS_CHUNKS = 8
"""The chunks torchtitan's `ChunkedLossWrapper` cuts a rank's tokens into (`to_torchtitan` keeps
num_chunks=8): seq_len / cp must divide by it (`sequence_problems`), and the loss logits of one
chunk are what the memory estimate counts (`qwen3exp.plan.memory`)."""


def sequence_problems(training: Training | None, parallelism: Parallelism | None) -> list[Problem]:
    """`training.seq_len` against the degrees that cut the sequence, as torchtitan 0.3.0 checks them
    inside a rank (after the workers started):
    - the chunked loss (`ChunkedLossWrapper`, num_chunks=8, which `to_torchtitan` keeps) splits the
      tokens a rank holds, seq_len / cp, into 8 equal chunks (a `torch._check` in the loss);
    - context parallelism's head-tail load balancer cuts the sequence into 2 x cp pieces
      (`Trainer.__init__`: seq_len divisible by 2 x cp);
    - sequence parallelism (torchtitan's default with tp > 1, kept by `to_torchtitan`) shards the
      sequence across the tp ranks; `Trainer.__init__` checks both at once: seq_len divisible by
      tp x (2 x cp when cp > 1).
    Together: seq_len must be a multiple of lcm(8 x cp, tp x 2cp) (tp x 2cp is tp x 1 when cp = 1).
    This function reports the loss and cp part (which needs no model); `section_arch_problems` the
    tensor-parallel part, once tp fits the model's heads (a tp that is wrong anyway is one mistake,
    not two)."""
    if training is None or parallelism is None:
        return []
    if training.seq_len % (LOSS_CHUNKS * parallelism.cp) == 0:
        return []
    return [_seq_len_problem(training.seq_len, parallelism.tp, parallelism.cp)]


def _seq_len_problem(seq: int, tp: int, cp: int) -> Problem:
    """The one problem about seq_len and the degrees, whichever part failed, with the value that
    satisfies every part (see `sequence_problems`)."""
    import math

    sharded = tp * (2 * cp if cp > 1 else 1)
    divisor = math.lcm(LOSS_CHUNKS * cp, sharded)
    held = f"the seq_len / cp = {seq} / {cp} tokens each rank holds" if cp > 1 else "the sequence"
    why = [f"torchtitan's chunked loss cuts {held} into {LOSS_CHUNKS} equal chunks"]
    if cp > 1:
        why.append(f"context parallelism (parallelism.cp={cp}) balances 2 x cp = {2 * cp} pieces of it")
    binding_tp = tp if divisor != LOSS_CHUNKS * cp else 1  # tp adds nothing when 8 x cp covers it
    if binding_tp > 1:
        why.append(f"sequence parallelism (on with parallelism.tp={tp}) shards it across {tp} ranks"
                   + (f", and torchtitan needs tp x 2 x cp = {sharded} to divide it" if cp > 1 else ""))
    lower = seq // divisor * divisor
    nearest = f"training.seq_len={lower} or {lower + divisor}" if lower else f"training.seq_len={divisor}"
    return Problem("training.seq_len", seq, f"is not a multiple of {divisor}: " + "; ".join(why),
                   f"a multiple of {divisor}" + _lcm_of(LOSS_CHUNKS, cp, binding_tp, sharded),
                   f"nearest valid values: {nearest}")


def arch_problems(model: Any, training: Training | None, parallelism: Parallelism | None, kernels: Kernels | None,
                  base: Arch, origin: str) -> list[Problem]:
    """Every setting the architecture rules out. `base` is the architecture before the experiment's
    reductions (a flavor's, or config.json's for flavor=auto and model=hf, checked before launch);
    `origin` names it in messages. A None section (one that did not validate on its own) skips the
    rules that read it."""
    problems = section_arch_problems(model, training, parallelism, base, origin)
    if kernels is not None and kernels.moe.impl == "nki" and base.moe is None:
        problems.append(Problem("kernels.moe.impl", "nki", f"{origin} is dense: it has no experts for kernels=nki_moe",
                                "torchtitan for dense models (nki needs an MoE model: tiny_moe, 30B-A3B, ...)"))
    return problems


def section_arch_problems(model: Any, training: Training | None, parallelism: Parallelism | None,
                          base: Arch, origin: str) -> list[Problem]:
    n_layers, num_experts, top_k = ((model.n_layers, model.num_experts, model.top_k) if model.backend == "native"
                                    else (None, None, None))
    arch = base.reduced(n_layers=n_layers, num_experts=num_experts, top_k=top_k)
    problems: list[Problem] = []
    if arch.n_heads % arch.n_kv_heads:
        # Grouped-query attention shares each kv head with n_heads / n_kv_heads query heads: torchtitan's
        # fused QKV raises in every rank, transformers fails on the first forward. Only a config.json
        # can say so (every flavor divides), so the key is the folder that holds it.
        key = "model.hf_model" if model.backend == "hf" and model.hf_model is not None else "model.hf_assets_path"
        value = model.hf_model if key == "model.hf_model" else model.hf_assets_path
        problems.append(Problem(key, value, f"num_attention_heads ({arch.n_heads}) is not a multiple of "
                                f"num_key_value_heads ({arch.n_kv_heads}) in {origin}",
                                "a config.json whose num_attention_heads is a multiple of num_key_value_heads",
                                f"divisors of {arch.n_heads}: {one_of(_divisors(arch.n_heads))}"))
    if parallelism is not None:
        problems += _pipeline_problems(model, parallelism, arch, origin)
        tp, cp = parallelism.tp, parallelism.cp
        if (training is not None and tp > 1 and arch.n_heads % tp == 0 and arch.n_kv_heads % tp == 0
                and not sequence_problems(training, parallelism)
                and training.seq_len % (tp * (2 * cp if cp > 1 else 1))):
            problems.append(_seq_len_problem(training.seq_len, tp, cp))  # sequence parallelism's share
        for key, heads in (("n_heads", arch.n_heads), ("n_kv_heads", arch.n_kv_heads)):
            if heads % tp:
                problems.append(Problem("parallelism.tp", tp, f"does not divide the model's {key} ({heads}, {origin})",
                                        f"{one_of(_divisors(heads))} (the divisors of {heads})",
                                        _nearest_hint("parallelism.tp", tp, _divisors(heads))))
        if arch.moe is not None and parallelism.ep > 1 and arch.moe.num_experts % parallelism.ep:
            problems.append(Problem("parallelism.ep", parallelism.ep,
                                    f"does not divide the number of experts ({arch.moe.num_experts}, {origin})",
                                    f"{one_of(_divisors(arch.moe.num_experts))} "
                                    f"(the divisors of {arch.moe.num_experts})"))
        if arch.moe is None and parallelism.ep > 1:
            problems.append(Problem("parallelism.ep", parallelism.ep,
                                    f"expert parallelism needs an MoE model; {origin} is dense", "1"))
    if training is not None and training.seq_len > arch.max_seq_len:
        problems.append(Problem("training.seq_len", training.seq_len,
                                f"exceeds the model's maximum sequence length ({arch.max_seq_len}, {origin})",
                                f"1..{arch.max_seq_len}"))
    if n_layers is not None and n_layers > base.n_layers:
        problems.append(Problem("model.n_layers", n_layers, f"{origin} has only {base.n_layers} layers",
                                f"1..{base.n_layers}"))
    for key, v in (("num_experts", num_experts), ("top_k", top_k)):
        if v is not None and base.moe is None:
            problems.append(Problem(f"model.{key}", v, f"{origin} is dense (no experts)", "null for dense models"))
    if base.moe is not None and num_experts is not None and num_experts > base.moe.num_experts:
        problems.append(Problem("model.num_experts", num_experts, f"{origin} has only {base.moe.num_experts} experts",
                                f"1..{base.moe.num_experts}"))
    if base.moe is not None and arch.moe is not None and arch.moe.top_k > arch.moe.num_experts:
        problems.append(Problem("model.top_k", arch.moe.top_k,
                                f"exceeds the number of experts ({arch.moe.num_experts})",
                                f"1..{arch.moe.num_experts}"))
    return problems


def _lcm_of(chunks: int, cp: int, tp: int, sharded: int) -> str:
    """How the divisor of `sequence_problems` is made, for the allowed line."""
    first = f"{chunks} x cp = {chunks * cp}" if cp > 1 else str(chunks)
    if tp > 1:
        second = f"tp x 2 x cp = {sharded}" if cp > 1 else f"tp = {tp}"
        return f" (lcm of {first} and {second})"
    return f" ({first})" if cp > 1 else ""


def _pipeline_problems(model: Any, parallelism: Parallelism, arch: Arch, origin: str) -> list[Problem]:
    """What torchtitan 0.3.0 refuses in a rank for parallelism.pp > 1 (`to_torchtitan` turns CUDA graphs
    off for pp > 1, which torchtitan otherwise refuses in `Trainer.Config`)."""
    pp = parallelism.pp
    if pp == 1:
        return []
    problems: list[Problem] = []
    if model.backend == "native" and arch.tied:
        # torchtitan's Decoder.Config.update_from_config: "Weight tying is not supported with Pipeline
        # Parallel" (the embedding is on the first stage, the output projection on the last). The
        # Transformers backend unties the two weights instead (as it does for FSDP), so model=hf runs.
        untied = [n for n, a in FLAVORS.items() if not a.tied and not n.startswith("debugmodel")]
        problems.append(Problem("parallelism.pp", pp, f"{origin} ties its embedding and output weights, and "
                                "torchtitan's Qwen3 cannot split tied weights across pipeline stages",
                                "1 for a model with tied embeddings",
                                f"pipeline an untied model ({one_of(untied)}) or use model=hf, which unties them"))
    # torchtitan's stage split counts the embedding and the output as one layer each and needs at
    # least one of these units per stage (`_generate_llm_fqn_per_model_part`).
    units = arch.n_layers + 2
    if pp > units:
        problems.append(Problem("parallelism.pp", pp, f"more pipeline stages than {origin}'s {arch.n_layers} "
                                "layers + embedding + output can fill (one unit per stage at least)",
                                f"1..{units}"))
    return problems


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest_hint(key: str, value: int, options: list[int]) -> str | None:
    if not options:
        return None
    best = min(options, key=lambda o: (abs(o - value), o))
    return f"nearest valid value: {key}={best}"


# ------------------------------------------------------------------------- error presentation
# Model validators raise ValueError with one or more lines "<TAG>key<SEP>value<SEP>msg<SEP>allowed<SEP>hint"
# so that cross-field errors keep their own key instead of the validator's location.
_TAG, _SEP = "\x00qk:", "\x00"


def _tagged(key: str, value: Any, message: str, allowed: str | None = None, hint: str | None = None) -> str:
    return _TAG + _SEP.join([key, repr(value), message, allowed or "", hint or ""])


_UNIONS = {"model", "checkpoint", "platform", "data", "launcher"}


def _key(loc: tuple, data: dict) -> str:
    parts = [str(x) for x in loc]
    # Drop the union tag pydantic inserts after the union field (model.native.flavor -> model.flavor).
    if len(parts) >= 2 and parts[0] in _UNIONS:
        parts.pop(1)
    return ".".join(parts)


def _value_at(data: Any, key: str) -> Any:
    cur = data
    for part in key.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return MISSING
    return cur


def _allowed_for(err: ErrorDetails) -> str | None:
    ctx = err.get("ctx") or {}
    t = err["type"]
    if t == "literal_error":
        return ctx.get("expected")
    if t in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[t]
        bound = next(iter(v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le")), None)
        return f"a number {op} {bound}"
    if t == "union_tag_invalid":
        return ctx.get("expected_tags")
    if t == "finite_number":
        return "a finite number (not inf, -inf or nan)"
    if t.endswith("_parsing") or t.endswith("_type"):
        return t.split("_")[0]
    if t == "string_pattern_mismatch":
        return "letters, digits and . _ = , + -"
    return None


def _field_names(model: type[BaseModel], key: str, data: Any = None) -> list[str]:
    """Valid sibling keys for an unknown key (for 'did you mean'); inside a union, those of the
    variant the data's tag selects (model.backend=hf lists HFModel's keys)."""
    parts = key.split(".")[:-1]
    cur: Any = model
    for part in parts:
        fld = getattr(cur, "model_fields", {}).get(part)
        if fld is None:
            return []
        data = data.get(part) if isinstance(data, dict) else None
        cur = _variant(fld, data)
        if cur is None:
            return []
    names = list(getattr(cur, "model_fields", {}))
    return [".".join([*parts, n]) for n in names]


def _variant(fld: Any, data: Any) -> Any:
    tag = fld.discriminator
    if isinstance(tag, str) and isinstance(data, dict):
        for member in getattr(fld.annotation, "__args__", ()) or ():
            f = getattr(member, "model_fields", {}).get(tag)
            if f is not None and f.default == data.get(tag):
                return member
    return _first_model(fld.annotation)


def describe(key: str) -> str | None:
    """The description (field docstring) of a dotted key, looking into every variant of a union
    (data.path is a field of data=local only)."""
    def models(ann: Any) -> list[type[BaseModel]]:
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return [ann]
        return [m for arg in getattr(ann, "__args__", ()) or () for m in models(arg)]

    current: list[type[BaseModel]] = [Experiment]
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = [m.model_fields[part] for m in current if part in m.model_fields]
        if not fields:
            return None
        if i == len(parts) - 1:
            desc = next((f.description for f in fields if f.description), None)
            return " ".join(desc.split()) if desc else None
        current = [m for f in fields for m in models(f.annotation)]
    return None


def field_of(key: str, data: dict) -> Any:
    """The pydantic field of a dotted key in the variant `data` chose (model.backend=hf: HFModel's
    fields), or None."""
    model: Any = Experiment
    node: Any = data
    parts = key.split(".")
    for i, part in enumerate(parts):
        fld = model.model_fields.get(part) if model is not None else None
        if fld is None:
            return None
        if i == len(parts) - 1:
            return fld
        node = node.get(part) if isinstance(node, dict) else None
        model = _variant(fld, node)
    return None


def type_name(annotation: Any) -> str:
    """A field's type as a person reads it: int, float, a|b|c, str or null, ..."""
    import typing

    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner = type_name(args[0])
        metas = [x for m in args[1:] for x in (getattr(m, "metadata", None) or [m])]  # Field(ge=0): its metadata
        bounds = [f"{op} {getattr(m, attr)}" for m in metas for attr, op in
                  (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if getattr(m, attr, None) is not None]
        return f"{inner} {' '.join(bounds)}".strip() if bounds else inner
    if origin is Literal:
        return "|".join(str(a) for a in args)
    if args and origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join("null" if a is type(None) else type_name(a) for a in args)
    if origin in (list, tuple, dict):
        return origin.__name__
    return getattr(annotation, "__name__", str(annotation))


def _first_model(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        m = _first_model(arg)
        if m is not None:
            return m
    origin = getattr(ann, "__origin__", None)
    if origin is not None:
        return _first_model(origin)
    return None


def problems_from_validation(e: ValidationError, data: dict, prefix: str | None = None) -> list[Problem]:
    """Problems named by YAML key. `prefix`: the section the validated data sits under (errors of a
    section validated on its own)."""
    out: list[Problem] = []
    for err in e.errors(include_url=False):
        if prefix:
            err = {**err, "loc": (prefix, *err["loc"])}
        msg = str(err.get("msg", ""))
        if _TAG in msg:
            where = _key(err["loc"], data)
            for line in msg.split(_TAG)[1:]:
                key, value, message, allowed, hint = line.rstrip("\n").split(_SEP)
                full = key if "." in key or not where else f"{where}.{key}"
                out.append(Problem(full, _value_at(data, full) if _value_at(data, full) is not MISSING else value,
                                   message, allowed or None, hint or None))
            continue
        key = _key(err["loc"], data)
        value = _value_at(data, key)
        if err["type"] == "extra_forbidden":
            siblings = _field_names(Experiment, key, data)
            out.append(Problem(key, value, "unknown key", one_of(s.split(".")[-1] for s in siblings) or None,
                               did_you_mean(key, siblings)))
        elif err["type"] == "missing":
            out.append(Problem(key, MISSING, "required key is missing", describe(key)))
        else:
            out.append(Problem(key, value, msg, _allowed_for(err), _value_hint(err, value)))
    return out


def _value_hint(err: ErrorDetails, value: Any) -> str | None:
    """'did you mean cosine?' for a misspelt choice."""
    import re

    if err["type"] == "literal_error" and isinstance(value, str):
        return did_you_mean(value, re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", ""))))
    if err["type"] == "union_tag_invalid" and isinstance(value, str):
        return did_you_mean(value, re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected_tags", ""))))
    return None


SECTIONS: dict[str, Any] = {
    "model": Model, "training": Training, "parallelism": Parallelism, "kernels": Kernels,
    "checkpoint": Checkpoint, "platform": Platform, "data": Data, "launcher": Launcher, "metrics": Metrics,
}


@dataclass
class Checked:
    exp: Experiment | None
    """The experiment, or None when it is invalid."""
    sections: dict[str, Any]
    """The sections that validate on their own (with `replaced` keys set to their defaults)."""
    replaced: set[str]
    """Keys whose bad value was replaced by the default so that the rest of the section validates."""
    problems: list[Problem]


def check_experiment(data: dict) -> Checked:
    """Validate, collecting every independent problem.

    When the experiment as a whole is invalid, each section is validated by itself (without its bad
    fields) and the cross-field rules run on what passed, so one mistake does not hide another."""
    from pydantic import TypeAdapter

    try:
        exp = Experiment.model_validate(data)
        return Checked(exp, {name: getattr(exp, name) for name in SECTIONS}, set(), [])
    except ValidationError as e:
        problems = problems_from_validation(e, data)
    sections: dict[str, Any] = {}
    replaced: set[str] = set()
    for name, typ in SECTIONS.items():
        if name not in data:
            default = Experiment.model_fields[name].get_default(call_default_factory=True)
            if default is not PydanticUndefined:  # a required section (model) that is absent: skip
                sections[name] = default
            continue
        try:
            sections[name] = TypeAdapter(typ).validate_python(data[name])
            continue
        except (ValidationError, TypeError) as e:
            if name == "model" or not isinstance(data[name], dict) or not isinstance(e, ValidationError):
                continue  # without a trustworthy flavor no model rule is meaningful
            bad = {p.key.split(".")[1] for p in problems_from_validation(e, {name: data[name]}, prefix=name)
                   if "." in p.key}
        # Validate the section without its bad fields (their defaults stand in), so the rules about
        # its other fields still run; rules about the replaced fields are dropped below.
        replaced |= {f"{name}.{k}" for k in bad}
        try:
            sections[name] = TypeAdapter(typ).validate_python({k: v for k, v in data[name].items() if k not in bad})
        except (ValidationError, TypeError):
            continue
    seen = {(p.key, p.message) for p in problems}
    for p in cross_field_problems(sections.get("model"), sections.get("training"), sections.get("parallelism")):
        if (p.key, p.message) not in seen and p.key not in replaced:
            problems.append(p)
    return Checked(None, sections, replaced, problems)


def validate_experiment(data: dict, *, context: str | None = None) -> Experiment:
    """Validate a plain dict (the resolved Hydra config) into an Experiment, or raise ConfigError
    naming every problem found."""
    checked = check_experiment(data)
    if checked.problems:
        raise ConfigError(checked.problems, context=context)
    assert checked.exp is not None, "check_experiment found no problem, so it built the Experiment"
    return checked.exp
