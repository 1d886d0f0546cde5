"""What `data=hf` reads: the files of a dataset by name (the local Hugging Face cache) or by files.

A name (`org/name`, `org/name@revision`) is resolved offline, like a model reference
(`qwen3exp.plan.model_ref`): huggingface_hub's own cache lookup (`snapshot_download(...,
repo_type="dataset", local_files_only=True)`) finds `datasets--org--name/snapshots/<commit>` in
HF_HUB_CACHE (else HF_HOME/hub); a name the cache does not hold is a Problem whose hint is the exact
command that fetches it. `files` is a data file, a folder or a glob.

In a folder (a snapshot, or `files` naming a folder) the split's files are chosen as the `datasets`
library chooses them, in plain Python (no `datasets` import before launch):
- the README's `configs` (its YAML header): the subset is a `config_name` (null: the one marked
  `default: true`, else the one named "default", else the only one), its `data_files` map splits to
  globs;
- otherwise the subset is null (or a top folder, the layout of the Hub's parquet conversion), and a
  file belongs to a split when its name or a folder above it holds the split's keyword (train,
  training; validation, valid, dev, val; test, testing, eval, evaluation) between non-word
  characters (`-._ 0-9`, or the path's ends); when no file holds a keyword, every file is `train`.
Of the files found, those of the most common format are read (parquet, json, arrow or csv: the
`datasets` builder the ranks load them with, `qwen3exp.titan.dataset`).
"""

from __future__ import annotations

import glob
import re
import shlex
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from qwen3exp.errors import Problem, did_you_mean, nearby_path
from qwen3exp.plan import model_ref

BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow", ".csv": "csv"}
"""A data file's suffix -> the `datasets` builder that reads it."""
SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
"""The names a split's files carry (datasets.data_files.SPLIT_KEYWORDS); any other split: its name."""
_SEP = r"[-._ 0-9]"
_GLOB = re.compile(r"[*?\[]")
_ALLOWED_FILES = "a parquet, .jsonl/.json, .arrow or .csv file, a folder of them, or a glob matching them"


@dataclass(frozen=True)
class HFSource:
    """The files data=hf reads, resolved."""

    key: str
    """data.name or data.files."""
    value: str
    builder: str
    """The `datasets` builder: parquet, json, arrow or csv."""
    files: tuple[str, ...]
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    """The cached snapshot's commit (a dataset by name)."""

    def describe(self) -> str:
        """`org/name@main (Hugging Face cache snapshot <commit>): 2 parquet file(s): a, b`."""
        where = f"{self.repo_id}@{self.revision or 'main'} (Hugging Face cache snapshot {self.commit})"
        shown = ", ".join(self.files[:3]) + (f" and {len(self.files) - 3} more" if len(self.files) > 3 else "")
        return f"{where if self.repo_id else self.value}: {len(self.files)} {self.builder} file(s): {shown}"


def fetch_command(repo_id: str, revision: str | None) -> str:
    argv = ["hf", "download", repo_id, "--repo-type", "dataset"]
    return shlex.join(argv + (["--revision", revision] if revision else []))


def resolve(data) -> tuple[HFSource | None, list[Problem]]:
    """The files of `data` (an HFData section), or the problems that name the key to fix."""
    if data.name is not None:
        return _by_name(data)
    return _by_files(data)


def _by_name(data) -> tuple[HFSource | None, list[Problem]]:
    hub = model_ref.split(data.name)
    if hub is None or "/" not in hub[0]:
        return None, [
            Problem(
                "data.name",
                data.name,
                "is not a dataset repo id",
                "org/name or org/name@revision, in the local Hugging Face cache",
                "local files go in data.files" if Path(data.name).expanduser().exists() else None,
            )
        ]
    repo_id, rev = hub
    folder = cached_snapshot(repo_id, rev)
    if folder is None:
        return None, [
            Problem(
                "data.name",
                data.name,
                f"the local Hugging Face cache ({model_ref.hub_cache_dir()}) holds no dataset {repo_id} at revision "
                f"{rev or 'main'} (nothing is downloaded)",
                "a dataset repo id (org/name[@revision]) in the local Hugging Face cache (HF_HUB_CACHE or HF_HOME)",
                f"fetch it first: {fetch_command(repo_id, rev)}",
            )
        ]
    found, problems = folder_files(folder, data.split, data.subset)
    if problems:
        return None, problems
    builder, files = found
    return HFSource("data.name", data.name, builder, files, repo_id, rev, folder.name), []


def cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot folder of dataset `repo_id` at `revision`, or None (huggingface_hub's offline
    lookup); also where the datasets of eval=lm_eval's tasks are looked up (`qwen3exp.plan.eval_tasks`)."""
    from huggingface_hub import snapshot_download  # lazy: a network client; only when a dataset is named
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError  # lazy: the same

    try:
        path = snapshot_download(repo_id, repo_type="dataset", revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError, OSError, ValueError):
        return None
    folder = Path(str(path))
    return folder if folder.is_dir() else None


def _by_files(data) -> tuple[HFSource | None, list[Problem]]:
    value = str(data.files)
    path = Path(value).expanduser()
    if path.is_dir():
        found, problems = folder_files(path, data.split, data.subset)
        if problems:
            return None, problems
        return HFSource("data.files", value, *found), []
    if _GLOB.search(value):
        files = sorted(f for f in glob.glob(str(path), recursive=True) if Path(f).is_file())
        if not any(Path(f).suffix in BUILDERS for f in files):
            return None, [Problem("data.files", value, "matches no data file", _ALLOWED_FILES)]
    elif not path.exists():
        return None, [Problem("data.files", value, "does not exist", _ALLOWED_FILES, nearby_path(path))]
    elif path.suffix not in BUILDERS:
        return None, [Problem("data.files", value, f"unsupported file type {path.suffix or '(none)'}", _ALLOWED_FILES)]
    else:
        files = [str(path)]
    kinds = sorted({BUILDERS[Path(f).suffix] for f in files if Path(f).suffix in BUILDERS})
    problems = []
    if len(kinds) > 1:
        problems.append(Problem("data.files", value, f"mixes formats ({', '.join(kinds)})", "files of one format"))
    for key, given, default in (("data.split", data.split, "train"), ("data.subset", data.subset, None)):
        if given != default:
            problems.append(
                Problem(
                    key,
                    given,
                    "chooses files in a dataset folder, and data.files names a file or a glob (read whole, as train)",
                    repr(default) if default else "null",
                    "give data.files a folder, or a glob of the files wanted",
                )
            )
    if problems:
        return None, problems
    return HFSource("data.files", value, kinds[0], tuple(f for f in files if Path(f).suffix in BUILDERS)), []


def folder_files(folder: Path, split: str, subset: str | None) -> tuple[tuple[str, tuple[str, ...]], list[Problem]]:
    """((builder, files), []) for the split of the subset of a dataset folder, or (_, problems)."""
    configs = readme_configs(folder)
    if configs:
        globs, problems = _config_globs(configs, split, subset)
        files = sorted({str(f) for g in globs for f in folder.glob(g) if f.is_file()})
    else:
        base, problems = _subset_folder(folder, subset)
        files = split_files(base, split, problems) if not problems else []
    if problems:
        return ("", ()), problems
    by_kind = Counter(BUILDERS[Path(f).suffix] for f in files if Path(f).suffix in BUILDERS)
    if not by_kind:
        return ("", ()), [Problem("data.split", split, f"{folder} holds no data file for this split", _ALLOWED_FILES)]
    kind = by_kind.most_common(1)[0][0]
    return (kind, tuple(f for f in files if BUILDERS.get(Path(f).suffix) == kind)), []


def readme_configs(folder: Path) -> list[dict]:
    """The `configs` of the dataset card's YAML header (README.md), [] when it has none."""
    try:
        text = (folder / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    m = re.match(r"---\r?\n(.*?)\r?\n---", text, re.S)
    try:
        header = yaml.safe_load(m[1]) if m else None
    except yaml.YAMLError:
        return []
    configs = header.get("configs") if isinstance(header, dict) else None
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []


def _config_globs(configs: list[dict], split: str, subset: str | None) -> tuple[list[str], list[Problem]]:
    names = [str(c.get("config_name", "default")) for c in configs]
    if subset is None:
        chosen = [c for c in configs if c.get("default")] or [c for c in configs if c.get("config_name") == "default"]
        if not chosen and len(configs) == 1:
            chosen = configs
        if not chosen:
            return [], [
                Problem("data.subset", None, "the dataset has several subsets and no default", ", ".join(names))
            ]
    else:
        chosen = [c for c, n in zip(configs, names, strict=True) if n == subset]
        if not chosen:
            return [], [Problem("data.subset", subset, "no such subset", ", ".join(names), did_you_mean(subset, names))]
    config = chosen[0]
    splits = _config_splits(config.get("data_files"))
    if split not in splits:
        return [], [Problem("data.split", split, "no such split in this subset", ", ".join(splits) or "none")]
    prefix = f"{config['data_dir']}/" if config.get("data_dir") else ""
    return [prefix + g for g in splits[split]], []


def _config_splits(data_files) -> dict[str, list[str]]:
    """A config's data_files (a glob, globs, {split: globs} or [{split, path}]) as split -> globs."""
    as_list = lambda v: [str(v)] if isinstance(v, str) else [str(x) for x in v or []]  # noqa: E731
    if isinstance(data_files, dict):
        return {str(k): as_list(v) for k, v in data_files.items()}
    if isinstance(data_files, list) and all(isinstance(d, dict) for d in data_files):
        return {str(d.get("split", "train")): as_list(d.get("path")) for d in data_files}
    return {"train": as_list(data_files or "**")}


def _subset_folder(folder: Path, subset: str | None) -> tuple[Path, list[Problem]]:
    if subset is None or subset == "default":
        return folder, []
    if (folder / subset).is_dir():
        return folder / subset, []
    tops = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    return folder, [
        Problem(
            "data.subset",
            subset,
            "the dataset has no README configs and no such top folder",
            f"null{', ' + ', '.join(tops) if tops else ''}",
            did_you_mean(subset, tops),
        )
    ]


def split_files(base: Path, split: str, problems: list[Problem]) -> list[str]:
    """The files of `split` under `base` by their names (see the module's docstring); appends a Problem
    naming data.split when the split has none."""
    rel = sorted(
        str(f.relative_to(base)).replace("\\", "/")
        for f in base.rglob("*")
        if f.is_file()
        and f.suffix in BUILDERS
        and not any(p.startswith((".", "__")) for p in f.relative_to(base).parts)
    )
    by_split = {s: [f for f in rel if _has_keyword(f, kws)] for s, kws in SPLIT_KEYWORDS.items()}
    if split not in SPLIT_KEYWORDS:
        by_split[split] = [f for f in rel if _has_keyword(f, (split,))]
    if not any(by_split.values()):
        by_split = {"train": rel}
    if not by_split.get(split):
        found = [s for s, fs in by_split.items() if fs]
        problems.append(Problem("data.split", split, "no file of the dataset is in this split", ", ".join(found)))
        return []
    return [str(base / f) for f in by_split[split]]


def _has_keyword(rel: str, keywords: tuple[str, ...]) -> bool:
    """A keyword in the file's name (`train-0.parquet`, `x_train.csv`) or in a folder above it
    (`train/`, `train_1/`, `x-train/`): datasets' KEYWORDS_IN_FILENAME / _DIR_NAME patterns."""
    *dirs, name = rel.split("/")
    for kw in map(re.escape, keywords):
        if re.match(rf"{kw}{_SEP}|.*{_SEP}{kw}{_SEP}", name):
            return True
        if any(re.fullmatch(rf"(.*{_SEP})?{kw}({_SEP}.*)?", d) for d in dirs):
            return True
    return False


def arrow_batches(path: Path) -> list:
    """The record batches of an .arrow file, in the stream format `datasets` writes or the file format."""
    import pyarrow as pa  # type: ignore[import-untyped]  # lazy: from datasets; arrow files only

    source = pa.memory_map(str(path))  # not closed here: the batches read from the mapping (freed with them)
    try:
        return list(pa.ipc.open_stream(source))
    except pa.ArrowInvalid:
        reader = pa.ipc.open_file(source)
        return [reader.get_batch(i) for i in range(reader.num_record_batches)]
