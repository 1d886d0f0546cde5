"""How the config names run and sweep directories: the resolvers conf/config.yaml uses.

- `${qwen3exp.stamp:}`: a new run's folder name, local time to the millisecond plus 6 random hex
  digits (`2026-12-01_09-30-12.345-7f3a9c`), so that launches of one name in the same second get
  folders of their own and `ls` still sorts them by time.
- `${qwen3exp.safe_dirname:${hydra.job.override_dirname}}`: a sweep job's folder, named by its
  overrides, so that the same point of the same sweep always lands in the same folder (resume).
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote

STAMP_RESOLVER = "qwen3exp.stamp"
DIRNAME_RESOLVER = "qwen3exp.safe_dirname"
_MAX_NAME = 200  # file names are limited to 255 bytes; leave room for suffixes


def stamp() -> str:
    import datetime as dt
    import secrets

    now = dt.datetime.now()
    return f"{now:%Y-%m-%d_%H-%M-%S}.{now.microsecond // 1000:03d}-{secrets.token_hex(3)}"


def safe_dirname(override_dirname: str) -> str:
    """A folder name for a job from Hydra's override_dirname (`a=1,b=x`): characters that are not
    safe in a file name are %-escaped (`/` -> `%2F`), an empty name (no overrides) is `base`, and a
    name too long for a file system is shortened with a hash of the full name."""
    name = quote(str(override_dirname), safe="=,+-._@~")
    if not name:
        return "base"
    if len(name) > _MAX_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:10]
        name = f"{name[:_MAX_NAME - 11]}-{digest}"
    return name


def register_resolvers() -> None:
    """Every process that composes (the launcher, a SLURM job) registers them. `stamp` is cached:
    Hydra copies a composed config's resolver cache into each job's config, so every job of a sweep
    (and every reference in one config) sees the same stamp."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(DIRNAME_RESOLVER):
        OmegaConf.register_new_resolver(DIRNAME_RESOLVER, safe_dirname)
    if not OmegaConf.has_resolver(STAMP_RESOLVER):
        OmegaConf.register_new_resolver(STAMP_RESOLVER, stamp, use_cache=True)
