"""Every YAML under conf/ composes, validates, plans and converts to a torchtitan Trainer.Config.

Parametrized over the files, so a new conf file is tested as soon as it exists. Options that need
a value no file can hold (a data path on your disk) get it from REQUIRED below.
"""

from __future__ import annotations

import pytest

from conftest import CONF, all_conf_files, compose
from qwen3exp.assets import CORPUS_DIR
from trn2_assets import overrides_for

# group/option -> extra overrides that a real user would have to give on the command line.
# {hf_checkpoint}: a tiny Hugging Face checkpoint written by tests/hf_fixtures.py (qwen3exp ships
# no weights, and loading options check the safetensors before launch).
REQUIRED: dict[str, list[str]] = {
    "data/local": [f"data.path={CORPUS_DIR / 'train.jsonl'}"],
    "checkpoint/hf_load": ["model.flavor=auto", "model.hf_assets_path={hf_checkpoint}"],
    "checkpoint/hf_roundtrip": ["model.flavor=auto", "model.hf_assets_path={hf_checkpoint}"],
    "kernels/nki_moe": ["model.flavor=tiny_moe"],  # replaces MoE experts: an MoE model is required
    # No Trainium or GPU here: a real launch would (rightly) stop at the device preflight, exit 2;
    # a dry run plans with the platform's table values and still converts.
    "platform/neuron": ["dry_run=true"],
    "platform/cuda": ["dry_run=true"],
    # trn2 experiments also name a published model folder: a stand-in with its config.json,
    # tokenizer and (header-complete, sparse) safetensors, see tests/trn2_assets.py.
    **{f"experiment/{p.stem}": overrides_for(p.stem) for p in CONF.glob("experiment/trn2_*.yaml")},
}


def _overrides(group: str, option: str, hf_checkpoint: str = "") -> list[str]:
    return [f"{group}={option}", *(o.replace("{hf_checkpoint}", hf_checkpoint)
                                   for o in REQUIRED.get(f"{group}/{option}", []))]


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory) -> str:
    from hf_fixtures import write_checkpoint

    return str(write_checkpoint(tmp_path_factory.mktemp("hf") / "tiny", tied=True))


@pytest.mark.parametrize("group,option", all_conf_files(), ids=lambda x: str(x))
def test_conf_file_composes_validates_converts(group, option, tmp_path, request):
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.launchers.local import prepare
    from qwen3exp.titan.job_config import to_torchtitan

    needs_ckpt = any("{hf_checkpoint}" in o for o in REQUIRED.get(f"{group}/{option}", []))
    data = compose(*_overrides(group, option, request.getfixturevalue("hf_checkpoint") if needs_ckpt else ""))
    exp = validate_experiment(data)
    prep = prepare(exp)
    config = to_torchtitan(prep.exp, prep.facts, tmp_path)
    # torchtitan's own cross-field checks (they are not re-run on mutation: run them explicitly).
    config.__post_init__()
    assert config.training.steps == exp.training.steps
    assert config.model_spec is not None
    assert config.model_spec.name == {"native": "qwen3", "hf": "transformers_modeling_backend"}[exp.model.backend]


def test_every_group_has_a_file():
    groups = {g for g, _ in all_conf_files()}
    assert groups >= {"model", "parallelism", "kernels", "checkpoint", "platform", "data", "launcher", "experiment"}


@pytest.mark.parametrize("option", [o for g, o in all_conf_files() if g == "experiment"])
def test_experiment_files_start_with_their_command(option):
    from conftest import CONF

    header, first = (CONF / "experiment" / f"{option}.yaml").read_text().splitlines()[:2]
    assert header == "# @package _global_", header  # so that experiment=NAME is plain Hydra
    assert first.startswith("# python -m qwen3exp") and f"experiment={option}" in first, first
