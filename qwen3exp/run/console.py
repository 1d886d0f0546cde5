"""The launcher's terminal: what a person watching a run sees, and the same lines in `qwen3exp.log`.

Every line the launcher says goes through the `qwen3exp` logger (Hydra's job logging,
`conf/hydra/job_logging/qwen3exp.yaml`: this module's `ConsoleHandler` on stdout, message only;
a file handler writes `<run dir>/qwen3exp.log` with time and level, DEBUG included, e.g. the whole
plan). Outside Hydra (`qwen3exp.api`, notebooks) `logger()` adds a ConsoleHandler when nothing
would print the lines.

- Colour only on a TTY and never when `NO_COLOR` is set (https://no-color.org: any non-empty value);
  a pipe, a file, a SLURM log and every rank log file get plain text.
- A live line (progress, what the ranks are doing): on a TTY one line rewritten in place, and the
  last one kept when another line comes; in a pipe or file each update is a line of its own.
  A record is live when it was logged with `extra=LIVE`.
- The wall time a run reports is the command's: `command_started()` is called by the command line
  first thing, and `command_start()` gives that moment to the launcher.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import sys
import threading
import time

LIVE = {"live": True}
"""`log.info(text, extra=LIVE)`: a live line (rewritten in place on a terminal)."""
GOOD = {"tone": "good"}
"""`extra=GOOD`: an outcome that went well (green on a colour terminal)."""

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_COLOURS = {"good": "\x1b[32m", logging.WARNING: "\x1b[33m", logging.ERROR: "\x1b[31m", "live": "\x1b[36m"}
_RESET = "\x1b[0m"


def strip_ansi(text: str) -> str:
    """`text` without terminal escape sequences (colours, cursor moves)."""
    return _ANSI.sub("", text)


def colour_allowed(stream) -> bool:
    """Colour on a TTY, unless NO_COLOR is set to anything but the empty string."""
    return not os.environ.get("NO_COLOR") and _isatty(stream)


class ConsoleHandler(logging.Handler):
    """Writes records to stdout (looked up at each write, so redirection and capture work): plain
    lines, plus one live line on a TTY (see the module docstring). Thread-safe: the ranks' output
    and the launcher's own lines come from different threads."""

    _lock = threading.Lock()
    _live_shown = False  # a live line is on the terminal, without its newline

    def __init__(self, level: int = logging.NOTSET, stream=None) -> None:
        super().__init__(level)
        self._stream = stream

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stdout

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            out = self.stream
            tty = _isatty(out)
            colour = colour_allowed(out)
            live = bool(getattr(record, "live", False))
            with ConsoleHandler._lock:
                if tty and live:
                    # cut to the terminal's width: a wrapped line could not be rewritten in place
                    width = shutil.get_terminal_size().columns - 1
                    last = text.splitlines()[-1] if text else ""
                    out.write("\r\x1b[K" + _paint(last[:width], "live", colour))
                    ConsoleHandler._live_shown = True
                else:
                    if ConsoleHandler._live_shown:
                        out.write("\n" if tty else "")
                        ConsoleHandler._live_shown = False
                    tone = getattr(record, "tone", None) or (
                        record.levelno if record.levelno >= logging.WARNING else None
                    )
                    out.write(_paint(text if colour else strip_ansi(text), tone, colour) + "\n")
                out.flush()
        except Exception:
            self.handleError(record)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _paint(text: str, tone, colour: bool) -> str:
    """`tone`: "good", "live" or a logging level (WARNING and above are coloured)."""
    if not colour or tone is None:
        return text
    if isinstance(tone, int):
        tone = logging.ERROR if tone >= logging.ERROR else logging.WARNING
    return f"{_COLOURS[tone]}{text}{_RESET}"


def end_live() -> None:
    """End a live line still on the terminal (before something else writes to stdout directly)."""
    with ConsoleHandler._lock:
        if ConsoleHandler._live_shown:
            sys.stdout.write("\n")
            sys.stdout.flush()
            ConsoleHandler._live_shown = False


def tolerate_full_disk() -> None:
    """The run's log file (qwen3exp.log, Hydra's FileHandler) on a disk that fills: logging would
    print its own traceback for every line it cannot write ("--- Logging error ---"). The console
    shows each line anyway, so a file handler skips what the full disk refuses, silently."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and not isinstance(handler.handleError, _SkipFullDisk):
            handler.handleError = _SkipFullDisk(handler.handleError)  # type: ignore[method-assign]


class _SkipFullDisk:
    def __init__(self, handle_error) -> None:
        self.handle_error = handle_error

    def __call__(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not (isinstance(error, OSError) and error.errno == errno.ENOSPC):
            self.handle_error(record)


def logger(name: str = "qwen3exp") -> logging.Logger:
    """The `qwen3exp` logger (or a child), printing to stdout even where Hydra's job logging is not
    configured: a ConsoleHandler is added when no handler in the chain writes to a terminal stream."""
    root = logging.getLogger("qwen3exp")
    if not _prints(root):
        handler = ConsoleHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    return logging.getLogger(name)


def _prints(log: logging.Logger) -> bool:
    streams = {id(s) for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    current: logging.Logger | None = log
    while current is not None:
        for h in current.handlers:
            if isinstance(h, ConsoleHandler) or (
                isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)
                and id(h.stream) in streams
            ):
                return True
        current = current.parent if current.propagate else None
    return False


_command_start: list[float] = []


def command_started() -> None:
    """The command line (`qwen3exp.cli.main`) starts now (`time.monotonic()`)."""
    _command_start[:] = [time.monotonic()]


def command_start(default: float) -> float:
    """When this process's command line started (`time.monotonic()`); `default` when it was not
    started by one (a SLURM job's process, a notebook calling the launcher)."""
    return _command_start[0] if _command_start else default
