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
    run wrongly: model=hf; pipeline, tensor, context and expert parallelism; resumable checkpoints
    of a full fine-tune with a reference (its frozen copy is not saved)."""
    kind, out = exp.objective.kind, []
    later = "not implemented yet for preference objectives"
    if exp.model.backend != "native":
        out.append(Problem("model", exp.model.backend, f"objective={kind}: {later}", "model=native"))
    for key in ("pp", "tp", "cp", "ep"):
        if getattr(exp.parallelism, key) != 1:
            value = getattr(exp.parallelism, key)
            out.append(Problem(f"parallelism.{key}", value, f"objective={kind}: {later}", "1 (FSDP only)"))
    if of(exp.objective).REFERENCE and exp.peft.kind != "lora" and exp.checkpoint.save and _live_copy(exp.objective):
        why = "a full fine-tune's reference (a frozen copy of the starting weights) is not checkpointed yet"
        fix = "false, peft=lora, objective.reference_logps=precomputed or a separate objective.reference"
        out.append(Problem("checkpoint.save", True, f"objective={kind}: {why}", fix))
    return out


def _live_copy(objective) -> bool:
    """The reference is a frozen copy of the starting weights held in the ranks (not a separate
    model, which a resume loads again, nor precomputed log-probs, which the run directory keeps)."""
    return isinstance(objective, dpo.SECTION) and objective.reference is None and objective.reference_logps == "live"
