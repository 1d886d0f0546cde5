"""Every run keeps score: what the plan predicted for it next to what it measured, so the estimate
is checked on every run, not once.

- Memory. Each rank records its own peak (`RankPeak`, called by `qwen3exp.titan.metrics` at every
  logged step): torchtitan's `memory/max_reserved(GiB)`, the figure metrics.jsonl's `memory_gib`
  shows for the metrics rank alone (on the CPU the process's peak resident set, VmHWM:
  `qwen3exp.platforms.cpu_device`). A rank rewrites `logs/memory_rank<R>.json` (atomically) only
  when its peak grows, so a run that fails keeps the peak it reached. The launcher reads this
  launch's files back (`measured_peak`) and summary.json gets `memory_predicted_gib` (the plan's
  per-rank peak as the platform measures it, plan.json `memory.peak`: the model's step peak plus
  what the measure counts beside it, `qwen3exp.plan.memory`), `memory_measured_gib` (the largest over the logged
  steps and the ranks), `memory_measured_rank` (the rank that held it) and `memory_ratio`
  (measured / predicted), from `memory_score`.
- A measured peak above `TOLERANCE` times the prediction means the plan under-estimates: its fit
  check is that much too optimistic, so the run ends with one warning line (`warning`) naming the
  keys that leave room (the platform's memory per rank) or use less memory.
- Step time. The plan predicts its layout's step with the cost model `parallelism=auto` ranks by
  (plan.json `step`, `qwen3exp.plan.layout_cost.run_step`); summary.json gets
  `step_time_predicted_s`, `step_time_measured_s` (the median `step_seconds` of the logged steps
  after the first, which also pays for allocation and compilation) and `step_time_ratio`, from
  `step_score`. No warning: the model ranks layouts and leaves out what it states it leaves out
  (latencies, the optimizer step, kernel efficiency), so the ratio is this host's distance from the
  platform's stated rates, shown for the user to judge.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import TypeGuard

from qwen3exp.platforms import BY_NAME
from qwen3exp.run import rundir
from qwen3exp.units import GIB

RANK_PEAK = "memory_rank{rank}.json"
"""Under logs/: one rank's peak memory so far, `{"rank", "peak_gib", "step"}`."""
TOLERANCE = 1.15
"""Measured / predicted above this: the plan under-estimates, and the run says so."""
CLOCK_SLACK_S = 2.0
"""A rank's file counts for this launch when written at most this long before the launch began
(file systems that keep coarse modification times, a node's clock a little behind)."""
LESS_MEMORY = "training.activation_checkpoint=full or a smaller training.local_batch_size"


class RankPeak:
    """One rank's peak memory over the logged steps of this launch, kept in `logs/memory_rank<R>.json`."""

    def __init__(self, logs: Path, rank: int) -> None:
        self.path = Path(logs) / RANK_PEAK.format(rank=rank)
        self.rank = rank
        self.peak: float | None = None

    def record(self, step: int, gib: float | None) -> None:
        """The peak of the steps since the last logged step (GiB); written when it is a new high."""
        if not isinstance(gib, (int, float)) or not math.isfinite(gib) or gib <= 0:
            return
        if self.peak is not None and gib <= self.peak:
            return
        self.peak = float(gib)
        try:
            rundir.atomic_write_json(self.path, {"rank": self.rank, "peak_gib": self.peak, "step": step})
        except OSError:  # a full disk: the run goes on; its summary then has no measured peak
            pass


def measured_peak(logs: Path, *, since: float) -> tuple[float, int] | None:
    """(GiB, rank) of the highest peak the ranks of this launch recorded (files written since
    `since`, a time.time(); earlier attempts' files are left out); None when none recorded one."""
    best: tuple[float, int] | None = None
    for path in sorted(Path(logs).glob(RANK_PEAK.format(rank="*"))):
        try:
            if path.stat().st_mtime < since - CLOCK_SLACK_S:
                continue
        except OSError:
            continue
        record = rundir.read_json(path)
        if not isinstance(record, dict):
            continue
        gib, rank = record.get("peak_gib"), record.get("rank")
        if isinstance(gib, (int, float)) and math.isfinite(gib) and isinstance(rank, int):
            if best is None or gib > best[0]:
                best = (float(gib), rank)
    return best


def memory_score(predicted_bytes: int | None, logs: Path, *, wall: float) -> dict:
    """summary.json's memory keys: the plan's per-rank peak (`Memory.peak`), the peak this launch measured (the
    launch began `wall` seconds ago) and their ratio (None where either is missing)."""
    predicted = predicted_bytes / GIB if predicted_bytes else None
    measured = measured_peak(logs, since=time.time() - wall)
    gib, rank = measured if measured is not None else (None, None)
    return {
        "memory_predicted_gib": predicted,
        "memory_measured_gib": gib,
        "memory_measured_rank": rank,
        "memory_ratio": gib / predicted if gib is not None and predicted else None,
    }


def step_score(predicted_s: float | None, rows: list[dict]) -> dict:
    """summary.json's step-time keys from the plan's predicted step and metrics.jsonl's training rows."""
    times = [r["step_seconds"] for r in rows[1:] if _number(r.get("step_seconds")) and r["step_seconds"] > 0]
    measured = statistics.median(times) if times else None
    return {
        "step_time_predicted_s": predicted_s,
        "step_time_measured_s": measured,
        "step_time_ratio": measured / predicted_s if measured is not None and predicted_s else None,
    }


def _number(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def outcome_part(summary: dict) -> str:
    """The score part of the outcome line:
    `  peak memory 0.97 GiB per rank (plan 0.92 GiB, 1.05x)  step 0.254s (plan 0.387s, 0.66x)`."""
    measured, predicted, ratio = (
        summary.get(k) for k in ("memory_measured_gib", "memory_predicted_gib", "memory_ratio")
    )
    if not _number(measured):
        return ""
    plan = f" (plan {predicted:.2f} GiB, {ratio:.2f}x)" if _number(predicted) and _number(ratio) else ""
    step, plan_step, step_ratio = (
        summary.get(k) for k in ("step_time_measured_s", "step_time_predicted_s", "step_time_ratio")
    )
    known = _number(step) and _number(plan_step) and _number(step_ratio)
    steps = f"  step {step:.3g}s (plan {plan_step:.3g}s, {step_ratio:.2f}x)" if known else ""
    return f"  peak memory {measured:.2f} GiB per rank{plan}{steps}"


def under_estimated(summary: dict) -> bool:
    ratio = summary.get("memory_ratio")
    return _number(ratio) and ratio > TOLERANCE


def budget_key(platform: object) -> str | None:
    """The platform section's key for its memory per rank (`platform.memory_per_rank_gib`, ...),
    found on the platform module's section (`qwen3exp.platforms.BY_NAME`); None: unknown."""
    module = BY_NAME.get(platform) if isinstance(platform, str) else None
    if module is None:
        return None
    found = [k for k in module.SECTION.model_fields if "_per_" in k and k.endswith("_gib")]
    return f"platform.{found[0]}" if len(found) == 1 else None


def warning(summary: dict) -> str | None:
    """One line when the measured peak exceeds the prediction by more than TOLERANCE, else None."""
    if not under_estimated(summary):
        return None
    measured, predicted, ratio = (summary[k] for k in ("memory_measured_gib", "memory_predicted_gib", "memory_ratio"))
    key = budget_key(summary.get("platform")) or "the platform's memory per rank"
    rank = summary.get("memory_measured_rank")
    return (
        f"qwen3exp: warning: the plan under-estimates this run's memory: rank {rank} measured {measured:.2f} GiB, "
        f"the plan predicted {predicted:.2f} GiB per rank ({ratio:.2f}x, more than {TOLERANCE}x), so its fit check is "
        f"that optimistic; to keep room, lower {key} by that factor, or use less memory with {LESS_MEMORY}"
    )
