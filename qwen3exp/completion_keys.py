"""The schema's keys as a TAB completes them, kept in a small cache file.

Building the schema's pydantic models is most of a TAB's time (0.4-0.8 s of CPU on a loaded 2-core
machine, against 0.05 s for the interpreter), so the table of keys is built from the schema once and
kept in `$XDG_CACHE_HOME/qwen3exp/completion-keys.json` (`~/.cache/...` without it), stamped with
the paths, sizes and modification times of the schema's source files (qwen3exp/config/) and of this
file: an edited or reinstalled schema is read again at the next TAB. The cache holds plain strings
that are only printed; one that cannot be read is rebuilt, one that cannot be written is skipped, so
completion never fails on it.

The table (`table()`): each candidate with the values it allows, `{"training.": [], "training.lr=":
[], "dry_run=": ["true", "false"], "model.attention=": ["auto", "sdpa", "flex"], ...}`; a section
ends with `.`, a key with `=`; a union's section has the keys of every variant (`model.hf_model=` is
a key of model=hf only); the values are a Literal's choices, true/false and null.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pydantic import BaseModel

SCHEMA_SOURCES = Path(__file__).with_name("config")
"""The package the schema is built from (its sections, rules and constants)."""
CACHE_NAME = "completion-keys.json"
MAX_DEPTH = 8
"""Sections nested deeper are not walked (the schema has two levels; a recursive model would loop)."""


def table(cache_dir: Path | None = None) -> dict[str, list[str]]:
    """The completion table, from the cache when its stamp is the schema's (`cache_dir`: default
    `cache_folder()`)."""
    folder = cache_dir or cache_folder()
    stamp = schema_stamp()
    cached = _read(folder / CACHE_NAME) if folder else None
    if cached is not None and cached.get("stamp") == stamp:
        return cached["table"]
    built = build()
    if folder:
        _write(folder / CACHE_NAME, {"stamp": stamp, "table": built})
    return built


def cache_folder() -> Path | None:
    """$XDG_CACHE_HOME/qwen3exp, else ~/.cache/qwen3exp; None without a home folder."""
    base = os.environ.get("XDG_CACHE_HOME")
    try:
        return Path(base or Path.home() / ".cache") / "qwen3exp"
    except RuntimeError:  # no HOME and no user entry
        return None


def schema_stamp() -> str:
    """The schema's source files as they are now: paths, sizes, modification times."""
    files = sorted([*SCHEMA_SOURCES.rglob("*.py"), Path(__file__)])
    lines = []
    for f in files:
        st = f.stat()
        lines.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    table = data.get("table") if isinstance(data, dict) else None
    valid = isinstance(table, dict) and all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v) for k, v in table.items()
    )
    return data if valid else None


def _write(path: Path, data: dict) -> None:
    """Written whole or not at all (a temporary file renamed), by this process only."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):  # no folder to write in: nothing was written
            tmp.unlink()


def build() -> dict[str, list[str]]:
    """The table, from `qwen3exp.config.schema.Experiment`."""
    from qwen3exp.config.schema import Experiment  # lazy: pydantic builds every section's model (0.4 s)

    found: dict[str, list[str]] = {}
    _walk([Experiment], "", found, 0)
    return found


def _walk(models: list[type[BaseModel]], prefix: str, found: dict[str, list[str]], depth: int) -> None:
    for model in models:
        for name, fld in model.model_fields.items():
            sections = _models(fld.annotation)
            if sections:
                found.setdefault(f"{prefix}{name}.", [])
                if depth < MAX_DEPTH:
                    _walk(sections, f"{prefix}{name}.", found, depth + 1)
                continue
            values = found.setdefault(f"{prefix}{name}=", [])
            values += [v for v in _values(fld.annotation) if v not in values]


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The sections an annotation names: the model, each variant of a union, through Annotated/Optional."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):  # a pydantic model
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _models(a)]
    return []


def _values(annotation: Any) -> list[str]:
    if annotation is bool:
        return ["true", "false"]
    if annotation is type(None):
        return ["null"]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return [str(a).lower() if isinstance(a, bool) else str(a) for a in args]
    if origin is typing.Annotated:
        return _values(args[0])
    if origin in (typing.Union, types.UnionType):
        return [v for a in args for v in _values(a)]
    return []
