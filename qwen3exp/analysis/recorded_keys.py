"""The keys of a recorded run's config, as `qwen3exp.analysis.recorded_config` and
`qwen3exp.analysis.recorded_hydra` look at them: walked depth first, named by their dotted key, and
refused as code (a Problem whose hint says why a recorded run directory is data)."""

from __future__ import annotations

from qwen3exp.errors import Problem

DATA_NOT_CODE = (
    "a recorded run directory is data and qwen3exp never runs code from it; if you wrote "
    "this yourself, put it in an experiment file and run python -m qwen3exp"
)


def refused(key: str, value, why: str, allowed: str | None = None) -> Problem:
    """The Problem of a key that would make relaunching the run run code."""
    return Problem(key, value, why, allowed, hint=f"refused: {DATA_NOT_CODE}")


def walk(node, path: tuple[str, ...] = ()):
    """(path of the parent, key, value) of every mapping entry, depth first; list items are `[i]`."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, str(key), value
            yield from walk(value, (*path, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, (*path, f"[{i}]"))


def dotted_key(path: str | tuple[str, ...], key: str) -> str:
    """The dotted key of `key` under `path` (list items as `[i]`): hydra.callbacks.x._target_."""
    out = ""
    for part in ((path,) if isinstance(path, str) else path) + (key,):
        if part:
            out += part if (part.startswith("[") or not out) else "." + part
    return out
