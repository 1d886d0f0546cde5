"""The limits of a config file, applied when a composition reads it, and only then.

Hydra reads only the files a composition selects (the primary config, each option chosen, the
defaults lists they name). A broken file elsewhere in a config folder (a half-written option on a
branch, a link that loops) must not stop a run that does not select it, and one that is selected
must be refused before Hydra parses it: Hydra parses a 50 MB file for minutes, OmegaConf copies each
use of a YAML alias (a 1 kB "billion laughs" file never ends), and a YAML error or a
`!!python/object/apply:...` tag ends in PyYAML's traceback.

- `file_problem`: a file that is not a regular file (a FIFO, a link that loops), is larger than
  MAX_FILE_BYTES, is not UTF-8, not YAML, holds a tag that is no plain YAML value or expands to
  more than MAX_VALUES values.
- `ReadGuard`: Hydra's config repository (`ConfigLoaderImpl.repository`, the one object through
  which Hydra loads every config file) with each file checked right before Hydra loads it; a
  `Composer` installs it on its loader (`guard`). A refused file raises ConfigError.
- `folder_problems`: a config folder that is no folder of config groups (a home folder: more than
  MAX_ENTRIES entries), which refuses the run; and the broken files under it, which only a warning
  names while no composition reads them.
"""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from qwen3exp.config.yaml_expansion import MAX_VALUES, PYTHON_TAG, shape
from qwen3exp.errors import ConfigError, Problem

MAX_FILE_BYTES = 1 << 20
"""A config file holds a few hundred lines; PyYAML reads about 1 MB per second."""
MAX_ENTRIES = 20_000
MAX_DEPTH = 8
"""Folders and files looked at under one config folder, and how deep: a config folder holds
config groups (model/, experiment/, ...), not a home folder or a virtual environment."""
ALLOWED = (
    f"a YAML file of at most {MAX_FILE_BYTES // (1 << 20)} MiB of plain values (no !!python/... tags) "
    f"whose values (each use of an alias counted) number at most {MAX_VALUES:,}"
)


def config_file(folder: str, config_path: str) -> Path:
    """The file Hydra's file config source reads for `config_path` (model/native: model/native.yaml)."""
    rel = config_path if config_path.endswith((".yaml", ".yml")) else f"{config_path}.yaml"
    return Path(folder) / rel


class ReadGuard:
    """Hydra's config repository (`inner`), each file checked (`file_problem`) before it is loaded:
    a file of a `file://` source that Hydra would read, or that stands before it (a link that
    loops, which Hydra would skip as missing). Files under `trusted` (the packaged conf/) are not
    checked. Hydra deep-copies its repository for each composition: the copies share the results."""

    def __init__(self, inner: Any, trusted: Path, results: dict | None = None) -> None:
        self.inner = inner
        self.trusted = trusted.resolve()
        self.results: dict[tuple, Problem | None] = {} if results is None else results

    def __getattr__(self, name: str) -> Any:  # everything but load_config is Hydra's own
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def __deepcopy__(self, memo: dict) -> ReadGuard:
        return ReadGuard(copy.deepcopy(self.inner, memo), self.trusted, self.results)

    def load_config(self, config_path: str):
        self.check(self.inner.get_sources(), config_path)
        return self.inner.load_config(config_path)

    def check(self, sources: list, config_path: str) -> None:
        """Raise ConfigError when the file Hydra would read for `config_path` from these sources
        (the first that holds it) breaks a limit."""
        for source in sources:
            if source.scheme() != "file":
                if source.is_config(config_path):
                    return
                continue
            path = config_file(source.path, config_path)
            if not os.path.lexists(path):
                continue
            if (problem := self.problem(path)) is not None:
                raise ConfigError([problem])
            if source.is_config(config_path):
                return

    def problem(self, path: Path) -> Problem | None:
        real = Path(os.path.realpath(path))
        if real.is_relative_to(self.trusted):
            return None
        try:
            st = os.stat(path)
            key: tuple = (str(path), st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            key = (str(path),)
        if key not in self.results:
            self.results[key] = file_problem(path, syntax=real.parent.name != ".hydra")
        return self.results[key]


def guard(loader: Any, trusted: Path) -> None:
    """Check every file this Hydra config loader reads (`ReadGuard`), for as long as it lives."""
    if not isinstance(loader.repository, ReadGuard):
        loader.repository = ReadGuard(loader.repository, trusted)


def folder_problems(folders: list[Path], checked: set[Path]) -> tuple[list[Problem], list[Problem]]:
    """(errors, broken): a folder with more than MAX_ENTRIES entries or deeper than MAX_DEPTH (an
    error), and every YAML file under these folders that breaks a limit (`file_problem`), which
    refuses only a composition that reads it. `checked`: folders already looked at (skipped, then
    added)."""
    errors: list[Problem] = []
    broken: list[Problem] = []
    for folder in folders:
        folder = folder.resolve()
        if folder in checked or not folder.is_dir():
            continue
        checked.add(folder)
        files, too_many = _yaml_files(folder)
        if too_many:
            errors.append(
                Problem(
                    "(config folder)",
                    str(folder),
                    f"holds more than {MAX_ENTRIES:,} entries (or folders deeper than {MAX_DEPTH} levels)",
                    "a folder of config groups (model/, data/, experiment/, ...)",
                    "point --config-dir (or hydra.searchpath) at the folder of your config groups",
                )
            )
        # A run's recorded .hydra/ (relaunch's config folder) holds Hydra's own records, which
        # Hydra does not parse (hydra.yaml may hold a redacted *** that is not YAML): sizes only.
        syntax = folder.name != ".hydra"
        broken += [p for f in files if (p := file_problem(f, syntax=syntax)) is not None]
    return errors, broken


def _yaml_files(folder: Path) -> tuple[list[Path], bool]:
    files: list[Path] = []
    seen, visited = 0, set()
    for root, dirs, names in os.walk(folder, followlinks=True):  # Hydra follows linked folders too
        depth = len(Path(root).relative_to(folder).parts)
        visited.add(os.path.realpath(root))  # a link back up is looked at once, not until the depth limit
        dirs[:] = [d for d in dirs if not d.startswith(".") and os.path.realpath(os.path.join(root, d)) not in visited]
        seen += len(dirs) + len(names)
        if seen > MAX_ENTRIES or (dirs and depth >= MAX_DEPTH):
            return files, True
        files += [Path(root) / n for n in sorted(names) if n.endswith((".yaml", ".yml"))]
    return files, False


def file_problem(path: Path, *, syntax: bool = True) -> Problem | None:
    """The limit this config file breaks, or None. `syntax=False`: sizes only (a run's .hydra/)."""
    try:
        st = path.stat()
    except OSError as e:
        return Problem("(config file)", str(path), f"cannot be read: {e.strerror or e}", ALLOWED, source=str(path))
    if not stat.S_ISREG(st.st_mode):
        why = "is not a regular file (a FIFO, a device?): Hydra would read it without end"
        return Problem("(config file)", str(path), why, ALLOWED, "replace it with a YAML file", source=str(path))
    if st.st_size > MAX_FILE_BYTES:
        return Problem(
            "(config file)",
            str(path),
            f"is {st.st_size / (1 << 20):,.1f} MiB; Hydra would parse it for minutes",
            ALLOWED,
            "keep data out of config folders; a config names data by path",
            source=str(path),
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        return Problem("(config file)", str(path), f"is not UTF-8 text (byte {e.start})", ALLOWED, source=str(path))
    except OSError as e:
        return Problem("(config file)", str(path), f"cannot be read: {e.strerror or e}", ALLOWED, source=str(path))
    try:
        held = shape(text)
    except yaml.YAMLError as e:  # Hydra would stop with the parser's traceback
        return yaml_problem(e, str(path)) if syntax else None
    if held.values > MAX_VALUES:
        what = "more than" if held.values == MAX_VALUES + 1 else f"{held.values:,},"
        return Problem(
            "(config file)",
            str(path),
            f"expands to {what} {MAX_VALUES:,} values through its YAML "
            "aliases (*name repeats the &name block): OmegaConf would copy each use without end",
            ALLOWED,
            "write the values out, or use ${key} interpolations instead of YAML aliases",
            source=str(path),
        )
    if held.tagged is not None:
        return _tag_problem(path, held.tagged)
    return None


def _tag_problem(path: Path, node: yaml.Node) -> Problem:
    tag = str(node.tag)
    shown = "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith(PYTHON_TAG) else tag
    where = f"line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"
    return Problem(
        "(config file)",
        str(path),
        f"holds the YAML tag {shown} at {where}: a config file holds plain values; a tag that builds "
        "Python objects (or runs a command) is never read",
        ALLOWED,
        "remove the tag; write the value itself",
        source=f"{path} at {where}",
    )


def yaml_problem(e: Exception, where: str | None = None) -> Problem:
    """A YAML syntax error in a config file: the file (`where`, else the parser's name for it), line
    and column."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = where or (f"{mark.name}" if mark is not None else "(a config file)")
    line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
    context, cm = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and cm is not None and mark is not None and cm.line != mark.line:
        what += f" ({context} at line {cm.line + 1}, column {cm.column + 1})"
    return Problem(
        "(config file)",
        where,
        f"YAML syntax error{line}: {what}",
        "valid YAML (key: value, indented with spaces; [ ] and { } closed)",
        source=f"{where}{line}",
    )


def warning_line(p: Problem) -> str:
    """A broken file no composition read, on one line."""
    return f"warning: {p.value}: {p.message}; not read by this run (a run that selects it is refused)"
