"""`python -m qwen3exp.relaunch RUN [overrides]`: run a recorded run again from its directory.

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
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from qwen3exp import rundir
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else EXIT_CONFIG_ERROR
    run, overrides = Path(argv[0]), argv[1:]
    config_dir = (run / rundir.HYDRA).resolve()
    if not (config_dir / "config.yaml").is_file():
        print(f"qwen3exp.relaunch: {run} is not a run directory (no {rundir.HYDRA}/config.yaml)", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    recorded = rundir.read_experiment(run)
    try:
        exp, run_dir = _compose(config_dir, overrides, recorded)
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    new = exp.model_dump(mode="json")
    if recorded is not None:
        _report_config(recorded, new, overrides)
    _report_code(run)
    from qwen3exp import cli

    kept = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    code = cli.main(["--config-path", str(config_dir), "--config-name", "config", *kept,
                     "hydra.job.name=qwen3exp", f"hydra.run.dir={_quote(run_dir)}"],
                    command=[sys.executable, "-m", "qwen3exp.relaunch", *argv])
    if code == 0 and not exp.dry_run:
        print(compare_losses(run, Path(run_dir)))
    return code


def _compose(config_dir: Path, overrides: list[str], recorded: dict | None):
    from qwen3exp.compose import _global_experiment, compose_point
    from qwen3exp.schema import validate_experiment

    ovs = [_global_experiment(o) for o in overrides]
    if not any(o.startswith("hydra.run.dir=") for o in ovs):
        name = (recorded or {}).get("name", "relaunch")
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        ovs.append(f"hydra.run.dir={_quote(f'outputs/{name}/{stamp}-relaunch')}")
    composed = compose_point(ovs, config_dir=config_dir, config_name="config")
    return validate_experiment(composed.data), composed.run_dir


def _quote(value: str) -> str:
    from qwen3exp.sweep import quote_value

    return quote_value(value)


def _report_config(recorded: dict, new: dict, overrides: list[str]) -> None:
    from qwen3exp.diff import differences, show

    changes = differences(recorded, new)
    h = rundir.experiment_hash(new)[:12]
    if not changes:
        print(f"qwen3exp.relaunch: same resolved experiment as recorded (hash {h})")
        return
    asked = [o for o in overrides if not o.startswith("hydra.")]
    print(f"qwen3exp.relaunch: the resolved experiment differs from the recorded one"
          + (f" (you passed {' '.join(asked)})" if asked else " (qwen3exp's schema or defaults changed since)")
          + ":\n" + "\n".join(f"  {k}: {show(a)} -> {show(b)}" for k, a, b in changes))


def _report_code(run: Path) -> None:
    from qwen3exp import provenance

    prov = rundir.read_json(run / rundir.PROVENANCE)
    if not isinstance(prov, dict):
        print(f"qwen3exp.relaunch: warning: {run} has no {rundir.PROVENANCE}; the code version cannot be checked")
        return
    notes = []
    then = prov.get("git") or {}
    now, diff_now = provenance.git_state(provenance.SOURCE_ROOT)
    if then.get("commit") != now.get("commit"):
        notes.append(f"git commit {then.get('commit')} then, {now.get('commit')} now")
    if then.get("dirty"):
        recorded = run / rundir.GIT_DIFF
        same = recorded.is_file() and diff_now is not None and recorded.read_text() == diff_now
        if not same:
            notes.append(f"the recorded tree had local changes ({recorded}), the current tree "
                         + ("has other changes" if diff_now else "has none"))
    elif now.get("dirty"):
        notes.append("the current tree has local changes, the recorded one had none")
    vers_then, vers_now = prov.get("versions") or {}, provenance.versions()
    for pkg in sorted(set(vers_then) | set(vers_now)):
        if pkg != "wandb" and vers_then.get(pkg) != vers_now.get(pkg):
            notes.append(f"{pkg} {vers_then.get(pkg)} then, {vers_now.get(pkg)} now")
    if notes:
        print("qwen3exp.relaunch: warning: the code differs from the recorded run:\n  " + "\n  ".join(notes))
    else:
        print(f"qwen3exp.relaunch: same code as recorded (commit {str(now.get('commit'))[:12]}"
              + (", same local changes)" if now.get("dirty") else ")"))


def compare_losses(a: Path, b: Path) -> str:
    ra = {m["step"]: m["loss"] for m in rundir.read_metrics(a)}
    rb = {m["step"]: m["loss"] for m in rundir.read_metrics(b)}
    common = sorted(set(ra) & set(rb))
    if not common:
        return "qwen3exp.relaunch: no common logged steps to compare losses"
    diffs = [abs(ra[s] - rb[s]) for s in common]
    worst = max(diffs)
    if worst == 0:
        return f"qwen3exp.relaunch: losses identical to {a} at all {len(common)} common steps"
    step = common[diffs.index(worst)]
    return (f"qwen3exp.relaunch: losses differ from {a}: max |diff| {worst:.3g} at step {step} "
            f"({ra[step]:.6f} vs {rb[step]:.6f}) over {len(common)} common steps")


if __name__ == "__main__":
    sys.exit(main())
