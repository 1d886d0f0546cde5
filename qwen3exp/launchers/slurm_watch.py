"""The submit host waiting for its SLURM jobs (`results_or_give_up`): hydra-submitit-launcher waits
for each job's result file, and a job that SLURM says has ended without one ends the wait."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

RESULT_GRACE_S = 15.0
"""After SLURM says a job has ended, how long the submitter still looks for its result file (a
shared file system may show it late; submitit itself waits as long)."""
ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)
"""squeue's final job states (a requeued job goes back to PENDING)."""


class JobLost(Exception):
    """A SLURM job ended and its result never appeared."""

    def __init__(self, job_id: str, state: str) -> None:
        super().__init__(job_id, state)
        self.job_id, self.state = job_id, state


@contextlib.contextmanager
def results_or_give_up(sweep_dir: Path, *, grace_s: float = RESULT_GRACE_S, poll_s: float = 5.0):
    """While hydra-submitit-launcher waits for the jobs' results: a job that SLURM says has ended,
    with no result `grace_s` later (its process was killed, its node lost), ends the wait with exit
    1 and a message naming the job and its logs.
    UPSTREAM BUG: submitit 1.5.4 learns a job's state only from sacct; without SLURM accounting
    every state is UNKNOWN ("Bypassing sacct error") and it waited for good for a job that died
    without writing its result (tests/test_slurm.py::test_a_job_killed_under_the_submitter_...).
    Its watcher is replaced by one that asks squeue for as long as this lasts."""
    from submitit.slurm import slurm as upstream  # lazy: optional extra (launcher=slurm)

    saved = upstream.SlurmJob.watcher
    upstream.SlurmJob.watcher = SqueueWatcher(grace_s=grace_s, poll_s=poll_s)  # type: ignore[assignment]
    try:
        yield
    except JobLost as e:
        from submitit.core.utils import JobPaths  # lazy: optional extra (launcher=slurm)

        paths = JobPaths(f"{sweep_dir}/.submitit/%j", job_id=e.job_id, task_id=0)
        state = "squeue no longer lists it" if e.state == "GONE" else e.state
        print(
            f"qwen3exp: SLURM job {e.job_id} ended ({state}) without a result: {paths.result_pickle.name} "
            f"did not appear within {grace_s:g} s (the job's process ended without writing it: killed, out of "
            f"memory, its node lost); not waiting any longer.\n  job logs: {paths.stderr}\n"
            f"            {paths.stdout}",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1) from None
    finally:
        upstream.SlurmJob.watcher = saved


class SqueueWatcher:
    """submitit's job watcher (what `SlurmJob.watcher` is asked), from squeue, which needs no
    accounting: a job has ended when squeue shows it in a final state or no longer knows it. A
    job's result file is what ends submitit's wait; a job that ended without one raises JobLost
    `grace_s` later (never in mode "cache": a Job's __del__ asks that way). squeue is asked every
    `poll_s` for the first minute, then every 30 s (a long job's submitter spares the controller)."""

    def __init__(self, *, grace_s: float, poll_s: float) -> None:
        self.grace_s, self.poll_s = grace_s, poll_s
        self.states: dict[str, str] = {}
        self._ended: dict[str, float] = {}
        self._checked = float("-inf")
        self._since = time.monotonic()

    def register_job(self, job_id: str) -> None:
        self.states.setdefault(job_id, "UNKNOWN")
        self._checked = float("-inf")

    def get_info(self, job_id: str, mode: str = "standard") -> dict[str, str]:
        if job_id not in self.states:
            self.register_job(job_id)
        now = time.monotonic()
        every = self.poll_s if now - self._since < 60 else max(self.poll_s, 30.0)
        if mode == "force" or (mode == "standard" and now - self._checked >= every):
            self.update()
        return {"State": self.states[job_id]}

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        return self.get_info(job_id, mode)["State"]

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        state, now = self.get_state(job_id, mode), time.monotonic()
        if state not in ENDED and state != "GONE":
            self._ended.pop(job_id, None)
        elif mode != "cache" and now - self._ended.setdefault(job_id, now) >= self.grace_s:
            raise JobLost(job_id, state)
        return False  # a result file ends the wait (submitit looks for it first)

    def update(self) -> None:
        self._checked = time.monotonic()
        ids = sorted({j.split("_")[0] for j in self.states})
        try:
            out = subprocess.run(
                ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(ids)],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            return  # no answer says nothing about the jobs
        if out.returncode != 0 and "Invalid job id" not in out.stderr:
            return
        listed = dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)
        for job in self.states:  # not listed any more: ended long enough ago to be forgotten
            self.states[job] = listed.get(job, "GONE")
