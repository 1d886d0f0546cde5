"""The run directory contract: file names, atomic writes, and reading a run back.

A run directory holds the resolved experiment (`experiment.yaml`), the plan (`plan.json`: mesh,
parameters, memory estimate, overrides, commands, where each value came from), the resolved platform
(`platform.json`), the torchtitan config (`torchtitan_config.json`), the exact command
(`command.txt`), Hydra's `.hydra/`, `metrics.jsonl`, `summary.json`, per-rank logs under `logs/`
and, when checkpointing is on, `checkpoint/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

EXPERIMENT = "experiment.yaml"
PLATFORM = "platform.json"
TORCHTITAN_CONFIG = "torchtitan_config.json"
COMMAND = "command.txt"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
PLAN = "plan.json"
LOGS = "logs"
CHECKPOINT = "checkpoint"

STATUSES = ("completed", "failed", "interrupted")


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
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
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_metrics(run_dir: Path) -> list[dict]:
    """Rows of metrics.jsonl; a torn last line (a killed run) is ignored."""
    rows = []
    try:
        text = (run_dir / METRICS).read_text()
    except OSError:
        return rows
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def looks_like_run(run_dir: Path) -> bool:
    """True when the folder already holds a qwen3exp run (never silently overwritten)."""
    return any((run_dir / name).exists() for name in (EXPERIMENT, SUMMARY, METRICS))


def experiment_yaml(data: dict) -> str:
    """The resolved experiment as written to experiment.yaml (deterministic: reruns compare it)."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def latest_checkpoint_step(run_dir: Path) -> int | None:
    """The newest complete DCP checkpoint `checkpoint/step-N` (with .metadata), as torchtitan
    resumes from it; None when there is none."""
    steps = [int(m.group(1)) for p in (run_dir / CHECKPOINT).glob("step-*")
             if (m := re.fullmatch(r"step-(\d+)", p.name)) and (p / ".metadata").is_file()]
    return max(steps) if steps else None


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Keep the metrics rows up to `last_step` (a resumed run appends the later steps again)."""
    rows = [r for r in read_metrics(run_dir) if r.get("step", 0) <= last_step]
    atomic_write_text(run_dir / METRICS, "".join(json.dumps(r) + "\n" for r in rows))
