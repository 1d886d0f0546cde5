"""Benchmark: the time one TAB costs, qwen3exp's own answer next to Hydra's, measured in one run.

    python tests/bench/bench_completion.py [--repeat 5]

Each row is a command line typed so far; a TAB runs `qwen3exp -sc query=bash` with it in COMP_LINE
(the function `eval "$(qwen3exp -sc install=bash)"` installs). Side by side, median of --repeat runs:
- qwen3exp's answer: the console script (`qwen3exp.entry` -> `qwen3exp.completion`: the config
  folders and the schema's keys, nothing composed), with the key table cached (every TAB but the
  first after the schema changed); one more row: the first TAB, which builds the table;
- Hydra's answer, the one the console script gave before: `qwen3exp.cli.entry()` (the whole command
  line imported, Hydra composes the config);
- the `-sc install=bash` line itself (a shell pays it at every start when .bashrc evaluates it);
- `python -c pass`, the least any answer costs.
Both answers run from a folder holding a user's conf/experiment/my_exp.yaml; the last column says
whether the answer to `-cd conf experiment=` offers it (Hydra's does not see the `-cd` of the line).
Goal: under 1 s per TAB.
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
LINES = [
    "qwen3exp ",
    "qwen3exp tr",
    "qwen3exp training.",
    "qwen3exp model=h",
    "qwen3exp -cd conf experiment=",
]
HYDRA = [sys.executable, "-c", "from qwen3exp.cli import entry; entry()"]
"""Hydra's answer: the command line as it was the console script's (`qwen3exp.cli:entry`)."""


def own_program() -> list[str]:
    script = Path(sys.executable).parent / "qwen3exp"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "qwen3exp"]


def timed(argv: list[str], line: str | None, cwd: Path, repeat: int) -> tuple[float, float, str]:
    """(median wall seconds, median CPU seconds (user + system), the last answer). The CPU time is
    the wall time of a TAB on an idle core; on a loaded machine the wall time grows, the CPU time not."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env["XDG_CACHE_HOME"] = str(cwd / "cache")  # qwen3exp.completion_keys' table: this run's own
    if line is not None:
        env.update(COMP_LINE=line, COMP_POINT=str(len(line)))
    times, cpus, out = [], [], ""
    for _ in range(repeat):
        start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(
                f"{' '.join(argv)} (COMP_LINE={line!r}) failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        out = proc.stdout
    return statistics.median(times), statistics.median(cpus), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    own = own_program()
    with tempfile.TemporaryDirectory(prefix="qwen3exp-bench-completion-") as tmp:
        cwd = Path(tmp)
        (cwd / "conf" / "experiment").mkdir(parents=True)
        (cwd / "conf" / "experiment" / "my_exp.yaml").write_text("# @package _global_\nname: mine\n")
        bare, bare_cpu, _ = timed([sys.executable, "-c", "pass"], None, cwd, args.repeat)
        print(f"python -c pass: {bare:.2f} s ({bare_cpu:.2f} s CPU)    qwen3exp: {' '.join(own)}")
        print("seconds per answer: wall (CPU); the CPU time is the wall time on an idle core")
        head = f"{'COMP_LINE':<34} {'qwen3exp':>12} {'Hydra':>12} {'Hydra/qwen3exp':>15}  {'words':>7}  my_exp"
        print(head)
        cold, cold_cpu, _ = timed([*own, "-sc", "query=bash"], "qwen3exp training.", cwd, 1)
        print(f"{'(first TAB: builds the key table)':<34} {cold:>5.2f} ({cold_cpu:.2f})")
        worst, worst_wall = 0.0, 0.0
        for line in [*LINES, None]:
            query = ["-sc", "install=bash"] if line is None else ["-sc", "query=bash"]
            fast, fast_cpu, fast_out = timed([*own, *query], line, cwd, args.repeat)
            slow, slow_cpu, slow_out = timed([*HYDRA, *query], line, cwd, args.repeat)
            if line is not None:
                worst, worst_wall = max(worst, fast_cpu), max(worst_wall, fast)
            words = f"{len(fast_out.split())}/{len(slow_out.split())}" if line is not None else ""
            mine = "experiment=my_exp"
            seen = f"{mine in fast_out.split()}/{mine in slow_out.split()}" if line and "-cd" in line else ""
            label = repr(line) if line is not None else "(-sc install=bash)"
            pair = f"{fast:>5.2f} ({fast_cpu:.2f}) {slow:>5.2f} ({slow_cpu:.2f})"
            print(f"{label:<34} {pair} {slow_cpu / fast_cpu:>15.1f}  {words:>7}  {seen}")
    verdict = "met" if worst < 1 else "NOT met"
    print(f"slowest TAB of qwen3exp's answer: {worst_wall:.2f} s wall, {worst:.2f} s CPU")
    print(f"goal < 1 s per TAB on an idle core (the CPU time): {verdict}")


if __name__ == "__main__":
    main()
