"""The values of sweep overrides (`a,b`, `range()`, `choice()`, `glob()`, `interval()`), counted
and sampled without expanding them: `range(0,100000000)` is one line on the command line and a
hundred million jobs for Hydra's basic sweeper, which lists every point before the first starts.

- `sweep_size`: how many values an override sweeps (from the range's bounds, not by listing them).
- `first_value` / `representative_values`: the values the checks compose (a range's ends when it is long).
- `size_problems`: a sweep the basic sweeper would expand into more than MAX_SWEEP_POINTS jobs,
  refused before anything lists its points.
"""

from __future__ import annotations

import decimal
import math
from itertools import islice

from hydra.core.override_parser.types import IntervalSweep, RangeSweep, Transformer

from qwen3exp.errors import Problem

MAX_SWEEP_POINTS = 10_000
"""Jobs of one launch of Hydra's basic sweeper: each is composed, validated and planned before the
first starts (about 0.1 s each), and Hydra lists them all in memory first."""
_LISTED = 16
"""A range of more values than this is represented by its two ends (an adaptive sweeper's space)."""


def _range(ov):
    value = ov.value()
    return value if isinstance(value, RangeSweep) else None


def sweep_size(ov) -> int | None:
    """How many values a sweep override gives; None for the forms only an adaptive sweeper reads
    (interval(), a tag() of one) or a range Hydra cannot expand (step 0: Hydra says so)."""
    r = _range(ov)
    if r is not None:
        try:
            start, stop, step = (decimal.Decimal(str(x)) for x in (r.start, r.stop, r.step))
        except (decimal.InvalidOperation, TypeError):
            return None
        if step == 0 or not all(x.is_finite() for x in (start, stop, step)):
            return None
        return max(0, math.ceil((stop - start) / step))
    if isinstance(ov.value(), IntervalSweep):
        return None
    try:  # a list, choice() (their values are on the command line already) or glob() (a group's files)
        return sum(1 for _ in ov.sweep_string_iterator())
    except Exception:  # tag(interval()) and friends: Hydra's own "not iterable" error
        return None


def first_value(ov) -> str | None:
    """The first value of a sweep override, without listing the others (a shuffled range: its start)."""
    r = _range(ov)
    if r is not None:
        if not sweep_size(ov):
            return None
        return _as_str(r.start)
    values = representative_values(ov)
    return values[0] if values else None


def representative_values(ov) -> list[str]:
    """Values of a sweep override a check can compose: a list / choice() / glob() / a short range
    gives all of them; a long range and interval() their two ends (tag() unwrapped)."""
    r = _range(ov)
    n = sweep_size(ov)
    if r is not None and n is not None and n > _LISTED:
        return [_as_str(r.start), _as_str(_last(r, n))]
    if n is not None:
        return list(islice(ov.sweep_string_iterator(), _LISTED if r is not None else None))
    v = ov.value()
    start, end = getattr(v, "start", None), getattr(v, "end", None)
    return [str(x) for x in (start, end) if x is not None]


def _last(r, n: int):
    if all(isinstance(x, int) for x in (r.start, r.stop, r.step)):
        return r.start + (n - 1) * r.step
    return float(decimal.Decimal(str(r.start)) + (n - 1) * decimal.Decimal(str(r.step)))


def _as_str(x) -> str:
    return Transformer.str(x)


def size_problems(sweeps: list, *, file_sweeps: tuple = ()) -> list[Problem]:
    """Hydra's basic sweeper runs the product of its sweeps' values: more than MAX_SWEEP_POINTS
    jobs is refused, naming each swept key and its number of values (counted, not listed)."""
    sizes = [(o, n) for o in sweeps if o.is_sweep_override() and (n := sweep_size(o)) is not None]
    total = math.prod(n for _, n in sizes)
    if total <= MAX_SWEEP_POINTS:
        return []
    counts = " x ".join(f"{o.key_or_group} ({n:,})" for o, n in sizes)
    where = "hydra.sweeper.params" if sizes and all(o in file_sweeps for o, _ in sizes) else "command line"
    return [
        Problem(
            " ".join(o.key_or_group for o, _ in sizes),
            " ".join(o.input_line for o, _ in sizes),
            f"is a sweep of {total:,} jobs ({counts}); Hydra's basic sweeper lists every job and qwen3exp "
            "checks each before the first starts",
            f"at most {MAX_SWEEP_POINTS:,} jobs per launch",
            "sweep fewer values (a few points of a range: range(0,100,25)), split the sweep into "
            "launches, or search the space with an adaptive sweeper (hydra/sweeper=optuna)",
            source=where,
        )
    ]


def single_problems(sweeps: list) -> list[Problem]:
    """A single sweep override of more than MAX_SWEEP_POINTS values that even an adaptive sweeper
    would list (shuffle() of a range, a config group's options), refused before it is listed."""
    problems = []
    for o in sweeps:
        r = _range(o)
        n = sweep_size(o) if r is not None else None
        if n is not None and n > MAX_SWEEP_POINTS and r.shuffle:
            problems.append(
                Problem(
                    o.key_or_group,
                    o.input_line.split("=", 1)[1],
                    f"shuffles a range of {n:,} values (Hydra lists them all first)",
                    f"at most {MAX_SWEEP_POINTS:,} values",
                    "drop shuffle() or sweep fewer values",
                    source="command line",
                )
            )
    return problems
