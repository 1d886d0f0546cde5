"""The scores of an lm-evaluation-harness evaluation as qwen3exp records them: one flat mapping
`{"<task>.<metric>": value}`, the same names everywhere (summary.json's `eval`, the report's
`eval.<task>.<metric>` columns, TensorBoard's and W&B's `eval/<task>.<metric>`,
`sweep.objective=eval.<task>.<metric>`).

lm-eval reports `results[task]["<metric>,<filter>"]`: a metric through the `none` filter (every
loglikelihood task's) is `<task>.<metric>`, through another filter `<task>.<metric>,<filter>`
(lm-eval's own spelling, e.g. `gsm8k.exact_match,strict-match`). Standard errors, aliases, sample
counts and values that are not finite numbers ("N/A") are left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from qwen3exp.config.sections.sweep import EVAL_PREFIX

TRACKER_TAG = "eval"
"""The TensorBoard / W&B name of a score: `eval/<task>.<metric>`."""


def flat(results: Mapping) -> dict[str, float]:
    """lm-eval's `results` (simple_evaluate(...)["results"]) as `{"<task>.<metric>": value}`."""
    out: dict[str, float] = {}
    for task, metrics in results.items():
        for key, value in metrics.items() if isinstance(metrics, Mapping) else ():
            metric, sep, filt = str(key).partition(",")
            if not sep or metric.endswith("_stderr") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                out[f"{task}.{metric}" + ("" if filt == "none" else f",{filt}")] = float(value)
    return out


def of(metric: str, scores: Mapping | None) -> float | None:
    """The score an objective `eval.<task>.<metric>` names, None when it was not recorded."""
    value = (scores or {}).get(metric[len(EVAL_PREFIX) :]) if metric.startswith(EVAL_PREFIX) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
