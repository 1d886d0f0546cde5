"""Every default has one home: a value that both a config file (conf/) and the schema's field default
(qwen3exp/config/schema.py) state must be the same value, so that a Python caller of the schema
(`Experiment(...)`, `api.plan`) and the command line get the same experiment."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from qwen3exp.config import schema

CONF = Path(__file__).resolve().parents[1] / "conf"
ROOT_SECTIONS = {"training": schema.Training, "metrics": schema.Metrics, "parallelism": schema.Parallelism,
                 "kernels": schema.Kernels, "validation": schema.Validation, "sweep": schema.Sweep}


def _variants(annotation) -> list[type[BaseModel]]:
    """The model classes a field's annotation allows (a discriminated union's members)."""
    out, todo = [], [annotation]
    while todo:
        a = todo.pop()
        if isinstance(a, type) and issubclass(a, BaseModel):
            out.append(a)
        else:
            todo.extend(typing.get_args(a))
    return out


def _model_for(field: str, data: dict) -> type[BaseModel]:
    variants = _variants(schema.Experiment.model_fields[field].annotation)
    if len(variants) == 1:
        return variants[0]
    key = schema.Experiment.model_fields[field].discriminator
    for cls in variants:  # the member whose discriminator literal is the file's
        if data.get(key) in typing.get_args(cls.model_fields[key].annotation):
            return cls
    raise AssertionError(f"no schema class for {field} = {data}")


def _default_options() -> dict[str, str]:
    """The option config.yaml's defaults list picks for each group."""
    out = {}
    for entry in yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]:
        if isinstance(entry, dict):
            (group, option), = entry.items()
            out[group] = option
    return out


def _disagreements(cls: type[BaseModel], data: dict, where: str) -> list[str]:
    out = []
    for key, value in data.items():
        field = cls.model_fields.get(key)
        assert field is not None, f"{where}.{key}: not a field of {cls.__name__}"
        default = field.default
        if default is PydanticUndefined:
            continue  # required in the schema: the config file is its only home
        if isinstance(default, BaseModel) and isinstance(value, dict):
            out += _disagreements(type(default), value, f"{where}.{key}")
            continue
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        if isinstance(default, tuple):
            default = list(default)
        if value != default:
            out.append(f"{where}.{key}: conf says {value!r}, the schema's default is {default!r}")
    return out


def _files():
    """The files that are the config home of a schema class's defaults: the default option of each
    group, and each option that is a variant of its own (checkpoint=dcp is DcpCheckpoint, ...).
    Options that only choose other values of the same class (kernels=nki_rope) are choices, not
    defaults."""
    defaults = _default_options()
    for path in sorted(CONF.glob("*/*.yaml")):
        group = path.parent.name
        if group == "experiment" or group not in schema.Experiment.model_fields:
            continue
        own_class = schema.Experiment.model_fields[group].discriminator is not None
        if path.stem == defaults.get(group) or own_class:
            yield path


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_group_file_agrees_with_the_schema(path):
    data = yaml.safe_load(path.read_text()) or {}
    data.pop("defaults", None)
    group = path.parent.name
    problems = _disagreements(_model_for(group, data), data, group)
    assert not problems, "\n".join(problems)


def test_root_config_agrees_with_the_schema():
    data = yaml.safe_load((CONF / "config.yaml").read_text())
    problems = []
    for section, cls in ROOT_SECTIONS.items():
        if section in data:
            problems += _disagreements(cls, data[section], section)
    assert data["dry_run"] == schema.Experiment.model_fields["dry_run"].default
    assert not problems, "\n".join(problems)


def test_warmup_adapts_to_the_steps_unless_given():
    from conftest import compose
    from qwen3exp.errors import ConfigError

    def warmup(*overrides):
        return schema.validate_experiment(compose(*overrides)).training.warmup

    assert warmup("training.steps=3") == 1  # the common smoke test needs no second override
    assert warmup("training.steps=1") == 1
    assert warmup("training.steps=30") == 5 and warmup("training.steps=1000") == 5
    assert warmup("training.steps=3", "training.warmup_steps=0") == 0
    with pytest.raises(ConfigError, match="exceeds training.steps"):
        warmup("training.steps=3", "training.warmup_steps=4")
