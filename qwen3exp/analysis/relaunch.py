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

A recorded run directory is data, and qwen3exp never runs code from it. Hydra instantiates
`_target_`s (callbacks, launcher, sweeper) and `logging.config` builds handlers and `()` factories
from the `hydra:` section of the config it composes, so before anything is composed the recorded
`.hydra/config.yaml` is read with `yaml.safe_load` and refused (exit 2, the key named) when it
asks for any code: see `recorded_code_problems`.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import yaml

from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError, Problem
from qwen3exp.run import rundir

DATA_NOT_CODE = ("a recorded run directory is data and qwen3exp never runs code from it; if you wrote "
                 "this yourself, put it in an experiment file and run python -m qwen3exp")
ALLOWED_TARGETS = {
    "hydra.launcher": ("hydra._internal.core_plugins.basic_launcher.BasicLauncher",
                       "hydra_plugins.qwen3exp_launcher.launcher.Qwen3expLauncher",
                       "hydra_plugins.hydra_submitit_launcher.submitit_launcher.*Launcher"),
    "hydra.sweeper": ("hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                      "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"),
    "hydra.sweeper.sampler": ("optuna.samplers.*Sampler",),
}
"""Where a recorded `hydra:` section may name a class, and which: Hydra's own launcher and sweeper
plugins (and Optuna's samplers), nothing else. `*` stands for one identifier (no dots)."""
LOG_HANDLER_CLASSES = ("logging.StreamHandler", "logging.FileHandler")
LOG_STREAMS = ("ext://sys.stdout", "ext://sys.stderr")
LOG_FILENAMES = ("${hydra.runtime.output_dir}/${hydra.job.name}.log",
                 "${hydra:runtime.output_dir}/${hydra.job.name}.log")
"""Hydra's default job log file; any other path lets a recorded file append to, e.g., ~/.bashrc."""


def main(argv: list[str], run_command) -> int:
    """`run_command(argv, command=...)`: the command line's main (the relaunch runs through it)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else EXIT_CONFIG_ERROR
    run, overrides = Path(argv[0]), argv[1:]
    config_dir = (run / rundir.HYDRA).resolve()
    if not (config_dir / "config.yaml").is_file():
        print(f"qwen3exp relaunch: {run} is not a run directory (no {rundir.HYDRA}/config.yaml)", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    problems = recorded_code_problems(config_dir / "config.yaml", run.resolve())
    if problems:
        print(ConfigError(problems, context=f"the recorded {config_dir / 'config.yaml'}").render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    recorded = rundir.read_experiment(run)
    try:
        exp, run_dir = _compose(config_dir, overrides, recorded)
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    from qwen3exp.run import identity

    new = identity.recorded_data(exp)
    if recorded is not None:
        _report_config(recorded, new, overrides)
    _report_code(run)
    kept = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    code = run_command(["--config-path", str(config_dir), "--config-name", "config", *kept, *RECOMPOSE,
                        f"hydra.run.dir={_quote(run_dir)}"],
                       command=[sys.executable, "-m", "qwen3exp", "relaunch", *argv])
    if code == 0 and not exp.dry_run:
        print(compare_losses(run, Path(run_dir)))
    return code


def recorded_code_problems(config_yaml: Path, run: Path) -> list[Problem]:
    """Everything in a recorded `.hydra/config.yaml` that would make relaunching it run code, one
    Problem per key (empty: the file is plain data). Read with `yaml.safe_load`, nothing resolved.

    Refused: a `defaults` list (a recorded config is Hydra's composed output and has none; a list
    would select config groups); `_target_` or `()` anywhere outside `hydra:` (qwen3exp's schema has
    none); in `hydra:` every `_target_` that is not an ALLOWED_TARGETS plugin at its place, every
    `()` factory, any `hydra.callbacks`, `hydra.launcher.setup` (shell lines), `hydra.job.env_set`
    (LD_PRELOAD, PYTHONPATH load code), `hydra.searchpath`, multirun mode, an `output_subdir`
    other than .hydra, and logging that is not Hydra's default shape; `kernels.overrides` whose
    module lies inside the run directory (an override import is code by design, but must be
    code you installed, not a file that came with the run)."""
    try:
        data = yaml.safe_load(config_yaml.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return [Problem("(recorded config)", str(config_yaml), f"not readable as plain YAML: {first}",
                        "Hydra's own config.yaml of a run (plain YAML, no tags)")]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return [Problem("(recorded config)", type(data).__name__, "the file is no mapping",
                        "Hydra's own config.yaml of a run")]
    problems: list[Problem] = []
    if "defaults" in data:
        problems.append(_code("defaults", data["defaults"], "a defaults list selects config groups (code among them)"))
    for path, key, value in _walk({k: v for k, v in data.items() if k not in ("hydra", "defaults")}):
        if key in ("_target_", "()"):
            problems.append(_code(_join(path, key), value,
                                  "qwen3exp's experiment has no targets: qwen3exp did not write this file"))
    hydra = data.get("hydra")
    if hydra is not None:
        problems += _hydra_problems(hydra) if isinstance(hydra, dict) else [
            Problem("hydra", hydra, "not a mapping", "no hydra section (a run records it in hydra.yaml)")]
    problems += _override_import_problems(data, run)
    return problems


def _hydra_problems(hydra: dict) -> list[Problem]:
    problems: list[Problem] = []
    callbacks = hydra.get("callbacks")
    if callbacks:
        for name, cb in (callbacks.items() if isinstance(callbacks, dict) else [("", callbacks)]):
            target = cb.get("_target_") if isinstance(cb, dict) else cb
            problems.append(_code(_join("hydra.callbacks", name), target,
                                  "Hydra instantiates every callback (imports and calls its _target_)"))
    launcher = hydra.get("launcher")
    if isinstance(launcher, dict) and launcher.get("setup"):  # submitit runs them in every SLURM job
        problems.append(_code("hydra.launcher.setup", launcher["setup"], "shell lines every launched job runs"))
    job = hydra.get("job")
    if isinstance(job, dict) and job.get("env_set"):
        problems.append(_code("hydra.job.env_set", job["env_set"],
                              "environment variables set for the run load code (LD_PRELOAD, PYTHONPATH, ...)"))
    if hydra.get("searchpath"):
        problems.append(_code("hydra.searchpath", hydra["searchpath"], "adds config sources the run would read"))
    if hydra.get("mode") not in (None, "RUN"):
        problems.append(Problem("hydra.mode", hydra["mode"], "relaunch repeats one recorded run", "RUN (or absent)"))
    if hydra.get("output_subdir") not in (None, ".hydra"):
        problems.append(Problem("hydra.output_subdir", hydra["output_subdir"],
                                "Hydra would write its files outside the new run's .hydra folder", ".hydra"))
    logging_sections = ("job_logging", "hydra_logging")
    for path, key, value in _walk({k: v for k, v in hydra.items() if k not in ("callbacks", *logging_sections)},
                                  ("hydra",)):
        if key == "_target_" and not allowed_target(".".join(path), value):
            allowed = ALLOWED_TARGETS.get(".".join(path))
            problems.append(_code(_join(path, key), value, "Hydra would import and call it",
                                  ", ".join(allowed) if allowed else
                                  "no _target_ here (only hydra.launcher, hydra.sweeper and hydra.sweeper.sampler)"))
        elif key == "()":
            problems.append(_code(_join(path, key), value, "Hydra would call this factory"))
    for section in logging_sections:
        if isinstance(hydra.get(section), dict):
            problems += _logging_problems(hydra[section], ("hydra", section))
    return problems


def _logging_problems(conf: dict, where: tuple[str, ...]) -> list[Problem]:
    """`logging.config.dictConfig` imports a handler's `class`, calls `()` factories and resolves
    `ext://` names; Hydra's default shape has only StreamHandler/FileHandler and plain formatters."""
    problems: list[Problem] = []
    why = "logging.config would import and run it"
    for path, key, value in _walk(conf, where):
        if key == "()":
            problems.append(_code(_join(path, key), value, why))
        elif isinstance(value, str) and value.startswith("ext://") and value not in LOG_STREAMS:
            problems.append(_code(_join(path, key), value, why, ", ".join(LOG_STREAMS)))
    handlers = conf.get("handlers")
    for name, handler in (handlers.items() if isinstance(handlers, dict) else []):
        if not isinstance(handler, dict):
            continue
        at = _join((*where, "handlers", str(name)), "class")
        cls = handler.get("class")
        if cls is not None and cls not in LOG_HANDLER_CLASSES:
            problems.append(_code(at, cls, why, ", ".join(LOG_HANDLER_CLASSES)))
        if cls == "logging.FileHandler" and handler.get("filename") not in LOG_FILENAMES:
            problems.append(_code(_join((*where, "handlers", str(name)), "filename"), handler.get("filename"),
                                  "a log file outside the new run directory (log lines appended to any file)",
                                  LOG_FILENAMES[0]))
    formatters = conf.get("formatters")
    for name, formatter in (formatters.items() if isinstance(formatters, dict) else []):
        if isinstance(formatter, dict) and "class" in formatter:
            problems.append(_code(_join((*where, "formatters", str(name)), "class"), formatter["class"], why,
                                  "format and datefmt only"))
    return problems


def _override_import_problems(data: dict, run: Path) -> list[Problem]:
    kernels = data.get("kernels")
    entries = kernels.get("overrides") if isinstance(kernels, dict) else None
    problems: list[Problem] = []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        target = entry.get("target") if isinstance(entry, dict) else entry
        if not isinstance(target, str) or not target.split(".")[0].isidentifier():
            continue  # the schema names what is wrong with it
        # find_spec of a top-level name locates it without importing anything.
        spec = importlib.util.find_spec(target.split(".")[0])
        if spec is None:
            continue
        # origin is a file only with has_location ("built-in", "frozen" are no paths).
        places = [*([spec.origin] if spec.has_location and spec.origin else []),
                  *(spec.submodule_search_locations or ())]
        inside = [p for p in places if Path(p).resolve().is_relative_to(run)]
        if inside:
            problems.append(_code(f"kernels.overrides[{i}].target", target,
                                  f"the module would be imported from the run directory ({inside[0]})"))
    return problems


def allowed_target(place: str, target) -> bool:
    """Whether `target` is one of Hydra's own plugins allowed at `place` (e.g. `hydra.launcher`)."""
    patterns = ALLOWED_TARGETS.get(place, ())
    return isinstance(target, str) and any(
        re.fullmatch(re.escape(p).replace(r"\*", r"[A-Za-z_][A-Za-z0-9_]*"), target) for p in patterns)


def _code(key: str, value, why: str, allowed: str | None = None) -> Problem:
    return Problem(key, value, why, allowed, hint=f"refused: {DATA_NOT_CODE}")


def _walk(node, path: tuple[str, ...] = ()):
    """(path of the parent, key, value) of every mapping entry, depth first; list items are `[i]`."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, str(key), value
            yield from _walk(value, (*path, str(key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, (*path, f"[{i}]"))


def _join(path: str | tuple[str, ...], key: str) -> str:
    """The dotted key of `key` under `path` (list items as `[i]`): hydra.callbacks.x._target_."""
    out = ""
    for part in ((path,) if isinstance(path, str) else path) + (key,):
        if part:
            out += part if (part.startswith("[") or not out) else "." + part
    return out


RECOMPOSE = ("hydra/launcher=qwen3exp", "hydra.job.name=qwen3exp")
"""A recorded config.yaml holds the experiment, not Hydra's settings: qwen3exp's launcher (the
command line adds it too) and job name."""


def _compose(config_dir: Path, overrides: list[str], recorded: dict | None):
    from omegaconf import OmegaConf

    from qwen3exp.config.compose import Composer, experiment_data
    from qwen3exp.config.names import stamp
    from qwen3exp.config.schema import validate_experiment

    ovs = [*overrides, *RECOMPOSE]
    if not any(o.startswith("hydra.run.dir=") for o in ovs):
        name = (recorded or {}).get("name", "relaunch")
        ovs.append(f"hydra.run.dir={_quote(f'outputs/{name}/{stamp()}-relaunch')}")
    with Composer(config_dir, "config") as c:
        cfg = c.compose(ovs)
        data, problems = experiment_data(cfg)
        run_dir = str(OmegaConf.select(cfg, "hydra.run.dir"))
    if problems:
        raise ConfigError(problems)
    return validate_experiment(data), run_dir


def _quote(value: str) -> str:
    from qwen3exp.config.compose import quote_value

    return quote_value(value)


def _report_config(recorded: dict, new: dict, overrides: list[str]) -> None:
    from qwen3exp.analysis.diff import show
    from qwen3exp.run.identity import differences

    changes = differences(recorded, new)
    h = rundir.experiment_hash(new)[:12]  # `new` is the recorded form: this is its identity
    if not changes:
        print(f"qwen3exp relaunch: same resolved experiment as recorded (hash {h})")
        return
    asked = [o for o in overrides if not o.startswith("hydra.")]
    print("qwen3exp relaunch: the resolved experiment differs from the recorded one"
          + (f" (you passed {' '.join(asked)})" if asked else " (qwen3exp's schema or defaults changed since)")
          + ":\n" + "\n".join(f"  {k}: {show(a)} -> {show(b)}" for k, a, b in changes))


def _report_code(run: Path) -> None:
    from qwen3exp.run import provenance
    prov = rundir.read_json(run / rundir.PROVENANCE)
    if not isinstance(prov, dict):
        print(f"qwen3exp relaunch: warning: {run} has no {rundir.PROVENANCE}; the code version cannot be checked")
        return
    notes = []
    then = prov.get("git") or {}
    now, diff_now = provenance.source_git_state()
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
        print("qwen3exp relaunch: warning: the code differs from the recorded run:\n  " + "\n  ".join(notes))
    else:
        print(f"qwen3exp relaunch: same code as recorded (commit {str(now.get('commit'))[:12]}"
              + (", same local changes)" if now.get("dirty") else ")"))


def compare_losses(a: Path, b: Path) -> str:
    # A non-finite loss is recorded as null (metrics.jsonl is strict JSON): not comparable.
    ra = {m["step"]: m["loss"] for m in rundir.read_metrics(a) if m.get("loss") is not None}
    rb = {m["step"]: m["loss"] for m in rundir.read_metrics(b) if m.get("loss") is not None}
    common = sorted(set(ra) & set(rb))
    if not common:
        return "qwen3exp relaunch: no common logged steps to compare losses"
    diffs = [abs(ra[s] - rb[s]) for s in common]
    worst = max(diffs)
    if worst == 0:
        return f"qwen3exp relaunch: losses identical to {a} at all {len(common)} common steps"
    step = common[diffs.index(worst)]
    return (f"qwen3exp relaunch: losses differ from {a}: max |diff| {worst:.3g} at step {step} "
            f"({ra[step]:.6f} vs {rb[step]:.6f}) over {len(common)} common steps")

