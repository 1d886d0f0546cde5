"""How a launch ends (`qwen3exp.launchers.local.launch`): the status of the torchrun run, the
`summary.json`, and the last line the person watching sees.

- The Hugging Face exports are completed and verified by `qwen3exp.launchers.exports`.
- The root cause of a failure is the ranks' own (`qwen3exp.run.diagnosis.root_cause`); when the run
  directory's disk is full, the error says so first.
- `summary.json` is written atomically, also on a disk the ranks filled: the launcher holds room
  for it while they run (`SummaryReserve`) and gives it back once they are gone.
- `summary.json` keeps score: the plan's per-rank memory next to the peak the ranks measured and
  their ratio (`qwen3exp.run.scorecard`); a run whose peak exceeds the plan by more than 15% says
  so in one line. A run that was not stopped ends by naming the next command (and, when it kept no
  weights, saying so): `qwen3exp.launchers.next_steps`.
- A run stopped by Ctrl-C or SIGTERM ends with one line: the last completed step and its loss,
  what is saved, and the command that resumes (`stopped_line`); torchrun's shutdown output is
  not shown (`qwen3exp.run.progress.Watch`).
"""

from __future__ import annotations

import errno
import os
import shlex
import signal
import sys
from pathlib import Path

from qwen3exp.config.argv import quote_value
from qwen3exp.config.schema import Experiment
from qwen3exp.launchers import next_steps, sweep
from qwen3exp.plan.build import Plan
from qwen3exp.plan.nodes import Placement
from qwen3exp.plan.placement import nodes_of
from qwen3exp.run import (
    console,
    diagnosis,
    identity,
    metrics_file,
    objective,
    provenance,
    redact,
    rundir,
    scorecard,
    timelimit,
)
from qwen3exp.titan import data_tokens, weights_record
from qwen3exp.titan.overrides import merge_applied

EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}
SUMMARY_RESERVE = "summary.reserve"
"""Under logs/, while a launch runs: room held for summary.json (node files: summary_node<R>.reserve)."""
FULL_BELOW = 1 << 20
"""Less room than this left on the run directory's disk: a failed run is blamed on the full disk."""


def experiment_hash(exp: Experiment) -> str:
    return identity.of(exp)


def node_file(name: str, where: Placement) -> str:
    """summary.json / command.txt of node 0; `summary_node<R>.json` ... of the other nodes."""
    if where.node_rank == 0:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}_node{where.node_rank}{dot}{ext}"


def first_rank_error(run_dir: Path, *, since: float = 0.0, rdzv_timeout_s: float | None = None) -> str | None:
    """The root cause of a failed run, from the ranks' error files and the agents' records of how
    ranks died (`qwen3exp.run.diagnosis.root_cause`): a rank killed by a signal, or gone without an error
    report, comes before the communication errors it caused in the other ranks."""
    return diagnosis.root_cause(run_dir / rundir.LOGS, since=since, rdzv_timeout_s=rdzv_timeout_s)


def status(
    plan: Plan, run_dir: Path, code: int | None, signum: int | None, *, ranks_started: bool, since: float
) -> tuple[str, int, str | None]:
    """(status, exit code, error) of the torchrun run that just ended (`code`; None when a signal
    abandoned the launch before torchrun ran); `since`: when this launch started (time.time())."""
    exp, logs = plan.exp, run_dir / rundir.LOGS
    if signum is not None:
        return (
            "interrupted",
            EXIT_SIGNAL[signal.Signals(signum)],
            f"stopped by {signal.Signals(signum).name}" + ("" if ranks_started else " before the ranks started"),
        )
    if code == 0 and (limit := timelimit.saved(logs)) is not None:
        return nodes_of(exp.launcher).time_limit_outcome(exp, limit, os.environ)
    if code == 0:
        return "completed", 0, None
    assert code is not None  # None only when a signal abandoned the launch (signum is set)
    rdzv = exp.launcher.rdzv_timeout_s
    error = first_rank_error(run_dir, since=since - rdzv, rdzv_timeout_s=rdzv) or (
        f"torchrun was killed by {signal.Signals(-code).name}" if code < 0 else f"torchrun exited with code {code}"
    )
    if (full := full_disk(run_dir, error)) is not None:
        # The ranks' and agents' records are written to that disk too: without a word of "no space"
        # in them they are incomplete (an agent whose end was not recorded looks killed).
        error = f"{full}; " + (
            error
            if "No space left on device" in error
            else "the ranks could not record why they stopped (their output is in logs/)"
        )
    return "failed", code, error


def full_disk(run_dir: Path, error: str) -> str | None:
    """A sentence naming the full disk when that is why the run failed (ENOSPC in the ranks' error,
    or next to no room left, e.g. a rank that could not even write its error report), else None."""
    try:
        st = os.statvfs(run_dir)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    if "No space left on device" not in error and (free is None or free >= FULL_BELOW):
        return None
    room = f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"
    return f"the disk that holds {run_dir} is full ({room})"


def loaded_weights(exp: Experiment, hf_weights: Path | None) -> Path | None:
    """What step 0 loaded: the Hugging Face folder (checkpoint.load=hf), the dcp step (load=dcp)."""
    c = exp.checkpoint
    return hf_weights if c.load == "hf" else Path(str(c.path)).expanduser() if c.load == "dcp" else None


class SummaryReserve:
    """Disk space held for the summary while the ranks run: a disk they fill (checkpoints, logs,
    another program) still gets its summary.json, written after this space is given back. Made
    with real blocks (posix_fallocate, not a sparse file); removed at the end of every launch."""

    SIZE = 1 << 20  # a summary is a few KiB; its atomic write needs a second copy for a moment

    def __init__(self, path: Path) -> None:
        self.path = path

    def make(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, self.SIZE)
        except OSError:  # no room even now: the summary then says the disk is full
            self.release()

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


def summarize(
    plan: Plan,
    run_dir: Path,
    *,
    exit_code: int,
    status: str,
    wall: float,
    error: str | None,
    resumed_from: int | None = None,
    export: dict | None = None,
    extra: dict | None = None,
) -> dict:
    rows = metrics_file.read_metrics(run_dir)
    val = metrics_file.read_validation(run_dir)
    step1 = next((r["loss"] for r in rows if r["step"] == 1), None)
    weights = loaded_weights(plan.exp, plan.files.weights)
    last_loss = rows[-1]["loss"] if rows else None
    val_loss, acc = (val[-1]["val_loss"], val[-1].get("val_reward_accuracy")) if val else (None, None)
    tps = objective.mean_tokens_per_second(rows)
    metric, direction = plan.exp.sweep_target
    value = objective.value_of(
        metric, last_loss=last_loss, val_loss=val_loss, tokens_per_second=tps, reward_accuracy=acc
    )
    summary = {
        "status": status,
        "exit_code": exit_code,
        "world_size": plan.mesh.world_size,
        "steps_completed": rows[-1]["step"] if rows else 0,
        "first_loss": rows[0]["loss"] if rows else None,
        "last_loss": last_loss,
        "val_loss": val_loss,
        "val_perplexity": val[-1]["val_perplexity"] if val else None,
        "first_val_loss": val[0]["val_loss"] if val else None,
        "val_step": val[-1]["step"] if val else None,
        **({"val_reward_accuracy": acc} if acc is not None else {}),  # a preference objective's held-out pairs
        "tokens_per_second": tps,
        # The plan's per-rank memory and step time next to what the run measured (qwen3exp.run.scorecard).
        **scorecard.memory_score(plan.memory.peak, run_dir / rundir.LOGS, wall=wall),
        **scorecard.step_score(plan.step.step_s if plan.step is not None else None, rows),
        "objective": objective.record(metric, direction, value),
        "wall_seconds": round(wall, 3),
        "error": error,
        "platform": plan.platform.name,
        "name": plan.exp.name,
        # The 6.54-vs-12.43 check in one look: step-1 loss and where the step-0 weights came from.
        "step1_loss": step1,
        **weights_record.summary_fields(run_dir),  # what the ranks report they loaded at step 0
        "weights_source": str(weights) if weights is not None else None,
        "checkpoint": plan.exp.checkpoint.summary,
        "resumed_from_step": resumed_from,
        "export": export,
        "experiment_hash": experiment_hash(plan.exp),
        "overrides": merge_applied(plan.kernel_claims, run_dir),
        "nnodes": plan.placement.nnodes,
        "node_rank": plan.placement.node_rank,
        "data": plan.data,  # the plan's figures: documents, tokens, epochs, separator; chat: dropped, truncated
    }
    summary.update({**data_tokens.summary_fields(run_dir), **(extra or {})})  # data=mix: tokens per source
    write_summary(run_dir / node_file(rundir.SUMMARY, plan.placement), summary)
    return summary


def write_summary(path: Path, summary: dict) -> None:
    """summary.json, atomically; on a disk too full even for that (after the launcher gave back its
    `SummaryReserve`), a minimal summary (status, exit code, error), else one line on stderr (no
    traceback: the launch's outcome line follows)."""
    minimal = {
        k: summary.get(k)
        for k in ("status", "exit_code", "steps_completed", "last_loss", "wall_seconds", "error", "experiment_hash")
    }
    try:
        rundir.atomic_write_json(path, summary)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        try:
            rundir.atomic_write_json(path, minimal)
        except OSError as again:
            print(f"qwen3exp: could not write {path}: {again.strerror}", file=sys.stderr, flush=True)


def say(summary: dict, run_dir: Path) -> None:
    """How a run that was not stopped by a signal ends, in at most 4 lines: the outcome (with the
    error of a failed run), the warning of a plan that under-estimated its memory
    (`qwen3exp.run.scorecard`), and what was saved and the next command (`next_steps`)."""
    log = console.logger("qwen3exp.launch")
    status, last, val, error = summary["status"], summary["last_loss"], summary["val_loss"], summary["error"]
    export = summary.get("export") or {}
    phases = [
        f"{what} {export[key]:.1f}s"
        for what, key in (("export", "complete_seconds"), ("verification", "verify_seconds"))
        if key in export
    ]
    outcome = (
        f"qwen3exp: {status}: {run_dir}  last loss {last if last is None else f'{last:.4f}'}"
        + (f"  val loss {val:.4f}" if val is not None else "")
        + scorecard.outcome_part(summary)
        + f"  wall {summary['wall_seconds']:.1f}s"
        + (f" (of which {', '.join(phases)})" if phases else "")
        + (f"\n  error: {error}" if error else "")
    )
    if status == "completed":
        log.info(outcome, extra=console.GOOD)
    elif status == "failed":
        log.error(outcome)
    else:  # requeued, stopped at the time limit
        log.warning(outcome)
    if (under := scorecard.warning(summary)) is not None:
        log.warning(under)
    for line in next_steps.lines(summary, run_dir):
        log.info(line)


def stopped_line(
    plan: Plan, run_dir: Path, signum: int, origin: provenance.Origin | None, *, ranks_started: bool
) -> str:
    """The one line a stopped run ends with: how it was stopped, the last step completed (and its
    loss), what is saved, and the command that resumes (or starts again)."""
    exp = plan.exp
    how = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    rows = metrics_file.read_metrics(run_dir)
    saved = rundir.latest_checkpoint_step(run_dir) if exp.checkpoint.resumable else None
    last = max([*([rows[-1]["step"]] if rows else []), *([saved] if saved else [])], default=None)
    loss = next((r["loss"] for r in reversed(rows) if r["step"] == last), None)
    if not ranks_started:
        done = "before the ranks started"
    elif last is None:
        done = "before the first step completed"
    else:
        done = f"after step {last}/{exp.training.steps}" + (f" (loss {loss:.4f})" if isinstance(loss, float) else "")
    if exp.checkpoint.resumable:
        kept = f"checkpoint step-{saved} is saved" if saved else "no checkpoint is saved yet"
        todo = "resume" if saved else "start again"
    else:
        kept, todo = "nothing resumable is saved (checkpoint.save=false)", "start again"
    return f"qwen3exp: interrupted by {how} {done}; {kept}; to {todo}: " + rerun_command(
        origin, run_dir, same_dir=exp.checkpoint.resumable
    )


def rerun_command(origin: provenance.Origin | None, run_dir: Path, *, same_dir: bool) -> str:
    """The command line that runs this again: in `run_dir` (a resumable run resumes there) or, when
    `same_dir` is False, in a new directory. A job of a sweep: the sweep's own resume command."""
    if origin is None:
        return f"the same command with hydra.run.dir={quote_value(str(run_dir))}"
    if origin.mode == "MULTIRUN" and origin.sweep_dir:
        return sweep.resume_command(redact.redact_argv(origin.command), Path(origin.sweep_dir))
    args = [a for a in origin.command if not a.lstrip("+").startswith("hydra.run.dir=")]
    if same_dir:
        args.append(f"hydra.run.dir={quote_value(str(run_dir))}")
    return shlex.join(redact.redact_argv(args))
