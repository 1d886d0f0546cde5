"""torchtitan's validator, validating at the last step too.

torchtitan 0.3.0's `Validator.should_validate` runs at step 1 and every `freq` steps; a run of 25
steps with freq 10 would end with its last validation at step 20, and a sweep's `val_loss`
objective would then rank runs by a loss measured before they finished. This subclass adds the
last step (`last_step`, the run's training.steps); everything else is torchtitan's own (the
validation dataloader is rebuilt for every validation, so each one reads the same batches, also
after a resume).
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.components.validate import Validator


class FinalStepValidator(Validator):
    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):
        last_step: int = -1
        """The run's last step (training.steps), validated whatever `freq` is; -1: none."""

    def should_validate(self, step: int) -> bool:
        return step == self.config.last_step or super().should_validate(step)
