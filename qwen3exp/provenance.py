"""Where a run came from: `provenance.json` (and `git.diff`) in every run directory.

Recorded by the launcher before torchrun starts: the qwen3exp source tree's git commit and whether
it had local changes (the changes themselves, untracked files included, go to `git.diff`, so
`git apply` recreates the tree), the versions of the packages that decide the numbers, the platform
and device names, the host, the environment variables that change how ranks run, the full command
line and the Hydra overrides. Secrets (variables named like *TOKEN*, *KEY*, *SECRET*, *PASSWORD*)
are never written.
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

from qwen3exp import rundir
from qwen3exp.platforms.cpu import cpu_name as _cpu_name

SOURCE_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("torch", "torchtitan", "transformers", "torch-neuronx", "neuronx-cc", "torch-xla",
            "hydra-core", "omegaconf", "pydantic", "datasets", "tokenizers", "safetensors", "numpy",
            "wandb", "qwen3exp")
_OPTIONAL = {"torch-neuronx", "neuronx-cc", "torch-xla", "wandb"}
"""Recorded only when installed."""
ENV_PREFIXES = ("NEURON_", "CUDA_", "NCCL_", "FI_", "XLA_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "KMP_",
                "HF_", "TRANSFORMERS_", "WANDB_", "SLURM_", "QWEN3EXP_", "MASTER_", "GLOO_", "TP_SOCKET")
ENV_NAMES = ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "LD_LIBRARY_PATH", "PATH", "VIRTUAL_ENV",
             "CONDA_PREFIX")
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")
_UNTRACKED_LIMIT = 1 << 20
"""Untracked files larger than this are listed but not copied into git.diff."""
_UNTRACKED_TOTAL = 16 << 20
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
    """(provenance, the git diff text or None)."""
    hydra = asdict(origin or Origin())
    command = hydra.pop("command")
    git, diff = git_state(SOURCE_ROOT)
    prov = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "experiment_hash": exp_hash,
        "command": command,
        "command_line": shlex.join(command),
        "cwd": os.getcwd(),
        "hydra": hydra,
        "git": git,
        "versions": versions(),
        "platform": {
            "name": facts.name,
            "reason": facts.reason,
            "device_type": facts.device_type,
            "devices": device_names(facts.name),
            "os": _platform.platform(),
            "machine": _machine(),
            "cpu": _cpu_name(),
            "cpu_count": os.cpu_count(),
        },
        "hostname": socket.gethostname(),
        "env": relevant_env(os.environ),
        "rank_env": dict(facts.env),
    }
    return prov, diff


def write(run_dir: Path, facts, exp_hash: str, origin: Origin | None) -> dict:
    prov, diff = collect(facts, exp_hash, origin)
    if diff:
        rundir.atomic_write_text(run_dir / rundir.GIT_DIFF, diff)
        prov["git"]["diff_file"] = rundir.GIT_DIFF
    rundir.atomic_write_json(run_dir / rundir.PROVENANCE, prov)
    return prov


def relevant_env(env) -> dict[str, str]:
    out = {}
    for name in sorted(env):
        if not (name.startswith(ENV_PREFIXES) or name in ENV_NAMES):
            continue
        if any(w in name.upper() for w in _SECRET_WORDS) or name == "QWEN3EXP_COMMAND":
            continue  # QWEN3EXP_COMMAND is recorded as "command"
        out[name] = env[name]
    return out


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
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def git_state(root: Path) -> tuple[dict, str | None]:
    """The source tree's commit, branch and local changes; {"error": ...} when it is no git checkout."""
    try:
        top = _git(root, "rev-parse", "--show-toplevel").strip()
        commit = _git(root, "rev-parse", "HEAD").strip()
    except (OSError, subprocess.SubprocessError) as e:
        return {"repo": str(root), "commit": None, "dirty": None,
                "error": f"not a git checkout ({type(e).__name__})"}, None
    branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD").strip()
    status = _git(root, "status", "--porcelain", "-z", "--untracked-files=all")
    untracked = [entry[3:] for entry in status.split("\0") if entry.startswith("?? ")]
    state = {"repo": top, "commit": commit, "branch": branch, "dirty": bool(status.strip("\0 \n")),
             "untracked": untracked[:_UNTRACKED_LISTED], "diff_file": None}
    if len(untracked) > _UNTRACKED_LISTED:
        state["untracked_not_listed"] = len(untracked) - _UNTRACKED_LISTED
    if not state["dirty"]:
        return state, None
    diff = _git(root, "diff", "HEAD", "--binary")
    budget = _UNTRACKED_TOTAL
    for rel in untracked:
        path = Path(top) / rel
        try:
            size = path.stat().st_size if path.is_file() else None
            if size is not None and size <= min(_UNTRACKED_LIMIT, budget):
                budget -= size
                # --no-index exits 1 when the files differ (always, against /dev/null).
                diff += subprocess.run(["git", "-C", top, "diff", "--binary", "--no-index", "/dev/null", rel],
                                       capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            continue
    return state, diff


def device_names(platform_name: str) -> list[str]:
    match platform_name:
        case "cpu":
            return [_cpu_name()]
        case "cuda":
            import torch

            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        case "neuron":
            # One /dev/neuronN per Neuron device; the instance type names the chip generation.
            devices = sorted(p.name for p in Path("/dev").glob("neuron[0-9]*"))
            return [f"{_machine() or 'neuron'}: {d}" for d in devices]
    return []


def _machine() -> str | None:
    """The machine model (on EC2 the instance type, e.g. trn1.32xlarge) from DMI, when readable."""
    try:
        return Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip() or None
    except OSError:
        return None
