"""Configuration errors: every problem names the key, the value and what is allowed.

A `ConfigError` carries one or more `Problem`s so that several mistakes are reported together.
The command-line layer prints them and exits with code 2, without a traceback.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path

EXIT_CONFIG_ERROR = 2
EXIT_CHECK_CRASHED = 70
"""A check raised an unexpected exception (a bug in qwen3exp, sysexits' EX_SOFTWARE): nothing started."""


@dataclass(frozen=True)
class Problem:
    key: str
    """Dotted YAML key, e.g. `training.steps`."""
    value: object
    message: str
    allowed: str | None = None
    hint: str | None = None
    source: str | None = None
    """Where the value came from (a conf file, the command line), when known."""

    def render(self) -> str:
        value = repr(self.value) if not isinstance(self.value, _Missing) else "(missing)"
        lines = [f"  {printable(self.key, 200)} = {printable(value, MAX_VALUE_CHARS)}: {printable(self.message)}"]
        if self.allowed:
            lines.append(f"      allowed: {printable(self.allowed)}")
        if self.source:
            lines.append(f"      from: {printable(self.source)}")
        if self.hint:
            lines.append(f"      {printable(self.hint)}")
        return "\n".join(lines)


MAX_VALUE_CHARS = 200
"""A value is shown up to this many characters (a 100,000-character value is cut, its length said)."""
MAX_TEXT_CHARS = 2000


def printable(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`text` safe to print on a terminal: control characters (ESC and the other C0/C1 codes, DEL; a
    value from a file or a command line can hold raw terminal escapes) shown as \\x.. escapes, and
    cut to `limit` characters with the length said."""
    out = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
    if len(out) > limit:
        out = f"{out[:limit]}... ({len(out):,} characters)"
    return out


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
"""Every control character but tab and newline, and lone surrogates (undecodable bytes of a
non-UTF-8 argument)."""


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


MISSING = _Missing()


@dataclass
class ConfigError(Exception):
    problems: list[Problem] = field(default_factory=list)
    context: str | None = None
    """E.g. the sweep point the problems belong to."""
    more: list[ConfigError] = field(default_factory=list)
    """Errors of other sweep points, rendered after this one, each with its own context."""

    def __post_init__(self) -> None:
        super().__init__(self.render())

    @classmethod
    def several(cls, errors: list[ConfigError]) -> ConfigError:
        first, *rest = errors
        return cls(first.problems, first.context, [*first.more, *rest])

    @property
    def all_problems(self) -> list[Problem]:
        return [*self.problems, *(p for e in self.more for p in e.all_problems)]

    def render(self) -> str:
        n = len(self.problems)
        head = f"qwen3exp: {n} configuration error{'s' if n != 1 else ''}"
        if self.context:
            head += f" in {self.context}"
        head += " (nothing was started):"
        return "\n".join([head, *(p.render() for p in self.problems), *(e.render() for e in self.more)])


def did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str | None:
    """The nearest option (case-insensitive), as 'did you mean X?'."""
    by_lower = {str(o).lower(): str(o) for o in options}
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1, cutoff=0.6)
    return f"did you mean {by_lower[close[0]]}?" if close else None


def one_of(options) -> str:
    return ", ".join(str(o) for o in options)


def nearby_path(path) -> str | None:
    """For a path that does not exist: 'did you mean <sibling>?', or which parent is missing."""
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        return f"{parent} does not exist either"
    try:
        names = [p.name for p in parent.iterdir()]
    except OSError:
        return None
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    return f"did you mean {parent / close[0]}?" if close else None
