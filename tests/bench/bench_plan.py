"""Benchmark: how much a dry run and a sweep's validation cost, next to a bare `import torch`.

    python tests/bench/bench_plan.py [--repeat 3]

Measured side by side in one run (median of --repeat runs each):
- `python -c "import torch"` (the reference: the least any training command pays);
- `python -m qwen3exp dry_run=true model.flavor=4B`: compose, validate, plan (parameters, memory,
  mesh, commands) and print a 4B experiment; goal: at most 2x the torch import;
- validating a 100-point sweep (`-m model.flavor=tiny,tiny_moe training.lr=<5 values>
  training.seed=range(10)`), measured inside one dry run of the whole command: qwen3exp's checks of
  every job (`launchers.batch.check_job`: schema, plan: parameters, memory, mesh, files; goal: under
  5 s) next to Hydra's own composition of the jobs (`ConfigLoader.load_sweep_config`, which
  qwen3exp's launcher calls once per job as Hydra's launchers do, plus the basic sweeper's own
  `validate_batch_is_legal` pass). The whole `python -m qwen3exp -m dry_run=true ...` command (which
  also prints 100 plans) is shown too.
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


_TIMED = """
import sys, time
from hydra.core.utils import JobReturn
from qwen3exp import cli
from qwen3exp.launchers import batch
spent = {"check": 0.0, "compose": 0.0, "jobs": 0}
check = batch.check_job
def timed_check(*a, **k):
    t = time.perf_counter()
    try:
        return check(*a, **k)
    finally:
        spent["check"] += time.perf_counter() - t
        spent["jobs"] += 1
batch.check_job = timed_check
launch = batch.launch
def timed_launch(config, hydra_context, *a, **k):
    loader = hydra_context.config_loader
    load = loader.load_sweep_config
    def timed_load(*la, **lk):
        t = time.perf_counter()
        try:
            return load(*la, **lk)
        finally:
            spent["compose"] += time.perf_counter() - t
    loader.load_sweep_config = timed_load
    try:
        return launch(config, hydra_context, *a, **k)
    finally:
        loader.load_sweep_config = load
batch.launch = timed_launch
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    code = cli.main(sys.argv[1:])
print(spent["check"], spent["compose"], spent["jobs"], code)
"""


def validation_seconds(repeat: int) -> tuple[float, float, int]:
    """(qwen3exp's checks, Hydra's composition, jobs) inside one dry run of the sweep (medians)."""
    checks, composes, n = [], [], 0
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", _TIMED, *SWEEP], env=ENV, cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
        checks.append(float(out[-4]))
        composes.append(float(out[-3]))
        n = int(out[-2])
    return statistics.median(checks), statistics.median(composes), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch_s = wall([sys.executable, "-c", "import torch"], args.repeat)
    dry_s = wall([sys.executable, "-m", "qwen3exp", "dry_run=true", "model.flavor=4B",
                  "hydra.run.dir=/tmp/qwen3exp-bench-plan/run"], args.repeat)
    pre_s, compose_s, points = validation_seconds(args.repeat)
    sweep_s = wall([sys.executable, "-m", "qwen3exp", *SWEEP], args.repeat)
    rows = [
        ("python -c 'import torch' (reference)", torch_s, 1.0, ""),
        ("dry run, 4B experiment", dry_s, dry_s / torch_s, "goal <= 2.0x torch import"),
        (f"qwen3exp's checks of a {points}-point sweep", pre_s, pre_s / torch_s, "goal < 5 s"),
        (f"Hydra's composition of the {points} jobs (launcher)", compose_s, compose_s / torch_s, "Hydra's own cost"),
        (f"dry run of the {points}-point sweep (whole command)", sweep_s, sweep_s / torch_s, ""),
    ]
    print(f"{'what':<52} {'seconds':>8} {'x torch import':>15}  goal")
    for what, s, ratio, goal in rows:
        print(f"{what:<52} {s:>8.2f} {ratio:>15.2f}  {goal}")
    ok = dry_s <= 2 * torch_s and pre_s < 5
    print(f"per sweep point: {pre_s / points * 1000:.1f} ms;  goals {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
