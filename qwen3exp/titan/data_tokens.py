"""The trained tokens each source of a mixture gave, as the ranks counted them: `logs/data_tokens/`.

summary.json's `data_tokens` ({source: tokens}) is read from these records, not inferred from the
plan: the mixture's dataset in each rank (`qwen3exp.titan.mixture_dataset`) counts the trained
tokens (labels not ignored) of every sample it yields, per source, and writes them after each local
batch into the file of its data-parallel rank (the ranks of one data-parallel group read the same
samples and write the same file), so the sum over the files counts every trained token once. The
counts are part of the dataloader's checkpointed state: a resumed run continues them. A launch that
starts from step 1 removes an earlier launch's records first (`clear`). Plain data, no torch: the
launcher reads it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from qwen3exp.run import rundir

FOLDER = "data_tokens"


def folder(run_dir: str | Path) -> Path:
    return Path(run_dir) / rundir.LOGS / FOLDER


def write(run_dir: str | Path, dp_rank: int, tokens: dict[str, int]) -> None:
    """One data-parallel rank's counts so far."""
    rundir.atomic_write_json(folder(run_dir) / f"dp_rank{dp_rank}.json", tokens)


def clear(run_dir: Path) -> None:
    """Before a launch that starts from step 1: an earlier launch's counts say nothing about it."""
    shutil.rmtree(folder(run_dir), ignore_errors=True)


def summary_fields(run_dir: Path) -> dict:
    """summary.json's `data_tokens`: each source's trained tokens summed over the data-parallel
    ranks (only for a run whose ranks counted them: data=mix)."""
    found = sorted(folder(run_dir).glob("dp_rank*.json")) if folder(run_dir).is_dir() else []
    total: dict[str, int] = {}
    for path in found:
        counts = rundir.read_json(path)
        if not isinstance(counts, dict):
            continue
        for name, n in counts.items():
            if isinstance(n, int) and not isinstance(n, bool):
                total[name] = total.get(name, 0) + n
    return {"data_tokens": total} if found else {}
