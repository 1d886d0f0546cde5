"""`qwen3exp diff RUN_A RUN_B`: the keys whose resolved values differ between two runs.

Compares the resolved experiments (`experiment.yaml`), key by dotted key. With `--provenance` it
also compares where the runs came from (git commit, package versions, platform, host). Exit code
0: identical, 1: different, 2: a path is not a run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from qwen3exp.errors import EXIT_CONFIG_ERROR
from qwen3exp.run import rundir
from qwen3exp.run.identity import ABSENT, differences


def show(v: Any) -> str:
    if v is ABSENT:
        return "(absent)"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return v
    return str(v).lower() if isinstance(v, bool) or v is None else repr(v)


def _provenance_view(run: Path) -> dict:
    prov = rundir.read_json(run / rundir.PROVENANCE) or {}
    keep = ("git", "versions", "platform", "hostname")
    return {k: prov[k] for k in keep if k in prov}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m qwen3exp.analysis.diff", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--provenance", action="store_true",
                    help="also compare git commit, package versions, platform and host")
    args = ap.parse_args(argv)
    exps = []
    for run in (args.run_a, args.run_b):
        data = rundir.read_experiment(run)
        if data is None:
            print(f"qwen3exp.analysis.diff: {run} is not a run directory (no readable {rundir.EXPERIMENT})",
                  file=sys.stderr)
            return EXIT_CONFIG_ERROR
        exps.append(data)
    changes = differences(*exps)
    width = max((len(k) for k, _, _ in changes), default=0)
    for key, va, vb in changes:
        print(f"{key:<{width}}  {show(va)} -> {show(vb)}")
    if args.provenance:
        prov = differences(_provenance_view(args.run_a), _provenance_view(args.run_b))
        prov = [c for c in prov if not c[0].startswith("git.untracked")]
        for key, va, vb in prov:
            print(f"provenance.{key}  {show(va)} -> {show(vb)}")
        changes = changes + prov
    if not changes:
        print("identical resolved experiments" + (" and provenance" if args.provenance else ""))
    return 1 if changes else 0


if __name__ == "__main__":
    sys.exit(main())
