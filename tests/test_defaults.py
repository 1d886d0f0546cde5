"""Every default has one home: the schema's field default (qwen3exp/config/sections/). Hydra gets
the defaults from its ConfigStore (`qwen3exp.config.registered`: `schema/root`, and one config per
variant, `schema/platform/cuda`, ...), which conf/config.yaml and the group files pull in through
their defaults lists. So no conf/ file restates a default, every key still exists in the composed
config (set from the command line without `+`), and a Python caller (`Experiment(...)`) and the
command line get the same experiment."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from hydra import compose as hydra_compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from conftest import CONF, all_conf_files, compose
from qwen3exp.assets import CORPUS_DIR
from qwen3exp.cli import main
from qwen3exp.config.names import register_resolvers
from qwen3exp.config.registered import variants
from qwen3exp.config.schema import Experiment, validate_experiment
from qwen3exp.errors import ConfigError
from qwen3exp.launchers.job import COMMAND_ENV

SCHEMA_SECTIONS = {
    name for name, fld in Experiment.model_fields.items() if isinstance(fld.default, BaseModel) or variants(fld)
}
"""The experiment's sections (training, platform, ...); the other fields (name, dry_run, verbose)
are the root's own keys."""
NEEDS: dict[str, dict[str, Any]] = {
    "data/local": {"data.path": str(CORPUS_DIR / "train.jsonl")},  # required (??? in the file)
    "data/hf": {"data.files": str(CORPUS_DIR / "train.jsonl")},  # a dataset by name or files: one of them
    "kernels/nki_moe": {"model.flavor": "tiny_moe"},  # replaces MoE experts: an MoE model is required
    "data/mix": {"data.sources": {"corpus": {"source": "bundled"}}},  # a mixture names its sources
}
"""Values an option needs besides its own to make a valid experiment (as in test_conf.py)."""


def _default_options() -> dict[str, str]:
    """The option config.yaml's defaults list picks for each group."""
    out = {}
    for entry in yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]:
        if isinstance(entry, dict):
            ((group, option),) = entry.items()
            out[group] = option
    return out


def _class_of(section: str, data: dict) -> type[BaseModel]:
    """The schema class of a section's file: for a section with variants, the one its tag names."""
    fld = Experiment.model_fields[section]
    classes = variants(fld)
    if not classes:
        return type(fld.default)
    tags = {str(cls.model_fields[str(fld.discriminator)].default): cls for cls in classes}
    assert data.get(fld.discriminator) in tags, f"{section}: {fld.discriminator} must be one of {sorted(tags)}"
    return tags[data[fld.discriminator]]


def _restated(cls: type[BaseModel], data: dict, where: str, *, home: bool, tag: str | None = None) -> list[str]:
    """The keys of `data` that restate a default of `cls`. A file that is a default's home (`home`)
    states no defaulted key at all (a different value there would be a second default); any other
    file (an option that chooses, like kernels=nki_rope) only states values that differ."""
    out = []
    for key, value in data.items():
        fld = cls.model_fields.get(key)
        assert fld is not None, f"{where}{key}: not a field of {cls.__name__}"
        if fld.is_required() or key == tag:
            continue  # `???` of a required value, or the tag that names the variant: not a default
        default = fld.get_default(call_default_factory=True)
        if isinstance(default, BaseModel) and isinstance(value, dict):
            out += _restated(type(default), value, f"{where}{key}.", home=home)
        elif home or value == to_jsonable_python(default):
            out.append(
                f"{where}{key}: {value!r}, and the schema's default is {to_jsonable_python(default)!r} "
                "(one home: leave it to the schema, or change the schema)"
            )
    return out


def _group_files() -> list[tuple[str, str]]:
    return [(g, o) for g, o in all_conf_files() if g in SCHEMA_SECTIONS]


@pytest.mark.parametrize("group,option", _group_files(), ids=lambda x: str(x))
def test_no_group_file_restates_a_schema_default(group, option):
    """The option config.yaml picks and a variant's own file (platform/cuda.yaml: CudaPlatform) are
    the schema's defaults plus their tag; other options state only what they change."""
    data = yaml.safe_load((CONF / group / f"{option}.yaml").read_text()) or {}
    data.pop("defaults", None)
    cls = _class_of(group, data)
    tag = Experiment.model_fields[group].discriminator
    home = option == _default_options().get(group) or (tag is not None and data.get(tag) == option)
    problems = _restated(cls, data, f"{group}.", home=home, tag=tag)
    assert not problems, "restated in conf/{}/{}.yaml:\n{}".format(group, option, "\n".join(problems))


def test_root_config_restates_no_schema_default():
    data = yaml.safe_load((CONF / "config.yaml").read_text())
    keys = {k: v for k, v in data.items() if k not in ("defaults", "hydra")}
    problems = _restated(Experiment, keys, "", home=True)
    assert not problems, "restated in conf/config.yaml:\n" + "\n".join(problems)


# ------------------------------------------------------------------ every key is still there
def _key_problems(cls: type[BaseModel], node: dict, where: str) -> list[str]:
    """The keys of `cls` (nested sections included; a variant section by its tag) that the composed
    `node` lacks, and the keys it has that `cls` does not."""
    out = [f"{where}{k}: not a key of {cls.__name__}" for k in node if k not in cls.model_fields]
    for name, fld in cls.model_fields.items():
        if name not in node:
            out.append(f"{where}{name}: missing (set only with +{where}{name}=...)")
            continue
        default = None if fld.is_required() else fld.get_default(call_default_factory=True)
        if variants(fld) or isinstance(default, BaseModel):
            section = _class_of(name, node[name]) if variants(fld) else type(default)
            out += _key_problems(section, node[name], f"{where}{name}.")
    return out


@pytest.fixture(scope="module")
def hydra_conf():
    """Hydra's compose API over conf/, as every qwen3exp process composes (resolvers and the
    schema's defaults registered first)."""
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield lambda *overrides: OmegaConf.to_container(hydra_compose(config_name="config", overrides=list(overrides)))
    GlobalHydra.instance().clear()


@pytest.mark.parametrize("group,option", _group_files(), ids=lambda x: str(x))
def test_every_key_is_in_the_composed_config(hydra_conf, group, option):
    """Every key of the experiment (the option's variant for its section) is in the composed config,
    so `platform=cuda platform.gpus_per_node=4` needs no `+`; Hydra's struct mode still refuses a
    key the schema does not have."""
    problems = _key_problems(Experiment, hydra_conf(f"{group}={option}"), "")
    assert not problems, "\n".join(problems)


def test_schema_keys_are_set_without_plus_and_a_typo_is_refused():
    exp = validate_experiment(
        compose(
            "training.lr=1e-3",
            "platform=cuda",
            "platform.gpus_per_node=4",
            "launcher=slurm",
            "launcher.partition=gpu",
            "checkpoint=dcp",
            "checkpoint.interval=10",
            "kernels.moe.block_size=256",
            "dry_run=true",
        )
    )
    assert (exp.training.lr, exp.platform.gpus_per_node, exp.launcher.partition) == (1e-3, 4, "gpu")
    assert (exp.checkpoint.interval, exp.kernels.moe.block_size) == (10, 256)
    with pytest.raises(ConfigError) as e:
        compose("platform=cuda", "platform.gpus_per_nod=4")
    (problem,) = e.value.problems
    assert problem.key == "platform.gpus_per_nod" and "platform.gpus_per_node" in str(problem)


def _override(value: Any) -> str:
    """A value as a command-line override writes it (a mapping in Hydra's flow style)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_override(v)}" for k, v in value.items()) + "}"
    return str(value)


@pytest.mark.parametrize("group,option", _group_files(), ids=lambda x: str(x))
def test_python_and_the_command_line_get_the_same_experiment(group, option):
    """With no experiment file, the composed option is the option's own keys on the schema's
    defaults: what `Experiment(...)` from Python gives for the same keys."""
    needs = NEEDS.get(f"{group}/{option}", {})
    composed = validate_experiment(
        compose("~experiment", "name=x", f"{group}={option}", *(f"{k}={_override(v)}" for k, v in needs.items()))
    )
    own = yaml.safe_load((CONF / group / f"{option}.yaml").read_text()) or {}
    own.pop("defaults", None)
    data: dict[str, Any] = {"name": "x", "model": {"backend": "native"}, group: own}
    for key, value in needs.items():
        section, leaf = key.split(".")
        data[section] = {**data.get(section, {}), leaf: value}
    assert composed == validate_experiment(data)


def test_origin_of_a_schema_default_and_of_a_file(monkeypatch, capsys):
    """The dry run's table names the schema for a key no file sets, the file for its tag."""
    monkeypatch.delenv(COMMAND_ENV, raising=False)  # main() sets it: put back after the test
    try:
        code = main(["platform=cuda", "dry_run=true"])
    finally:
        GlobalHydra.instance().clear()
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"\n  platform\.assumed_gpus_per_node +8 +schema default\n", out), out
    assert re.search(
        r"\n  platform\.name +cuda +group file conf/platform/cuda\.yaml \(chosen on the command line\)\n", out
    ), out
    assert re.search(r"\n  training\.seed +42 +schema default\n", out), out


# ------------------------------------------------------------------ a default the schema derives
def test_warmup_adapts_to_the_steps_unless_given():
    def warmup(*overrides):
        return validate_experiment(compose(*overrides)).training.warmup

    assert warmup("training.steps=3") == 1  # the common smoke test needs no second override
    assert warmup("training.steps=1") == 1
    assert warmup("training.steps=30") == 5 and warmup("training.steps=1000") == 5
    assert warmup("training.steps=3", "training.warmup_steps=0") == 0
    with pytest.raises(ConfigError, match="exceeds training.steps"):
        warmup("training.steps=3", "training.warmup_steps=4")
