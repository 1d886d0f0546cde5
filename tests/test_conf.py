"""Every YAML under conf/ composes, validates, plans and converts to a torchtitan Trainer.Config.

Parametrized over the files, so a new conf file is tested as soon as it exists. Options that need
a value no file can hold (a data path on your disk) get it from REQUIRED below.
"""

from __future__ import annotations

import pytest

from conftest import all_conf_files, compose
from qwen3exp.assets import CORPUS_DIR

# group/option -> extra overrides that a real user would have to give on the command line.
REQUIRED: dict[str, list[str]] = {
    "data/local": [f"data.path={CORPUS_DIR / 'train.jsonl'}"],
}


def _overrides(group: str, option: str) -> list[str]:
    return [f"{group}={option}", *REQUIRED.get(f"{group}/{option}", [])]


@pytest.mark.parametrize("group,option", all_conf_files(), ids=lambda x: str(x))
def test_conf_file_composes_validates_converts(group, option, tmp_path):
    from qwen3exp.launch import prepare
    from qwen3exp.schema import validate_experiment
    from qwen3exp.to_torchtitan import to_torchtitan

    data = compose(*_overrides(group, option))
    exp = validate_experiment(data)
    prep = prepare(exp)
    config = to_torchtitan(prep.exp, prep.facts, tmp_path)
    # torchtitan's own cross-field checks (they are not re-run on mutation: run them explicitly).
    config.__post_init__()
    assert config.training.steps == exp.training.steps
    assert config.model_spec is not None and config.model_spec.name == "qwen3"


def test_every_group_has_a_file():
    groups = {g for g, _ in all_conf_files()}
    assert groups >= {"model", "parallelism", "kernels", "checkpoint", "platform", "data", "launcher", "experiment"}


@pytest.mark.parametrize("option", [o for g, o in all_conf_files() if g == "experiment"])
def test_experiment_files_start_with_their_command(option):
    from conftest import CONF

    first = (CONF / "experiment" / f"{option}.yaml").read_text().splitlines()[0]
    assert first.startswith("# python -m qwen3exp") and f"experiment={option}" in first, first
