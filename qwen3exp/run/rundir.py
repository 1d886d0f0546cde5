"""The run directory contract: file names, atomic writes, and reading a run back.

A run directory holds the resolved experiment (`experiment.yaml`), the plan (`plan.json`: mesh,
parameters, memory estimate, overrides, commands, where each value came from), the resolved platform
(`platform.json`), the torchtitan config (`torchtitan_config.json`), the exact command
(`command.txt`), where it came from (`provenance.json`, and `git.diff` when the source tree had
local changes), Hydra's `.hydra/`, `metrics.jsonl`, `summary.json`, per-rank logs under `logs/`,
the `[Override]` lines torchtitan logged (`overrides_applied.json`, when kernels overrides are active),
the answers to eval.samples (`samples.jsonl`) and, when checkpointing is on, `checkpoint/`. A rerun
of an unfinished sweep job keeps the earlier attempt's files under `attempts/<n>/`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import secrets
import tempfile
from pathlib import Path
from typing import Any

import yaml

from qwen3exp.errors import ConfigError, Problem
from qwen3exp.run import records, signing

EXPERIMENT = "experiment.yaml"
PLATFORM = "platform.json"
TORCHTITAN_CONFIG = "torchtitan_config.json"
COMMAND = "command.txt"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
"""eval.samples: the answers of each validation, one JSON record per prompt (`qwen3exp.titan.metrics`)."""
PLAN = "plan.json"
OVERRIDES_APPLIED = "overrides_applied.json"
LOGS = "logs"
CHECKPOINT = "checkpoint"
EXPORT = "export"
"""Hugging Face exports: `<run dir>/export/step-N` (checkpoint.export)."""
REFERENCE_LOGPS = "reference_logps"
"""objective.reference_logps=precomputed: the reference's stored log-probs, `reference_logps/<part>.pt`."""
ADAPTER = "adapter"
"""The PEFT adapter folder of a peft=lora export: `export/step-N/adapter/`."""
MERGED = "merged"
"""checkpoint.merge_lora: the merged weights' Hugging Face folder, `export/step-N/merged/`."""
PROVENANCE = "provenance.json"
GIT_DIFF = "git.diff"
ATTEMPTS = "attempts"
HYDRA = ".hydra"

STATUSES = ("completed", "failed", "interrupted")

STAMP_RESOLVER = "qwen3exp.stamp"


def stamp() -> str:
    """The default run folder's name, `2026-12-01_09-30-12.345-7f3a9c`: local time to the
    millisecond plus 6 random hex digits, so that launches of one name in the same second (a shell
    loop with &, a job array) get folders of their own, and `ls` still sorts them by time. (The
    claim refuses a folder that another launch holds in any case.)"""
    now = dt.datetime.now()
    return f"{now:%Y-%m-%d_%H-%M-%S}.{now.microsecond // 1000:03d}-{secrets.token_hex(3)}"


def umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status; elsewhere the
    set-and-restore of os.umask)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename: readers never see half a file.
    The file gets the mode a plain `open()` would give it (0666 minus the umask: 0644 under umask
    022), not mkstemp's private 0600, so a teammate on a shared file system can read a run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: Path) -> Any | None:
    """The data of a JSON file; None when it is missing or not readable as data (`records`: no
    regular file, too large, too deep, not JSON)."""
    try:
        return records.load_json(path)
    except records.Unreadable:
        return None


def looks_like_run(run_dir: Path) -> bool:
    """True when the folder already holds a qwen3exp run (never silently overwritten)."""
    return any((run_dir / name).exists() for name in (EXPERIMENT, SUMMARY, METRICS))


def experiment_yaml(data: dict) -> str:
    """The resolved experiment as written to experiment.yaml (deterministic: reruns compare it)."""
    return yaml.safe_dump(data, sort_keys=False)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


EXPERIMENT_DIGEST_ENV = "QWEN3EXP_EXPERIMENT_SHA256"
"""The sha256 of the experiment.yaml the launcher planned and wrote, in each rank's environment: a
rank reads that experiment (it does not validate or plan again) only if the file still has it."""


def read_planned_experiment(run_dir: Path, digest: str | None) -> dict:
    """The experiment a rank runs: experiment.yaml, if its sha256 is `digest` (None: not checked,
    a worker started by hand); raises ConfigError when the file changed since the launch planned it."""
    text = (Path(run_dir) / EXPERIMENT).read_text()
    if digest is not None and sha256(text) != digest:
        raise ConfigError(
            [
                Problem(
                    EXPERIMENT,
                    str(Path(run_dir) / EXPERIMENT),
                    "changed since the launcher checked and planned it",
                    "the file the launch wrote",
                    "launch again; never edit a run's files",
                )
            ]
        )
    data = yaml.safe_load(text)
    return data if isinstance(data, dict) else {}


def complete_checkpoint_steps(run_dir: Path) -> list[int]:
    """Every complete DCP checkpoint `checkpoint/step-N` (with .metadata), oldest first: what
    torchtitan would resume from by itself (the newest). DCP writes `.metadata` last (temporary
    name, fsync, rename), so a save cut short by a kill is never taken for a checkpoint."""
    return sorted(
        int(m.group(1))
        for p in (run_dir / CHECKPOINT).glob("step-*")
        if (m := re.fullmatch(r"step-(\d+)", p.name)) and (p / ".metadata").is_file()
    )


def latest_checkpoint_step(run_dir: Path) -> int | None:
    """The newest complete checkpoint that its ranks signed (`qwen3exp.run.signing`): the one a
    resume loads (torchtitan is told its step); None when there is none. A newer one without a
    signature (a stop between its save and its signature, or not qwen3exp's) is never loaded."""
    folder = run_dir / CHECKPOINT
    signed = [s for s in complete_checkpoint_steps(run_dir) if signing.has_signature(folder / f"step-{s}")]
    return signed[-1] if signed else None


IDENTITY_IGNORES = ("dry_run", "verbose")
"""Top-level keys that do not change what a run computes, only how it is shown (presentation keys):
left out of the experiment hash and of what `diff`, `report` and `relaunch` compare."""


def identity_view(resolved: dict) -> dict:
    """A resolved experiment without its presentation keys (IDENTITY_IGNORES)."""
    return {k: v for k, v in resolved.items() if k not in IDENTITY_IGNORES}


def experiment_hash(resolved: dict) -> str:
    """Content hash of a resolved experiment (`Experiment.model_dump(mode="json")`): the identity of
    what a run computes, independent of the directory it lives in. Key order does not matter."""
    identity = identity_view(resolved)
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def read_experiment(run_dir: Path) -> dict | None:
    """The resolved experiment a run was launched with (plain data), or None (missing, or not
    readable as plain data: see `load_experiment`)."""
    try:
        return load_experiment(run_dir)
    except records.Unreadable:
        return None


def load_experiment(run_dir: Path) -> dict | None:
    """The resolved experiment of a run as plain data (None: there is no experiment.yaml); raises
    records.Unreadable, naming the file and why, when it is not a plain YAML mapping within the
    limits of a recorded file."""
    path = Path(run_dir) / EXPERIMENT
    data = records.load_yaml(path)
    if data is not None and not isinstance(data, dict):
        raise records.Unreadable(path, f"a YAML {type(data).__name__}, not the mapping of an experiment")
    return data


def run_hash(run_dir: Path) -> str | None:
    """The experiment hash recorded for a run: summary.json's, else computed from experiment.yaml
    (a run killed before it could write its summary)."""
    summary = read_json(run_dir / SUMMARY)
    if isinstance(summary, dict) and summary.get("experiment_hash"):
        return summary["experiment_hash"]
    data = read_experiment(run_dir)
    return experiment_hash(data) if data is not None else None


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """{"training": {"lr": 1}} -> {"training.lr": 1}; lists stay values."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def find_runs(path: Path) -> list[Path]:
    """The runs at PATH: PATH itself if it is a run, else every run below it (a run's own
    sub-folders, e.g. earlier attempts, are not searched), in natural order (seed=2 before seed=10)."""
    path = Path(path)
    if looks_like_run(path):
        return [path]
    found = []
    for root, dirs, _files in os.walk(path):
        here = Path(root)
        if here != path and looks_like_run(here):
            found.append(here)
            dirs.clear()
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".")]
    return sorted(found, key=lambda p: natural_key(str(p.relative_to(path))))


def natural_key(text: str) -> list:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]
