"""Ctrl-C, SIGTERM and SIGHUP from the command's first instruction to its last: one handler, one
exit code (130, or 143 for SIGTERM and SIGHUP).

Why here and installed first (`qwen3exp.entry`): the launcher used to leave SIGINT to Python
until the torchrun supervisor (`launchers.torchrun.StopSignals`) took it. A shell starts a background
job (`qwen3exp ... &` in a script: job control off) with SIGINT *ignored*, and Python keeps an
inherited SIG_IGN: `kill -INT` was swallowed through the import, compose, checks, claim and plan (the
first second or more) and the run trained to the end with exit 0, or a dry run exited 0 without
having finished; from StopSignals on, the same signal gave 130. Started from a terminal, the
KeyboardInterrupt of the import escaped with a traceback; one raised inside omegaconf's
`flag_override` came out as omegaconf's own AttributeError/ConfigKeyError ("a check crashed", 70,
or a composition error, 2); and a second Ctrl-C that came during the interpreter's finalization (which
puts SIG_DFL back) killed it (-2). The supervisor's own `Interrupted` was an Exception, which
logging's handlers and any `except Exception` swallow or turn into an error of their own.

So the command installs `handler` before it imports anything of note, and:
- the FIRST signal is recorded and raised once (KeyboardInterrupt, or `Terminated` for SIGTERM and
  SIGHUP); later ones are only counted: the launch is already unwinding, and a second Ctrl-C must
  not cut the clean-up (removing a claimed directory) short;
- inside `held()` (the claim and its release, the few steps between starting a job and the
  supervisor taking the signals over, the summary) a signal waits until the section is whole, then
  raises;
- the exit code is the first signal's whatever the unwinding turned it into (`exit_code`), and
  `check()` raises it again where library code swallowed it.
A SIGHUP ignored when the command started (`nohup`) stays ignored.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 143}
"""A signal's exit code: a hang-up stops a launch as SIGTERM does."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP outside a job's supervisor (while checking, between two jobs): stop like Ctrl-C."""


class _State:
    first: int | None = None  # the first signal of this launch
    raised = False  # it was raised (the launch unwinds)
    pending = False  # it came inside `held()`: raised when the section ends
    holds = 0
    installed = False


_S = _State()


def _exception(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def handler(signum: int, _frame) -> None:
    if _S.first is None:
        _S.first = signum
    if _S.raised:
        return  # already unwinding: a second Ctrl-C is 130 too, and the clean-up goes on
    if _S.holds:
        _S.pending = True
        return
    _S.raised = True
    raise _exception(_S.first)


def install() -> dict:
    """Take SIGINT, SIGTERM and SIGHUP (an inherited SIG_IGN of SIGINT too, SIGHUP's not); forget an
    earlier launch's signal. Returns the handlers it replaced (for `restore`)."""
    _S.first, _S.raised, _S.pending, _S.holds, _S.installed = None, False, False, 0, True
    old = {}
    for sig in SIGNALS:
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue  # nohup: the user asked for the launch to outlive the terminal
        old[sig] = signal.signal(sig, handler)
    return old


def installed() -> bool:
    """Whether this process's command installed the handler (`qwen3exp.entry`): an in-process
    call of the command line (`cli.main`, tests, notebooks) installs it for the call only."""
    return _S.installed and signal.getsignal(signal.SIGINT) is handler


def restore(old: dict) -> None:
    """The end of an in-process call that installed the handler: the handlers it replaced are back,
    and its signal is forgotten (a later call, or a check run directly, starts anew)."""
    for sig, h in old.items():
        signal.signal(sig, h)
    if old:
        _S.first, _S.raised, _S.pending, _S.holds, _S.installed = None, False, False, 0, False


def received() -> int | None:
    """The first signal of this launch, if one came."""
    return _S.first


def exit_code(code: int) -> int:
    """The command's exit code: the first signal's, if one came; else `code`."""
    return EXIT[_S.first] if _S.first is not None else code


def check() -> None:
    """Raise the launch's signal again if it came and the launch goes on (library code swallowed
    what `handler` raised)."""
    if _S.first is not None and _S.holds == 0:
        _S.raised, _S.pending = True, False
        raise _exception(_S.first)


def take_pending() -> int | None:
    """A signal that came inside `held()` and was not raised yet, handed to whoever takes the
    signals over now (`StopSignals`: the job then ends as interrupted, with its summary)."""
    if not _S.pending:
        return None
    _S.pending = False
    _S.raised = True
    return _S.first


@contextmanager
def held() -> Iterator[None]:
    """A section a signal must not cut in two: it waits for the section's end, then raises."""
    _S.holds += 1
    try:
        yield
    finally:
        _S.holds -= 1
        if not _S.holds and _S.pending and _S.first is not None:
            _S.pending, _S.raised = False, True
            raise _exception(_S.first)


def silence() -> None:
    """From here to the process's end a signal only sets the exit code (the command's teardown)."""
    _S.holds += 1


def last_code(code: int) -> int:
    """The exit code, taken as the process's last instruction: from here on the signals are ignored.
    (The interpreter's finalization puts SIG_DFL back for every signal with a Python handler: a
    second Ctrl-C 30 ms after the first then killed the process, exit -2 instead of 130.)"""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    return exit_code(code)
