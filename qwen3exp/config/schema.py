"""The contract: one validated, frozen `Experiment` per run.

Hydra composes YAML; this module decides what is a valid experiment. Everything here is plain data
and cheap to import (no torch, no torchtitan). The sections are defined in
`qwen3exp.config.sections`, the rules between them in `qwen3exp.config.rules`, and pydantic's errors
are named by YAML key in `qwen3exp.config.translate`. `check_experiment` runs all three: parse,
then rules, every problem collected. Ranks read an experiment the launcher checked, so they only
parse it (`parse_experiment`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError
from pydantic_core import PydanticUndefined

from qwen3exp.config.rules import cross_field_problems, mixture_validation_problems, rule_problems
from qwen3exp.config.sections.base import Strict
from qwen3exp.config.sections.checkpoint import Checkpoint
from qwen3exp.config.sections.data import BundledData, Validation
from qwen3exp.config.sections.eval import Eval, NoEval
from qwen3exp.config.sections.kernels import Kernels
from qwen3exp.config.sections.launcher import Launcher, LocalLauncher
from qwen3exp.config.sections.metrics import Metrics
from qwen3exp.config.sections.mixture import Data
from qwen3exp.config.sections.model import Model
from qwen3exp.config.sections.objective import Objective, SftObjective
from qwen3exp.config.sections.parallelism import Parallelism
from qwen3exp.config.sections.peft import NoPeft, Peft
from qwen3exp.config.sections.platform import AutoPlatform, Platform
from qwen3exp.config.sections.sweep import Sweep
from qwen3exp.config.sections.training import Training
from qwen3exp.config.translate import problems_from_validation, value_at
from qwen3exp.errors import MISSING, ConfigError, Problem


class Experiment(Strict):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9._=,+-]+$")]
    """The run's name: one folder of the default run directory (outputs/<name>/<stamp>)."""
    dry_run: bool = False
    """true: validate, print the plan and start nothing."""
    verbose: bool = False
    """true (or `-v`): the launcher shows every line rank 0 prints, also torchtitan's info lines and
    the known warnings it leaves out by default (`qwen3exp.run.noise`). Changes nothing a run computes."""
    model: Model
    training: Training = Training()
    parallelism: Parallelism = Parallelism()
    kernels: Kernels = Kernels()
    checkpoint: Checkpoint = Checkpoint()
    platform: Platform = AutoPlatform()
    data: Data = BundledData()
    peft: Peft = NoPeft()
    objective: Objective = SftObjective()
    eval: Eval = NoEval()
    launcher: Launcher = LocalLauncher()
    metrics: Metrics = Metrics()
    validation: Validation = Validation()
    sweep: Sweep = Sweep()

    @property
    def sweep_target(self) -> tuple[str, str]:
        """(metric, direction) each job returns to the sweeper (`sweep.objective`, resolved)."""
        metric = self.sweep.objective or ("val_loss" if self.validation.enable else "last_loss")
        return metric, self.sweep.direction_of(metric)


SECTIONS: dict[str, Any] = {
    "model": Model,
    "training": Training,
    "parallelism": Parallelism,
    "kernels": Kernels,
    "checkpoint": Checkpoint,
    "platform": Platform,
    "data": Data,
    "peft": Peft,
    "objective": Objective,
    "eval": Eval,
    "launcher": Launcher,
    "metrics": Metrics,
}

VALIDATIONS: Counter[str] = Counter()
"""How many times this process validated an experiment: the one-pass test reads it
(`VALIDATIONS["experiment"]`, one per `check_experiment`, so also one per `validate_experiment`)."""


@dataclass
class Checked:
    exp: Experiment | None
    """The experiment, or None when it is invalid."""
    sections: dict[str, Any]
    """The sections that validate on their own (with `replaced` keys set to their defaults)."""
    replaced: set[str]
    """Keys whose bad value was replaced by the default so that the rest of the section validates."""
    problems: list[Problem]


def check_experiment(data: dict) -> Checked:
    """Validate, collecting every independent problem: parse every section, then run the rules
    between them (`qwen3exp.config.rules`).

    When a section does not parse, each section is validated by itself (without its bad fields)
    and the cross-field rules run on what passed, so one mistake does not hide another."""
    VALIDATIONS["experiment"] += 1
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as e:
        problems = problems_from_validation(Experiment, e, data)
        sections, replaced = _sections_alone(data)
    else:
        sections, replaced = {name: getattr(exp, name) for name in SECTIONS}, set()
        problems = [
            _as_given(p, data)
            for p in rule_problems(exp.name, exp.model, exp.training, exp.parallelism, exp.sweep, exp.validation)
            + mixture_validation_problems(exp.sweep, exp.data, exp.validation, exp.parallelism)
        ]
        if not problems:
            return Checked(exp, sections, replaced, [])
    seen = {(p.key, p.message) for p in problems}
    for p in cross_field_problems(sections.get("model"), sections.get("training"), sections.get("parallelism")):
        if (p.key, p.message) not in seen and p.key not in replaced:
            problems.append(p)
    return Checked(None, sections, replaced, problems)


def _as_given(p: Problem, data: dict) -> Problem:
    """The problem with the value as the data gives it (what the user wrote), where the data has the key."""
    given = value_at(data, p.key)
    return p if given is MISSING else replace(p, value=given)


def _sections_alone(data: dict) -> tuple[dict[str, Any], set[str]]:
    """Each section validated by itself: those that parse, and the keys whose bad value was left out
    (its default stands in) so that the rules about the section's other fields still run."""
    sections: dict[str, Any] = {}
    replaced: set[str] = set()
    for name, typ in SECTIONS.items():
        if name not in data:
            default = Experiment.model_fields[name].get_default(call_default_factory=True)
            if default is not PydanticUndefined:  # a required section (model) that is absent: skip
                sections[name] = default
            continue
        try:
            sections[name] = TypeAdapter(typ).validate_python(data[name])
            continue
        except (ValidationError, TypeError) as e:
            if name == "model" or not isinstance(data[name], dict) or not isinstance(e, ValidationError):
                continue  # without a trustworthy flavor no model rule is meaningful
            bad = {
                p.key.split(".")[1]
                for p in problems_from_validation(Experiment, e, {name: data[name]}, prefix=name)
                if "." in p.key
            }
        replaced |= {f"{name}.{k}" for k in bad}
        try:
            sections[name] = TypeAdapter(typ).validate_python({k: v for k, v in data[name].items() if k not in bad})
        except (ValidationError, TypeError):
            continue
    return sections, replaced


def validate_experiment(data: dict, *, context: str | None = None) -> Experiment:
    """Validate a plain dict (the resolved Hydra config) into an Experiment, or raise ConfigError
    naming every problem found."""
    checked = check_experiment(data)
    if checked.problems:
        raise ConfigError(checked.problems, context=context)
    assert checked.exp is not None, "check_experiment found no problem, so it built the Experiment"
    return checked.exp


def parse_experiment(data: dict) -> Experiment:
    """An experiment the launcher already checked (a rank's resolved experiment file), parsed into
    its types without running the rules again. A record that does not parse raises ConfigError."""
    try:
        return Experiment.model_validate(data)
    except ValidationError as e:
        raise ConfigError(problems_from_validation(Experiment, e, data)) from None
