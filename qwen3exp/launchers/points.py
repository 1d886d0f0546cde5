"""A job of a batch, checked: its composed config validated against the schema and planned, every
problem named with the file its value came from (`check_job`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from qwen3exp.config.argv import is_group_override, parse_overrides
from qwen3exp.config.origins import Provenance, file_sources
from qwen3exp.config.precheck import Prechecked, validated
from qwen3exp.config.schema import Experiment
from qwen3exp.errors import MISSING, ConfigError, Problem
from qwen3exp.plan.build import Plan, make_plan, section_problems
from qwen3exp.plan.memory_fit import DoesNotFit
from qwen3exp.titan.job_config import override_claims


@dataclass
class Point:
    """One checked job."""

    overrides: list[str]
    exp: Experiment
    run_dir: str
    plan: Plan
    provenance: Provenance


# ------------------------------------------------------------------------------ where keys come from
class HydraFiles:
    """The files of a composition, read through Hydra's public ConfigLoader (for `origins`)."""

    def __init__(self, config_loader: Any, config_name: str, hydra_overrides: Sequence[str] = ()) -> None:
        self.loader = config_loader
        self.config_name = config_name
        self.searchpath = [o for o in hydra_overrides if o.split("=", 1)[0] == "hydra.searchpath"]
        """The user's config dirs (`--config-dir`, `hydra.searchpath`): part of every lookup."""
        self._defaults: dict[tuple[str, ...], list] = {}
        self._sources: dict[tuple[str, ...], dict] = {}

    def defaults_list(self, group_key: tuple[str, ...]) -> list:
        if group_key not in self._defaults:
            self._defaults[group_key] = self.loader.compute_defaults_list(
                self.config_name, [*self.searchpath, *group_key], RunMode.RUN
            ).defaults
        return self._defaults[group_key]

    def _source(self, config_path: str):
        for source in self.loader.get_sources():
            if source.provider not in ("hydra", "schema") and source.is_config(config_path):
                return source
        return None

    def load_file(self, config_path: str):
        source = self._source(config_path)
        return source.load_config(config_path) if source is not None else None

    def where(self, config_path: str) -> str:
        source = self._source(config_path)
        root = Path(source.path).name if source is not None and source.scheme() == "file" else "conf"
        return f"{root}/{config_path}.yaml"

    def provenance(self, overrides: list[str]) -> Provenance:
        parsed = parse_overrides(overrides)
        groups = tuple(o.input_line for o in parsed if is_group_override(o))
        if groups not in self._sources:
            self._sources[groups] = file_sources(self, groups)
        return Provenance.with_overrides(self._sources[groups], [o for o in parsed if not is_group_override(o)])


# --------------------------------------------------------------------------------------- checks
def job_dir(cfg) -> str:
    """The job's folder, as Hydra's run_job computes it (sweep dir / subdir)."""
    if "${hydra:" in str(OmegaConf.to_container(cfg.hydra.sweep, resolve=False)):
        # Hydra's `hydra:` resolver reads the config Hydra holds (a copy of the hydra node: 20 ms a job)
        HydraConfig.instance().set_config(cfg)
    subdir = str(OmegaConf.select(cfg, "hydra.sweep.subdir"))
    return str(Path(str(OmegaConf.select(cfg, "hydra.sweep.dir"))) / subdir)


def check_job(
    cfg,
    files: HydraFiles,
    overrides: list[str],
    *,
    context: str | None = None,
    run_dir: str | None = None,
    prechecked: Prechecked | None = None,
) -> Point:
    """Every check of one job, all problems together, each with the file its value came from.
    `cfg`: the job's composed config (with its hydra node, unless `run_dir` is given);
    `prechecked`: its validation, when the command line has done it (a single run)."""
    if prechecked is None:
        prechecked = validated(cfg, context)
    problems, checked = prechecked.problems, prechecked.checked
    exp = checked.exp
    problems = _merge(problems, checked.problems)
    if exp is None:
        problems = _merge(problems, section_problems(checked.sections, checked.replaced))
    provenance = files.provenance(overrides)
    run_dir = run_dir if run_dir is not None else job_dir(cfg)
    plan, unfit = None, None
    if not problems and exp is not None:
        try:
            plan = make_plan(exp, run_dir, overrides=overrides, provenance=provenance, claims_of=override_claims)
        except ConfigError as e:
            problems = e.problems
            unfit = exp.sweep_target if isinstance(e, DoesNotFit) else None
    if problems:
        sourced = [_with_source(p, provenance) for p in problems]
        if unfit is not None:  # refused only because it does not fit: an adaptive sweep goes on
            raise DoesNotFit(sourced, context=context, objective=unfit)
        raise ConfigError(sourced, context=context)
    assert exp is not None and plan is not None
    # The plan's experiment: the one checked, with a value for every key written `auto`.
    return Point(list(overrides), plan.exp, run_dir, plan, provenance)


def planned_here(point: Point, run_dir: Path) -> Plan:
    """The plan of a checked job, made again on the machine the job landed on (a scheduler's
    allocation): its experiment is the one the launcher validated, not validated again."""
    return make_plan(
        point.exp, str(run_dir), overrides=point.overrides, provenance=point.provenance, claims_of=override_claims
    )


def _merge(first: list[Problem], then: list[Problem]) -> list[Problem]:
    """`first` and the problems of `then` about other keys, or new messages about the same key
    (a value missing in the config is reported once, not again as missing by validation)."""
    reported = {p.key for p in first}
    seen = {(p.key, p.message) for p in first}
    out = list(first)
    for p in then:
        if (p.key, p.message) in seen or (p.key in reported and p.value is MISSING):
            continue
        seen.add((p.key, p.message))
        out.append(p)
    return out


def _with_source(p: Problem, provenance) -> Problem:
    if p.source is not None or p.key.startswith("("):
        return p
    return replace(p, source=str(provenance.source(p.key)))
