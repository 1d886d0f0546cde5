"""What every section shares: the strict pydantic base, the integer bounds, and the way a section's
own validator names the key it refuses (`tagged`, read back by `qwen3exp.config.translate`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    # use_attribute_docstrings: the docstring under a field is its description, which error
    # messages quote as what is allowed (see `translate.describe`). allow_inf_nan=False:
    # `training.lr=inf` or `nan` (which YAML and Hydra parse as floats) is refused in every float
    # field of every section; otherwise inf passes `gt=0` and rank 0 trains NaN losses.
    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, use_attribute_docstrings=True, allow_inf_nan=False
    )


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


# A section's model validator raises ValueError with one or more lines
# "<TAG>key<SEP>value<SEP>msg<SEP>allowed<SEP>hint", so that a rule between two fields of a section
# keeps its own key instead of the validator's location (the section).
TAG, SEP = "\x00qk:", "\x00"


def tagged(key: str, value: Any, message: str, allowed: str | None = None, hint: str | None = None) -> str:
    """One refused key as a line of a validator's ValueError (`translate.problems_from_validation`
    turns it back into a Problem)."""
    return TAG + SEP.join([key, repr(value), message, allowed or "", hint or ""])
