"""The contract: one validated, frozen `Experiment` per run.

Hydra composes YAML; this module decides what is a valid experiment. Everything here is plain data
and cheap to import (no torch, no torchtitan). Variants are discriminated unions keyed on a short
tag (`model.backend`, `platform.name`, ...); pydantic puts the tag into error locations, and
`validate_experiment` strips it so messages show the YAML key.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from qwen3exp.errors import ConfigError, MISSING, Problem, did_you_mean, one_of
from qwen3exp.flavors import FLAVORS, Arch


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
Degree = Annotated[int, Field(ge=-1)]


# --------------------------------------------------------------------------------------- model
class NativeModel(_Strict):
    """torchtitan's own Qwen3 implementation."""

    backend: Literal["native"] = "native"
    flavor: str = "tiny"
    """A torchtitan Qwen3 flavor (0.6B, 1.7B, 4B, 8B, 14B, 32B, 30B-A3B, 235B-A22B, debugmodel, ...),
    a qwen3exp flavor (tiny, tiny_moe), or `auto` to read the architecture from
    `hf_assets_path/config.json`."""
    hf_assets_path: str | None = None
    """Folder with tokenizer files (and config.json / safetensors for checkpoints). None: the
    tokenizer bundled with qwen3exp."""
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
        if self.flavor == "auto" and self.hf_assets_path is None:
            raise ValueError(_tagged("hf_assets_path", None,
                                     "flavor=auto reads config.json from hf_assets_path, which is not set",
                                     "a folder holding config.json"))
        return self

    def arch(self) -> Arch | None:
        """The architecture when it is known without reading files (None for flavor=auto)."""
        if self.flavor == "auto":
            return None
        arch = FLAVORS[self.flavor]
        return arch.reduced(n_layers=self.n_layers, num_experts=self.num_experts, top_k=self.top_k)


Model = Annotated[Union[NativeModel], Field(discriminator="backend")]


# ------------------------------------------------------------------------------------ training
class Training(_Strict):
    steps: PosInt = 30
    seq_len: PosInt = 256
    local_batch_size: PosInt = 8
    global_batch_size: int = -1
    """-1: local_batch_size x data-parallel degree (no gradient accumulation)."""
    lr: Annotated[float, Field(gt=0)] = 3e-3
    warmup_steps: NonNegInt = 5
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

    @model_validator(mode="after")
    def _batch(self) -> Training:
        if self.global_batch_size == 0 or self.global_batch_size < -1:
            raise ValueError(_tagged("global_batch_size", self.global_batch_size,
                                     "must be positive, or -1 for local_batch_size x dp",
                                     "-1 or an integer > 0"))
        if self.warmup_steps > self.steps:
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
class Kernels(_Strict):
    name: str = "default"
    """The kernels group option this came from (for the record)."""


# ---------------------------------------------------------------------------------- checkpoint
class NoCheckpoint(_Strict):
    kind: Literal["none"] = "none"


Checkpoint = Annotated[Union[NoCheckpoint], Field(discriminator="kind")]


# ------------------------------------------------------------------------------------ platform
class AutoPlatform(_Strict):
    name: Literal["auto"] = "auto"
    """cuda if a GPU is visible, else neuron if torch_neuronx is importable, else cpu."""


class CpuPlatform(_Strict):
    name: Literal["cpu"] = "cpu"
    ranks_per_node: PosInt = 2
    """Ranks when launcher.nproc_per_node is null."""
    threads_per_rank: PosInt | None = None
    """torch intra-op threads per rank; None: cores / ranks (at least 1)."""
    memory_per_rank_gib: Annotated[float, Field(gt=0)] | None = None
    """Memory budget per rank for planning; None: physical memory / ranks."""


Platform = Annotated[Union[AutoPlatform, CpuPlatform], Field(discriminator="name")]


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


Data = Annotated[Union[BundledData, LocalData], Field(discriminator="source")]


# ------------------------------------------------------------------------------------ launcher
class LocalLauncher(_Strict):
    kind: Literal["local"] = "local"
    nnodes: PosInt = 1
    nproc_per_node: PosInt | None = None
    """Ranks per node; None: the platform decides (cpu: platform.ranks_per_node)."""
    node_rank: NonNegInt = 0
    rdzv_endpoint: str | None = None
    """host:port of the c10d rendezvous; required when nnodes > 1."""
    max_restarts: NonNegInt = 0
    stop_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """After Ctrl-C/SIGTERM, seconds to wait for the ranks before killing them."""

    @model_validator(mode="after")
    def _multinode(self) -> LocalLauncher:
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(_tagged("rdzv_endpoint", None, f"nnodes={self.nnodes} needs a rendezvous endpoint",
                                     "host:port reachable from every node"))
        if self.node_rank >= self.nnodes:
            raise ValueError(_tagged("node_rank", self.node_rank, f"must be below nnodes ({self.nnodes})",
                                     f"0..{self.nnodes - 1}"))
        return self


Launcher = Annotated[Union[LocalLauncher], Field(discriminator="kind")]


# ------------------------------------------------------------------------------------- metrics
class Metrics(_Strict):
    log_freq: PosInt = 1
    tensorboard: bool = True
    wandb: bool = False


# ---------------------------------------------------------------------------------- experiment
class Experiment(_Strict):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9._=,+-]+$")]
    dry_run: bool = False
    model: Model
    training: Training = Training()
    parallelism: Parallelism = Parallelism()
    kernels: Kernels = Kernels()
    checkpoint: Checkpoint = NoCheckpoint()
    platform: Platform = AutoPlatform()
    data: Data = BundledData()
    launcher: Launcher = LocalLauncher()
    metrics: Metrics = Metrics()

    @model_validator(mode="after")
    def _cross(self) -> Experiment:
        arch = self.model.arch()
        if arch is None:
            return self
        p = self.parallelism
        problems: list[str] = []
        for key, heads in (("n_heads", arch.n_heads), ("n_kv_heads", arch.n_kv_heads)):
            if heads % p.tp:
                problems.append(_tagged("parallelism.tp", p.tp, f"does not divide the model's {key} ({heads})",
                                        one_of(d for d in range(1, heads + 1) if heads % d == 0)))
        if self.training.seq_len > arch.max_seq_len:
            problems.append(_tagged("training.seq_len", self.training.seq_len,
                                    f"exceeds the model's maximum sequence length ({arch.max_seq_len})",
                                    f"1..{arch.max_seq_len}"))
        if self.model.n_layers is not None and self.model.n_layers > FLAVORS[self.model.flavor].n_layers:
            problems.append(_tagged("model.n_layers", self.model.n_layers,
                                    f"flavor {self.model.flavor} has only {FLAVORS[self.model.flavor].n_layers} layers",
                                    f"1..{FLAVORS[self.model.flavor].n_layers}"))
        base = FLAVORS[self.model.flavor]
        for key in ("num_experts", "top_k"):
            v = getattr(self.model, key)
            if v is not None and base.moe is None:
                problems.append(_tagged(f"model.{key}", v, f"flavor {self.model.flavor} is dense (no experts)",
                                        "null for dense flavors"))
        if base.moe is not None and arch.moe is not None and arch.moe.top_k > arch.moe.num_experts:
            problems.append(_tagged("model.top_k", arch.moe.top_k,
                                    f"exceeds the number of experts ({arch.moe.num_experts})",
                                    f"1..{arch.moe.num_experts}"))
        if problems:
            raise ValueError("\n".join(problems))
        return self


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


def _allowed_for(err: dict) -> str | None:
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
    if t.endswith("_parsing") or t.endswith("_type"):
        return t.split("_")[0]
    if t == "string_pattern_mismatch":
        return "letters, digits and . _ = , + -"
    return None


def _field_names(model: type[BaseModel], key: str) -> list[str]:
    """Valid sibling keys for an unknown key (for 'did you mean')."""
    parts = key.split(".")[:-1]
    cur: Any = model
    for part in parts:
        fld = getattr(cur, "model_fields", {}).get(part)
        if fld is None:
            return []
        ann = fld.annotation
        cur = _first_model(ann)
        if cur is None:
            return []
    names = list(getattr(cur, "model_fields", {}))
    return [".".join([*parts, n]) for n in names]


def _first_model(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        m = _first_model(arg)
        if m is not None:
            return m
    for meta in getattr(ann, "__metadata__", ()) or ():
        pass
    origin = getattr(ann, "__origin__", None)
    if origin is not None:
        return _first_model(origin)
    return None


def problems_from_validation(e: ValidationError, data: dict) -> list[Problem]:
    out: list[Problem] = []
    for err in e.errors(include_url=False):
        msg = str(err.get("msg", ""))
        if _TAG in msg:
            prefix = _key(err["loc"], data)
            for line in msg.split(_TAG)[1:]:
                key, value, message, allowed, hint = line.rstrip("\n").split(_SEP)
                full = key if "." in key or not prefix else f"{prefix}.{key}"
                out.append(Problem(full, _value_at(data, full) if _value_at(data, full) is not MISSING else value,
                                   message, allowed or None, hint or None))
            continue
        key = _key(err["loc"], data)
        value = _value_at(data, key)
        if err["type"] == "extra_forbidden":
            siblings = _field_names(Experiment, key)
            out.append(Problem(key, value, "unknown key", one_of(s.split(".")[-1] for s in siblings) or None,
                               did_you_mean(key, siblings)))
        elif err["type"] == "missing":
            out.append(Problem(key, MISSING, "required key is missing"))
        else:
            out.append(Problem(key, value, msg, _allowed_for(err)))
    return out


def validate_experiment(data: dict, *, context: str | None = None) -> Experiment:
    """Validate a plain dict (the resolved Hydra config) into an Experiment, or raise ConfigError."""
    try:
        return Experiment.model_validate(data)
    except ValidationError as e:
        raise ConfigError(problems_from_validation(e, data), context=context) from None
