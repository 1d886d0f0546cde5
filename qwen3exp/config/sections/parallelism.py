"""The `parallelism` section: the degrees of the device mesh."""

from __future__ import annotations

from pydantic import model_validator

from qwen3exp.config.sections.base import Degree, PosInt, Strict, tagged


class Parallelism(Strict):
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
            raise ValueError(tagged("dp_shard", 0, "must be -1 or positive", "-1 or an integer > 0"))
        return self
