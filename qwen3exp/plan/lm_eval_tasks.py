"""Where the tasks of `eval=lm_eval` are defined: lm-evaluation-harness task YAML files, found as
lm-eval finds them, read without importing lm-eval (its task index takes a minute to build here).

lm-eval's TaskManager indexes its own task folder and then the `include_path` folders, a later
definition of a name winning; qwen3exp passes the bundled folder (`qwen3exp/assets/lm_eval`) and
then `eval.include_path`. A name is a task (`task: name`), a group (`group: name`, its members
under `task:`) or a tag (`tag:` on tasks: all of them). Task files are plain YAML with lm-eval's
`!function module.name` tag (read here as text: nothing is imported) and `include: other.yaml`
(read relative to the file, the including file's keys winning).

The small folders (bundled, include_path) are read whole; lm-eval's ~14,000 built-in files are only
scanned for their top-level `task:`, `group:` and `tag:` lines (a few seconds, once per process)
and then only when a task is not in the folders, and a file is read once its name is asked for.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

MAX_DEPTH = 4
"""Group members are followed this deep (groups of groups of tags ...), and includes this deep."""
_IGNORE_DIRS = {"__pycache__", ".ipynb_checkpoints"}
_TOP = re.compile(r"^(task|group):[ \t]*['\"]?([^\s'\"#\[\]]+)", re.M)
_TAG_INLINE = re.compile(r"^tag:[ \t]*\[?([^\n\]#]+)\]?", re.M)
_TAG_BLOCK = re.compile(r"^tag:[ \t]*\n((?:[ \t]+-[ \t]*\S+[ \t]*\n?)+)", re.M)


class _Loader(yaml.SafeLoader):
    """YAML with lm-eval's `!function` tag kept as text (never imported)."""


_Loader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")  # type: ignore[arg-type]


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    """task, group or tag."""
    paths: tuple[Path, ...]
    """The YAML that defines it (a tag: the YAML files of its tasks)."""


@dataclass
class Index:
    """The names one folder defines (the later of two definitions in one folder is ignored, as lm-eval does)."""

    entries: dict[str, Entry] = field(default_factory=dict)

    def add(self, name: str, kind: str, path: Path) -> None:
        if kind == "tag":
            old = self.entries.get(name)
            if old is None or old.kind == "tag":
                self.entries[name] = Entry(name, "tag", (*(old.paths if old else ()), path))
        elif name not in self.entries or self.entries[name].kind == "tag":
            self.entries[name] = Entry(name, kind, (path,))


def read_task(path: Path, depth: int = 0) -> dict:
    """A task file's keys, its includes merged under them; {} when it does not read as YAML."""
    try:
        cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    includes = cfg.pop("include", None)
    merged: dict = {}
    for inc in (includes if isinstance(includes, list) else [includes]) if includes and depth < MAX_DEPTH else []:
        merged.update(read_task(path.parent / str(inc), depth + 1))
    return {**merged, **cfg}


def tags_of(cfg: dict) -> list[str]:
    tag = cfg.get("tag")
    return [str(t) for t in (tag if isinstance(tag, list) else [tag] if tag else [])]


def _yaml_files(root: Path) -> list[Path]:
    return sorted((p for p in root.glob("**/*.yaml") if not _IGNORE_DIRS & set(p.parts)), key=lambda p: p.as_posix())


@functools.lru_cache(maxsize=16)
def folder_index(folder: str) -> Index:
    """Every name a task folder (bundled, include_path) defines, each file read whole."""
    index = Index()
    for path in _yaml_files(Path(folder)):
        cfg = read_task(path)
        if isinstance(cfg.get("group"), str):
            index.add(cfg["group"], "group", path)
        elif isinstance(cfg.get("task"), str):
            index.add(cfg["task"], "task", path)
            for tag in tags_of(cfg):
                index.add(tag, "tag", path)
    return index


def builtin_folder() -> Path | None:
    """lm-eval's own task folder (lm_eval/tasks of the installed package), None without lm-eval."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "tasks"
    return folder if folder.is_dir() else None


@functools.lru_cache(maxsize=1)
def builtin_index() -> Index:
    """lm-eval's built-in names, from the top-level lines of its task files (see the module docstring)."""
    index = Index()
    folder = builtin_folder()
    for path in _yaml_files(folder) if folder is not None else []:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for kind, name in _TOP.findall(text):
            index.add(name, kind, path)
        tags = [t for m in _TAG_INLINE.findall(text) for t in m.split(",")]
        tags += [line.strip().lstrip("-").strip() for m in _TAG_BLOCK.findall(text) for line in m.splitlines()]
        for tag in filter(None, (t.strip().strip("'\"") for t in tags)):
            index.add(tag, "tag", path)
    return index


def find(name: str, folders: list[Path]) -> tuple[Entry | None, bool]:
    """(where `name` is defined, whether that is lm-eval's built-in folder): the last of `folders`
    that defines it, else lm-eval's own tasks; (None, False) when nothing does."""
    for folder in reversed(folders):
        if (entry := folder_index(str(folder)).entries.get(name)) is not None:
            return entry, False
    entry = builtin_index().entries.get(name)
    return entry, entry is not None


def local_names(folders: list[Path]) -> list[str]:
    """The names the folders define (for a message's "allowed")."""
    return sorted({n for f in folders for n in folder_index(str(f)).entries})


def members(entry: Entry) -> list[str | dict]:
    """A group's `task:` list (names, or inline task dicts); a tag's task names."""
    if entry.kind == "tag":
        return [t for p in entry.paths if isinstance(t := read_task(p).get("task"), str)]
    listed = read_task(entry.paths[0]).get("task") if entry.kind == "group" else None
    return [m for m in (listed if isinstance(listed, list) else []) if isinstance(m, (str, dict))]
