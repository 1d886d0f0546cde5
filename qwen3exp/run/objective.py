"""A run's objective: the one number a sweep optimizes and ranks runs by (`sweep.objective`).

Computed once, when the run's summary is written (`record`), and stored in summary.json as
`objective: {metric, direction, value}` (a score of eval=lm_eval, `eval.<task>.<metric>`, once the
evaluation after training has given it: `qwen3exp.launchers.lm_eval_run`); the Hydra launcher
returns `value` to the sweeper, and the end-of-sweep table and the report rank by it. `value` is
None when the run measured nothing to give (it failed before its first validation or step, or its
evaluation reported no such score): a sweeper is then told the trial failed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from qwen3exp.config.sections.sweep import EVAL_PREFIX, SOURCE_OBJECTIVE
from qwen3exp.run import eval_scores


def mean_tokens_per_second(rows: list[dict]) -> float | None:
    """Mean throughput over the logged steps, the first left out (it pays for warm-up: allocation,
    compilation) unless it is the only one."""
    values = [r["tokens_per_second"] for r in (rows[1:] or rows) if r.get("tokens_per_second") is not None]
    return sum(values) / len(values) if values else None


def value_of(
    metric: str,
    *,
    last_loss: float | None,
    val_loss: float | None,
    tokens_per_second: float | None,
    scores: Mapping[str, float] | None = None,
    validation: Mapping[str, float | None] | None = None,
) -> float | None:
    """`scores`: the run's lm-eval scores (`qwen3exp.run.eval_scores`), for an `eval.` metric;
    `validation`: the last validation's other numbers (`metrics_file.validation_extras`): a preference
    objective's val_reward_accuracy (on the held-out pairs), a data mixture's val_loss_<source>."""
    if metric.startswith(EVAL_PREFIX):
        value = eval_scores.of(metric, scores)
    elif metric == "val_reward_accuracy" or SOURCE_OBJECTIVE.fullmatch(metric):
        value = (validation or {}).get(metric)
    else:
        value = {"val_loss": val_loss, "last_loss": last_loss, "tokens_per_second": tokens_per_second}[metric]
    return value if value is not None and math.isfinite(value) else None


def record(metric: str, direction: str, value: float | None) -> dict:
    return {"metric": metric, "direction": direction, "value": value}


def of_summary(summary: dict | None) -> float | None:
    """The objective value a completed run's summary records (None: not completed, or nothing)."""
    if not isinstance(summary, dict) or summary.get("status") != "completed":
        return None
    obj = summary.get("objective")
    value = obj.get("value") if isinstance(obj, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def better(direction: str):
    """A sort key: the best run first, runs without a value last."""
    sign = 1.0 if direction == "minimize" else -1.0
    return lambda value: (value is None, sign * value if value is not None else 0.0)
