"""Fault injection for tests (a documented test hook, off unless its environment variable is set).

Read by every rank (`qwen3exp.worker.main`) and applied inside torchtitan's training loop, so the
launcher, torchrun and the other ranks meet a real failure at a real point of training:

  QWEN3EXP_FAULT_RAISE_AT_STEP=N  raise RuntimeError at the start of step N
  QWEN3EXP_FAULT_HANG_AT_STEP=N   stop making progress at the start of step N (sleep forever);
                                  the other ranks then wait in their next collective
  QWEN3EXP_FAULT_KILL_AT_STEP=N   SIGKILL the rank at the start of step N: it dies without a word
                                  (as under `kill -9` or the OOM killer) and the other ranks fail
                                  with "Connection reset by peer" in their next collective
  QWEN3EXP_FAULT_STALL_AT_STEP=N  at the start of step N wait until SLURM's pre-timeout signal has
                                  come (`qwen3exp.run.timelimit`), then go on: the time limit then
                                  falls at a known step, whatever the machine's speed
  QWEN3EXP_FAULT_RANK=R           only on global rank R (default: every rank)
  QWEN3EXP_FAULT_RUN_MATCH=TEXT   only in runs whose directory name contains TEXT (one job of a sweep)

The launcher passes its environment to the ranks, so `QWEN3EXP_FAULT_RAISE_AT_STEP=3 python -m
qwen3exp ...` makes a run fail at step 3.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.run import rundir, timelimit

RAISE_AT_STEP = "QWEN3EXP_FAULT_RAISE_AT_STEP"
HANG_AT_STEP = "QWEN3EXP_FAULT_HANG_AT_STEP"
KILL_AT_STEP = "QWEN3EXP_FAULT_KILL_AT_STEP"
STALL_AT_STEP = "QWEN3EXP_FAULT_STALL_AT_STEP"
RANK = "QWEN3EXP_FAULT_RANK"
RUN_MATCH = "QWEN3EXP_FAULT_RUN_MATCH"


class InjectedFault(RuntimeError):
    """The error QWEN3EXP_FAULT_RAISE_AT_STEP raises."""


@dataclass(frozen=True)
class Faults:
    raise_at_step: int | None = None
    hang_at_step: int | None = None
    rank: int | None = None
    kill_at_step: int | None = None
    stall_at_step: int | None = None
    log_dir: Path | None = None

    @property
    def any(self) -> bool:
        return any(
            s is not None for s in (self.raise_at_step, self.hang_at_step, self.kill_at_step, self.stall_at_step)
        )


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{name}={value!r}: expected a non-negative integer")
    return int(value)


def from_env(env: Mapping[str, str], run_dir=None) -> Faults:
    """The faults the environment asks for in this run (none when QWEN3EXP_FAULT_RUN_MATCH is set and
    `run_dir`'s name does not contain it)."""
    match = env.get(RUN_MATCH)
    if match and (run_dir is None or match not in str(run_dir)):
        return Faults()
    return Faults(
        _int(env, RAISE_AT_STEP),
        _int(env, HANG_AT_STEP),
        _int(env, RANK),
        _int(env, KILL_AT_STEP),
        _int(env, STALL_AT_STEP),
        Path(run_dir) / rundir.LOGS if run_dir is not None else None,
    )


def install(trainer, faults: Faults, rank: int) -> None:
    """Wrap `trainer.train_step`: torchtitan's loop sets `trainer.step` before calling it."""
    if not faults.any or (faults.rank is not None and faults.rank != rank):
        return
    original = trainer.train_step

    def train_step(*args, **kwargs):
        if trainer.step == faults.raise_at_step:
            raise InjectedFault(f"injected fault: {RAISE_AT_STEP}={faults.raise_at_step} on rank {rank}")
        if trainer.step == faults.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if trainer.step == faults.hang_at_step:
            while True:
                time.sleep(3600)
        if trainer.step == faults.stall_at_step and faults.log_dir is not None:
            deadline = time.monotonic() + 900
            while timelimit.requested(faults.log_dir) is None and time.monotonic() < deadline:
                time.sleep(0.1)
        return original(*args, **kwargs)

    trainer.train_step = train_step
