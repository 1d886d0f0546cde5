"""Whether this launcher process has started a job yet, and how a check ends the launch: a refusal
(exit 2) or a crashed check (exit 70), before anything started."""

from __future__ import annotations

import sys
import traceback

from qwen3exp.errors import EXIT_CHECK_CRASHED, EXIT_CONFIG_ERROR, ConfigError
from qwen3exp.run import stopping


def refuse(e: ConfigError) -> None:
    print(e.render(), file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CONFIG_ERROR)


STARTED: list[bool] = [False]
"""Whether this process's launcher has started (or submitted) a job: until then, whatever stops the
launch (a refusal, a crash in a check, Ctrl-C or SIGHUP while planning) leaves nothing behind."""


def job_started() -> bool:
    return STARTED[0]


def checked(check, *args, **kwargs):
    """`check(...)`; an exception other than a refusal is a bug in qwen3exp: said so, with its
    traceback (for the bug report), and exit EXIT_CHECK_CRASHED with nothing started."""
    try:
        return check(*args, **kwargs)
    except ConfigError as e:
        stopping.check()  # a signal that library code turned into an error is still the signal
        refuse(e)
        raise
    except Exception as e:
        stopping.check()
        traceback.print_exc()
        print(
            f"qwen3exp: a check crashed ({type(e).__name__}: {str(e)[:300]}); this is a bug in qwen3exp, not "
            "a mistake of yours: please report it with the traceback above. Nothing was started.",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(EXIT_CHECK_CRASHED) from None


_LAUNCHER: list[object] = [None]


def begin() -> None:
    """A new launch (the command line, or `api.run` called again in the same process): nothing of it
    has started yet."""
    STARTED[0] = False
    _LAUNCHER[0] = None


def mark_started(launcher: object) -> None:
    """A job of a batch is about to start (or be submitted) through this launcher section."""
    STARTED[0] = True
    _LAUNCHER[0] = launcher


def started_launcher() -> object:
    """The launcher section of the batch that started (`mark_started`)."""
    return _LAUNCHER[0]
