"""The run directory contract: file names, atomic writes, and reading a run back.

A run directory holds the resolved experiment (`experiment.yaml`), the resolved platform
(`platform.json`), the torchtitan config (`torchtitan_config.json`), the exact command
(`command.txt`), Hydra's `.hydra/`, `metrics.jsonl`, `summary.json`, per-rank logs under `logs/`
and, when checkpointing is on, `checkpoint/`.
"""

from __future__ import annotations

import json
import os
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
