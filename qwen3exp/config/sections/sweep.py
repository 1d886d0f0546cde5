"""The `sweep` section: what each job returns to Hydra's sweeper, and how many local jobs run at once."""

from __future__ import annotations

from typing import Literal

from qwen3exp.config.sections.base import PosInt, Strict

OBJECTIVES: dict[str, str] = {
    "val_loss": "minimize",
    "last_loss": "minimize",
    "tokens_per_second": "maximize",
}
"""What a job can return to a sweeper (from its summary.json), with the direction that is better."""


class Sweep(Strict):
    objective: Literal["val_loss", "last_loss", "tokens_per_second"] | None = None
    """What each job returns to Hydra's sweeper (Optuna optimizes it; the end table ranks by it):
    val_loss (the last validation loss) and last_loss are minimized, tokens_per_second maximized.
    None: val_loss when validation is on, else last_loss."""
    parallel_jobs: PosInt = 1
    """Local jobs of one batch run at once (above 1: through hydra-joblib-launcher, after every job
    of the batch was checked); each job starts its own launcher.nproc_per_node ranks."""
