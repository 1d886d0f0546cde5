"""The config files of a composition: found the way Hydra finds them, shown so that a user can
open them, and checked before Hydra parses any of them.

- `SearchPath`: Hydra's config sources in Hydra's order: the primary config folder (the packaged
  conf/, or `--config-path`), plugins' search paths, then every `hydra.searchpath` entry (which
  `-cd DIR` becomes; Hydra appends them after its own sources, and the first source that holds a
  file wins). Hydra's `ConfigLoader.get_sources()` lists the sources it started with only, not the
  search path a composition adds, so a user's files would not be found through it.
- `file_problems`: size and shape limits of every YAML file under the file folders of the search
  path, applied before Hydra reads them: Hydra parses a 50 MB file for minutes, and OmegaConf
  copies each use of a YAML alias, so a 1 kB "billion laughs" file (anchors of anchors) never ends.
- `headless_problems`: an experiment file must start with `# @package _global_` (else Hydra nests
  its keys under `experiment.`, or fails on its `override /group:` lines with "Could not override").
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigSource
from omegaconf import OmegaConf

from qwen3exp.config.yaml_expansion import MAX_VALUES, expanded_values
from qwen3exp.errors import Problem

MAX_FILE_BYTES = 1 << 20
"""A config file holds a few hundred lines; PyYAML reads about 1 MB per second."""
MAX_ENTRIES = 20_000
MAX_DEPTH = 8
"""Folders and files looked at under one config folder, and how deep: a config folder holds
config groups (model/, experiment/, ...), not a home folder or a virtual environment."""
HEADER = "_global_"
SEARCHPATH_KEY = "hydra.searchpath"


@dataclass(frozen=True)
class _Source:
    source: Any
    """Hydra's ConfigSource."""
    user: bool
    """A `hydra.searchpath` entry (`-cd DIR`): its files are shown by their full path."""


class SearchPath:
    """Hydra's config sources for a composition with these (parsed) overrides."""

    def __init__(self, loader: Any, config_name: str | None, overrides: list) -> None:
        self.config_name = config_name
        self._sources = [_Source(s, False) for s in loader.get_sources() if s.provider not in ("hydra", "schema")]
        self._sources += [_Source(s, True) for s in _user_sources(self.searchpath(overrides))]

    def searchpath(self, overrides: list) -> list[str]:
        """`hydra.searchpath` of the command line or, as Hydra reads it, of the primary config."""
        for ov in overrides:
            if ov.key_or_group == SEARCHPATH_KEY and not ov.is_delete():
                value = ov.value()
                return [str(v) for v in (value if isinstance(value, list) else [value])]
        primary = self.load(self.config_name) if self.config_name else None
        if primary is None:
            return []
        listed = OmegaConf.select(primary.config, SEARCHPATH_KEY, default=None, throw_on_resolution_failure=False)
        return [str(v) for v in listed] if OmegaConf.is_list(listed) else []

    def _find(self, config_path: str) -> _Source | None:
        for s in self._sources:
            if s.source.is_config(config_path):
                return s
        return None

    def load(self, config_path: str):
        """Hydra's ConfigResult (config, header) of the first file of this name; None: none."""
        found = self._find(config_path)
        return found.source.load_config(config_path) if found is not None else None

    def where(self, config_path: str) -> str:
        """The file as shown: `conf/model/native.yaml` in the primary config folder (the packaged
        one: its folder name), a user's file (`-cd`) by its full path."""
        found = self._find(config_path)
        rel = f"{config_path}.yaml" if not config_path.endswith((".yaml", ".yml")) else config_path
        if found is None:
            return f"conf/{rel}"
        s = found.source
        if s.scheme() != "file":
            return f"{s.scheme()}://{s.path}/{rel}"
        return str(Path(s.path) / rel) if found.user else f"{Path(s.path).name}/{rel}"

    def folders(self) -> list[Path]:
        """The folders of the file sources (the primary config folder first)."""
        return [Path(s.source.path) for s in self._sources if s.source.scheme() == "file"]


def _user_sources(entries: list[str]) -> list:
    """Hydra's ConfigSource of each search path entry, found through Hydra's public plugin discovery
    (file://, pkg://); an entry of another scheme is left to Hydra (it reports it)."""
    kinds: dict[str, Any] = {c.scheme(): c for c in Plugins.instance().discover(ConfigSource)}  # type: ignore[attr-defined]
    out = []
    for entry in entries:
        scheme = entry.split("://", 1)[0] if "://" in entry else "file"
        if scheme in kinds:
            out.append(kinds[scheme]("hydra.searchpath", entry if "://" in entry else f"file://{entry}"))
    return out


# ------------------------------------------------------------------------------ limits
def file_problems(folders: list[Path], checked: set[Path]) -> list[Problem]:
    """Every YAML file under these folders that is not a regular file, is larger than
    MAX_FILE_BYTES, is not UTF-8 or expands to more than MAX_VALUES values; `checked`: folders
    already looked at (skipped, then added)."""
    problems: list[Problem] = []
    for folder in folders:
        folder = folder.resolve()
        if folder in checked or not folder.is_dir():
            continue
        checked.add(folder)
        files, too_many = _yaml_files(folder)
        if too_many:
            problems.append(
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
        problems += [p for f in files if (p := _file_problem(f, syntax=syntax)) is not None]
    return problems


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


def _file_problem(path: Path, *, syntax: bool = True) -> Problem | None:
    allowed = (
        f"a YAML file of at most {MAX_FILE_BYTES // (1 << 20)} MiB whose values (each use of an alias "
        f"counted) number at most {MAX_VALUES:,}"
    )
    try:
        st = path.stat()
    except OSError as e:
        return Problem("(config file)", str(path), f"cannot be read: {e.strerror or e}", allowed)
    if not stat.S_ISREG(st.st_mode):
        return Problem(
            "(config file)",
            str(path),
            "is not a regular file (a FIFO, a device?): Hydra would read it without end",
            allowed,
            "replace it with a YAML file",
            source=str(path),
        )
    if st.st_size > MAX_FILE_BYTES:
        return Problem(
            "(config file)",
            str(path),
            f"is {st.st_size / (1 << 20):,.1f} MiB; Hydra would parse it for minutes",
            allowed,
            "keep data out of config folders; a config names data by path",
            source=str(path),
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        return Problem("(config file)", str(path), f"is not UTF-8 text (byte {e.start})", allowed, source=str(path))
    except OSError as e:
        return Problem("(config file)", str(path), f"cannot be read: {e.strerror or e}", allowed)
    try:
        values = expanded_values(text)
    except yaml.YAMLError as e:  # Hydra would stop with the parser's traceback
        return yaml_problem(e, str(path)) if syntax else None
    if values > MAX_VALUES:
        what = "more than" if values == MAX_VALUES + 1 else f"{values:,},"
        return Problem(
            "(config file)",
            str(path),
            f"expands to {what} {MAX_VALUES:,} values through its YAML "
            "aliases (*name repeats the &name block): OmegaConf would copy each use without end",
            allowed,
            "write the values out, or use ${key} interpolations instead of YAML aliases",
            source=str(path),
        )
    return None


# ------------------------------------------------------------------------------ experiment files
def default_experiment(search: SearchPath) -> str | None:
    """The experiment option the primary config's defaults list chooses (`- experiment: NAME`)."""
    primary = search.load(search.config_name) if search.config_name else None
    defaults = OmegaConf.select(primary.config, "defaults", default=None) if primary is not None else None
    for entry in defaults if defaults is not None and OmegaConf.is_list(defaults) else []:
        if OmegaConf.is_dict(entry) and len(entry) == 1:
            key, value = next(iter(entry.items()))
            group = str(key).removeprefix("override ").removeprefix("optional ").strip().lstrip("/")
            if group == "experiment" and isinstance(value, str):
                return value
    return None


def headless_problems(search: SearchPath, choices: list[str]) -> list[Problem]:
    """Each of these experiment files that does not start with `# @package _global_`, whatever it
    holds (read through Hydra's config source, which reads the header from the file's first lines)."""
    problems = []
    for choice in choices:
        path = f"experiment/{choice}"
        loaded = search.load(path)
        if loaded is None or loaded.header.get("package") == HEADER:
            continue
        problems.append(headless_problem(choice, search.where(path), loaded.header.get("package")))
    return problems


def headless_problem(choice: str, where: str, package: str | None, nested: list[str] | None = None) -> Problem:
    """An experiment file without `# @package _global_` as its first line."""
    first = f"starts with '# @package {package}'" if package else "does not start with the line '# @package _global_'"
    keys = f" ({', '.join(f'experiment.{k}' for k in nested[:4])})" if nested else ""
    return Problem(
        "experiment",
        choice,
        f"{where} {first}, so Hydra would put its keys under experiment.{keys} "
        "instead of the top level (and its `override /group:` lines fail)",
        "experiment files whose first line is # @package _global_",
        "add '# @package _global_' as the file's first line",
        source=where,
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
