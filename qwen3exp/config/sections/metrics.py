"""The `metrics` section: how often and where a run logs (TensorBoard, Weights & Biases)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from qwen3exp.config.sections.base import PosInt, Strict


class Metrics(Strict):
    log_freq: PosInt = 1
    """Log (metrics.jsonl, the progress line, the trackers) every n steps."""
    tensorboard: bool = True
    """TensorBoard event files under the run directory's tb/."""
    wandb: bool = False
    """Weights & Biases (opt-in): needs `wandb` installed and a login, or WANDB_MODE=offline."""
    wandb_project: Annotated[str, Field(min_length=1)] = "qwen3exp"
    """W&B project (the WANDB_PROJECT environment variable wins when set)."""
