"""The `training` section: steps, batch, optimizer and precision.

`local_batch_size` and `activation_checkpoint` may be `auto`: the plan chooses them before anything
starts (`qwen3exp.plan.auto_layout`; see `qwen3exp.config.sections.auto_values`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from qwen3exp.config.sections.auto_values import validate_with_auto
from qwen3exp.config.sections.base import INT_MAX, NonNegInt, PosInt, Strict, tagged

LOSS_CHUNKS = 8
"""The chunks torchtitan's `ChunkedLossWrapper` cuts a rank's tokens into (`to_torchtitan` keeps
num_chunks=8): seq_len / cp must divide by it (`qwen3exp.config.parallel_rules.sequence_problems`), and the
loss logits of one chunk are what the memory estimate counts (`qwen3exp.plan.memory`)."""
AC_MODES = ("none", "selective", "full")
"""training.activation_checkpoint's modes (besides `auto`, which chooses one of them)."""
STAND_IN: dict[str, Any] = {"local_batch_size": 1, "activation_checkpoint": "none"}
"""What a field written `auto` holds until the plan chooses it."""


class Training(Strict):
    steps: PosInt = 30
    """Optimizer steps."""
    seq_len: PosInt = 256
    """Tokens per sequence (sample)."""
    local_batch_size: PosInt = 8
    """Sequences per rank per micro-batch; `auto`: the plan chooses (the fastest predicted that fits)."""
    global_batch_size: Annotated[int, Field(le=INT_MAX)] = -1
    """-1: local_batch_size x data-parallel degree (no gradient accumulation); a larger multiple of
    it accumulates gradients."""
    lr: Annotated[float, Field(gt=0)] = 3e-3
    """AdamW peak learning rate (after the warm-up)."""
    warmup_steps: NonNegInt | None = None
    """Linear warm-up steps. None: derived from `steps` (`warmup`: min(5, max(1, steps // 5))), so that
    a short smoke test (training.steps=3) needs no second override; an explicit value must fit."""
    decay_type: Literal["linear", "sqrt", "cosine"] = "cosine"
    """How the learning rate decays after the warm-up, down to lr x min_lr_factor."""
    min_lr_factor: Annotated[float, Field(ge=0, le=1)] = 0.1
    """The final learning rate as a fraction of `lr`."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.1
    """AdamW weight decay."""
    max_norm: Annotated[float, Field(gt=0)] = 1.0
    """Gradient clipping: the largest total gradient norm."""
    seed: NonNegInt = 42
    """Seed of the initialisation and the data order."""
    deterministic: bool = False
    """torch deterministic algorithms."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the parameters as stored (FSDP keeps float32 master weights by default)."""
    mixed_precision_param: Literal["float32", "bfloat16"] = "float32"
    """Dtype FSDP all-gathers parameters in for compute."""
    activation_checkpoint: Literal["none", "selective", "full"] = "none"
    """Recompute activations in the backward pass: none, selective (torchtitan's op-level SAC) or
    full (every block); `auto`: the plan chooses."""
    compile: bool = False
    """torch.compile the model and loss (backend chosen by the platform)."""
    _auto: frozenset[str] = PrivateAttr(default=frozenset())

    @model_validator(mode="wrap")
    @classmethod
    def _auto_fields(cls, data: Any, handler) -> Training:
        return validate_with_auto(data, handler, STAND_IN)

    @property
    def auto(self) -> frozenset[str]:
        """The fields written `auto` (they hold `STAND_IN` until the plan chooses)."""
        return self._auto

    @property
    def warmup(self) -> int:
        """The warm-up the run uses: `warmup_steps`, or the value derived from `steps`."""
        return self.warmup_steps if self.warmup_steps is not None else min(5, max(1, self.steps // 5))

    @model_validator(mode="after")
    def _batch(self) -> Training:
        if self.global_batch_size == 0 or self.global_batch_size < -1:
            raise ValueError(
                tagged(
                    "global_batch_size",
                    self.global_batch_size,
                    "must be positive, or -1 for local_batch_size x dp",
                    "-1 or an integer > 0",
                )
            )
        if self.warmup_steps is not None and self.warmup_steps > self.steps:
            raise ValueError(
                tagged("warmup_steps", self.warmup_steps, f"exceeds training.steps ({self.steps})", f"0..{self.steps}")
            )
        return self
