"""What the launcher does not show of the ranks' output, and why: the one place that silences lines.

torchrun tees rank 0's output (stdout and stderr) to the launcher, which shows it through its
console (`qwen3exp.run.console`). By default it leaves out
- torchtitan's INFO lines: setup and step lines, which qwen3exp's own progress and phase lines
  replace (`qwen3exp.run.progress`);
- the known warnings in `SILENCED` below, each with the reason nobody needs to act on it.
Everything else (any other warning, every error, every traceback) is shown, until the disk fills
or the launcher has asked the ranks to stop (Ctrl-C, SIGTERM). A traceback is held until it is
complete (`HeldTracebacks`): one that ends in a full disk (ENOSPC: a rank's failed checkpoint
write, then torchrun's report of that rank and the agent's own traceback) is left out with all the
ranks print after it, since the launcher's outcome says in one line that the disk is full. What
torchrun and the ranks print after a stop (torchrun's shutdown warnings and SignalException
traceback, the errors of ranks whose peers were stopped) is the expected end of a stop, and the
launcher's own line says how it ended. What is left out goes to qwen3exp.log; `verbose=true` (or
`-v`) shows every line. Nothing is lost either way: every rank's whole output is in the run
directory's `logs/` (torchrun's per-rank stdout.log / stderr.log) while the disk has room, and the
end of the launch says how many lines were left out.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

_TEE = re.compile(r"^\[(?:default|rank)\d+\]:")
_TITAN = re.compile(r"^\[titan\] \S+ \S+ - (?P<logger>\S+) - (?P<level>[A-Z]+) - (?P<message>.*)$")
_PYWARNING = re.compile(r"^\S.*:\d+: (?P<category>\w*Warning): (?P<message>.*)$")
FULL_DISK = re.compile(r"\[Errno 28\]|No space left on device")
"""A line saying that a write failed on a full disk (ENOSPC)."""
_TRACEBACK = re.compile(r"^(?:Traceback \(most recent call last\)|Process \w+-\d+:$)")
"""The first line of a traceback (multiprocessing's `Process ForkProcess-1:` heads a forked rank's)."""


@dataclass(frozen=True)
class Silenced:
    """A known line nobody can act on: `pattern` (searched in the line's message), who prints it,
    and why it is left out."""

    pattern: str
    source: str
    reason: str


# The known non-actionable lines (torch, torchtitan, torchdata, transformers), on CPU, CUDA and the
# Transformers backend. A Python warning's source line (the indented line after it) goes with it.
SILENCED: tuple[Silenced, ...] = (
    Silenced(
        r"initial_load_model_only=True has no effect without an initial_load_path",
        "torchtitan",
        "torchtitan's default for its loader; qwen3exp sets initial_load_path exactly when the checkpoint "
        "kind loads weights, and the plan says where they come from",
    ),
    Silenced(
        r"ENV\[TORCH_NCCL_ASYNC_ERROR_HANDLING\]",
        "torchtitan",
        "torchtitan sets the variable from its own job config, as intended",
    ),
    Silenced(
        r"Error running lspci", "torchtitan", "torchtitan's device-name probe; the platform line names the device"
    ),
    Silenced(
        r"Peak flops undefined for",
        "torchtitan",
        "no known peak FLOPS for this device (CPU): MFU is recorded as null, not against an A100",
    ),
    Silenced(
        r"model\.safetensors\.index\.json not found at hf_assets_path",
        "torchtitan",
        "qwen3exp completes the export itself (one file, or shards by checkpoint.max_shard_mb)",
    ),
    Silenced(
        r"CUDA graph capture is only supported on NVIDIA CUDA",
        "torchtitan",
        "on CPU and Neuron the steps run eagerly, as intended",
    ),
    Silenced(
        r"Config field value of type \S+ may not be JSON serializable",
        "torchtitan",
        "torchtitan's config printer; qwen3exp writes torchtitan_config.json itself",
    ),
    Silenced(
        r"DTensor random operators may not have complete support on cpu device mesh",
        "torch",
        "the CPU mesh's random ops are only used for initialisation, seeded by training.seed",
    ),
    Silenced(
        r"DTensor manual_seed\(\) may not have complete support on cpu device mesh",
        "torch",
        "as above: seeding on a CPU mesh works for what the run needs",
    ),
    Silenced(
        r"'set_vital' is deprecated",
        "torchdata",
        "torchdata's StatefulDataLoader calls a deprecated torch API on its own",
    ),
    Silenced(
        r"^(Loading weights|Loading checkpoint shards)\b.*\d+/\d+",
        "transformers",
        "a progress bar; qwen3exp says when weights load",
    ),
    Silenced(
        r"^Generating \w+ split\b",
        "datasets",
        "a progress bar of the data cache being built; qwen3exp says when the data is prepared",
    ),
)
_COMPILED = tuple((re.compile(s.pattern), s) for s in SILENCED)


@dataclass(frozen=True)
class RankLine:
    """One line of a rank's output, parsed: torchtitan's log format, a Python warning, or other."""

    text: str
    """The line without torchrun's `[default0]:` prefix."""
    level: str | None
    """torchtitan's log level (INFO, WARNING, ...), `WARNING` for a Python warning, None otherwise."""
    message: str
    kind: str = "other"
    """"titan" (torchtitan's log format), "warning" (a Python warning) or "other"."""


def parse(line: str) -> RankLine:
    text = _TEE.sub("", line.rstrip("\r\n"), count=1)
    if m := _TITAN.match(text):
        return RankLine(text, m["level"], m["message"], "titan")
    if m := _PYWARNING.match(text):
        return RankLine(text, "WARNING", f"{m['category']}: {m['message']}", "warning")
    return RankLine(text, None, text)


def silenced(message: str) -> Silenced | None:
    """The SILENCED entry for a message, or None."""
    return next((s for rx, s in _COMPILED if rx.search(message)), None)


class RankFilter:
    """Decides, line by line, what of the ranks' output is shown (see the module docstring) and
    counts what is not."""

    def __init__(self, *, verbose: bool, stopping: Callable[[], bool] = lambda: False) -> None:
        self.verbose = verbose
        self.stopping = stopping
        """True once the launcher has asked the ranks to stop."""
        self.hidden: Counter[str] = Counter()
        self.disk_full = False
        """True once a line said the disk is full: the rest is the ranks failing on it."""
        self._source_line_of_hidden_warning = False

    def shows(self, line: RankLine) -> bool:
        follows_hidden = self._source_line_of_hidden_warning
        # A rank's stdout and stderr reach the launcher interleaved: a torchtitan log line may come
        # between a warning (stderr) and its source line, so only a line of another kind ends it.
        if line.kind != "titan":
            self._source_line_of_hidden_warning = False
        if self.verbose:
            return True
        if self.stopping():
            self.hidden["lines printed while stopping"] += 1
            return False
        if self.disk_full:
            self.hidden["lines printed after the disk filled"] += 1
            return False
        if follows_hidden and line.kind == "other" and line.text.startswith("  "):
            self.hidden["known warnings"] += 1
            return False
        if not line.text.strip():  # an empty line (what a progress bar leaves behind) says nothing
            return False
        if line.level == "INFO":
            self.hidden["torchtitan info lines"] += 1
            return False
        if silenced(line.message) is not None:
            self.hidden["known warnings"] += 1
            self._source_line_of_hidden_warning = line.kind == "warning"
            return False
        return True

    def summary(self) -> str | None:
        """One line on what was left out, or None."""
        if not self.hidden:
            return None
        parts = ", ".join(f"{n} {what}" for what, n in sorted(self.hidden.items()))
        return f"not shown: {parts} of rank 0 (verbose=true shows them; every rank's output is in logs/)"


class HeldTracebacks:
    """The lines the filter shows, with each traceback held until it is complete: from its first
    line until the ranks have been quiet for QUIET_S (or LONGEST_S after it began, or the end of the
    launch). A held block that names a full disk is left out, with what follows (`RankFilter.disk_full`):
    the launcher's outcome says it in one line. Thread-safe: lines come from the reader thread,
    `due` from the launcher's ticks."""

    QUIET_S = 0.5
    LONGEST_S = 5.0

    def __init__(self, filter: RankFilter, now: Callable[[], float] = time.monotonic) -> None:
        self.filter, self.now = filter, now
        self._held: list[str] = []
        self._began = self._last = 0.0
        self._lock = threading.Lock()

    def take(self, text: str) -> tuple[list[str], list[str]]:
        """(shown, left out) now, for a line the filter shows."""
        with self._lock:
            if not self._held and not _TRACEBACK.match(text):
                if FULL_DISK.search(text) and not self.filter.verbose:
                    return self._left_out([text])
                return [text], []
            self._last = self.now()
            self._began = self._began if self._held else self._last
            self._held.append(text)
            return [], []

    def due(self, *, end: bool = False) -> tuple[list[str], list[str]]:
        """(shown, left out): the held block once it is complete (`end`: the launch is over)."""
        with self._lock:
            now = self.now()
            if not self._held or not (end or now - self._last >= self.QUIET_S or now - self._began >= self.LONGEST_S):
                return [], []
            block, self._held = self._held, []
            if self.filter.verbose:
                return block, []
            if self.filter.stopping():
                self.filter.hidden["lines printed while stopping"] += len(block)
                return [], block
            if any(FULL_DISK.search(line) for line in block):
                return self._left_out(block)
            return block, []

    def _left_out(self, lines: list[str]) -> tuple[list[str], list[str]]:
        """Lines of a full disk: left out, and every line after them (`RankFilter.disk_full`)."""
        self.filter.disk_full = True
        self.filter.hidden["lines printed after the disk filled"] += len(lines)
        return [], lines
