"""Where a run came from: `provenance.json` (and `git.diff`) in every run directory.

Recorded by the launcher before torchrun starts: the qwen3exp source tree's git commit and whether
it had local changes to tracked files (those changes go to `git.diff`, so `git apply` on the commit
recreates the tracked tree; untracked files are listed by name and size only, never copied: a
`.env` next to the code must not land in a run directory), the versions of the packages that decide
the numbers, the platform and device names, the host, the environment variables that change how
ranks run, the full command line and the Hydra overrides.

Secrets never land in a run directory: everything recorded from the environment or a command line
goes through `qwen3exp.run.redact`.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform as _platform
import shlex
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from qwen3exp import platforms
from qwen3exp.config.argv import CONF_DIR
from qwen3exp.platforms.host import cpu_name, machine
from qwen3exp.run import rundir
from qwen3exp.run.redact import redact_argv, redact_env, redact_text

SOURCE_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "torch",
    "torchtitan",
    "transformers",
    "torch-neuronx",
    "neuronx-cc",
    "torch-xla",
    "hydra-core",
    "omegaconf",
    "pydantic",
    "datasets",
    "tokenizers",
    "safetensors",
    "numpy",
    "wandb",
    "qwen3exp",
)
_OPTIONAL = {"torch-neuronx", "neuronx-cc", "torch-xla", "wandb"}
"""Recorded only when installed."""
ENV_PREFIXES = (
    "NEURON_",
    "CUDA_",
    "NCCL_",
    "FI_",
    "XLA_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "HF_",
    "TRANSFORMERS_",
    "WANDB_",
    "SLURM_",
    "QWEN3EXP_",
    "MASTER_",
    "GLOO_",
    "TP_SOCKET",
)
ENV_NAMES = ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "LD_LIBRARY_PATH", "PATH", "VIRTUAL_ENV", "CONDA_PREFIX")
_UNTRACKED_LISTED = 500


@dataclass
class Origin:
    """How the launcher was started (filled in by the command line layer)."""

    command: list[str] = field(default_factory=lambda: [sys.executable, *sys.argv])
    mode: str = "RUN"
    """RUN or MULTIRUN."""
    task_overrides: list[str] = field(default_factory=list)
    hydra_overrides: list[str] = field(default_factory=list)
    config_sources: list[str] = field(default_factory=list)
    config_name: str | None = None
    job_num: int | None = None
    override_dirname: str | None = None
    sweep_dir: str | None = None


def collect(facts, exp_hash: str, origin: Origin | None) -> tuple[dict, str | None]:
    """(provenance, the git diff text or None); every command line and environment redacted."""
    hydra = asdict(origin or Origin())
    command = redact_argv(hydra.pop("command"))
    for key in ("task_overrides", "hydra_overrides"):
        hydra[key] = redact_argv(hydra[key])
    hydra["config_sources"] = [redact_text(s) for s in hydra["config_sources"]]
    for key in ("override_dirname", "sweep_dir"):
        if hydra[key] is not None:
            hydra[key] = redact_text(hydra[key])
    git, diff = source_git_state()
    prov = {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "experiment_hash": exp_hash,
        "command": command,
        "command_line": shlex.join(command),
        "cwd": redact_text(os.getcwd()),
        "hydra": hydra,
        "git": git,
        "versions": versions(),
        "platform": {
            "name": facts.name,
            "reason": facts.reason,
            "device_type": facts.device_type,
            "devices": platforms.device_names(facts),
            "os": _platform.platform(),
            "machine": machine(),
            "cpu": cpu_name(),
            "cpu_count": os.cpu_count(),
        },
        "experiments": experiments_state(hydra["config_sources"]),
        "hostname": socket.gethostname(),
        "env": relevant_env(os.environ),
        "rank_env": redact_env(facts.env),
    }
    return prov, diff


def model_sources(run_dir: Path) -> dict | None:
    """Where the run's config, tokenizer and weights come from, as its plan resolved them (a Hub id:
    repo id, revision and the snapshot commit of the local cache), from the plan the launcher
    wrote just before (`plan.json`, or `plan_node<R>.json` on the other nodes of a multi-node run)."""
    for path in sorted(run_dir.glob("plan*.json")):
        plan = rundir.read_json(path)
        if isinstance(plan, dict) and isinstance(plan.get("model_files"), dict):
            return plan["model_files"]
    return None


def write(run_dir: Path, facts, exp_hash: str, origin: Origin | None) -> dict:
    prov, diff = collect(facts, exp_hash, origin)
    prov["model_sources"] = model_sources(run_dir)
    if diff:
        rundir.atomic_write_text(run_dir / rundir.GIT_DIFF, diff)
        prov["git"]["diff_file"] = rundir.GIT_DIFF
    rundir.atomic_write_json(run_dir / rundir.PROVENANCE, prov)
    return prov


def relevant_env(env) -> dict[str, str]:
    """The variables that change how ranks run (ENV_PREFIXES, ENV_NAMES), redacted."""
    # QWEN3EXP_COMMAND is recorded (redacted) as "command".
    names = sorted(n for n in env if (n.startswith(ENV_PREFIXES) or n in ENV_NAMES) and n != "QWEN3EXP_COMMAND")
    return redact_env({n: env[n] for n in names})


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            if pkg not in _OPTIONAL:
                out[pkg] = None
    return out


def _git(root: Path, *args: str) -> str:
    """A read-only git command in `root`. `--no-optional-locks`: `git status` would otherwise
    refresh (rewrite) the repository's index and take `.git/index.lock` to do it; reading the state
    of someone's repository must not write to it, nor leave a lock behind that blocks their next
    `git commit` when the launch is killed meanwhile."""
    return subprocess.run(
        ["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def source_git_state() -> tuple[dict, str | None]:
    """qwen3exp's own source tree, when it runs from a checkout (an installed wheel has none: its
    version is in `versions`). Only SOURCE_ROOT's own repository counts: a venv inside a user's
    repository must not record that repository as qwen3exp's source."""
    if not (SOURCE_ROOT / ".git").exists():
        return {
            "repo": None,
            "commit": None,
            "dirty": None,
            "error": f"qwen3exp is installed, not a checkout (version {versions().get('qwen3exp')})",
        }, None
    return git_state(SOURCE_ROOT)


def experiments_state(config_sources: list[str]) -> dict:
    """The git state of the repository that holds the experiment files: the first config folder on
    the search path that is not qwen3exp's own (--config-dir, hydra.searchpath, --config-path), or
    qwen3exp's packaged conf/ when there is none. Its diff is not copied (see `git_state`)."""
    folders = []
    for entry in config_sources:
        provider, _, where = entry.partition(": ")
        if provider in ("hydra", "schema") or not where.startswith("file://"):
            continue
        path = Path(where[len("file://") :]).resolve()
        if path != CONF_DIR:
            folders.append(path)
    if not folders:
        return {"config_dir": str(CONF_DIR), "packaged": True}
    state, _diff = git_state(folders[0])
    return {"config_dir": str(folders[0]), "packaged": False, "git": state}


def git_state(root: Path) -> tuple[dict, str | None]:
    """(state, diff): the source tree's commit, branch, whether tracked files changed (`dirty`) and
    the untracked files as [{"path", "size"}]; diff is `git diff HEAD --binary` (tracked changes,
    staged or not) or None when there are none. A repository with no commit yet (`git init`, files
    added or not) has commit None and `note` "no commit yet"; its staged files are listed like the
    untracked ones (`staged`), and `dirty` says whether there are any. {"error": ...} when it is no
    git checkout."""
    try:
        top = _git(root, "rev-parse", "--show-toplevel").strip()
    except FileNotFoundError:
        return {"repo": str(root), "commit": None, "dirty": None, "error": "git is not installed"}, None
    except (OSError, subprocess.SubprocessError) as e:
        return {
            "repo": str(root),
            "commit": None,
            "dirty": None,
            "error": f"not a git checkout ({type(e).__name__})",
        }, None
    commit = _git_or_none(root, "rev-parse", "--verify", "-q", "HEAD")
    # symbolic-ref names the branch of a repository with no commit too; it fails on a detached HEAD.
    branch = _git_or_none(root, "symbolic-ref", "--short", "-q", "HEAD") or "HEAD"
    status = _git(root, "status", "--porcelain", "-z", "--untracked-files=all")
    entries = [e for e in status.split("\0") if len(e) > 3]
    untracked = [e[3:] for e in entries if e.startswith("?? ")]
    state: dict = {"repo": top, "commit": commit, "branch": branch}
    if commit is None:
        staged = [e[3:] for e in entries if e[0] not in " ?"]
        state.update(dirty=bool(staged), note="no commit yet", staged=_listed(top, staged))
        diff = ""  # nothing to apply a diff on: the staged files are listed, not copied
    else:
        # Tracked changes only: an untracked file is whatever happens to lie in the checkout (a .env
        # with a token, a scratch dump); its contents never go into the run directory.
        diff = _git(root, "diff", "HEAD", "--binary")
        state["dirty"] = bool(diff)
    state.update(untracked=_listed(top, untracked), diff_file=None)
    if len(untracked) > _UNTRACKED_LISTED:
        state["untracked_not_listed"] = len(untracked) - _UNTRACKED_LISTED
    return state, (diff or None)


def _git_or_none(root: Path, *args: str) -> str | None:
    """The output of a git command that fails for an answer of 'none' (no commit, no branch)."""
    try:
        return _git(root, *args).strip() or None
    except subprocess.CalledProcessError:
        return None


def _listed(top: str, paths: list[str]) -> list[dict]:
    return [{"path": rel, "size": _size(Path(top) / rel)} for rel in paths[:_UNTRACKED_LISTED]]


def _size(path: Path) -> int | None:
    try:
        return path.lstat().st_size
    except OSError:
        return None
