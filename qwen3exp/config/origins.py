"""Where each value of an experiment came from: a schema default, the root config, a group file, an
experiment file, or the command line.

Computed by walking Hydra's own defaults list (the files it composed, in composition order): each
file's keys, placed at the file's package, are attributed to that file, a later file overriding an
earlier one exactly as Hydra merges them; the command-line value overrides come last. Keys that no
file and no override set take the schema's default. This is correct for nested defaults lists and
for experiment files that swap groups (`override /model: ...`), because the defaults list Hydra
computes already reflects both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from qwen3exp.config.argv import parse_overrides
from qwen3exp.config.sources import SearchPath

SCHEMA_DEFAULT = "schema default"
ROOT_CONFIG = "root config"
GROUP_FILE = "group file"
EXPERIMENT_FILE = "experiment file"
COMMAND_LINE = "command line"


@dataclass(frozen=True)
class Source:
    kind: str
    """schema default | root config | group file | experiment file | command line"""
    where: str | None = None
    """The file (conf/model/native.yaml) or the override (training.steps=5)."""

    def __str__(self) -> str:
        return f"{self.kind} {self.where}" if self.where else self.kind


class Provenance:
    """Mapping from dotted leaf key (training.steps) to its `Source`."""

    def __init__(self, sources: dict[str, Source]) -> None:
        self.sources = sources

    @classmethod
    def with_overrides(cls, files: dict[str, Source], value_overrides: list) -> Provenance:
        """The files' sources, then the command line's value overrides (parsed) on top."""
        sources = dict(files)
        if value_overrides:
            for ov in value_overrides:
                key = ov.key_or_group
                if key.startswith("hydra."):
                    continue
                if ov.is_delete():
                    for k in [k for k in sources if k == key or k.startswith(key + ".")]:
                        del sources[k]
                    continue
                value = ov.value()
                for k in _leaves(value, key) if isinstance(value, dict) else [key]:
                    sources[k] = Source(COMMAND_LINE, ov.input_line)
        return cls(sources)

    def source(self, key: str) -> Source:
        """The source of a key; for a section, the single source of all its keys if there is one;
        for a key no file sets, the schema default."""
        if key in self.sources:
            return self.sources[key]
        under = {s for k, s in self.sources.items() if k.startswith(key + ".")}
        if len(under) == 1:
            return under.pop()
        if under:
            files = sorted({str(s) for s in under})
            return Source("several", "; ".join(files))
        return Source(SCHEMA_DEFAULT)

    def table(self, data: dict) -> list[tuple[str, Any, Source]]:
        """(key, value, source) for every leaf of the validated experiment, in schema order."""
        return [(k, v, self.source(k)) for k, v in _leaf_items(data, "")]

    def as_dict(self, data: dict) -> dict[str, dict]:
        return {k: {"value": v, "source": str(s)} for k, v, s in self.table(data)}


def file_sources(composer, group_key: tuple[str, ...]) -> dict[str, Source]:
    """Each key set by a file of the defaults list, attributed to the last file that sets it.
    `composer`: `defaults_list(group_key)` (Hydra's, with the search path), `loader` (Hydra's
    ConfigLoader), `config_name` and `searchpath` (the `hydra.searchpath` overrides), e.g.
    `qwen3exp.launchers.points.HydraFiles`. Files are looked up in the search path as Hydra looks
    them up (`qwen3exp.config.sources.SearchPath`): a user's `-cd` folder included."""
    search = SearchPath(composer.loader, composer.config_name, parse_overrides(list(composer.searchpath)))
    sources: dict[str, Source] = {}
    chosen_on_cli = {g.split("=", 1)[0].lstrip("+~").split("@")[0] for g in group_key}
    for d in composer.defaults_list(group_key):
        path = d.config_path
        if path is None or path.startswith("hydra/") or (d.package or "").startswith("hydra"):
            continue
        loaded = search.load(path)
        if loaded is None:
            continue
        node = OmegaConf.to_container(loaded.config, resolve=False)
        if not isinstance(node, dict):
            continue
        node.pop("defaults", None)
        src = _source(path, search.where(path), chosen_on_cli)
        for key in _leaves(node, d.package or ""):
            sources[key] = src
    return sources


def _source(config_path: str, where: str, chosen_on_cli: set[str]) -> Source:
    group = config_path.rsplit("/", 1)[0] if "/" in config_path else None
    if group is None:
        return Source(ROOT_CONFIG, where)
    if group.split("/")[0] == "experiment":
        return Source(EXPERIMENT_FILE, where)
    return Source(GROUP_FILE, where + (" (chosen on the command line)" if group in chosen_on_cli else ""))


def _leaves(node: Any, prefix: str) -> list[str]:
    return [k for k, _ in _leaf_items(node, prefix)]


def _leaf_items(node: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        out = []
        for k, v in node.items():
            out += _leaf_items(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, node)]
