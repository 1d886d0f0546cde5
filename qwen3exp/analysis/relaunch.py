"""`qwen3exp relaunch RUN [overrides]`: run a recorded run again from its directory.

A run's `.hydra/config.yaml` is its complete composed config (every config group already applied),
so `python -m qwen3exp --config-path RUN/.hydra --config-name config` recomposes the same
experiment. This command runs exactly that, into `outputs/<name>/<timestamp>-relaunch` (or the
`hydra.run.dir=...` you pass), and around it:
- before: checks that the recomposed experiment equals the recorded `experiment.yaml` (else it
  lists the keys that differ), and warns when the source tree (git commit, local changes) or the
  package versions differ from the run's `provenance.json` (`git apply RUN/git.diff` on the
  recorded commit recreates the recorded tree);
- after: compares the losses step by step with the recorded run's.
Extra overrides (`training.steps=50`) change the relaunched run as usual.

A recorded run directory is data, and qwen3exp never runs code from it nor resolves anything in it:
before anything is composed, its `.hydra/` must hold no folder of config groups and its
`.hydra/config.yaml` is read as plain data within size and depth limits and refused (exit 2, the
key named) when it asks for any code or holds an interpolation (`qwen3exp.analysis.recorded_config`).
The relaunch starts a new run: a `hydra.run.dir` that already holds a run or a checkpoint (the
recorded run itself among them) is refused, since the run would continue from a checkpoint that
came with the data (DCP checkpoints are pickles).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from qwen3exp.analysis.diff import show
from qwen3exp.analysis.recorded_config import hydra_folder_problems, recorded_code_problems
from qwen3exp.config.argv import quote_value
from qwen3exp.config.compose import experiment_data
from qwen3exp.config.composer import Composer
from qwen3exp.config.names import stamp
from qwen3exp.config.schema import validate_experiment
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError, Problem, printable
from qwen3exp.run import identity, metrics_file, provenance, records, rundir
from qwen3exp.run.identity import differences


def main(argv: list[str], run_command) -> int:
    """`run_command(argv, command=...)`: the command line's main (the relaunch runs through it)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else EXIT_CONFIG_ERROR
    run, overrides = Path(argv[0]), argv[1:]
    if flags := [a for a in argv if a.startswith("-")]:
        print(
            f"qwen3exp relaunch: unknown option {printable(flags[0])}\nusage: qwen3exp relaunch RUN [overrides]",
            file=sys.stderr,
        )
        return EXIT_CONFIG_ERROR
    config_dir = (run / rundir.HYDRA).resolve()
    if not (config_dir / "config.yaml").is_file():
        print(
            f"qwen3exp relaunch: {printable(str(run))} is not a run directory (no {rundir.HYDRA}/config.yaml)",
            file=sys.stderr,
        )
        return EXIT_CONFIG_ERROR
    try:
        recorded = _recorded(run, config_dir, overrides)
        exp, run_dir = _compose(config_dir, overrides)
        _check_target(run, Path(run_dir))
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    new = identity.recorded_data(exp)
    if recorded is not None:
        _report_config(recorded, new, overrides)
    _report_code(run)
    kept = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    code = run_command(
        [
            "--config-path",
            str(config_dir),
            "--config-name",
            "config",
            *kept,
            *RECOMPOSE,
            f"hydra.run.dir={quote_value(run_dir)}",
        ],
        command=[sys.executable, "-m", "qwen3exp", "relaunch", *argv],
    )
    if code == 0 and not exp.dry_run:
        print(compare_losses(run, Path(run_dir)))
    return code


def _recorded(run: Path, config_dir: Path, overrides: list[str]) -> dict | None:
    """The recorded experiment (experiment.yaml, None when there is none), once the recorded
    `.hydra/` has been checked as data; ConfigError naming every problem."""
    config = config_dir / "config.yaml"
    problems = hydra_folder_problems(config_dir) + recorded_code_problems(config, run.resolve(), tuple(overrides))
    if problems:
        raise ConfigError(problems, context=f"the recorded {config}")
    try:
        return rundir.load_experiment(run)
    except records.Unreadable as e:
        raise ConfigError(
            [
                Problem(
                    "(recorded run)",
                    str(e.path),
                    f"not readable as plain data: {e.why}",
                    f"the {rundir.EXPERIMENT} qwen3exp wrote (a YAML mapping of a few kB)",
                )
            ]
        ) from None


def _check_target(run: Path, target: Path) -> None:
    """A relaunch starts a new run: never into the recorded run, nor into a folder that holds a run or
    a checkpoint (the launcher would continue it, loading a checkpoint qwen3exp did not write there)."""
    same = target.resolve() == run.resolve()
    holds = rundir.looks_like_run(target) or os.path.lexists(target / rundir.CHECKPOINT)
    if same or holds:
        raise ConfigError(
            [
                Problem(
                    "hydra.run.dir",
                    str(target),
                    "is the recorded run itself" if same else "already holds a run or a checkpoint",
                    "a new or empty directory (relaunch starts a new run; the default is "
                    "outputs/<name>/<stamp>-relaunch)",
                    hint="to continue a run, rerun its own command (command.txt) in its folder; a checkpoint that "
                    "came with a recorded run is never loaded (DCP checkpoints are pickles)",
                )
            ]
        )


RECOMPOSE = ("hydra/launcher=qwen3exp", "hydra.job.name=qwen3exp")
"""A recorded config.yaml holds the experiment, not Hydra's settings: qwen3exp's launcher (the
command line adds it too) and job name."""


def _compose(config_dir: Path, overrides: list[str]):
    """(the validated experiment, the new run's directory: the `hydra.run.dir` passed, else
    outputs/<the composed, validated name>/<stamp>-relaunch)."""
    given = any(o.startswith("hydra.run.dir=") for o in overrides)
    with Composer(config_dir, "config") as c:
        cfg = c.compose([*overrides, *RECOMPOSE])
        data, problems = experiment_data(cfg)
        run_dir = str(OmegaConf.select(cfg, "hydra.run.dir")) if given else None
    if problems:
        raise ConfigError(problems)
    exp = validate_experiment(data)
    return exp, run_dir or f"outputs/{exp.name}/{stamp()}-relaunch"


def _report_config(recorded: dict, new: dict, overrides: list[str]) -> None:
    changes = differences(rundir.identity_view(recorded), rundir.identity_view(new))
    h = rundir.experiment_hash(new)[:12]  # `new` is the recorded form: this is its identity
    if not changes:
        print(f"qwen3exp relaunch: same resolved experiment as recorded (hash {h})")
        return
    asked = [o for o in overrides if not o.startswith("hydra.")]
    print(
        "qwen3exp relaunch: the resolved experiment differs from the recorded one"
        + (f" (you passed {' '.join(asked)})" if asked else " (qwen3exp's schema or defaults changed since)")
        + ":\n"
        + "\n".join(f"  {k}: {show(a)} -> {show(b)}" for k, a, b in changes)
    )


def _report_code(run: Path) -> None:
    try:
        prov = records.load_json(run / rundir.PROVENANCE)
    except records.Unreadable as e:
        print(f"qwen3exp relaunch: warning: {printable(str(e))}; the code version cannot be checked")
        return
    if not isinstance(prov, dict):
        print(f"qwen3exp relaunch: warning: {run} has no {rundir.PROVENANCE}; the code version cannot be checked")
        return
    then, vers_then = (v if isinstance(v := prov.get(k), dict) else {} for k in ("git", "versions"))
    now, diff_now = provenance.source_git_state()
    vers_now = provenance.versions()
    notes = _code_notes(run, then, now, diff_now)
    for pkg in sorted(set(vers_then) | set(vers_now)):
        if pkg != "wandb" and vers_then.get(pkg) != vers_now.get(pkg):
            notes.append(f"{pkg} {vers_then.get(pkg)} then, {vers_now.get(pkg)} now")
    if notes:
        print(
            "qwen3exp relaunch: warning: the code differs from the recorded run:\n  "
            + "\n  ".join(printable(n) for n in notes)
        )
        return
    if now.get("commit"):
        what = f"commit {str(now['commit'])[:12]}" + (", same local changes" if now.get("dirty") else "")
    else:  # an installed qwen3exp, or a checkout with no commit yet: the versions are what was compared
        why = now.get("note") or now.get("error") or "no git commit"
        version = f"qwen3exp {vers_now['qwen3exp']} and " if vers_now.get("qwen3exp") else ""
        what = f"{version}the same package versions; no git commit to compare: {why}"
    print(f"qwen3exp relaunch: same code as recorded ({printable(what)})")


def _code_notes(run: Path, then: dict, now: dict, diff_now: str | None) -> list[str]:
    """How qwen3exp's source tree now differs from the recorded one (commit, local changes)."""
    notes = []
    if then.get("commit") != now.get("commit"):
        notes.append(f"git commit {then.get('commit') or 'none'} then, {now.get('commit') or 'none'} now")
    if then.get("dirty"):
        try:
            recorded = records.read_text(run / rundir.GIT_DIFF)
        except records.Unreadable:
            recorded = None
        if recorded is None or diff_now is None or recorded != diff_now:
            notes.append(
                f"the recorded tree had local changes ({run / rundir.GIT_DIFF}), the current tree "
                + ("has other changes" if diff_now else "has none")
            )
    elif now.get("dirty"):
        notes.append("the current tree has local changes, the recorded one had none")
    return notes


def compare_losses(a: Path, b: Path) -> str:
    # A non-finite loss is recorded as null (metrics.jsonl is strict JSON): not comparable.
    ra = {m["step"]: m["loss"] for m in metrics_file.read_metrics(a) if m.get("loss") is not None}
    rb = {m["step"]: m["loss"] for m in metrics_file.read_metrics(b) if m.get("loss") is not None}
    common = sorted(set(ra) & set(rb))
    if not common:
        return "qwen3exp relaunch: no common logged steps to compare losses"
    diffs = [abs(ra[s] - rb[s]) for s in common]
    worst = max(diffs)
    if worst == 0:
        return f"qwen3exp relaunch: losses identical to {a} at all {len(common)} common steps"
    step = common[diffs.index(worst)]
    return (
        f"qwen3exp relaunch: losses differ from {a}: max |diff| {worst:.3g} at step {step} "
        f"({ra[step]:.6f} vs {rb[step]:.6f}) over {len(common)} common steps"
    )
