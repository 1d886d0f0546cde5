"""The loss of a preference objective (objective=dpo, orpo, simpo) as a torchtitan loss component.

torchtitan 0.3.0's trainer calls `loss_fn(pred, labels, global_valid_tokens)` on the logits of one
micro-batch and backpropagates what it returns; the step's logged loss is the sum of the returns
over the micro-batches and the data-parallel ranks. Here the batch holds pairs (rows 2i chosen,
2i + 1 rejected: `qwen3exp.titan.preference_dataset`): each row's summed log-prob over its counted
tokens (labels != -100) and their count go to the objective's own module
(`qwen3exp.objectives.registry`), whose per-pair losses are summed and divided by the pairs of the
whole step (`pairs_per_step` micro-batches x ranks), so the logged loss is the mean over the step's
pairs. The reference's summed log-probs of the rows (`reference`) are set by the trainer before
each micro-batch (`qwen3exp.titan.preference_trainer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import spmd_types as spmd  # type: ignore[import-untyped]
import torch
from pydantic import TypeAdapter
from torchtitan.components.loss import IGNORE_INDEX, BaseLoss, compute_logprobs
from torchtitan.config import CompileConfig

from qwen3exp.config.sections.objective import Objective
from qwen3exp.objectives import registry
from qwen3exp.objectives.registry import METRICS, PairLogps


def row_logps(pred: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-prob of each row's counted labels, their count), each [rows]."""
    counted = labels != IGNORE_INDEX
    logps = compute_logprobs(pred, labels)
    return (logps * counted).sum(dim=-1), counted.sum(dim=-1)


class PreferenceLoss(BaseLoss):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        objective: str = "{}"
        """The experiment's `objective` section as JSON."""

    def __init__(self, config: Config, *, compile_config: CompileConfig | None = None):
        self.section = TypeAdapter(Objective).validate_json(config.objective)
        self.module = registry.of(self.section)
        self.reference: torch.Tensor | None = None
        """The reference's summed log-probs of the next micro-batch's rows (set by the trainer)."""
        self.steps_and_ranks = 1
        """Micro-batches per step x data-parallel ranks (set by the trainer)."""
        self._sums: dict[str, torch.Tensor] = {}
        self._pairs = 0

    def __call__(self, pred, labels, global_valid_tokens=None, **kwargs: Any) -> tuple[torch.Tensor, dict]:
        del global_valid_tokens, kwargs  # pairs, not tokens, are averaged
        with spmd.no_typecheck():
            sums, counts = row_logps(pred, labels)
            ref = self.reference
            lp = PairLogps(sums[0::2], sums[1::2], counts[0::2], counts[1::2])
            if self.module.REFERENCE:
                assert ref is not None, "the trainer sets the reference log-probs before each micro-batch"
                lp.ref_chosen, lp.ref_rejected = ref[0::2], ref[1::2]
            per_pair, metrics = self.module.loss(self.section, lp)
            pairs = per_pair.shape[0]
            loss = per_pair.sum() / (pairs * self.steps_and_ranks)
        for name in METRICS:
            value = metrics[name].detach().float().sum()
            self._sums[name] = self._sums[name] + value if name in self._sums else value
        self._pairs += pairs
        self.reference = None
        return loss, {}

    def take_metrics(self) -> torch.Tensor:
        """The per-pair means of `METRICS` since the last call, over this rank's pairs: (sums, pairs)
        as one tensor [len(METRICS) + 1] for the trainer to add up over the ranks."""
        values = [self._sums.get(name, torch.zeros(())).reshape(()) for name in METRICS]
        device = values[0].device
        out = torch.stack([v.to(device) for v in values] + [torch.tensor(float(self._pairs), device=device)])
        self._sums, self._pairs = {}, 0
        return out
