"""The value `auto` in a key that otherwise holds a number or a mode: the plan chooses it.

`parallelism.<degree>=auto` (conf/parallelism/auto.yaml sets every degree), `training.local_batch_size=auto`
and `training.activation_checkpoint=auto` leave the choice to `qwen3exp.plan.auto_layout`, which runs
once per job before anything starts; the experiment that is recorded and launched holds the number
it chose. Until then the section holds a neutral stand-in in that field (a degree of 1, dp_shard -1,
batch 1, no checkpointing), so that every rule written for numbers reads a valid section (and the
stand-in is the value under which those rules refuse least), and the section's `auto` property names
the fields left to the plan. The field keeps its number type: code after the plan never sees `auto`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

AUTO = "auto"


def take_auto(data: Any, stand_in: Mapping[str, Any]) -> tuple[Any, frozenset[str]]:
    """`data` (a section as plain data) with each field of `stand_in` that says `auto` replaced by
    its stand-in, and the names of those fields. Anything else (a validated section) passes as it is."""
    if not isinstance(data, dict):
        return data, frozenset()
    auto = frozenset(k for k in stand_in if isinstance(data.get(k), str) and data[k] == AUTO)
    if not auto:
        return data, auto
    return {**data, **{k: stand_in[k] for k in auto}}, auto


def validate_with_auto(data: Any, handler: Callable[[Any], Any], stand_in: Mapping[str, Any]) -> Any:
    """A section's wrap validator: validate `data` with its `auto` fields stood in, and remember
    which fields they were (the section's private `_auto`)."""
    data, auto = take_auto(data, stand_in)
    section = handler(data)
    if auto:
        section._auto = auto
    return section
