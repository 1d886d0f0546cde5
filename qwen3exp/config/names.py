"""How the config names run and sweep directories: the resolvers conf/config.yaml uses.

- `${qwen3exp.stamp:}`: a new run's folder name, local time to the millisecond plus 6 random hex
  digits (`2026-12-01_09-30-12.345-7f3a9c`), so that launches of one name in the same second get
  folders of their own and `ls` still sorts them by time.
- `${qwen3exp.safe_dirname:${hydra.job.override_dirname}}`: a sweep job's folder, named by its
  overrides, so that the same point of the same sweep always lands in the same folder (resume).
- `placement_problems`: Hydra's keys that place what it writes (`hydra.sweep.subdir`,
  `hydra.output_subdir`, `hydra.job.name`, log handlers' `filename`) must stay inside the run
  directory: an absolute path or `..` there would overwrite or append to a user's files.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import secrets
from urllib.parse import quote

from omegaconf import OmegaConf, open_dict, read_write

from qwen3exp.config.registered import register_schema_defaults
from qwen3exp.errors import Problem

STAMP_RESOLVER = "qwen3exp.stamp"
DIRNAME_RESOLVER = "qwen3exp.safe_dirname"
_MAX_NAME = 200  # file names are limited to 255 bytes; leave room for suffixes


def stamp() -> str:
    now = dt.datetime.now()
    return f"{now:%Y-%m-%d_%H-%M-%S}.{now.microsecond // 1000:03d}-{secrets.token_hex(3)}"


def safe_dirname(override_dirname: str) -> str:
    """A folder name for a job from Hydra's override_dirname (`a=1,b=x`): characters that are not
    safe in a file name are %-escaped (`/` -> `%2F`), an empty name (no overrides) is `base`, and a
    name too long for a file system is shortened with a hash of the full name."""
    # surrogateescape: a non-UTF-8 byte of the command line (a lone surrogate in Python) is %-escaped
    # as the byte it was, not a UnicodeEncodeError inside Hydra's interpolation of the job folder.
    name = quote(str(override_dirname), safe="=,+-._@~", errors="surrogateescape")
    if not name:
        return "base"
    if len(name) > _MAX_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:10]
        name = f"{name[: _MAX_NAME - 11]}-{digest}"
    return name


def register_resolvers() -> None:
    """Every process that composes (the launcher, a SLURM job) registers them, and with them the
    schema's defaults that conf/ pulls in (`registered`). `stamp` is cached: Hydra copies a composed
    config's resolver cache into each job's config, so every job of a sweep (and every reference in
    one config) sees the same stamp."""
    if not OmegaConf.has_resolver(DIRNAME_RESOLVER):
        OmegaConf.register_new_resolver(DIRNAME_RESOLVER, safe_dirname)
    if not OmegaConf.has_resolver(STAMP_RESOLVER):
        OmegaConf.register_new_resolver(STAMP_RESOLVER, stamp, use_cache=True)
    register_schema_defaults()


_INSIDE = "a relative path inside the run directory (not absolute, no '..' out of it)"
_LOGGING = ("hydra.job_logging", "hydra.hydra_logging")


def placement_problems(cfg, *, multirun: bool) -> list[Problem]:
    """Every place Hydra writes to for the first job of this composed config (with its hydra node;
    the job's folder computed as Hydra's run_job does) that is outside the run directory (multirun:
    the sweep directory). A value that does not resolve is left to the checks that report it."""
    root = _resolved(cfg, "hydra.sweep.dir" if multirun else "hydra.run.dir")
    if root is None:
        return []
    root = os.path.abspath(root)
    job, problems = root, []
    if multirun and (subdir := _resolved(cfg, "hydra.sweep.subdir")) is not None:
        job = os.path.abspath(os.path.join(root, subdir))
        if not _inside(job, root):  # what goes into the job's folder goes there too: this one is the cause
            return [_outside("hydra.sweep.subdir", subdir, "each job's folder", job, root)]
    name = _resolved(cfg, "hydra.job.name")
    if name is not None and (name in ("", ".", "..") or any(c in name for c in "/\\\0")):
        problems.append(
            Problem(
                "hydra.job.name",
                name,
                "names files Hydra writes (<job name>.log); a path there places them outside the run directory",
                "a plain name without / (e.g. qwen3exp)",
            )
        )
    if (subdir := _resolved(cfg, "hydra.output_subdir")) is not None:
        record = os.path.abspath(os.path.join(job, subdir))
        if not _inside(record, root):
            problems.append(
                _outside("hydra.output_subdir", subdir, "Hydra's record (.hydra/config.yaml, ...)", record, root)
            )
    if _resolved(cfg, "hydra.job.chdir") == "True":
        # The plan reads every relative path (data.path, model folders) from the directory the
        # command runs in; a job that changed into its run directory would read others in the ranks.
        problems.append(
            Problem(
                "hydra.job.chdir",
                True,
                "would run each job inside its run directory, where the "
                "relative paths the plan checked (data.path, model.hf_assets_path, ...) name "
                "other files",
                "false (qwen3exp's jobs run in the directory you launch from)",
                "drop hydra.job.chdir=true (a path inside the run directory: ${hydra:runtime.output_dir}/...)",
            )
        )
    # A bad job name also misplaces the log file named after it: report the cause once.
    bad_name = any(p.key == "hydra.job.name" for p in problems)
    return problems + [p for p in _log_file_problems(cfg, job, root) if not (bad_name and str(name) in str(p.value))]


def _log_file_problems(cfg, job: str, root: str) -> list[Problem]:
    """Log handlers' `filename`, resolved with ${hydra.runtime.output_dir} = the job's folder (set
    for the check and put back; relative names resolve against the working directory, or the job's
    folder with hydra.job.chdir=true, as logging opens them)."""
    chdir = _resolved(cfg, "hydra.job.chdir") == "True"
    runtime = cfg.hydra.runtime
    recorded = OmegaConf.to_container(runtime, resolve=False)
    before = recorded.get("output_dir", "???") if isinstance(recorded, dict) else "???"
    problems = []
    with read_write(runtime), open_dict(runtime):
        runtime.output_dir = job
        try:
            for logging_key in _LOGGING:
                handlers = OmegaConf.select(
                    cfg, f"{logging_key}.handlers", default=None, throw_on_resolution_failure=False
                )
                for handler in list(handlers.keys()) if OmegaConf.is_dict(handlers) else []:
                    key = f"{logging_key}.handlers.{handler}.filename"
                    if (filename := _resolved(cfg, key)) is None:
                        continue
                    path = os.path.abspath(os.path.join(job if chdir else os.getcwd(), filename))
                    if not _inside(path, root):
                        problems.append(_outside(key, filename, "a log file", path, root))
        finally:
            runtime.output_dir = before
    return problems


def _resolved(cfg, key: str) -> str | None:
    try:
        value = OmegaConf.select(cfg, key, default=None)
    except Exception:  # an interpolation that does not resolve: reported by the checks of values
        return None
    return None if value is None else str(value)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _outside(key: str, value: str, what: str, path: str, root: str) -> Problem:
    return Problem(
        key,
        value,
        f"places {what} at {path}, outside the run directory {root}",
        _INSIDE,
        f"drop {key}=... or give a path under the run directory",
    )
