"""objective=sft: the next-token cross-entropy over the data's trained tokens (torchtitan's own
loss, unchanged); no pairs, no reference."""

from __future__ import annotations

from qwen3exp.config.sections.objective import SftObjective

SECTION = SftObjective
DATA = "sequences"
REFERENCE = False


def loss(section, lp):
    raise AssertionError("objective=sft trains with torchtitan's cross-entropy, not a pair loss")
