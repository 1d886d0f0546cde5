"""The Python API: the command line's pipeline, for notebooks and scripts.

    from qwen3exp import api
    exp = api.compose(["experiment=tiny_native", "training.steps=3"])   # -> Experiment
    plan = api.plan(exp)                                                 # -> Plan (what a dry run prints)
    summary = api.run(["training.steps=3"], run_dir="outputs/nb/first")  # -> summary.json as a dict

`overrides` are the command line's (`group=option`, `key=value`, `+key=value`); `config_dir` is your
own config folder (the command line's `-cd DIR`). `compose` and `plan` raise
`qwen3exp.errors.ConfigError` (its `problems` name the keys) and start nothing. `run` launches
exactly `python -m qwen3exp ...` in a child process (Hydra, signals and torchrun stay out of the
notebook's interpreter) and returns the run's summary; a configuration mistake raises `Refused`
with the message the command line prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from qwen3exp.config.argv import parse_argv, quote_value
from qwen3exp.config.composer import compose_experiment
from qwen3exp.config.names import stamp
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError
from qwen3exp.plan.build import make_plan
from qwen3exp.run import rundir
from qwen3exp.titan.job_config import override_claims


class Refused(Exception):
    """`run` was refused before anything started (exit code 2); the message is the command line's."""


def _argv(overrides: Sequence[str], config_dir: str | Path | None) -> list[str]:
    return [*(["--config-dir", str(Path(config_dir).resolve())] if config_dir is not None else []), *overrides]


def compose(overrides: Sequence[str] = (), *, config_dir: str | Path | None = None):
    """The validated Experiment of these overrides (no files read beyond the config files)."""
    inv = parse_argv(_argv(overrides, config_dir))
    return compose_experiment(inv.overrides, config_dir=inv.config_dir, config_name=inv.config_name)


def plan(exp, run_dir: str | Path | None = None):
    """Resolve and check everything a launch would (model files, data, platform, mesh, memory,
    placement); the Plan a dry run prints. Raises ConfigError naming every problem."""
    where = run_dir if run_dir is not None else f"outputs/{exp.name}/{stamp()}"
    return make_plan(exp, where, claims_of=override_claims)


def run(
    overrides: Sequence[str] = (),
    *,
    config_dir: str | Path | None = None,
    run_dir: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    quiet: bool = True,
) -> dict:
    """Train: `python -m qwen3exp OVERRIDES` in a child process; returns summary.json. `run_dir`:
    Hydra's run directory (default: a new `outputs/<name>/<stamp>`, computed here so that the
    summary can be read back); `quiet`: keep the child's output out of the notebook (it is in the
    run directory's logs) unless the run is refused."""
    if run_dir is None:
        try:  # the run's name, for its default directory: a mistake is refused like the command line's
            run_dir = Path("outputs") / compose(overrides, config_dir=config_dir).name / stamp()
        except ConfigError as e:
            raise Refused(e.render()) from None
    argv = [*_argv(overrides, config_dir), f"hydra.run.dir={quote_value(str(run_dir))}"]
    proc = subprocess.run(
        [sys.executable, "-m", "qwen3exp", *argv], env={**os.environ, **(env or {})}, capture_output=quiet, text=True
    )
    if proc.returncode == EXIT_CONFIG_ERROR:
        raise Refused((proc.stderr or "").strip() or f"refused (exit {EXIT_CONFIG_ERROR}); see the output above")
    summary = rundir.read_json(Path(run_dir) / rundir.SUMMARY)
    if not isinstance(summary, dict):
        raise RuntimeError(f"the run wrote no summary (exit {proc.returncode}): {(proc.stderr or '')[-2000:]}")
    return summary


__all__ = ["ConfigError", "Refused", "compose", "plan", "run"]
