"""Validation of a preference objective: its loss and reward accuracy on held-out pairs.

torchtitan's validator sums a token loss over the validation batches; a pair objective's loss is a
mean over pairs and DPO's needs the reference's log-probs of each batch, so `validate` is this
module's own: each of validation.steps batches of held-out pairs (`qwen3exp.titan.preference_dataset`,
the validation side of the split or validation.path) goes through the model without gradients, the
reference's log-probs come from the trainer (`reference`, the same pass as in training), and the
objective's own loss and metrics are averaged over every pair of every data-parallel rank. The row
in metrics.jsonl: `val_loss`, `val_perplexity` (exp of the loss, as for every validation) and
`val_reward_accuracy`. The samples of eval.samples follow, as for SFT (`FinalStepValidator`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torchtitan.tools import utils

from qwen3exp.objectives.registry import PairLogps
from qwen3exp.titan.chat_dataset import VALIDATION
from qwen3exp.titan.metrics import VAL_REWARD_ACCURACY
from qwen3exp.titan.preference_loss import row_logps
from qwen3exp.titan.validator import FinalStepValidator


class PreferenceValidator(FinalStepValidator):
    @dataclass(kw_only=True, slots=True)
    class Config(FinalStepValidator.Config):
        """FinalStepValidator's (its own class, so that `build` makes this validator)."""

    reference: Callable | None = None
    """(inputs, labels, extra kwargs) -> the reference's summed log-probs of the rows (set by the trainer)."""

    def validate(self, model_parts, step: int) -> None:
        (model,) = model_parts  # pipeline parallelism is refused before launch
        loss_fn, device = self.loss_fn, utils.device_type
        loader = self.dl_config.build(
            dp_world_size=self.dp_world_size,
            dp_rank=self.dp_rank,
            tokenizer=self.tokenizer,
            seq_len=self.seq_len,
            local_batch_size=self.local_batch_size,
        )
        totals = torch.zeros(3, device=device)  # loss sum, accurate pairs, pairs
        model.eval()
        try:
            for _, (input_dict, labels) in zip(range(self.config.steps), loader, strict=False):
                input_dict = {k: v.to(device) for k, v in input_dict.items()}
                pairs = input_dict.pop("pair", None)  # reference_logps=precomputed: each sample's pair index
                inputs, labels, extra = self.post_dataloading_process(input_dict, labels.to(device), model_parts)
                with torch.no_grad():
                    ref = None
                    if loss_fn.module.REFERENCE:
                        assert self.reference is not None, "the trainer sets it"
                        ref = self.reference(inputs, labels, extra, pairs, VALIDATION)
                    with self.validation_context():
                        sums, counts = row_logps(model(inputs, **extra), labels)
                    lp = PairLogps(sums[0::2], sums[1::2], counts[0::2], counts[1::2])
                    if ref is not None:
                        lp.ref_chosen, lp.ref_rejected = ref[0::2], ref[1::2]
                    per_pair, metrics = loss_fn.module.loss(loss_fn.section, lp)
                totals += torch.stack(
                    [
                        per_pair.sum(),
                        metrics["reward_accuracy"].sum(),
                        torch.tensor(float(len(per_pair)), device=device),
                    ]
                )
        finally:
            model.train()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(totals)
        loss, accuracy, pairs = (float(x) for x in totals)
        self.metrics_processor.log_validation(
            loss=loss / max(pairs, 1.0), step=step, extra_metrics={VAL_REWARD_ACCURACY: accuracy / max(pairs, 1.0)}
        )
        if self.sampler is not None:
            self.answer_samples(self.sampler, model_parts, step)
