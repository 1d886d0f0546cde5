"""torchtitan's validator, validating at the last step too, and answering eval.samples.

torchtitan 0.3.0's `Validator.should_validate` runs at step 1 and every `freq` steps; a run of 25
steps with freq 10 would end with its last validation at step 20, and a sweep's `val_loss`
objective would then rank runs by a loss measured before they finished. This subclass adds the
last step (`last_step`, the run's training.steps); everything else is torchtitan's own (the
validation dataloader is rebuilt for every validation, so each one reads the same batches, also
after a resume).

After the validation loss, every rank answers the eval.samples prompts together
(`qwen3exp.titan.samples`: all ranks must take part in a sharded model's forward passes); the
metrics processor writes them on the metrics rank: samples.jsonl, TensorBoard, W&B
(`qwen3exp.titan.metrics`). The model is back in training mode before the next step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torchtitan.components.validate import Validator
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from qwen3exp.titan import samples


def sample_settings(eval_, tokenizer_path: str, vocab_size: int) -> dict:
    """The validator's sample fields of an `eval` section (`qwen3exp.titan.job_config`)."""
    return dict(
        samples=list(eval_.samples),
        sample_tokens=eval_.sample_tokens,
        sample_temperature=eval_.sample_temperature,
        sample_seed=eval_.sample_seed,
        tokenizer_path=tokenizer_path,
        vocab_size=vocab_size,
    )


class FinalStepValidator(Validator):
    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):
        last_step: int = -1
        """The run's last step (training.steps), validated whatever `freq` is; -1: none."""
        samples: list[str] = field(default_factory=list)
        """eval.samples: the prompts answered after each validation ([]: none)."""
        sample_tokens: int = 32
        """eval.sample_tokens: new tokens per answer at most."""
        sample_temperature: float = 0.0
        """eval.sample_temperature: 0 greedy, else sampled."""
        sample_seed: int = 0
        """eval.sample_seed: prompt i's sampling generator is seeded with sample_seed + i at every validation."""
        tokenizer_path: str = ""
        """The folder of the transformers tokenizer that renders the prompts (the run's hf_assets_path)."""
        vocab_size: int = 0
        """The model's vocabulary: the logits a new token is picked from (gathered over tp)."""

    def __init__(self, config: Config, **kwargs):
        super().__init__(config, **kwargs)
        self.sampler: samples.Sampler | None = None
        if config.samples:
            self.sampler = samples.Sampler(
                config.samples,
                tokenizer_path=config.tokenizer_path,
                seq_len=self.seq_len,
                max_new=config.sample_tokens,
                temperature=config.sample_temperature,
                seed=config.sample_seed,
            )

    def should_validate(self, step: int) -> bool:
        return step == self.config.last_step or super().should_validate(step)

    def validate(self, model_parts, step: int) -> None:
        super().validate(model_parts, step)
        if self.sampler is not None:
            self.answer_samples(self.sampler, model_parts, step)

    def answer_samples(self, sampler: samples.Sampler, model_parts, step: int) -> None:
        (model,) = model_parts  # pipeline stages are refused with samples before launch
        started = time.perf_counter()
        model.eval()
        try:
            with torch.no_grad():
                answers = sampler.answer(
                    lambda rows, last: samples.last_logits(self, model, rows, last, self.config.vocab_size),
                    utils.device_type,
                )
        finally:
            model.train()
        records = sampler.records(step, answers)
        logger.info(
            f"Samples at step {step}: {sum(len(a) for a in answers)} new tokens for {len(answers)} prompt(s) "
            f"in {time.perf_counter() - started:.2f}s"
        )
        self.metrics_processor.log_samples(records, step)
