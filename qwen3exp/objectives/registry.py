"""Which objective module an experiment's `objective` section selects, and what it needs.

An objective is one module here, following `ObjectiveModule`: the section class that selects it,
the data kind it trains on, whether it needs a reference model's log-probs, and its loss on a batch
of per-sequence log-prob sums and token counts (torch is imported inside the loss only, so the
launcher reads everything else without torch). A new objective is its module, one entry in
`OBJECTIVES`, its section class in `qwen3exp.config.sections.objective` and `conf/objective/<name>.yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from qwen3exp.errors import Problem
from qwen3exp.objectives import dpo, orpo, sft, simpo

METRICS = (
    "rewards_chosen",
    "rewards_rejected",
    "reward_margin",
    "reward_accuracy",
    "logps_chosen",
    "logps_rejected",
)
"""The per-pair metrics a preference objective logs next to `loss` (each a mean over the step's pairs)."""


@dataclass
class PairLogps:
    """Per-pair tensors ([pairs]): the policy's summed log-probs of each side's counted tokens, their
    counts, and the reference's summed log-probs (None where the objective has no reference)."""

    chosen: Any
    rejected: Any
    n_chosen: Any
    n_rejected: Any
    ref_chosen: Any = None
    ref_rejected: Any = None


class ObjectiveModule(Protocol):
    @property
    def SECTION(self) -> type[BaseModel]:
        """The `objective` section class that selects it."""
        ...

    @property
    def DATA(self) -> str:
        """The data kind it trains on: "sequences" (text, chat) or "pairs" (data=preference)."""
        ...

    @property
    def REFERENCE(self) -> bool:
        """It needs the reference model's log-probs of each side."""
        ...

    def loss(self, section, lp: PairLogps) -> tuple[Any, dict[str, Any]]:
        """(the loss of each pair, {metric: per-pair tensor} of `METRICS`); pairs objectives only."""
        ...


OBJECTIVES: tuple[ObjectiveModule, ...] = (sft, dpo, orpo, simpo)
BY_SECTION: dict[type, ObjectiveModule] = {m.SECTION: m for m in OBJECTIVES}


def of(section) -> ObjectiveModule:
    """The module of an `objective` section."""
    return BY_SECTION[type(section)]


def problems(objective, data, training, exp=None) -> list[Problem]:
    """The objective and the data kind must agree: pairs for a preference objective, sequences for
    sft; a batch holds whole pairs (two sequences each). With the whole experiment (`exp`), also
    what a preference objective does not support yet (`not_yet`)."""
    module, pairs = of(objective), data.source == "preference"
    if data.source == "mix":  # a mixture: each source against the objective (`qwen3exp.data.mixture_checks`)
        return []
    if exp is not None and exp.sweep.objective == "val_reward_accuracy" and not (pairs and exp.validation.enable):
        why = "is the reward accuracy on held-out pairs: it needs a preference objective and validation"
        fix = "objective=dpo|orpo|simpo with data=preference and validation.enable=true, or another objective"
        return [Problem("sweep.objective", "val_reward_accuracy", why, fix)]
    if module.DATA == "pairs" and not pairs:
        return [
            Problem(
                "objective",
                objective.kind,
                f"trains on pairs of a chosen and a rejected answer, and data={data.source} has none",
                "data=preference with objective=dpo, orpo or simpo",
                "data=preference (data.path: a .jsonl of {prompt, chosen, rejected})",
            )
        ]
    if module.DATA != "pairs" and pairs:
        return [
            Problem(
                "data.source",
                "preference",
                f"holds pairs, which objective={objective.kind} does not train on",
                "objective=dpo, orpo or simpo with data=preference",
                "objective=dpo",
            )
        ]
    later = not_yet(exp) if exp is not None and module.DATA == "pairs" else []
    if pairs and training is not None and training.local_batch_size % 2:
        return later + [
            Problem(
                "training.local_batch_size",
                training.local_batch_size,
                "holds the chosen and the rejected sequence of each pair side by side, so it must be even",
                "an even number (2 per pair)",
            )
        ]
    return later


def not_yet(exp) -> list[Problem]:
    """What preference training does not support yet (issue 40's later slices), refused rather than
    run wrongly: pipeline, tensor, context and expert parallelism (on either backend); precomputed
    reference log-probs of a mixture. A separate reference (objective.reference) runs on both
    backends: a native model beside either policy (`qwen3exp.titan.reference_load`)."""
    kind, out = exp.objective.kind, []
    later = "not implemented yet for preference objectives"
    for key in ("pp", "tp", "cp", "ep"):
        if getattr(exp.parallelism, key) != 1:
            value = getattr(exp.parallelism, key)
            out.append(Problem(f"parallelism.{key}", value, f"objective={kind}: {later}", "1 (FSDP only)"))
    if getattr(exp.objective, "reference_logps", "live") == "precomputed" and exp.data.source == "mix":
        why = f"objective={kind}: precomputed reference log-probs are not implemented yet for data=mix"
        out.append(Problem("objective.reference_logps", "precomputed", why, "live"))
    return out
