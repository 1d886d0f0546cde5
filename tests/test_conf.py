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
    "data/hf": [f"data.files={CORPUS_DIR / 'train.jsonl'}"],
    "data/mix": ["data.sources={corpus: {source: bundled, weight: 0.7}, chats: {source: chat, weight: 0.3}}"],
    "checkpoint/hf_load": ["model.flavor=auto", "model.hf_assets_path={hf_checkpoint}"],
    "checkpoint/hf_roundtrip": ["model.flavor=auto", "model.hf_assets_path={hf_checkpoint}"],
    "checkpoint/hf_finetune": ["model.flavor=auto", "model.hf_assets_path={hf_checkpoint}"],
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
    return [
        f"{group}={option}",
        *(o.replace("{hf_checkpoint}", hf_checkpoint) for o in REQUIRED.get(f"{group}/{option}", [])),
    ]


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


# ------------------------------------------------------------------ where each value came from
@pytest.fixture(scope="module")
def user_repo(tmp_path_factory):
    """A user's experiments repository as `qwen3exp init` writes it, plus a platform option of its
    own that sets one key (the others: the schema's defaults) and a second experiment with a mistake."""
    from qwen3exp.scaffold import init

    repo = tmp_path_factory.mktemp("user_repo")
    init(repo)
    (repo / "conf" / "platform").mkdir()
    (repo / "conf" / "platform" / "my_cpu.yaml").write_text("name: cpu\n")
    experiment = (repo / "conf" / "experiment" / "my_experiment.yaml").read_text()
    (repo / "conf" / "experiment" / "bad.yaml").write_text(experiment.replace("steps: 20", "steps: -3"))
    return repo


def _cli(repo, monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    """`qwen3exp ARGV` in-process, run from the user's repository (Hydra's global state cleared)."""
    from hydra.core.global_hydra import GlobalHydra

    from qwen3exp.cli import main
    from qwen3exp.launchers.job import COMMAND_ENV

    monkeypatch.chdir(repo)
    monkeypatch.delenv(COMMAND_ENV, raising=False)  # main() sets it: put back after the test
    GlobalHydra.instance().clear()
    try:
        code = main(list(argv))
    finally:
        GlobalHydra.instance().clear()
    out = capsys.readouterr()
    return code, out.out, out.err


def _origins(out: str) -> dict[str, str]:
    """The dry run's `key  value  where it came from` rows, by key."""
    import re

    rows = re.findall(r"^  ([a-z_]+(?:\.[a-z_]+)+|name|dry_run|verbose)  +(\S+) +(.+)$", out, re.MULTILINE)
    return {k: where for k, _v, where in rows}


def test_origins_of_every_kind_with_a_user_repo(user_repo, monkeypatch, capsys):
    """Each kind of origin, for the packaged files and for the user's `-cd` files (which were shown
    as the root config or the schema default), and errors repeat the right one."""
    conf = user_repo / "conf"
    code, out, err = _cli(
        user_repo,
        monkeypatch,
        capsys,
        "-cd",
        "conf",
        "experiment=my_experiment",
        "platform=my_cpu",
        "training.lr=0.01",
        "dry_run=true",
    )
    assert code == 0, err
    origin = _origins(out)
    assert origin["training.steps"] == f"experiment file {conf}/experiment/my_experiment.yaml"  # user's experiment
    assert origin["data.path"] == f"group file {conf}/data/my_data.yaml"  # user's option, chosen by the experiment
    assert origin["platform.name"] == f"group file {conf}/platform/my_cpu.yaml (chosen on the command line)"
    assert origin["platform.threads_per_rank"] == "schema default"  # my_cpu.yaml leaves it unset
    assert origin["model.backend"] == "group file conf/model/native.yaml"  # packaged option
    assert origin["model.flavor"] == "schema default"  # every default has one home: the schema
    assert origin["training.seed"] == "schema default"
    assert origin["training.lr"] == "command line training.lr=0.01"

    code, out, err = _cli(user_repo, monkeypatch, capsys, "-cd", "conf", "dry_run=true")
    assert code == 0, err
    assert _origins(out)["training.steps"] == "experiment file conf/experiment/tiny_native.yaml"  # packaged

    code, out, err = _cli(user_repo, monkeypatch, capsys, "-cd", "conf", "experiment=bad", "dry_run=true")
    assert code == 2 and "Traceback" not in err
    assert f"from: experiment file {conf}/experiment/bad.yaml" in err, err


def test_experiment_without_header_is_refused_whatever_it_holds(user_repo, monkeypatch, capsys, tmp_path):
    """The file `qwen3exp init` writes, less its first line: a defaults list with `override /data:`
    made Hydra fail with "Could not override 'data@experiment.data'" and no fix named."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(user_repo, repo)
    path = repo / "conf" / "experiment" / "my_experiment.yaml"
    path.write_text(path.read_text().replace("# @package _global_\n", "", 1))
    code, out, err = _cli(repo, monkeypatch, capsys, "-cd", "conf", "experiment=my_experiment", "dry_run=true")
    assert code == 2 and "Traceback" not in err, err
    assert "Could not override" not in err
    assert f"{path} does not start with the line '# @package _global_'" in err
    assert "add '# @package _global_' as the file's first line" in err
    assert not (repo / "outputs").exists()
