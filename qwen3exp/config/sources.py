"""The config files of a composition: found the way Hydra finds them, shown so that a user can
open them, and checked before Hydra parses any of them.

- `SearchPath`: Hydra's config sources in Hydra's order: the primary config folder (the packaged
  conf/, or `--config-path`), plugins' search paths, then every `hydra.searchpath` entry (which
  `-cd DIR` becomes; Hydra appends them after its own sources, and the first source that holds a
  file wins). Hydra's `ConfigLoader.get_sources()` lists the sources it started with only, not the
  search path a composition adds, so a user's files would not be found through it.
- `SearchPath.load`: a file read here is checked first (`file_limits`), as Hydra's own reads are.
- `headless_problems`: an experiment file must start with `# @package _global_` (else Hydra nests
  its keys under `experiment.`, or fails on its `override /group:` lines with "Could not override").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigSource
from omegaconf import OmegaConf

from qwen3exp.config.file_limits import ReadGuard
from qwen3exp.errors import Problem

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
        repository = getattr(loader, "repository", None)  # Hydra's own loader (a Composer's)
        self._guard: ReadGuard | None = repository if isinstance(repository, ReadGuard) else None
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
        """Hydra's ConfigResult (config, header) of the first file of this name; None: none. The file
        is checked first (`file_limits.ReadGuard`: raises ConfigError)."""
        if self._guard is not None:
            self._guard.check([s.source for s in self._sources], config_path)
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
