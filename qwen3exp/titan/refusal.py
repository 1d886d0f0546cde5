"""A rank's refusal: the ConfigError it met while building torchtitan's Trainer.Config
(`qwen3exp.titan.job_config.build_checked`), recorded in the run directory's
`logs/config_error.json`, before any training step. The rank writes it (`write_refusal`) and exits
with code 2; the launcher watches for the file (`refusal_path`), stops torchrun at once and raises
the recorded ConfigError (`read_refusal`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from qwen3exp.errors import ConfigError, Problem
from qwen3exp.run import rundir

REFUSAL = "config_error.json"
"""Under the run directory's `logs/`: the ConfigError a rank met while building Trainer.Config."""


def refusal_path(run_dir: Path) -> Path:
    return Path(run_dir) / rundir.LOGS / REFUSAL


def write_refusal(run_dir: Path, error: ConfigError) -> None:
    """A rank's record of the ConfigError it met (every rank may write it: the content is the same)."""
    rundir.atomic_write_json(
        refusal_path(run_dir),
        {
            "rank": int(os.environ.get("RANK", "0")),
            "problems": [{**asdict(p), "value": _plain(p.value)} for p in error.problems],
        },
    )


def read_refusal(run_dir: Path) -> ConfigError | None:
    """The ConfigError a rank of this launch recorded, or None."""
    try:
        data = json.loads(refusal_path(run_dir).read_text())
        return ConfigError([Problem(**p) for p in data["problems"]])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _plain(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)
