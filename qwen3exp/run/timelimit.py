"""SLURM's time limit: the pre-timeout signal, the checkpoint the ranks save on it, the requeue.

submitit submits every job with `sbatch --signal=USR2@<launcher.signal_delay_s>`: SLURM sends
SIGUSR2 that long before the time limit. It reaches every process of the job's steps (srun's
tasks: the torchrun agents and their ranks) and not the processes of the batch script (measured
on SLURM 22.05: a Python process started by the batch script got nothing, the tasks of an srun
step got it), so the torchrun agents are started by srun whenever the job may requeue itself.

- `request(log_dir, who)`: whoever gets the signal (an agent, a rank, the launcher) records it in
  `logs/time_limit.json`; nobody dies of SIGUSR2.
- In the ranks (`install`, with checkpoint=dcp): before every step all ranks agree (one MAX
  all-reduce of a flag) whether a request came; if so each rank saves a full DCP checkpoint of the
  step just finished (`checkpoint/step-N`, synchronous), rank 0 writes `logs/time_limit_saved.json`
  and the training loop ends, so torchrun exits 0.
- The launcher (`qwen3exp.launchers.local`) then records the attempt, as the launcher's `Nodes`
  says (`time_limit_outcome`, `qwen3exp.plan.slurm_nodes`): `requeued` when the job may requeue
  itself (`launcher.requeue=true`, fewer than `launcher.max_requeues` requeues so far:
  SLURM_RESTART_COUNT), and hands the signal to submitit, which requeues the job (same job id,
  same run directory); the requeued job resumes from that checkpoint. Otherwise the run is
  `interrupted` and a rerun of the same command resumes.
Without checkpoint=dcp the ranks ignore the signal and the job runs until SLURM stops it at the
time limit (`interrupted`, nothing to resume from); the plan says so.

After submitit's `scontrol requeue`, `restart_soon` sets when the requeued job may start again:
SLURM's own choice is about 2 minutes later (see there).
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qwen3exp.run import rundir

REQUEST = "time_limit.json"
SAVED = "time_limit_saved.json"
RESTART_MARGIN_S = 5
"""A requeued job starts this long after SLURM has certainly ended the requeued attempt (below)."""
RESTART_TRIES = 8
RESTART_PAUSE_S = 0.5


def request(log_dir: Path, who: str) -> None:
    """Record that the pre-timeout signal arrived (the first record is kept)."""
    path = Path(log_dir) / REQUEST
    if path.exists():
        return
    try:
        rundir.atomic_write_json(
            path, {"signal": "SIGUSR2", "received_by": who, "time": time.time(), "pid": os.getpid()}
        )
    except OSError:
        pass


def requested(log_dir: Path) -> dict | None:
    data = rundir.read_json(Path(log_dir) / REQUEST)
    return data if isinstance(data, dict) else None


def saved(log_dir: Path) -> dict | None:
    """What rank 0 recorded after the ranks saved their checkpoint and stopped: {step, time}."""
    data = rundir.read_json(Path(log_dir) / SAVED)
    return data if isinstance(data, dict) else None


def clear(log_dir: Path) -> None:
    """Before a launch: an earlier attempt's request and record are not this one's."""
    for name in (REQUEST, SAVED):
        (Path(log_dir) / name).unlink(missing_ok=True)


def stopped_at_limit(record: dict, delay: str = "") -> str:
    """What an attempt stopped at the pre-timeout signal did (`record`: `saved`'s); `delay`: the
    launcher's note on when the signal comes."""
    step = record.get("step")
    return f"stopped at the SLURM time limit (SIGUSR2{delay}) " + (
        f"after step {step}, checkpoint step-{step} saved" if step else "before any step (nothing to save)"
    )


def not_requeued(what: str, why: str) -> tuple[str, int, str]:
    """(status, exit code, error) of an attempt stopped at the time limit that is not requeued."""
    return "interrupted", 143, f"{what}; not requeued ({why}): the same command again resumes"


def attempt_record(
    env: Mapping[str, str],
    *,
    number: int,
    status: str,
    started: float,
    wall: float,
    resumed_from: int | None,
    error: str | None,
    steps: list[dict],
) -> dict:
    """This attempt, as summary.json's `attempts` lists it (`number`: 1 + the earlier ones)."""
    return {
        "attempt": number,
        "job_id": env.get("SLURM_JOB_ID"),
        "nodes": env.get("SLURM_JOB_NODELIST"),
        "status": status,
        "started": round(started, 3),
        "wall_seconds": round(wall, 3),
        "resumed_from_step": resumed_from,
        "steps_completed": steps[-1]["step"] if steps else 0,
        "error": error,
    }


def earlier_attempts(run_dir: Path, experiment_hash: str) -> list[dict]:
    """The attempts an earlier summary of the same experiment in `run_dir` recorded (a requeued
    job's, a relaunch's; a sweep keeps the earlier one under attempts/<n>/)."""
    run_dir = Path(run_dir)
    kept = sorted(
        (run_dir / rundir.ATTEMPTS).glob("*/summary.json"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for path in [run_dir / rundir.SUMMARY, *reversed(kept)]:
        s = rundir.read_json(path)
        if isinstance(s, dict) and s.get("experiment_hash") == experiment_hash:
            if isinstance(s.get("attempts"), list):
                return list(s["attempts"])
            return [
                {
                    "attempt": 1,
                    "job_id": None,
                    "status": s.get("status"),
                    "started": None,
                    "wall_seconds": s.get("wall_seconds"),
                    "resumed_from_step": s.get("resumed_from_step"),
                    "steps_completed": s.get("steps_completed"),
                    "error": s.get("error"),
                }
            ]
    return []


# --------------------------------------------------------------------------------- in the ranks
_received: list[float] = []


def catch_signal(log_dir: Path) -> None:
    """First thing in a rank: SIGUSR2 is recorded, never fatal (the default action kills)."""

    def on_signal(_signum, _frame) -> None:
        _received.append(time.time())
        request(log_dir, f"rank {os.environ.get('RANK', '?')}")

    signal.signal(signal.SIGUSR2, on_signal)
    # The agent blocks SIGUSR2 and its ranks inherit that: one that came meanwhile arrives now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})


def install(trainer: Any, log_dir: Path) -> None:
    """With checkpoint=dcp, after the trainer is built: before each step the ranks agree whether
    the pre-timeout signal came (to this rank, or to any process that recorded it in `log_dir`);
    if so every rank saves the finished step (unless torchtitan just saved it at its interval)
    and training stops there."""
    import torch  # lazy: torch is imported in the ranks only
    import torch.distributed as dist  # lazy: torch is imported in the ranks only

    log_dir = Path(log_dir)
    original = trainer.should_continue_training
    device = getattr(trainer, "device", torch.device("cpu"))
    interval = trainer.config.checkpoint.interval
    first: list[int] = []

    def should_continue_training() -> bool:
        if not first:
            first.append(trainer.step)  # the step this attempt starts from (a resumed one's checkpoint)
        if not original():
            return False
        flag = torch.tensor([1 if _received or (log_dir / REQUEST).exists() else 0], dtype=torch.int32, device=device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if not int(flag.item()):
            return True
        step = trainer.step
        if step > first[0] and step % interval != 0:
            trainer.checkpointer.save(step, last_step=True)  # a full, synchronous DCP checkpoint
        trainer.checkpointer.maybe_wait_for_saving()
        if not dist.is_initialized() or dist.get_rank() == 0:
            rundir.atomic_write_json(log_dir / SAVED, {"step": step if step > 0 else None, "time": time.time()})
        return False

    trainer.should_continue_training = should_continue_training


# ------------------------------------------------------------------------- after the requeue
def restart_soon(job: str) -> str | None:
    """In the requeued job's own process, after `scontrol requeue`: let the job start again in
    seconds (KillWait + RESTART_MARGIN_S from now). None when SLURM shows that start (the job's
    EligibleTime) with the job requeued; else what went wrong, for the job log and the summary.

    SLURM itself holds a requeued job until CredExpire + 1 s after the requeue completes (121 s by
    default; 144 s measured before it started). The update must outlast this process: the requeue
    completes only when the batch script's processes have ended, and SLURM then replaces a start
    time that has already passed (measured on 22.05: StartTime=now+2 with the script alive 4 s
    more gave the 121 s again; StartTime=now+5, used before, gave the 148 s seen once when the
    attempt outlived those 5 s). The requeue's SIGTERM is followed by SIGKILL after KillWait, so a
    start KillWait + a margin ahead is always after that (and never in the same second as the
    requeue, which the nodes refused: "Job credential revoked").
    Retried (the update may fail, e.g. the controller busy), at most RESTART_TRIES times; SLURM
    kills this process KillWait after the requeue in any case."""
    ahead = _kill_wait_s() + RESTART_MARGIN_S
    why = "no try"
    for _ in range(RESTART_TRIES):
        start = datetime.datetime.now().replace(microsecond=0) + datetime.timedelta(seconds=ahead)
        wanted = start.isoformat()
        update = _scontrol("update", f"JobId={job}", f"StartTime={wanted}")
        fields = _job_fields(job)
        state, eligible = fields.get("JobState", "?"), fields.get("EligibleTime", "?")
        if update.returncode == 0 and state in ("PENDING", "COMPLETING", "REQUEUED") and eligible == wanted:
            return None
        said = (update.stdout + update.stderr).strip().splitlines()
        why = (
            f"scontrol update StartTime={wanted}: "
            + (said[-1] if said else f"exit code {update.returncode}")
            + f"; the job is {state}, may start at {eligible}"
        )
        time.sleep(RESTART_PAUSE_S)
    return (
        f"SLURM job {job} was requeued, but its start could not be moved to {ahead} s from now after "
        f"{RESTART_TRIES} tries ({why}): SLURM starts it when it decides (about 2 minutes after the requeue)"
    )


def _scontrol(*args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(["scontrol", *args], 1, "", f"{type(e).__name__}: {e}")


def _job_fields(job: str) -> dict[str, str]:
    """`scontrol -o show job`'s Key=Value fields (JobState, EligibleTime, ...); {} when it fails."""
    out = _scontrol("-o", "show", "job", job)
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout)) if out.returncode == 0 else {}


def _kill_wait_s() -> int:
    """SLURM's KillWait: seconds between a job's SIGTERM and its SIGKILL (SLURM's default, 30,
    when `scontrol show config` does not say)."""
    out = _scontrol("show", "config")
    found = re.search(r"^KillWait\s*=\s*(\d+)", out.stdout, re.MULTILINE)
    return int(found.group(1)) if out.returncode == 0 and found else 30
