"""The command line: `python -m qwen3exp [overrides]` (`-m` for a sweep, `dry_run=true` to plan).

1. Every point (one, or each point of a sweep) is composed, validated and planned before anything
   starts; any mistake prints the key, the value and what is allowed, and exits with code 2.
2. Then Hydra runs (or sweeps) for real with the run/sweep directory pinned to what was checked,
   and each job launches torchrun through `qwen3exp.launch`.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from qwen3exp import rundir
from qwen3exp.compose import Composer, Invocation, parse_argv, sweep_points
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError, Problem
from qwen3exp.schema import Experiment

if TYPE_CHECKING:
    from qwen3exp.plan import Plan
    from qwen3exp.provenance import Provenance

_results: list[dict] = []
_points: dict[tuple[str, ...], Point] = {}


@dataclass
class Point:
    """One checked point of a run or sweep."""

    overrides: list[str]
    exp: Experiment
    run_dir: str
    sweep_dir: str
    plan: Plan
    provenance: Provenance

    @property
    def task_key(self) -> tuple[str, ...]:
        return _task_key(self.overrides)


def _task_key(overrides) -> tuple[str, ...]:
    """The overrides Hydra records as the job's task overrides (hydra's own excluded)."""
    return tuple(o for o in overrides if not o.lstrip("+~").startswith("hydra"))


def preflight(inv: Invocation) -> list[Point]:
    """Compose, validate and plan every point; raise one ConfigError naming every problem of every
    point. Composition is shared between points (see `Composer`), so a 100-point sweep over values
    checks in about a second."""
    points = sweep_points(inv.overrides) if inv.multirun else [inv.overrides]
    out, errors = [], []
    with Composer(inv.config_dir, inv.config_name) as composer:
        for i, point in enumerate(points):
            context = f"sweep point {i + 1}/{len(points)} [{' '.join(o for o in point if not o.startswith('hydra.'))}]" \
                if inv.multirun else None
            try:
                out.append(check_point(composer, point, context=context, job_num=i if inv.multirun else None))
            except ConfigError as e:
                if e.context is None:
                    e.context = context
                errors.append(e)
    if errors:
        raise ConfigError.several(errors)
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


def check_point(composer: Composer, overrides: list[str], *, context: str | None = None,
                job_num: int | None = None) -> Point:
    """Every check of one point, all problems together, each with the file its value came from."""
    from qwen3exp.plan import make_plan, section_problems
    from qwen3exp.schema import check_experiment

    composed = composer.compose(overrides, context=context, job_num=job_num, collect=True)
    checked = check_experiment(composed.data)
    exp = checked.exp
    problems = _merge(composed.problems, checked.problems)
    if exp is None:
        problems = _merge(problems, section_problems(checked.sections, checked.replaced))
    provenance = composer.provenance(composed)
    plan = None
    if not problems:
        try:
            plan = make_plan(exp, composed.run_dir, overrides=overrides, provenance=provenance)
        except ConfigError as e:
            problems = e.problems
    if problems:
        raise ConfigError([_with_source(p, provenance) for p in problems], context=context)
    return Point(overrides, exp, composed.run_dir, composed.sweep_dir, plan, provenance)


def _merge(first: list[Problem], then: list[Problem]) -> list[Problem]:
    """`first` and the problems of `then` about other keys, or new messages about the same key
    (a value missing in the config is reported once, not again as missing by validation)."""
    reported = {p.key for p in first}
    seen = {(p.key, p.message) for p in first}
    out = list(first)
    for p in then:
        if (p.key, p.message) in seen or (p.key in reported and p.value is _missing()):
            continue
        seen.add((p.key, p.message))
        out.append(p)
    return out


def _missing():
    from qwen3exp.errors import MISSING

    return MISSING


def _with_source(p: Problem, provenance) -> Problem:
    if p.source is not None or p.key.startswith("("):
        return p
    return replace(p, source=str(provenance.source(p.key)))


def _task(cfg) -> None:
    """One Hydra job: validate (cheap, already checked), launch torchrun, record the summary."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from qwen3exp.launch import launch, prepare
    from qwen3exp.plan import make_plan
    from qwen3exp.schema import validate_experiment

    data = OmegaConf.to_container(cfg, resolve=True)
    data.pop("hydra", None)
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    exp = validate_experiment(data)
    checked = _points.get(_task_key(hc.overrides.task))
    try:
        plan = make_plan(exp, run_dir, overrides=list(hc.overrides.task),
                         provenance=checked.provenance if checked is not None else None)
        summary = launch(prepare(exp), run_dir, plan)
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
    if any(p.exp.dry_run for p in points):
        from qwen3exp.report_plan import print_plans

        return print_plans(points)
    _points.clear()
    _points.update({p.task_key: p for p in points})
    if inv.multirun:
        extra = [f"hydra.sweep.dir={points[0].sweep_dir}"]
    else:
        run_dir = Path(points[0].run_dir)
        if rundir.looks_like_run(run_dir):
            problem = rerun_problem(points[0].exp, run_dir)
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
