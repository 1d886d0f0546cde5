"""`qwen3exp diff RUN_A RUN_B`: the keys whose resolved values differ between two runs.

Compares the resolved experiments (`experiment.yaml`), key by dotted key, leaving out the
presentation keys (verbose, dry_run: `rundir.IDENTITY_IGNORES`, which the experiment hash leaves out
too). With `--provenance` it also compares where the runs came from (qwen3exp's git commit, the
commit of the repository that holds the experiments, package versions, platform, host). Exit code
0: identical, 1: different, 2: a path is not a run, or a recorded file is not readable as data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from qwen3exp.errors import EXIT_CONFIG_ERROR, printable
from qwen3exp.run import records, rundir
from qwen3exp.run.identity import ABSENT, differences

PROG = "python -m qwen3exp.analysis.diff"
PROVENANCE_KEYS = ("git", "experiments", "versions", "platform", "hostname")
"""What `--provenance` compares: qwen3exp's source tree, the experiments repository, the packages,
the platform and the host (not the time, the command line or the environment)."""


def show(v: Any) -> str:
    if v is ABSENT:
        return "(absent)"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return v
    return str(v).lower() if isinstance(v, bool) or v is None else repr(v)


def _provenance_view(run: Path) -> dict:
    """The compared part of a run's provenance.json ({} when it has none); the untracked files are
    left out (listed by name only, they say nothing about the code that ran)."""
    prov = records.load_json(run / rundir.PROVENANCE)
    if prov is None:
        return {}
    if not isinstance(prov, dict):
        raise records.Unreadable(run / rundir.PROVENANCE, f"a JSON {type(prov).__name__}, not an object")
    view = {k: prov[k] for k in PROVENANCE_KEYS if k in prov}
    return {k: v for k, v in rundir.flatten(view).items() if ".untracked" not in f".{k}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument(
        "--provenance",
        action="store_true",
        help="also compare git commits (qwen3exp's, the experiments repository's), package versions, platform and host",
    )
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # argparse printed the usage and the mistake (an unknown option, ...)
        return e.code if isinstance(e.code, int) else EXIT_CONFIG_ERROR
    try:
        exps = [_experiment(run) for run in (args.run_a, args.run_b)]
        provs = [_provenance_view(run) for run in (args.run_a, args.run_b)] if args.provenance else []
    except records.Unreadable as e:
        print(f"{PROG}: {printable(str(e))}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    changes = differences(*(rundir.identity_view(e) for e in exps))
    width = max((len(k) for k, _, _ in changes), default=0)
    for key, va, vb in changes:
        print(printable(f"{key:<{width}}  {show(va)} -> {show(vb)}"))
    if args.provenance:
        prov = differences(*provs)
        for key, va, vb in prov:
            print(printable(f"provenance.{key}  {show(va)} -> {show(vb)}"))
        changes = changes + prov
    if not changes:
        print("identical resolved experiments" + (" and provenance" if args.provenance else ""))
    return 1 if changes else 0


def _experiment(run: Path) -> dict:
    data = rundir.load_experiment(run) if run.is_dir() else None
    if data is None:
        raise records.Unreadable(run, f"not a run directory (no readable {rundir.EXPERIMENT})")
    return data


if __name__ == "__main__":
    sys.exit(main())
