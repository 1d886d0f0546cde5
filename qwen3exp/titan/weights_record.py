"""What the ranks loaded into the model at step 0, as they report it: `logs/weights_loaded.json`.

summary.json's `weights_loaded` is read from this record, not inferred from the configuration: rank 0
writes it right after torchtitan's checkpoint manager returned from the step-0 load
(`checkpoint.load=hf|dcp`, its `initial_load_path`; `qwen3exp.titan.checkpointing`), naming the
tensors the load filled (a DCP load is strict: every one of them was in the checkpoint). A resume from
the run's own dcp step is no step-0 load and writes none: the record of the attempt whose step 1 it
continues stays (a launch that starts from step 1 removes an earlier one first, `clear`). A run that
starts from random weights has none. Plain data, no torch: the launcher reads it.
"""

from __future__ import annotations

from pathlib import Path

from qwen3exp.run import rundir

RECORD = "weights_loaded.json"


def path(run_dir: Path) -> Path:
    return Path(run_dir) / rundir.LOGS / RECORD


def write(run_dir: Path, *, source: str, hf: bool, names: list[str]) -> None:
    """Rank 0, after the step-0 load: where from, in which format, and the tensors loaded."""
    rundir.atomic_write_json(
        path(run_dir),
        {"source": source, "format": "hf" if hf else "dcp", "tensors": len(names), "names": sorted(names)},
    )


def clear(run_dir: Path) -> None:
    """Before a launch that starts from step 1: an earlier launch's record says nothing about it."""
    path(run_dir).unlink(missing_ok=True)


def summary_fields(run_dir: Path) -> dict:
    """summary.json's `weights_loaded` (the ranks loaded tensors at step 0) and
    `weights_loaded_tensors` (how many; 0 without a load)."""
    found = rundir.read_json(path(run_dir))
    tensors = found.get("tensors") if isinstance(found, dict) else None
    count = tensors if isinstance(tensors, int) and not isinstance(tensors, bool) and tensors > 0 else 0
    return {"weights_loaded": count > 0, "weights_loaded_tensors": count}
