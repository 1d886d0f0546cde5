"""How a rank's `Trainer.train()` ends: without torchtitan's fixed 2-second sleep on rank 0.

torchtitan 0.3.0 ends `Trainer.train()` with `time.sleep(2)` on rank 0 "for other ranks to
complete". Here nothing waits on it: each rank closes its own files (`worker.main._finish`), an
asynchronous checkpoint is awaited there, and the launcher waits for every rank through torchrun.
The sleep only added 2 s to every run (every job of a sweep, every test that trains).
"""

from __future__ import annotations

import contextlib
import time
import types
from unittest import mock


@contextlib.contextmanager
def without_final_sleep():
    """While it is open, `time.sleep` as torchtitan's trainer module sees it returns at once
    (that module's only sleep is the final one); every other `time` function is the real one."""
    import torchtitan.trainer as trainer_module  # lazy: after the platform is prepared

    # UPSTREAM BUG: torchtitan 0.3.0 `Trainer.train()` (trainer.py) sleeps a fixed 2 s on rank 0 after
    # the last step, waiting on nothing it can see; tests/test_cli.py checks the sleep is gone.
    shim = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    shim.sleep = lambda seconds: None
    with mock.patch.object(trainer_module, "time", shim):
        yield
