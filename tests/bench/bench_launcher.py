"""End-to-end cost of qwen3exp's launcher on a 10-step tiny run, measured side by side.

A: `python -m qwen3exp training.steps=10` (Hydra compose, validation, the plan, run-directory
   files, torchrun, the ranks' rebuild and check of Trainer.Config, summary). The launcher itself
   imports neither torch nor torchtitan for this experiment: torchrun starts right after the plan.
B: the same Trainer.Config trained by torchtitan's trainer under a bare torchrun
   (tests/bench/direct_worker.py), same rank environment.
Runs alternate A, B, A, B, ... and the medians are compared. Goal: A / B < 1.10. The recorded
numbers are the default median of 5 (fewer repeats only while iterating). Each run's CPU time (user
+ system of every process it started) is compared too: A's CPU ranks are forked from their agent,
which imports torchtitan once (`forked_ranks`); B's bare torchrun starts a new interpreter per rank.

    .venv/bin/python tests/bench/bench_launcher.py [--repeats 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _env():
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return env


def _timed(argv: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process it started and waited for)."""
    before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(argv, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def ours(run_dir: Path, steps: int) -> tuple[float, float]:
    return _timed(
        [
            sys.executable,
            "-m",
            "qwen3exp",
            f"training.steps={steps}",
            "training.warmup_steps=2",
            f"hydra.run.dir={run_dir}",
        ],
        _env(),
    )


def direct(source_run: Path, out: Path) -> tuple[float, float]:
    import json

    env = _env()
    env.update(json.loads((source_run / "platform.json").read_text())["env"])
    return _timed(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:0",
            str(REPO / "tests/bench/direct_worker.py"),
            str(source_run),
            str(out),
        ],
        env,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    a, b = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for i in range(args.repeats):
            a.append(ours(tmp / f"ours{i}", args.steps))
            b.append(direct(tmp / "ours0", tmp / f"direct{i}"))
            print(
                f"  round {i + 1}: qwen3exp {a[-1][0]:6.2f} s ({a[-1][1]:5.1f} s CPU)   "
                f"direct torchrun {b[-1][0]:6.2f} s ({b[-1][1]:5.1f} s CPU)",
                flush=True,
            )
    (ma, ca), (mb, cb) = ([statistics.median(x) for x in zip(*runs, strict=True)] for runs in (a, b))
    print(f"launcher overhead, {args.steps}-step tiny run, 2 CPU ranks (median of {args.repeats}):")
    print(f"  python -m qwen3exp      {ma:6.2f} s  {ca:5.1f} s CPU (ranks forked from the agent)")
    print(f"  bare torchrun + trainer {mb:6.2f} s  {cb:5.1f} s CPU (a new interpreter per rank)")
    print(f"  ratio {ma / mb:.3f}  (goal < 1.10); CPU ratio {ca / cb:.3f}")


if __name__ == "__main__":
    main()
