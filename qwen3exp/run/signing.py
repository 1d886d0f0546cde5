"""Checkpoints qwen3exp wrote, signed: a DCP checkpoint is read with pickle (`.metadata` by
`pickle.load`, its byte items by `torch.load(weights_only=False)`, torchtitan's data-loader state by
`pickle.loads`), so resuming from a checkpoint somebody else put into a run directory would run their
code. qwen3exp resumes only from a checkpoint whose every file it signed when it wrote it.

- Each rank, right after a save, lists the files it wrote in `step-N/` (DCP names them
  `__<rank>_<i>.distcp`; rank 0 also wrote `.metadata`) with their size and SHA-256, and signs the
  list with an HMAC-SHA256 under this user's key: `step-N/.qwen3exp-signed-<rank>.json`. Hashing
  its own shard costs each rank about a second per GB, in parallel.
- Before a launch resumes (`qwen3exp.plan.build.checkpoint_verdict`), the checkpoint torchtitan
  would load is verified: every signature valid, every file of the folder listed with its size and
  hash, nothing listed missing. Otherwise the launch is refused (exit 2) before any rank starts. This
  reads the whole checkpoint once (about a second per GB).
- The key: `QWEN3EXP_SIGNING_KEY` (a file), else `~/.config/qwen3exp/checkpoint.key` (32 random
  bytes, mode 0600, made on first use). The nodes of a multi-node run must see the same key file (a
  shared home, or the variable). A checkpoint copied from another user or machine is refused by
  design: its signatures are not this key's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

KEY_ENV = "QWEN3EXP_SIGNING_KEY"
SIGNED = ".qwen3exp-signed-{rank}.json"
_SIGNED_PREFIX, _SIGNED_SUFFIX = ".qwen3exp-signed-", ".json"
_BLOCK = 1 << 20


def key_path() -> Path:
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV])
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "qwen3exp" / "checkpoint.key"


def key(*, create: bool) -> bytes | None:
    """This user's signing key (made on first use when `create`); None when there is none."""
    path = key_path()
    try:
        return path.read_bytes()
    except FileNotFoundError:
        if not create:
            return None
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another rank made it first
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
        f.flush()
        os.fsync(f.fileno())
    return path.read_bytes()


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _mac(secret: bytes, step: str, files: dict, world: int) -> str:
    body = json.dumps({"step": step, "files": files, "world": world}, sort_keys=True, separators=(",", ":"))
    return hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()


def own_files(step_dir: Path, rank: int) -> list[Path]:
    """The files rank `rank` wrote into a DCP checkpoint folder."""
    names = [p for p in step_dir.glob(f"__{rank}_*") if p.is_file()]
    if rank == 0 and (step_dir / ".metadata").is_file():
        names.append(step_dir / ".metadata")
    return sorted(names)


def sign(step_dir: Path, rank: int, world: int) -> None:
    """Sign the files `rank` (of `world` ranks) wrote into `step_dir` (each rank, right after a save)."""
    files = {p.name: [p.stat().st_size, _digest(p)] for p in own_files(step_dir, rank)}
    record = {
        "step": step_dir.name,
        "files": files,
        "world": world,
        "mac": _mac(key(create=True) or b"", step_dir.name, files, world),
    }
    target = step_dir / SIGNED.format(rank=rank)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, target)


def problem(step_dir: Path) -> str | None:
    """Why `step_dir` is not a checkpoint qwen3exp signed under this user's key (None: it is)."""
    listed: dict[str, list] = {}
    signatures = sorted(p for p in step_dir.iterdir() if _is_signature(p.name))
    if not signatures:
        return f"{step_dir.name} carries no qwen3exp signature"
    secret = key(create=False)
    if secret is None:
        return f"{step_dir.name} is signed, but this user has no key to check it with (none at {key_path()})"
    worlds = set()
    for sig in signatures:
        try:
            if sig.stat().st_size > 16 << 20 or not sig.is_file():
                return f"{step_dir.name}/{sig.name} is not a signature file"
            record = json.loads(sig.read_text())
            files, mac, world = record["files"], record["mac"], record["world"]
            valid = (
                isinstance(files, dict)
                and isinstance(mac, str)
                and isinstance(world, int)
                and hmac.compare_digest(mac, _mac(secret, step_dir.name, files, world))
            )
        except (OSError, ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            return f"{step_dir.name}/{sig.name} is not signed with this user's key"
        worlds.add(world)
        listed.update(files)
    if len(worlds) != 1 or {p.name for p in signatures} != {SIGNED.format(rank=r) for r in range(worlds.pop())}:
        return f"{step_dir.name} is not signed by every rank that saved it"
    present = {p.name for p in step_dir.iterdir() if not p.name.startswith(_SIGNED_PREFIX)}
    if extra := sorted(present - set(listed)):
        return f"{step_dir.name} holds {extra[0]}, which no qwen3exp signature lists"
    for name, (size, digest) in sorted(listed.items()):
        path = step_dir / name
        if not path.is_file() or path.is_symlink():
            return f"{step_dir.name}/{name}, which its signature lists, is missing"
        if path.stat().st_size != size or _digest(path) != digest:
            return f"{step_dir.name}/{name} changed since qwen3exp wrote it"
    return None


MAX_WORLD = 1 << 20


def has_signature(step_dir: Path) -> bool:
    """Whether every rank that saved this checkpoint signed it: rank 0's signature names the world
    size, and a signature file of each rank is there (cheap: the signatures are checked by
    `problem`). A stop between a save and its last signature leaves a folder this says False of."""
    try:
        first = step_dir / SIGNED.format(rank=0)
        if not first.is_file() or first.stat().st_size > 16 << 20:
            return False
        world = json.loads(first.read_text()).get("world")
    except (OSError, ValueError, AttributeError):
        return False
    if isinstance(world, bool) or not isinstance(world, int) or not 0 < world <= MAX_WORLD:
        return False
    return all((step_dir / SIGNED.format(rank=r)).is_file() for r in range(world))


def _is_signature(name: str) -> bool:
    return name.startswith(_SIGNED_PREFIX) and name.endswith(_SIGNED_SUFFIX)
