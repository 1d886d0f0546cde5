"""Model references: a local folder, or a Hub id (with or without a revision) resolved offline from a
Hugging Face cache laid out as huggingface_hub lays it out; the tokenizer comes from the named model;
a reference the cache does not hold exits 2 with the `hf download` command; run files honour the umask."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from conftest import compose, run_cli
from hf_fixtures import hub_cache
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.schema import validate_experiment
from qwen3exp.errors import ConfigError
from qwen3exp.plan import model_files
from qwen3exp.run import rundir

REPO = "qwen3exp-test/tiny"
OLD, NEW = "a" * 40, "b" * 40


def _model(folder: Path, *, extra_tokens: int = 0) -> Path:
    """The bundled tiny model folder (config.json, tokenizer); `extra_tokens` added tokens make its
    tokenizer differ from the bundled one (vocab_size grows to hold them)."""
    folder.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((TOKENIZER_DIR / name).read_bytes())
    if extra_tokens:
        tok = json.loads((folder / "tokenizer.json").read_text())
        flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        tok["added_tokens"] = [
            *tok.get("added_tokens", []),
            *({"id": 2048 + i, "content": f"<x{i}>", **flags} for i in range(extra_tokens)),
        ]
        (folder / "tokenizer.json").write_text(json.dumps(tok))
        cfg = json.loads((folder / "config.json").read_text())
        cfg["vocab_size"] = 2048 + 128
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    from huggingface_hub import constants

    root = tmp_path / "hub"
    hub_cache(root, REPO, _model(tmp_path / "old"), commit=OLD, refs=())
    hub_cache(root, REPO, _model(tmp_path / "new", extra_tokens=50), commit=NEW, refs=("main",))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    return root


def _files(*overrides: str) -> model_files.ModelFiles:
    return model_files.check(validate_experiment(compose(*overrides)))


def test_the_cache_is_laid_out_as_huggingface_hub_reads_it(cache):
    from huggingface_hub import scan_cache_dir

    (repo,) = scan_cache_dir(cache).repos
    assert repo.repo_id == REPO and {r.commit_hash for r in repo.revisions} == {OLD, NEW}


@pytest.mark.parametrize("how", ["main", "@", "revision key"])
def test_hub_id_resolves_from_the_cache(cache, how):
    match how:
        case "main":
            files, commit = _files("model.flavor=auto", f"model.hf_assets_path={REPO}"), NEW
        case "@":
            files, commit = _files("model.flavor=auto", f"model.hf_assets_path={REPO}@{OLD}"), OLD
        case _:
            files, commit = _files("model.flavor=auto", f"model.hf_assets_path={REPO}", f"model.revision={OLD}"), OLD
    snapshot = cache / "models--qwen3exp-test--tiny" / "snapshots" / commit
    assert files.folder == snapshot and files.config_folder == snapshot
    src = files.sources()
    assert src["config"]["commit"] == commit and src["tokenizer"]["repo_id"] == REPO
    assert files.tokenizer_vocab == (2098 if commit == NEW else 2048)


def test_conflicting_revisions_are_refused(cache):
    with pytest.raises(ConfigError) as e:
        _files("model.flavor=auto", f"model.hf_assets_path={REPO}@{OLD}", f"model.revision={NEW}")
    assert e.value.problems[0].key == "model.revision"


def test_hf_model_brings_its_own_tokenizer(cache, tmp_path):
    files = _files("model=hf", f"model.hf_model={REPO}")
    assert files.folder.name == NEW and files.tokenizer_vocab == 2098  # not the bundled 2048
    # Another model's tokenizer next to it is a mismatch, before launch.
    with pytest.raises(ConfigError) as e:
        _files("model=hf", f"model.hf_model={REPO}", f"model.hf_assets_path={_model(tmp_path / 'other')}")
    (p,) = e.value.problems
    assert p.key == "model.hf_assets_path" and "has 2048 tokens" in p.message and "2098 tokens" in p.message


def test_missing_hub_id_exits_2_with_the_fetch_command(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(
        "model.flavor=auto",
        "model.hf_assets_path=Qwen/Qwen3-0.6B@c1899de",
        "training.steps=2",
        f"hydra.run.dir={run_dir}",
        env={"HF_HUB_CACHE": str(tmp_path / "empty")},
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "model.hf_assets_path = 'Qwen/Qwen3-0.6B@c1899de'" in r.stderr
    assert "hf download Qwen/Qwen3-0.6B --revision c1899de" in r.stderr
    assert not (run_dir / "logs").exists()


def test_missing_folder_named_like_a_qwen3_release_names_its_hub_id_and_local_dir(tmp_path):
    # The trn2 experiments' default folder: taken as a Hub id, it gave `hf download
    # models/Qwen3-4B-Instruct-2507`, a repository that does not exist.
    r = run_cli(
        "experiment=trn2_qwen3_4b_hf", "dry_run=true", cwd=tmp_path, env={"HF_HUB_CACHE": str(tmp_path / "empty")}
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "model.hf_assets_path = 'models/Qwen3-4B-Instruct-2507'" in r.stderr
    assert "hf download Qwen/Qwen3-4B-Instruct-2507 --local-dir models/Qwen3-4B-Instruct-2507" in r.stderr
    assert "hf download models/" not in r.stderr


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_atomic_writes_honour_the_umask(tmp_path, mask, mode):
    from qwen3exp.config.flavors import FLAVORS
    from qwen3exp.titan import hf_export

    old = os.umask(mask)
    try:
        rundir.atomic_write_json(tmp_path / "summary.json", {"ok": True})
        export = tmp_path / "export"
        export.mkdir()
        hf_export.complete(export, arch=FLAVORS["tiny"], assets=TOKENIZER_DIR, config_source=None, dtype="bfloat16")
    finally:
        os.umask(old)
    for path in (tmp_path / "summary.json", *export.iterdir()):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    assert (export / "generation_config.json").is_file()  # derived from config.json
