"""Configuration errors: every problem names the key, the value and what is allowed.

A `ConfigError` carries one or more `Problem`s so that several mistakes are reported together.
The command-line layer prints them and exits with code 2, without a traceback.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

EXIT_CONFIG_ERROR = 2


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
        lines = [f"  {self.key} = {value}: {self.message}"]
        if self.allowed:
            lines.append(f"      allowed: {self.allowed}")
        if self.source:
            lines.append(f"      from: {self.source}")
        if self.hint:
            lines.append(f"      {self.hint}")
        return "\n".join(lines)


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
    from pathlib import Path

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
