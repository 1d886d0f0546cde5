"""Runs in every rank under torchrun: `python -m qwen3exp.worker RUN_DIR`.

Order matters: read the resolved files, prepare the platform (before the first torchtitan import:
torchtitan binds the device type at import), rebuild `Trainer.Config`, train. Hydra never runs here.
A failure writes `logs/error_rank<R>.json` (rank, type, message, traceback) so the launcher can
report the rank's own error instead of torchrun's wrapper text.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from qwen3exp import rundir
from qwen3exp.platforms import PlatformFacts, prepare_worker


def load_run(run_dir: Path):
    import yaml

    from qwen3exp.schema import validate_experiment

    exp = validate_experiment(yaml.safe_load((run_dir / rundir.EXPERIMENT).read_text()))
    facts = PlatformFacts(**json.loads((run_dir / rundir.PLATFORM).read_text()))
    return exp, facts


def _write_error(run_dir: Path, exc: BaseException) -> None:
    rank = int(os.environ.get("RANK", "0"))
    rundir.atomic_write_json(run_dir / rundir.LOGS / f"error_rank{rank}.json", {
        "rank": rank,
        "time": time.time(),
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc(),
    })


def train(run_dir: Path) -> None:
    exp, facts = load_run(run_dir)
    prepare_worker(facts)

    import torch
    from torchtitan.tools.logging import init_logger

    from qwen3exp.kernels import overrides
    from qwen3exp.to_torchtitan import to_torchtitan

    init_logger()
    config = to_torchtitan(exp, facts, run_dir)
    trainer = None
    try:
        # torchtitan applies the overrides while building; keep its [Override] lines as a record.
        with overrides.record_applied(run_dir, write=int(os.environ.get("RANK", "0")) == 0):
            trainer = config.build()
        trainer.train()
    finally:
        if trainer is not None:
            trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = Path(argv[0]).resolve()
    try:
        train(run_dir)
    except KeyboardInterrupt:
        raise SystemExit(130)
    except BaseException as e:
        _write_error(run_dir, e)
        raise


if __name__ == "__main__":
    main()
