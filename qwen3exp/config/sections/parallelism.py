"""The `parallelism` section: the degrees of the device mesh.

A degree may be `auto` (conf/parallelism/auto.yaml sets them all): the plan chooses it before
anything starts (`qwen3exp.plan.auto_layout`; see `qwen3exp.config.sections.auto_values`)."""

from __future__ import annotations

from typing import Any

from pydantic import PrivateAttr, model_validator

from qwen3exp.config.sections.auto_values import validate_with_auto
from qwen3exp.config.sections.base import Degree, PosInt, Strict, tagged

DEGREES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")
STAND_IN: dict[str, Any] = {"dp_replicate": 1, "dp_shard": -1, "tp": 1, "pp": 1, "cp": 1, "ep": 1}
"""What a degree written `auto` holds until the plan chooses it (no parallelism: FSDP over every rank)."""


class Parallelism(Strict):
    dp_replicate: PosInt = 1
    """HSDP replicas (data parallel without sharding between them); `auto`: the plan chooses."""
    dp_shard: Degree = -1
    """FSDP degree; -1 uses every rank left over after the other degrees; `auto`: the plan chooses."""
    tp: PosInt = 1
    """Tensor-parallel degree (divides the heads and kv heads); `auto`: the plan chooses."""
    pp: PosInt = 1
    """Pipeline stages; `auto`: the plan chooses."""
    cp: PosInt = 1
    """Context-parallel degree (splits the sequence); `auto`: the plan chooses."""
    ep: PosInt = 1
    """Expert-parallel degree (divides the experts of an MoE model); `auto`: the plan chooses."""
    _auto: frozenset[str] = PrivateAttr(default=frozenset())

    @model_validator(mode="wrap")
    @classmethod
    def _auto_degrees(cls, data: Any, handler) -> Parallelism:
        return validate_with_auto(data, handler, STAND_IN)

    @property
    def auto(self) -> frozenset[str]:
        """The degrees written `auto` (their fields hold `STAND_IN` until the plan chooses)."""
        return self._auto

    @model_validator(mode="after")
    def _shard(self) -> Parallelism:
        if self.dp_shard == 0:
            raise ValueError(tagged("dp_shard", 0, "must be -1 or positive", "-1 or an integer > 0"))
        return self
