"""A model reference: what `model.hf_assets_path`, `model.hf_model` and `checkpoint.path` accept.

A reference is a local folder, or a Hugging Face Hub id with an optional revision
(`Qwen/Qwen3-4B-Instruct-2507`, `Qwen/Qwen3-4B-Instruct-2507@<commit or branch>`, or the id with
the section's `revision` key). A Hub id is resolved offline, through huggingface_hub's own cache
lookup (`snapshot_download(..., local_files_only=True)`), in the cache huggingface_hub uses
(`HF_HUB_CACHE`, else `HF_HOME/hub`): the result is the snapshot folder and its commit. Nothing is
ever downloaded; a reference the cache does not hold is a Problem whose hint is the exact command
that fetches it (`hf download ID --revision REV`).

An existing local folder always wins (`models/Qwen3-4B` is a folder if it exists, else it is tried
as a Hub id). Cheap: huggingface_hub is imported only for a reference that is not a local folder.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.errors import Problem, nearby_path

QWEN3_RELEASES = tuple(
    f"Qwen3-{n}"
    for n in (
        *(f"{size}{base}" for size in ("0.6B", "1.7B", "4B", "8B", "14B", "30B-A3B") for base in ("", "-Base")),
        "32B",
        "235B-A22B",
        *(f"{size}-{kind}-2507" for size in ("4B", "30B-A3B", "235B-A22B") for kind in ("Instruct", "Thinking")),
    )
)
"""Qwen3 models the Hub holds as `Qwen/<name>` (the Qwen3 and Qwen3-2507 releases). A missing
folder named like one of them (`models/Qwen3-4B-Instruct-2507`, the trn2 experiments' default) is
that model not yet downloaded: its hint names the real Hub id and `--local-dir`, where the folder
taken as a Hub id would give `hf download models/Qwen3-4B-Instruct-2507`, which does not exist."""

# A Hub id: `name` or `namespace/name` (letters, digits, - _ .), then optionally `@revision`.
# huggingface_hub's validate_repo_id decides in the end; this only rules out obvious paths.
_HUB_ID = re.compile(r"^(?P<id>[A-Za-z0-9][\w.\-]*(?:/[\w.\-]+)?)(?:@(?P<rev>[^\s@]+))?$")


@dataclass(frozen=True)
class ModelRef:
    key: str
    """The experiment key the reference was given in (model.hf_assets_path, ...)."""
    value: str
    """The reference as written."""
    folder: Path | None
    """The local folder (for a Hub id: the snapshot folder), None when it cannot be resolved."""
    repo_id: str | None = None
    """The Hub id, None for a local folder."""
    revision: str | None = None
    """The revision asked for (None: the cache's `main`)."""
    commit: str | None = None
    """The snapshot's commit (Hub ids only)."""

    @property
    def is_hub(self) -> bool:
        return self.repo_id is not None

    def fetch_command(self, *patterns: str) -> str | None:
        """The `hf` command that puts this reference (or only `patterns` of it) into the cache."""
        if self.repo_id is None:
            return None
        argv = ["hf", "download", self.repo_id]
        if self.revision:
            argv += ["--revision", self.revision]
        for p in patterns:
            argv += ["--include", p]
        return shlex.join(argv)

    def describe(self) -> str:
        """`Qwen/Qwen3-0.6B@main (snapshot 1a2b3c4d..., /cache/models--Qwen--Qwen3-0.6B/snapshots/...)`."""
        if self.repo_id is None:
            return str(self.folder)
        return f"{self.repo_id}@{self.revision or 'main'} (Hugging Face cache snapshot {self.commit}: {self.folder})"

    def as_json(self) -> dict:
        return {
            "key": self.key,
            "value": self.value,
            "folder": str(self.folder) if self.folder else None,
            "repo_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
        }


def hub_cache_dir() -> Path:
    """The cache huggingface_hub reads (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants  # lazy: a network client; only when an HF repository is named

    return Path(constants.HF_HUB_CACHE)


def split(value: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when `value` can be a Hub id, None when it can only be a path."""
    m = _HUB_ID.match(value)
    if m is None or value.startswith((".", "~")):
        return None
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # lazy: only for what can be a Hub id

    try:
        validate_repo_id(m["id"])
    except HFValidationError:
        return None
    return m["id"], m["rev"]


def resolve(
    key: str, value: str, *, revision: str | None = None, revision_key: str | None = None
) -> tuple[ModelRef, list[Problem]]:
    """Resolve `value` (given in `key`); `revision`: the section's `revision` key (named
    `revision_key`), which applies when `value` is a Hub id without its own `@revision`."""
    local = Path(value).expanduser()
    if local.exists():
        if revision is not None and split(value) is None:
            return ModelRef(key, value, local.resolve()), [
                Problem(
                    revision_key or key,
                    revision,
                    f"applies to Hub ids only, and {key} = {value!r} is a local folder",
                    "null for a local folder",
                )
            ]
        return ModelRef(key, value, local.resolve()), []
    hub = split(value)
    if hub is None:  # only a path: a folder that is not there
        return ModelRef(key, value, None), [
            Problem(
                key,
                value,
                "folder does not exist",
                "a local folder, or a Hugging Face Hub id (org/name[@revision]) in the local Hugging Face cache",
                nearby_path(local.resolve()),
            )
        ]
    repo_id, own = hub
    if own is not None and revision is not None and own != revision:
        return ModelRef(key, value, None, repo_id, own), [
            Problem(
                revision_key or key, revision, f"differs from the revision in {key} = {value!r}", f"null, or {own!r}"
            )
        ]
    rev = own or revision
    ref = ModelRef(key, value, None, repo_id, rev)
    folder = _snapshot(repo_id, rev)
    if folder is None:
        cache = hub_cache_dir()
        near = nearby_path(local.resolve())
        near = near if near and near.startswith("did you mean") else None
        hint = _missing_hint(value, ref)
        return ref, [
            Problem(
                key,
                value,
                f"folder does not exist ({local.resolve()}), and the local Hugging Face cache ({cache}) "
                f"holds no Hub id {repo_id} at revision {rev or 'main'} (nothing is downloaded)",
                "a local folder, or a Hugging Face Hub id (org/name[@revision]) in the local Hugging Face cache "
                "(HF_HUB_CACHE or HF_HOME)",
                f"{near}; or, for the Hub id, {hint}" if near else hint,
            )
        ]
    return ModelRef(key, value, folder, repo_id, rev, folder.name), []


def _missing_hint(value: str, ref: ModelRef) -> str:
    """How to fetch a reference that is neither a folder nor in the cache: a folder named like a
    Qwen3 release is that release downloaded into the folder; else the value taken as a Hub id."""
    command = f"fetch it first (nothing is downloaded at run time): {ref.fetch_command()}"
    name = Path(value.split("@")[0]).name
    release = next((r for r in QWEN3_RELEASES if r.lower() == name.lower()), None)
    if release is None or ref.repo_id == f"Qwen/{release}":
        return command
    local = shlex.join(["hf", "download", f"Qwen/{release}", "--local-dir", value.split("@")[0]])
    return (
        f"the folder is named like Qwen's {release}; download it into the folder: {local} (or into the "
        f"Hugging Face cache with `hf download Qwen/{release}` and set {ref.key}=Qwen/{release})"
    )


def _snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot folder of `repo_id` at `revision` (a branch, tag or full commit), or None.
    huggingface_hub's own offline lookup: refs/<revision> -> snapshots/<commit>, or snapshots/<commit>."""
    from huggingface_hub import snapshot_download  # lazy: a network client; only when a Hub id is named
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError  # lazy: the same

    try:
        path = snapshot_download(repo_id, revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError, OSError, ValueError):
        return None
    folder = Path(str(path))
    return folder if folder.is_dir() else None
