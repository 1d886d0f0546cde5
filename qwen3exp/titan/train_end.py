"""How a rank's `Trainer.train()` ends: without torchtitan's fixed 2-second sleep on rank 0.

torchtitan 0.3.0 ends `Trainer.train()` with `time.sleep(2)` on rank 0 "for other ranks to
complete". Here nothing waits on it: each rank closes its own files (`worker.main._finish`), an
asynchronous checkpoint is awaited there, and the launcher waits for every rank through torchrun.
The sleep only added 2 s to every run (every job of a sweep, every test that trains).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
import types
from unittest import mock

FINAL_SLEEP_S = 2
"""The seconds torchtitan 0.3.0's `Trainer.train()` sleeps after the last step (rank 0 only)."""


@contextlib.contextmanager
def without_final_sleep():
    """While it is open, the one `time.sleep(2)` that `Trainer.train()` itself calls returns at once;
    any other sleep (another function of torchtitan's trainer module, another length) and every
    other `time` function are the real ones."""
    import torchtitan.trainer as trainer_module  # lazy: after the platform is prepared

    train_code = inspect.unwrap(trainer_module.Trainer.train).__code__

    def sleep(seconds: float) -> None:
        if seconds == FINAL_SLEEP_S and sys._getframe(1).f_code is train_code:
            return
        time.sleep(seconds)

    # UPSTREAM BUG: torchtitan 0.3.0 `Trainer.train()` (trainer.py) sleeps a fixed 2 s on rank 0 after
    # the last step, waiting on nothing it can see; only that call is skipped (the trainer module
    # reads `time.sleep` through its module global, the one seam short of editing the method).
    # tests/test_cli.py checks the sleep is gone, tests/test_train_end.py that nothing else changed.
    shim = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    shim.sleep = sleep
    with mock.patch.object(trainer_module, "time", shim):
        yield
