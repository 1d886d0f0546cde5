"""The questions of the bundled lm-eval task `qwen3exp_tiny` (its YAML's `custom_dataset`), read from
the JSON lines file next to this one, so the task reads no network and no cache wherever qwen3exp
is installed (a `data_files` path in a task YAML is read relative to the working directory)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets

QUESTIONS = Path(__file__).with_suffix(".jsonl")


def load(**_metadata) -> datasets.DatasetDict:
    """The `test` split (lm-eval passes the task's metadata as keywords; none is used)."""
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
