"""A launch resumes only from a DCP checkpoint qwen3exp wrote: DCP reads `.metadata` with pickle (and
its byte items, and torchtitan's data-loader state), so a checkpoint planted beside a copied
experiment.yaml would run its author's code in every rank. Each rank signs the files it saved
(`qwen3exp.run.signing`); the plan verifies them before any rank starts."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml

from conftest import compose, run_cli
from qwen3exp.config.schema import validate_experiment
from qwen3exp.run import identity, signing


@pytest.fixture
def own_key(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "keys" / "mine.key"
    monkeypatch.setenv(signing.KEY_ENV, str(path))
    return path


def _step(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"rank 0's shard")
    (folder / "__1_0.distcp").write_bytes(b"rank 1's shard")
    (folder / ".metadata").write_bytes(b"the index")
    return folder


def test_signed_by_each_rank_and_verified(tmp_path, own_key, monkeypatch):
    step = _step(tmp_path / "checkpoint" / "step-3")
    assert "no qwen3exp signature" in signing.problem(step) and not signing.has_signature(step)
    signing.sign(step, 0, 2)
    assert not signing.has_signature(step)  # a stop before rank 1 signed: never loaded
    assert "not signed by every rank that saved it" in signing.problem(step)
    signing.sign(step, 1, 2)
    assert signing.problem(step) is None and signing.has_signature(step)
    assert own_key.stat().st_mode & 0o777 == 0o600
    (step / ".metadata").write_bytes(b"the index, replaced")
    assert signing.problem(step) == "step-3/.metadata changed since qwen3exp wrote it"
    (step / ".metadata").write_bytes(b"the index")
    (step / "__2_0.distcp").write_bytes(b"planted")
    assert "holds __2_0.distcp, which no qwen3exp signature lists" in signing.problem(step)
    (step / "__2_0.distcp").unlink()
    (step / "__1_0.distcp").unlink()
    assert "__1_0.distcp, which its signature lists, is missing" in signing.problem(step)
    (step / "__1_0.distcp").write_bytes(b"rank 1's shard")
    monkeypatch.setenv(signing.KEY_ENV, str(tmp_path / "keys" / "another.key"))
    signing.key(create=True)
    assert "is not signed with this user's key" in signing.problem(step)


def test_a_planted_checkpoint_beside_a_copied_experiment_is_never_loaded(tmp_path, own_key):
    """The same settings, a run directory holding a copied experiment.yaml and a checkpoint whose
    .metadata is a pickle that writes a file when loaded: refused before any rank starts (exit 2,
    `checkpoint` named), and the pickle never runs."""
    overrides = ["checkpoint=dcp", "training.steps=2", "training.warmup_steps=1", "validation.enable=false"]
    exp = validate_experiment(compose(*overrides))
    run = tmp_path / "copied"
    run.mkdir()
    (run / "experiment.yaml").write_text(yaml.safe_dump(identity.recorded_data(exp)))
    marker = tmp_path / "pwned"
    step = run / "checkpoint" / "step-1"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(pickle.dumps(_Planted(str(marker))))
    r = run_cli(*overrides, f"hydra.run.dir={run}", env={signing.KEY_ENV: str(own_key)}, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "  checkpoint = 'load=none save=dcp export=none': checkpoint.save=true would resume from" in r.stderr
    assert "step-1 carries no qwen3exp signature" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists()


class _Planted:
    """Unpickling it creates a file: what a planted checkpoint's author could run instead."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))
