"""Benchmark: what a dry run and a sweep's dry run cost, next to a bare `import torch`.

    python tests/bench/bench_plan.py [--repeat 3]

Measured side by side in one run (median of --repeat runs each):
- `python -c "import torch"` (the reference: the least any training command pays);
- `python -m qwen3exp dry_run=true model.flavor=4B`: compose, validate, plan (parameters, memory,
  mesh, commands) and print a 4B experiment; goal: at most 0.5x the torch import;
- the whole 100-point grid's dry run (`-m dry_run=true model.flavor=tiny,tiny_moe training.lr=<5
  values> training.seed=range(10)`): compose, check and plan each of the 100 jobs once and print 100
  plans; goal: under 5 s (41 s before the launcher composed each job once: `qwen3exp.config.jobs`);
- the number of Hydra compositions that grid's dry run made (the one-pass counter), in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
SWEEP = [
    "-m",
    "dry_run=true",
    "model.flavor=tiny,tiny_moe",
    "training.lr=1e-3,2e-3,3e-3,4e-3,5e-3",
    "training.seed=range(10)",
]


def wall(argv: list[str], repeat: int) -> float:
    times = []
    for i in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(
            [a.replace("{i}", str(i)) for a in argv], env=ENV, cwd=REPO, capture_output=True, text=True
        )
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return statistics.median(times)


def compositions() -> dict:
    """The grid's dry run in this process: how many configs were composed, derived and validated."""
    from qwen3exp import cli
    from qwen3exp.config.jobs import COMPOSED
    from qwen3exp.config.schema import VALIDATIONS

    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main([*SWEEP, "hydra.sweep.dir=/tmp/qwen3exp-bench-plan/counted"])
    assert code == 0, code
    return {**COMPOSED, "validated": sum(VALIDATIONS.values())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch_s = wall([sys.executable, "-c", "import torch"], args.repeat)
    dry_s = wall(
        [
            sys.executable,
            "-m",
            "qwen3exp",
            "dry_run=true",
            "model.flavor=4B",
            "hydra.run.dir=/tmp/qwen3exp-bench-plan/run{i}",
        ],
        args.repeat,
    )
    sweep_s = wall(
        [sys.executable, "-m", "qwen3exp", *SWEEP, "hydra.sweep.dir=/tmp/qwen3exp-bench-plan/sweep{i}"], args.repeat
    )
    rows = [
        ("python -c 'import torch' (reference)", torch_s, 1.0, ""),
        ("dry run, 4B experiment", dry_s, dry_s / torch_s, "goal <= 0.5x torch import"),
        ("dry run of the 100-point grid (whole command)", sweep_s, sweep_s / torch_s, "goal < 5 s"),
    ]
    print(f"{'what':<52} {'seconds':>8} {'x torch import':>15}  goal")
    for what, s, ratio, goal in rows:
        print(f"{what:<52} {s:>8.2f} {ratio:>15.2f}  {goal}")
    counts = compositions()
    print("the grid's compositions in one process: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    ok = dry_s <= 0.5 * torch_s and sweep_s < 5
    print(f"goals {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
