"""Benchmark: how much a dry run and a sweep's validation cost, next to a bare `import torch`.

    python tests/bench/bench_plan.py [--repeat 3]

Measured side by side in one run (median of --repeat runs each):
- `python -c "import torch"` (the reference: the least any training command pays);
- `python -m qwen3exp dry_run=true model.flavor=4B`: compose, validate, plan (parameters, memory,
  mesh, commands) and print a 4B experiment; goal: at most 2x the torch import;
- validating a 100-point sweep (`-m model.flavor=tiny,tiny_moe training.lr=<5 values>
  training.seed=range(10)`): `cli.preflight` in-process (compose, validate and plan every point);
  goal: under 5 s. The whole `python -m qwen3exp -m dry_run=true ...` command (which also prints 100
  plans) is shown too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
SWEEP = ["-m", "dry_run=true", "model.flavor=tiny,tiny_moe", "training.lr=1e-3,2e-3,3e-3,4e-3,5e-3",
         "training.seed=range(10)", "hydra.sweep.dir=/tmp/qwen3exp-bench-plan/sweep"]


def wall(argv: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(argv, env=ENV, cwd=REPO, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return statistics.median(times)


def preflight_seconds(repeat: int) -> tuple[float, int]:
    code = ("import sys, time; from qwen3exp.cli import preflight; from qwen3exp.config.compose import parse_argv; "
            "inv = parse_argv(sys.argv[1:]); t = time.perf_counter(); pts = preflight(inv); "
            "print(time.perf_counter() - t, len(pts))")
    times, n = [], 0
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", code, *SWEEP], env=ENV, cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
        times.append(float(out[0]))
        n = int(out[1])
    return statistics.median(times), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch_s = wall([sys.executable, "-c", "import torch"], args.repeat)
    dry_s = wall([sys.executable, "-m", "qwen3exp", "dry_run=true", "model.flavor=4B",
                  "hydra.run.dir=/tmp/qwen3exp-bench-plan/run"], args.repeat)
    pre_s, points = preflight_seconds(args.repeat)
    sweep_s = wall([sys.executable, "-m", "qwen3exp", *SWEEP], args.repeat)
    rows = [
        ("python -c 'import torch' (reference)", torch_s, 1.0, ""),
        ("dry run, 4B experiment", dry_s, dry_s / torch_s, "goal <= 2.0x torch import"),
        (f"validate a {points}-point sweep (preflight)", pre_s, pre_s / torch_s, "goal < 5 s"),
        (f"dry run of the {points}-point sweep (whole command)", sweep_s, sweep_s / torch_s, ""),
    ]
    print(f"{'what':<52} {'seconds':>8} {'x torch import':>15}  goal")
    for what, s, ratio, goal in rows:
        print(f"{what:<52} {s:>8.2f} {ratio:>15.2f}  {goal}")
    ok = dry_s <= 2 * torch_s and pre_s < 5
    print(f"per sweep point: {pre_s / points * 1000:.1f} ms;  goals {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
