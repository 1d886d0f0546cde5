"""Fault injection for tests (a documented test hook, off unless its environment variable is set).

Read by every rank (`qwen3exp.worker`) and applied inside torchtitan's training loop, so the
launcher, torchrun and the other ranks meet a real failure at a real point of training:

  QWEN3EXP_FAULT_RAISE_AT_STEP=N  raise RuntimeError at the start of step N
  QWEN3EXP_FAULT_HANG_AT_STEP=N   stop making progress at the start of step N (sleep forever);
                                  the other ranks then wait in their next collective
  QWEN3EXP_FAULT_RANK=R           only on global rank R (default: every rank)

The launcher passes its environment to the ranks, so `QWEN3EXP_FAULT_RAISE_AT_STEP=3 python -m
qwen3exp ...` makes a run fail at step 3.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

RAISE_AT_STEP = "QWEN3EXP_FAULT_RAISE_AT_STEP"
HANG_AT_STEP = "QWEN3EXP_FAULT_HANG_AT_STEP"
RANK = "QWEN3EXP_FAULT_RANK"


class InjectedFault(RuntimeError):
    """The error QWEN3EXP_FAULT_RAISE_AT_STEP raises."""


@dataclass(frozen=True)
class Faults:
    raise_at_step: int | None = None
    hang_at_step: int | None = None
    rank: int | None = None

    @property
    def any(self) -> bool:
        return self.raise_at_step is not None or self.hang_at_step is not None


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{name}={value!r}: expected a non-negative integer")
    return int(value)


def from_env(env: Mapping[str, str]) -> Faults:
    return Faults(_int(env, RAISE_AT_STEP), _int(env, HANG_AT_STEP), _int(env, RANK))


def install(trainer, faults: Faults, rank: int) -> None:
    """Wrap `trainer.train_step`: torchtitan's loop sets `trainer.step` before calling it."""
    if not faults.any or (faults.rank is not None and faults.rank != rank):
        return
    original = trainer.train_step

    def train_step(*args, **kwargs):
        if trainer.step == faults.raise_at_step:
            raise InjectedFault(f"injected fault: {RAISE_AT_STEP}={faults.raise_at_step} on rank {rank}")
        if trainer.step == faults.hang_at_step:
            while True:
                time.sleep(3600)
        return original(*args, **kwargs)

    trainer.train_step = train_step
