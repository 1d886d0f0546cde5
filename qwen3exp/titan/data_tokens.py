"""The trained tokens each source of a mixture gave, as the ranks counted them: `logs/data_tokens/`.

summary.json's `data_tokens` ({source: tokens}) is read from these records, not inferred from the
plan: the mixture's dataset in each rank (`qwen3exp.titan.mixture_dataset`) counts the trained
tokens (labels not ignored) of every sample it yields, per source, and writes them after each local
batch into its rank's file with its data-parallel rank; the sum takes one file per data-parallel
rank (the ranks of one data-parallel group read the same samples), so it counts every trained token
once. The
counts are part of the dataloader's checkpointed state: a resumed run continues them. A launch that
starts from step 1 removes an earlier launch's records first (`clear`). Plain data, no torch: the
launcher reads it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from qwen3exp.run import rundir

FOLDER = "data_tokens"


def folder(run_dir: str | Path) -> Path:
    return Path(run_dir) / rundir.LOGS / FOLDER


class Record:
    """One rank's file, kept open and rewritten in place after each local batch: a seek and a
    write (a rename, or `rundir.atomic_write_json`'s fsync, cost milliseconds of every step's data
    loading on a busy disk). The launcher reads it once the rank has exited."""

    def __init__(self, run_dir: str | Path, dp_rank: int) -> None:
        folder(run_dir).mkdir(parents=True, exist_ok=True)
        rank = int(os.environ.get("RANK", "0"))
        self._file = (folder(run_dir) / f"rank{rank}.json").open("w")
        self.dp_rank = dp_rank

    def write(self, tokens: dict[str, int]) -> None:
        self._file.seek(0)
        self._file.write(json.dumps({"dp_rank": self.dp_rank, "tokens": tokens}) + "\n")
        self._file.truncate()
        self._file.flush()


def clear(run_dir: Path) -> None:
    """Before a launch that starts from step 1: an earlier launch's counts say nothing about it."""
    for f in folder(run_dir).glob("rank*.json"):  # the ranks' own files only (`Counts`)
        f.unlink(missing_ok=True)


def summary_fields(run_dir: Path) -> dict:
    """summary.json's `data_tokens`: each source's trained tokens summed over the data-parallel
    ranks, one rank's record for each (the ranks of one data-parallel group read the same samples);
    only for a run whose ranks counted them (data=mix)."""
    found = sorted(folder(run_dir).glob("rank*.json")) if folder(run_dir).is_dir() else []
    by_dp: dict[int, dict] = {}
    for path in found:
        record = rundir.read_json(path)
        if isinstance(record, dict) and isinstance(record.get("tokens"), dict):
            by_dp.setdefault(record.get("dp_rank", -1), record["tokens"])
    total: dict[str, int] = {}
    for tokens in by_dp.values():
        for name, n in tokens.items():
            if isinstance(n, int) and not isinstance(n, bool):
                total[name] = total.get(name, 0) + n
    return {"data_tokens": total} if found else {}
