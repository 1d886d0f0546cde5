"""The validation loss is measured on documents no training step reads: the held-out split is a
fixed set of documents (the same in every run), the training dataset is the rest, and the
torchtitan config a run trains with (rebuilt from its recorded files, as its ranks build it) reads
exactly those two sets. No training here: the datasets are loaded through the registered loaders."""

from __future__ import annotations

import json

import pytest

from conftest import compose
from qwen3exp.assets import CORPUS_DIR


def test_held_out_positions_are_fixed_spread_and_exact():
    from qwen3exp.titan.dataset import held_out

    a = held_out(729, 0.1)
    assert a == held_out(729, 0.1) and len(a) == 73 and a == sorted(set(a))
    assert min(a) < 100 and max(a) > 629  # spread over the corpus, not its tail
    assert len(held_out(10, 0.01)) == 1  # at least one document
    with pytest.raises(ValueError, match="leaves nothing to train on"):
        held_out(1, 0.5)


def _texts(config_entry) -> list[str]:
    from torchtitan.hf_datasets.text_datasets import DATASETS

    entry = DATASETS[config_entry.dataset]
    ds = entry.loader(config_entry.dataset_path or entry.path)
    return [entry.sample_processor(row) for row in ds]


def test_the_run_config_validates_on_documents_training_never_reads(tmp_path):
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.launchers.local import prepare
    from qwen3exp.titan.job_config import to_torchtitan

    prep = prepare(validate_experiment(compose("platform=cpu")))
    config = to_torchtitan(prep.exp, prep.facts, tmp_path)
    assert config.validator.enable and config.validator.freq == 10 and config.validator.steps == 2
    train, val = _texts(config.dataloader), _texts(config.validator.dataloader)
    everything = [json.loads(line)["text"] for line in (CORPUS_DIR / "train.jsonl").read_text().splitlines()]
    assert len(val) == 73 and len(train) == len(everything) - 73
    assert sorted(train + val) == sorted(everything)
    assert not set(train) & set(val)


def test_a_separate_validation_path_trains_on_everything(tmp_path):
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.launchers.local import prepare
    from qwen3exp.titan.job_config import to_torchtitan

    held = tmp_path / "val.jsonl"
    held.write_text(json.dumps({"text": "a held-out document of its own"}) + "\n")
    prep = prepare(validate_experiment(compose("platform=cpu", f"validation.path={held}")))
    config = to_torchtitan(prep.exp, prep.facts, tmp_path)
    assert len(_texts(config.dataloader)) == len((CORPUS_DIR / "train.jsonl").read_text().splitlines())
    assert _texts(config.validator.dataloader) == ["a held-out document of its own"]


def test_validation_off_and_a_missing_path_are_checked_before_launch(tmp_path):
    from conftest import run_cli

    r = run_cli("validation.enable=false", "sweep.objective=val_loss", "dry_run=true")
    assert r.returncode == 2 and "sweep.objective = 'val_loss'" in r.stderr and "last_loss" in r.stderr
    r = run_cli(f"validation.path={tmp_path / 'nope.jsonl'}", "dry_run=true")
    assert r.returncode == 2 and "validation.path" in r.stderr and "does not exist" in r.stderr
    ok = run_cli("validation.enable=false", "dry_run=true")
    assert ok.returncode == 0 and "validation: off" in ok.stdout and "objective:  last_loss" in ok.stdout


@pytest.mark.parametrize(
    "fraction, why, allowed",
    [
        # The bundled corpus (729 documents) was not checked: the ranks started and failed (exit 1).
        (
            "0.9995",
            "holds out 729 of the 729 document(s) of the bundled corpus, which leaves 0 to train on",
            "0.0028 to 0.9972 for 729 documents and 2 ranks",
        ),
        # One document per side is not enough for 2 data-parallel ranks: a rank read none and failed.
        (
            "0.9986",
            "which leaves 1 to train on for 2 data-parallel ranks",
            "0.0028 to 0.9972 for 729 documents and 2 ranks",
        ),
        (
            "0.001",
            "holds out 1 of the 729 document(s) of the bundled corpus for 2 data-parallel ranks",
            "0.0028 to 0.9972",
        ),
    ],
)
def test_a_split_that_leaves_a_rank_no_documents_is_refused_before_launch(tmp_path, fraction, why, allowed):
    from conftest import run_cli

    run_dir = tmp_path / "run"
    r = run_cli(f"validation.fraction={fraction}", "training.steps=2", f"hydra.run.dir={run_dir}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"validation.fraction = {fraction}: " in r.stderr and why in r.stderr and allowed in r.stderr
    assert not (run_dir / "logs").exists()
    if fraction == "0.001":  # the smallest fraction named works
        assert run_cli("validation.fraction=0.0028", "dry_run=true").returncode == 0
