"""Adaptive sweeps (a Hydra sweeper that picks its points as it goes, such as Optuna's): what the
command line does around them.

The points are not known before the sweeper runs, so:
- every batch of trials the sweeper asks for is checked and planned by qwen3exp's launcher before
  any trial of it starts, like any batch (`qwen3exp.launchers.batch`);
- before the first trial, representative points are checked and planned (`check_space`: each
  value of a list or choice(), both ends of each interval()), so a value the schema refuses is
  exit 2 before any trial starts; a point that only does not fit (a batch too large for the memory)
  is said and the search starts anyway: such trials are refused when the sweeper picks them and go
  back to it as the worst value (`batch.refused_return`), unless no representative point fits;
  `dry_run=true` does not pretend to know the points (`dry_run`): it prints the search space, the
  trial budget and the first representative point's plan;
- the sweeper's direction must agree with the objective the jobs return (`sweep.objective`):
  minimizing tokens/s would be exit 2, not a search for the slowest run (`direction_problems`);
- a search with a storage (Optuna: `hydra.sweeper.storage`, e.g. SQLite in the sweep directory)
  continues when rerun into the same `hydra.sweep.dir` (`resume_overrides`): the trials it
  finished count towards `hydra.sweeper.n_trials` (the Optuna sweeper itself would run n_trials
  more), trials left running by a stopped search are marked failed (only in a study in the sweep
  directory, which the launch holds: a shared database is left alone), and finished trials are never
  run again (a seeded sampler is seeded past the trials so far, so it does not propose them again).
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from qwen3exp.config.argv import Invocation, parse_overrides
from qwen3exp.config.composer import Composer
from qwen3exp.config.names import safe_dirname
from qwen3exp.config.precheck import Master
from qwen3exp.config.sweeps import representative_values
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError, Problem
from qwen3exp.launchers.points import HydraFiles, check_job
from qwen3exp.plan.memory_fit import DoesNotFit
from qwen3exp.plan.render import print_plans
from qwen3exp.run.rundir import IDENTITY_IGNORES

OPTUNA = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"


def _select(cfg, key: str, default=None):
    return OmegaConf.select(cfg, key, default=default, throw_on_resolution_failure=False)


def _directions(cfg) -> list[str]:
    raw = _select(cfg, "hydra.sweeper.direction")
    items = list(raw) if raw is not None and not isinstance(raw, str) and hasattr(raw, "__iter__") else [raw]
    return [str(d).rsplit(".", 1)[-1] for d in items if d is not None]


def direction_problems(master: Master, exp) -> list[Problem]:
    """The sweeper's direction (when it has one) against the objective each job returns."""
    metric, direction = exp.sweep_target
    found = _directions(master.cfg)
    if not found:
        return []
    if len(found) > 1:
        return [
            Problem(
                "hydra.sweeper.direction",
                found,
                f"asks for {len(found)} objectives; each job returns one ({metric}, sweep.objective)",
                f"a single direction: {direction}",
            )
        ]
    if found[0] != direction:
        return [
            Problem(
                "hydra.sweeper.direction",
                found[0],
                f"but sweep.objective={metric} is {direction}d (the sweeper would search for the worst runs)",
                direction,
                f"hydra.sweeper.direction={direction}, or another sweep.objective",
            )
        ]
    return []


def space_lines(master: Master) -> list[str]:
    """The search space and the budget, as the sweeper will read them."""
    lines = []
    for line in master.sweeps:
        key, _, spec = line.partition("=")
        lines.append(f"  {key:<28} {spec}")
    trials, jobs = _select(master.cfg, "hydra.sweeper.n_trials"), _select(master.cfg, "hydra.sweeper.n_jobs")
    sampler = _select(master.cfg, "hydra.sweeper.sampler._target_")
    storage = _select(master.cfg, "hydra.sweeper.storage")
    budget = [
        f"{trials} trial(s)" if trials is not None else None,
        f"{jobs} per batch" if jobs is not None else None,
        f"sampler {sampler}" if sampler else None,
        f"direction {'/'.join(_directions(master.cfg))}" if _directions(master.cfg) else None,
        f"storage {storage}" if storage else "no storage (a stopped search cannot continue)",
    ]
    lines.append("  budget: " + ", ".join(b for b in budget if b))
    return lines


def representative_points(master: Master, inv: Invocation) -> list[list[str]]:
    """The first value of every swept key, then each further representative value of one key at a
    time (a list's values, an interval's ends): the points a dry run checks."""
    fixed = [o for o in inv.overrides if not parse_overrides([o])[0].is_sweep_override()]
    swept = parse_overrides(master.sweeps)
    values = {o.key_or_group: representative_values(o) for o in swept}
    first = {k: v[0] for k, v in values.items() if v}
    points = [[*fixed, *(f"{k}={v}" for k, v in first.items())]]
    for k, vs in values.items():
        for v in vs[1:]:
            points.append([*fixed, *(f"{kk}={v if kk == k else vv}" for kk, vv in first.items())])
    return points


def check_space(master: Master, inv: Invocation) -> list:
    """Check and plan the representative points (`representative_points`); raises ConfigError with
    every problem of every point, or about the sweeper's direction. Runs and writes nothing."""
    points: list = []
    errors: list[ConfigError] = []
    unfit: list[ConfigError] = []
    with Composer(inv.config_dir, inv.config_name) as c:
        searchpath = [o for o in inv.overrides if o.split("=", 1)[0] == "hydra.searchpath"]
        files = HydraFiles(c.loader, inv.config_name, searchpath)
        for i, overrides in enumerate(representative_points(master, inv)):
            task = [o for o in overrides if not (o.startswith("hydra.") or o.startswith("hydra/"))]
            label = " ".join(o for o in task[-len(master.sweeps) :]) if master.sweeps else "(no swept key)"
            # A trial's folder is named by its overrides, like any sweep job's.
            folder = safe_dirname(",".join(sorted(o for o in task if o.split("=", 1)[0] not in IDENTITY_IGNORES)))
            try:
                cfg = c.compose([*overrides, "hydra.sweeper.params=null"])
                points.append(
                    check_job(
                        cfg,
                        files,
                        task,
                        context=f"representative point {i + 1} [{label}]",
                        run_dir=str(Path(master.output_dir) / folder),
                    )
                )
            except DoesNotFit as e:
                unfit.append(e)
            except ConfigError as e:
                errors.append(e)
    if errors or (unfit and not points):
        raise ConfigError.several(errors or unfit)
    for refusal in unfit:  # the search starts: such trials are refused when the sweeper picks them
        print(
            f"{refusal.render()}\nqwen3exp: trials there will be refused before launch; the search goes on",
            file=sys.stderr,
        )
    if points and (problems := direction_problems(master, points[0].exp)):
        raise ConfigError(problems)
    return points


def dry_run(master: Master, inv: Invocation) -> int:
    """`dry_run=true` with an adaptive sweeper: the space, the budget, and the representative
    points checked; exit 2 when one of them is refused. Runs nothing, writes nothing."""
    print(
        f"qwen3exp dry run of an adaptive sweep ({master.sweeper}): its points are chosen while it runs; "
        "each batch of trials is checked and planned before any trial of it starts"
    )
    print("search space:")
    for line in space_lines(master):
        print(line)
    try:
        points = check_space(master, inv)
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(
        f"checked {len(points)} representative point(s) (every listed value, both ends of every interval): "
        "all pass. The first, planned:"
    )
    print_plans(points[:1])
    return 0


def resume_overrides(master: Master, sweep_dir: Path) -> list[str]:
    """Overrides that make a rerun of a stored Optuna search continue it (see the module docstring);
    [] for a new search, another sweeper or no storage."""
    if master.sweeper != OPTUNA:
        return []
    # The storage URL may name the sweep directory: resolve it with the directory Hydra will get.
    plain = OmegaConf.to_container(master.cfg, resolve=False)
    assert isinstance(plain, dict)
    plain["hydra"]["sweep"]["dir"] = str(sweep_dir)
    cfg = OmegaConf.create(plain)
    storage = OmegaConf.select(cfg, "hydra.sweeper.storage", default=None)
    name = OmegaConf.select(cfg, "hydra.sweeper.study_name", default=None)
    n_trials = OmegaConf.select(cfg, "hydra.sweeper.n_trials", default=None)
    if not storage or not name or n_trials is None:
        return []
    import optuna  # lazy: optional (the optuna extra), only for hydra/sweeper=optuna searches

    try:
        study = optuna.load_study(study_name=str(name), storage=str(storage))
    except KeyError:  # no such study yet: a new search
        return []
    states = optuna.trial.TrialState
    # Trials left running are this search's own only when the study lives in the sweep directory,
    # which this launch holds; a shared storage (a database other workers use) is left as it is.
    owned = _inside(str(storage), sweep_dir)
    stale = [t for t in study.get_trials(deepcopy=False) if t.state == states.RUNNING] if owned else []
    for t in stale:  # left running by a stopped search
        study.tell(t.number, state=states.FAIL)
    finished = sum(t.state in (states.COMPLETE, states.PRUNED, states.FAIL) for t in study.get_trials(deepcopy=False))
    finished -= len(stale)
    left = max(0, int(n_trials) - finished)
    print(
        f"qwen3exp: continuing the search in {storage} (study {name}): {finished} trial(s) finished earlier, "
        f"{len(stale)} left running by the stopped search marked failed, {left} of {n_trials} to go",
        flush=True,
    )
    extra = [f"hydra.sweeper.n_trials={left}"]
    seed = OmegaConf.select(cfg, "hydra.sweeper.sampler.seed", default=None)
    if isinstance(seed, int):
        # A seeded sampler in a new process starts its random sequence again and would propose the
        # points it already tried (their folders hold finished runs: skipped, but the budget is
        # spent on them). Seed it past the trials so far: still reproducible, no repeats.
        extra.append(f"hydra.sweeper.sampler.seed={seed + len(study.get_trials(deepcopy=False))}")
    return extra


def _inside(storage: str, sweep_dir: Path) -> bool:
    """An SQLite storage URL (`sqlite:///PATH`) whose file lies in the sweep directory."""
    prefix = "sqlite:///"
    if not storage.startswith(prefix):
        return False
    return Path(storage[len(prefix) :]).resolve().is_relative_to(Path(sweep_dir).resolve())
