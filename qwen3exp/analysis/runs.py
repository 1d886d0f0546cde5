"""A recorded run, read back as data for `report` (and the end of a sweep): its resolved
experiment, summary and metrics rows.

Every file is read through `qwen3exp.run.records` (a regular file within size and depth limits,
plain YAML/JSON, nothing resolved), so a run directory handed over by someone else can neither
hang the reader (a FIFO, a 50 MB file, an anchor bomb) nor crash it. What cannot be read is kept
in `Run.problems` (the file and why: `report` names it and lists the run as `unreadable`, e.g. a
summary.json cut in half by a kill, written by a tool that did not write it atomically); a
metrics.jsonl line that is no metrics row is left out and named in `Run.skipped`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qwen3exp.run import metrics_file, objective, records, rundir


@dataclass
class Run:
    path: Path
    experiment: dict
    """The resolved experiment (plain, nested)."""
    summary: dict | None
    metrics: list[dict] = field(default_factory=list)
    validation: list[dict] = field(default_factory=list)
    """The validation rows of metrics.jsonl (step, val_loss, val_perplexity)."""
    problems: list[str] = field(default_factory=list)
    """`FILE: why` for each recorded file that exists but is not readable as data."""
    skipped: list[str] = field(default_factory=list)
    """`line N: why` for each metrics.jsonl line that is no metrics row (left out)."""

    @property
    def readable(self) -> bool:
        """Whether every recorded file that exists could be read as data (`problems` is empty)."""
        return not self.problems

    @property
    def status(self) -> str:
        if not self.readable:
            return "unreadable"
        if self.summary:
            return str(self.summary.get("status"))
        return "incomplete" if rundir.looks_like_run(self.path) else "not run"

    @property
    def steps(self) -> int | None:
        if self.summary and self.summary.get("steps_completed") is not None:
            return self.summary["steps_completed"]
        return self.metrics[-1]["step"] if self.metrics else None

    @property
    def final_loss(self) -> float | None:
        if self.metrics:
            return self.metrics[-1].get("loss")
        return self.summary.get("last_loss") if self.summary else None

    @property
    def val_loss(self) -> float | None:
        if self.validation:
            return self.validation[-1].get("val_loss")
        return self.summary.get("val_loss") if self.summary else None

    @property
    def tokens_per_second(self) -> float | None:
        """Mean over the logged steps after the first (the first pays for warm-up)."""
        return objective.mean_tokens_per_second(self.metrics)

    @property
    def objective(self) -> tuple[str, str] | None:
        """(metric, direction) the run recorded (`sweep.objective`), if any."""
        obj = self.summary.get("objective") if self.summary else None
        if isinstance(obj, dict) and obj.get("metric") and obj.get("direction") in ("minimize", "maximize"):
            return str(obj["metric"]), str(obj["direction"])
        return None

    @property
    def objective_value(self) -> float | None:
        return objective.of_summary(self.summary)

    @property
    def peak_memory_gib(self) -> float | None:
        """The peak the ranks measured: summary.json's `memory_measured_gib` (every rank's,
        `qwen3exp.run.scorecard`); for a run recorded before runs kept score, the largest
        `memory_gib` of metrics.jsonl (the metrics rank's)."""
        measured = self._summary_number("memory_measured_gib")
        if measured is not None:
            return measured
        values = [m["memory_gib"] for m in self.metrics if m.get("memory_gib") is not None]
        return max(values) if values else None

    @property
    def predicted_memory_gib(self) -> float | None:
        """The plan's per-rank memory estimate (summary.json's `memory_predicted_gib`)."""
        return self._summary_number("memory_predicted_gib")

    @property
    def memory_ratio(self) -> float | None:
        """Measured / predicted peak memory (summary.json's `memory_ratio`)."""
        return self._summary_number("memory_ratio")

    @property
    def step_ratio(self) -> float | None:
        """Measured median / predicted step time (summary.json's `step_time_ratio`)."""
        return self._summary_number("step_time_ratio")

    def _summary_number(self, key: str) -> float | None:
        value = self.summary.get(key) if self.summary else None
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def scores(self) -> dict[str, float]:
        """The lm-eval scores the run recorded (summary.json's `eval`: `{"<task>.<metric>": value}`)."""
        found = self.summary.get("eval") if self.summary else None
        return {
            str(k): float(v)
            for k, v in (found.items() if isinstance(found, dict) else ())
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }

    @property
    def wall_seconds(self) -> float | None:
        return self.summary.get("wall_seconds") if self.summary else None


def load_run(path: Path, *, experiment: dict | None = None) -> Run:
    """The run at `path` (`experiment`: its resolved experiment when the caller has it already)."""
    path = Path(path)
    problems: list[str] = []
    if experiment is None:
        try:
            experiment = rundir.load_experiment(path)
        except records.Unreadable as e:
            problems.append(str(e))
    summary = None
    try:
        summary = records.load_json(path / rundir.SUMMARY)
    except records.Unreadable as e:
        problems.append(str(e))
    if summary is not None and not isinstance(summary, dict):
        problems.append(f"{path / rundir.SUMMARY}: a JSON {type(summary).__name__}, not the object of a summary")
        summary = None
    rows: list[dict] = []
    skipped: list[str] = []
    try:
        rows, skipped = metrics_file.scan_metrics(path)
    except records.Unreadable as e:
        problems.append(str(e))
    return Run(
        path,
        experiment or {},
        summary,
        [r for r in rows if "loss" in r],
        [r for r in rows if "val_loss" in r],
        problems,
        skipped,
    )


def compared(experiment: dict) -> dict[str, object]:
    """The dotted keys and values of a resolved experiment that runs are compared by: every key
    but the presentation keys (verbose, dry_run: `rundir.IDENTITY_IGNORES`, also left out of the
    experiment hash), which change how a run is shown, not what it computes."""
    return rundir.flatten(rundir.identity_view(experiment))


def varied_keys(runs: list[Run]) -> list[str]:
    """Dotted keys whose resolved values are not the same in every run (keys missing in some runs
    count as differing); presentation keys never count (`compared`)."""
    flat = [compared(r.experiment) for r in runs]
    keys = sorted({k for f in flat for k in f})
    return [k for k in keys if len({repr(f.get(k, "\0absent")) for f in flat}) > 1]
