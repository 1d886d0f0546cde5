"""The command line: `python -m qwen3exp [overrides]` (`-m` for a sweep, `dry_run=true` to plan).

1. Every point (one, or each point of a sweep) is composed, validated and planned before anything
   starts; any mistake prints the key, the value and what is allowed, and exits with code 2.
2. Then Hydra runs (or sweeps) for real with the run/sweep directory pinned to what was checked,
   and each job launches torchrun through `qwen3exp.launch`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from qwen3exp import rundir
from qwen3exp.compose import Invocation, compose_point, parse_argv, sweep_points
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError, Problem
from qwen3exp.schema import Experiment, validate_experiment

_results: list[dict] = []


def preflight(inv: Invocation) -> list[tuple[list[str], Experiment, str]]:
    """Compose and validate every point; returns (overrides, experiment, run dir) per point."""
    from qwen3exp.launch import prepare

    points = sweep_points(inv.overrides) if inv.multirun else [inv.overrides]
    out, problems = [], []
    for i, point in enumerate(points):
        context = f"sweep point {i + 1}/{len(points)} [{' '.join(o for o in point if not o.startswith('hydra.'))}]" \
            if inv.multirun else None
        try:
            composed = compose_point(point, config_dir=inv.config_dir, config_name=inv.config_name, context=context)
            exp = validate_experiment(composed.data, context=context)
            prepare(exp)
        except ConfigError as e:
            if e.context is None:
                e.context = context
            problems.append(e)
            continue
        out.append((point, exp, composed.sweep_dir if inv.multirun else composed.run_dir))
    if problems:
        raise ConfigError([p for e in problems for p in e.problems],
                          context="; ".join(e.context for e in problems if e.context) or None)
    return out


def rerun_problem(exp: Experiment, run_dir: Path) -> Problem | None:
    """A directory that holds a run is never overwritten. The one exception is resuming: with
    checkpoint=dcp and the identical resolved experiment (same experiment.yaml content hash) the
    run continues from its latest checkpoint. None: the rerun may go ahead."""
    new = rundir.experiment_yaml(exp.model_dump(mode="json"))
    try:
        old = (run_dir / rundir.EXPERIMENT).read_text()
    except OSError:
        old = None
    if exp.checkpoint.kind == "dcp" and old is not None and rundir.sha256(old) == rundir.sha256(new):
        return None
    if exp.checkpoint.kind != "dcp":
        message = "already holds a run; it is never overwritten (only checkpoint=dcp reruns resume)"
    elif old is None:
        message = f"already holds files of a run but no {rundir.EXPERIMENT}; cannot resume"
    else:
        changed = _changed_keys(old, new)
        message = (f"holds a run of a different experiment (experiment.yaml sha256 {rundir.sha256(old)[:12]}, "
                   f"this one {rundir.sha256(new)[:12]}; differing keys: {', '.join(changed) or '?'}); "
                   "a dcp rerun resumes only the identical experiment")
    return Problem("hydra.run.dir", str(run_dir), message, "a new directory (the default adds a timestamp)",
                   "choose another name=... or hydra.run.dir=..., or rerun with exactly the same settings")


def _changed_keys(old: str, new: str) -> list[str]:
    import yaml

    def flat(d, prefix=""):
        out = {}
        for k, v in (d or {}).items():
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    try:
        a, b = flat(yaml.safe_load(old)), flat(yaml.safe_load(new))
    except yaml.YAMLError:
        return []
    return sorted(k for k in a.keys() | b.keys() if a.get(k, object()) != b.get(k, object()))


def _task(cfg) -> None:
    """One Hydra job: validate (cheap, already checked), launch torchrun, record the summary."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from qwen3exp.launch import launch, prepare

    data = OmegaConf.to_container(cfg, resolve=True)
    data.pop("hydra", None)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    exp = validate_experiment(data)
    try:
        summary = launch(prepare(exp), run_dir)
    except ConfigError as e:
        _discard_if_empty(run_dir)
        print(e.render(), file=sys.stderr)
        if HydraConfig.get().mode.name == "RUN":
            raise SystemExit(EXIT_CONFIG_ERROR)
        summary = {"status": "failed", "exit_code": EXIT_CONFIG_ERROR, "error": e.render()}
    _results.append({"run_dir": str(run_dir), **summary})
    if summary.get("status") == "interrupted":
        raise SystemExit(summary["exit_code"])


def _discard_if_empty(run_dir: Path) -> None:
    """A job refused before launch leaves no directory that looks like a run."""
    if run_dir.is_dir() and not rundir.looks_like_run(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)


def _run_hydra(inv: Invocation, extra: list[str]) -> None:
    import hydra

    main = hydra.main(config_path=str(inv.config_dir), config_name=inv.config_name, version_base="1.3")(_task)
    saved = sys.argv
    sys.argv = [saved[0], *inv.hydra_argv(extra)]
    try:
        main()
    finally:
        sys.argv = saved


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    inv = parse_argv(argv)
    if inv.info_flags:  # --help, --cfg job, ...: Hydra answers by itself
        _run_hydra(inv, [])
        return 0
    try:
        points = preflight(inv)
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if any(exp.dry_run for _, exp, _ in points):
        from qwen3exp.report_plan import print_plans

        return print_plans(points)
    if inv.multirun:
        extra = [f"hydra.sweep.dir={points[0][2]}"]
    else:
        run_dir = Path(points[0][2])
        if rundir.looks_like_run(run_dir):
            problem = rerun_problem(points[0][1], run_dir)
            if problem is not None:
                print(ConfigError([problem]).render(), file=sys.stderr)
                return EXIT_CONFIG_ERROR
        extra = [f"hydra.run.dir={run_dir}"]
    _results.clear()
    _run_hydra(inv, extra)
    if not _results:
        return 1
    if len(_results) == 1:
        return int(_results[0]["exit_code"])
    failed = [r for r in _results if r["status"] != "completed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
