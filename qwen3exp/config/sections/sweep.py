"""The `sweep` section: what each job returns to Hydra's sweeper, and how many local jobs run at once.

The objective is a number of the job's summary.json: a loss, the throughput, or a score of
`eval=lm_eval` (`eval.<task>.<metric>`, the key lm-eval reports it under, with `,<filter>` when
the metric went through a filter other than `none`). Which tasks a run evaluates is known only
with its `eval` section, so the task of an `eval.` objective is checked by the plan
(`qwen3exp.plan.eval_tasks`); the shape of the name and its direction are checked here.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import model_validator

from qwen3exp.config.sections.base import PosInt, Strict, tagged

Direction = Literal["minimize", "maximize"]
OBJECTIVES: dict[str, Direction] = {
    "val_loss": "minimize",
    "last_loss": "minimize",
    "tokens_per_second": "maximize",
    "val_reward_accuracy": "maximize",
}
"""What a job can return to a sweeper (from its summary.json), with the direction that is better."""
SOURCE_OBJECTIVE = re.compile(r"val_loss_(?P<source>[a-z][a-z0-9_]{0,31})")
"""`val_loss_<source>`: one source's held-out loss of a data mixture (minimized); the source is checked
against data.sources by `qwen3exp.config.rules.source_objective_problems`."""
EVAL_PREFIX = "eval."
EVAL_OBJECTIVE = re.compile(r"eval\.(?P<task>[^,\s]+)\.(?P<metric>[A-Za-z0-9_]+)(?:,(?P<filter>[^\s.]+))?")
"""`eval.<task>.<metric>[,<filter>]`: a score of summary.json's `eval` (task names may hold dots)."""
EVAL_DIRECTIONS: dict[str, Direction] = {
    **dict.fromkeys(
        ("acc", "acc_norm", "acc_bytes", "acc_mutual_info", "exact_match", "f1", "mcc", "bleu", "chrf", "rouge1"),
        "maximize",
    ),
    **dict.fromkeys(
        ("perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "brier_score", "ter"), "minimize"
    ),
}
"""lm-eval's metrics whose better direction qwen3exp knows (lm-eval's `higher_is_better`); another
metric needs `sweep.direction`."""
_ALLOWED = (
    ", ".join(OBJECTIVES)
    + ", val_loss_<source> (data=mix), or eval.<task>.<metric> (a score of eval=lm_eval, e.g. eval.qwen3exp_tiny.acc)"
)


class Sweep(Strict):
    objective: str | None = None
    """What each job returns to Hydra's sweeper (Optuna optimizes it; the end table ranks by it):
    val_loss (the last validation loss) and last_loss are minimized, tokens_per_second and
    val_reward_accuracy (a preference objective's, on the held-out pairs) maximized; val_loss_<source>
    (data=mix: one source's held-out loss; val_loss is then the token-weighted mean) minimized;
    eval.<task>.<metric> (a score of eval=lm_eval, e.g. eval.qwen3exp_tiny.acc) in the metric's
    direction (sweep.direction). None: val_loss when validation is on, else last_loss."""
    direction: Direction | None = None
    """The better direction of an eval.<task>.<metric> objective: null for lm-eval's usual metrics
    (acc, acc_norm, exact_match, f1, ...: maximize; perplexity, bits_per_byte, brier_score, ...:
    minimize); required for another metric. A loss or the throughput has its own."""
    parallel_jobs: PosInt = 1
    """Local jobs of one batch run at once (above 1: through hydra-joblib-launcher, after every job
    of the batch was checked); each job starts its own launcher.nproc_per_node ranks. Checked
    together against this host (its cores and the memory available now; one at a time on an
    accelerator): fewer that fit run at once, and the plan says why (launcher=slurm: not this host's)."""
    strict_parallel_jobs: bool = False
    """true: a batch whose sweep.parallel_jobs jobs do not fit this host together is refused (exit 2)
    instead of run with fewer at once."""

    @model_validator(mode="after")
    def _known_objective(self) -> Sweep:
        metric = self.objective
        if metric is None or metric in OBJECTIVES:
            fixed = OBJECTIVES[metric or "val_loss"]
            if self.direction is not None and self.direction != fixed:
                why = f"{metric or 'the default objective (a loss)'} is {fixed}d"
                raise ValueError(tagged("direction", self.direction, why, f"null or {fixed}"))
            return self
        if SOURCE_OBJECTIVE.fullmatch(metric):
            if self.direction not in (None, "minimize"):
                raise ValueError(tagged("direction", self.direction, f"{metric} is minimized", "null or minimize"))
            return self
        m = EVAL_OBJECTIVE.fullmatch(metric)
        if m is None:
            raise ValueError(tagged("objective", metric, "is not an objective a job records", _ALLOWED))
        if self.direction is None and m["metric"] not in EVAL_DIRECTIONS:
            raise ValueError(
                tagged(
                    "direction",
                    None,
                    f"qwen3exp does not know whether a higher or a lower {m['metric']} is better",
                    "maximize or minimize",
                    f"the task's metric_list says (higher_is_better); set sweep.direction for {metric}",
                )
            )
        return self

    def direction_of(self, metric: str) -> Direction:
        """The better direction of `metric` (this section's objective, or the default one)."""
        if metric in OBJECTIVES:
            return OBJECTIVES[metric]
        if SOURCE_OBJECTIVE.fullmatch(metric):
            return "minimize"
        m = EVAL_OBJECTIVE.fullmatch(metric)
        return self.direction or EVAL_DIRECTIONS[m["metric"] if m else metric]
