"""The `hydra:` section of a recorded run's config (see `qwen3exp.analysis.recorded_config`): Hydra
instantiates its `_target_`s (callbacks, launcher, sweeper) and `logging.config` builds handlers
and `()` factories from its logging sections, so only Hydra's own plugins and Hydra's default
logging shape pass."""

from __future__ import annotations

import re

from qwen3exp.analysis.recorded_keys import dotted_key, refused, walk
from qwen3exp.errors import Problem

ALLOWED_TARGETS = {
    "hydra.launcher": (
        "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
        "hydra_plugins.qwen3exp_launcher.launcher.Qwen3expLauncher",
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher.*Launcher",
    ),
    "hydra.sweeper": (
        "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
        "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
    ),
    "hydra.sweeper.sampler": ("optuna.samplers.*Sampler",),
}
"""Where a recorded `hydra:` section may name a class, and which: Hydra's own launcher and sweeper
plugins (and Optuna's samplers), nothing else. `*` stands for one identifier (no dots)."""
LOG_HANDLER_CLASSES = ("logging.StreamHandler", "logging.FileHandler")
LOG_STREAMS = ("ext://sys.stdout", "ext://sys.stderr")
LOG_FILENAMES = (
    "${hydra.runtime.output_dir}/${hydra.job.name}.log",
    "${hydra:runtime.output_dir}/${hydra.job.name}.log",
)
"""Hydra's default job log file; any other path lets a recorded file append to, e.g., ~/.bashrc."""


LOGGING_SECTIONS = ("job_logging", "hydra_logging")


def hydra_section_problems(hydra: dict) -> list[Problem]:
    """One Problem per key of the recorded `hydra:` section that would run code or relaunch
    something else than the recorded run (see `recorded_config.recorded_code_problems`)."""
    problems = _code_route_problems(hydra)
    if hydra.get("mode") not in (None, "RUN"):
        problems.append(Problem("hydra.mode", hydra["mode"], "relaunch repeats one recorded run", "RUN (or absent)"))
    if hydra.get("output_subdir") not in (None, ".hydra"):
        problems.append(
            Problem(
                "hydra.output_subdir",
                hydra["output_subdir"],
                "Hydra would write its files outside the new run's .hydra folder",
                ".hydra",
            )
        )
    problems += _target_problems(hydra)
    for section in LOGGING_SECTIONS:
        if isinstance(hydra.get(section), dict):
            problems += _logging_problems(hydra[section], ("hydra", section))
        elif hydra.get(section) is not None:
            problems.append(Problem(f"hydra.{section}", hydra[section], "not a mapping", "Hydra's logging config"))
    return problems


def _code_route_problems(hydra: dict) -> list[Problem]:
    """Callbacks, launcher setup lines, the job's environment and the search path: each runs code."""
    problems: list[Problem] = []
    callbacks = hydra.get("callbacks")
    if callbacks:
        for name, cb in callbacks.items() if isinstance(callbacks, dict) else [("", callbacks)]:
            target = cb.get("_target_") if isinstance(cb, dict) else cb
            problems.append(
                refused(
                    dotted_key("hydra.callbacks", name),
                    target,
                    "Hydra instantiates every callback (imports and calls its _target_)",
                )
            )
    launcher = hydra.get("launcher")
    if isinstance(launcher, dict) and launcher.get("setup"):  # submitit runs them in every SLURM job
        problems.append(refused("hydra.launcher.setup", launcher["setup"], "shell lines every launched job runs"))
    job = hydra.get("job")
    if isinstance(job, dict) and job.get("env_set"):
        problems.append(
            refused(
                "hydra.job.env_set",
                job["env_set"],
                "environment variables set for the run load code (LD_PRELOAD, PYTHONPATH, ...)",
            )
        )
    if hydra.get("searchpath"):
        problems.append(refused("hydra.searchpath", hydra["searchpath"], "adds config sources the run would read"))
    return problems


def _target_problems(hydra: dict) -> list[Problem]:
    """Every `_target_` outside ALLOWED_TARGETS and every `()` factory (callbacks and logging apart)."""
    problems: list[Problem] = []
    for path, key, value in walk(
        {k: v for k, v in hydra.items() if k not in ("callbacks", *LOGGING_SECTIONS)}, ("hydra",)
    ):
        if key == "_target_" and not allowed_target(".".join(path), value):
            allowed = ALLOWED_TARGETS.get(".".join(path))
            problems.append(
                refused(
                    dotted_key(path, key),
                    value,
                    "Hydra would import and call it",
                    ", ".join(allowed)
                    if allowed
                    else "no _target_ here (only hydra.launcher, hydra.sweeper and hydra.sweeper.sampler)",
                )
            )
        elif key == "()":
            problems.append(refused(dotted_key(path, key), value, "Hydra would call this factory"))
    return problems


def _logging_problems(conf: dict, where: tuple[str, ...]) -> list[Problem]:
    """`logging.config.dictConfig` imports a handler's `class`, calls `()` factories and resolves
    `ext://` names; Hydra's default shape has only StreamHandler/FileHandler and plain formatters."""
    problems: list[Problem] = []
    why = "logging.config would import and run it"
    for path, key, value in walk(conf, where):
        if key == "()":
            problems.append(refused(dotted_key(path, key), value, why))
        elif isinstance(value, str) and value.startswith("ext://") and value not in LOG_STREAMS:
            problems.append(refused(dotted_key(path, key), value, why, ", ".join(LOG_STREAMS)))
    handlers = conf.get("handlers")
    for name, handler in handlers.items() if isinstance(handlers, dict) else []:
        if not isinstance(handler, dict):
            problems.append(
                Problem(
                    dotted_key((*where, "handlers"), str(name)),
                    handler,
                    "not a mapping",
                    "a handler: class, formatter, level, stream or filename",
                )
            )
            continue
        at = dotted_key((*where, "handlers", str(name)), "class")
        cls = handler.get("class")
        if cls is not None and cls not in LOG_HANDLER_CLASSES:
            problems.append(refused(at, cls, why, ", ".join(LOG_HANDLER_CLASSES)))
        if cls == "logging.FileHandler" and handler.get("filename") not in LOG_FILENAMES:
            problems.append(
                refused(
                    dotted_key((*where, "handlers", str(name)), "filename"),
                    handler.get("filename"),
                    "a log file outside the new run directory (log lines appended to any file)",
                    LOG_FILENAMES[0],
                )
            )
    formatters = conf.get("formatters")
    for name, formatter in formatters.items() if isinstance(formatters, dict) else []:
        if isinstance(formatter, dict) and "class" in formatter:
            problems.append(
                refused(
                    dotted_key((*where, "formatters", str(name)), "class"),
                    formatter["class"],
                    why,
                    "format and datefmt only",
                )
            )
    return problems


def allowed_target(place: str, target) -> bool:
    """Whether `target` is one of Hydra's own plugins allowed at `place` (e.g. `hydra.launcher`)."""
    patterns = ALLOWED_TARGETS.get(place, ())
    return isinstance(target, str) and any(
        re.fullmatch(re.escape(p).replace(r"\*", r"[A-Za-z_][A-Za-z0-9_]*"), target) for p in patterns
    )
