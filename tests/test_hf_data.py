"""data=hf: a dataset by name (the local Hugging Face cache, offline) or by files, read as plain text.

The dataset is built here, in the hub cache layout (`datasets--org--name/refs/main` and
`snapshots/<commit>/data/train-00000-of-00001.parquet`) under a temporary HF_HOME, from the bundled
corpus's documents; nothing is downloaded.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import read_summary, run_cli
from qwen3exp.assets import CORPUS_DIR
from qwen3exp.config.sections.data import HFData
from qwen3exp.data.text import hf_files as hf_data_files, hf_source as hf_data_source
from qwen3exp.titan import dataset
from runprocs import TINY

NAME = "qwen3exp-tests/tiny-text"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _texts(n: int = 60) -> list[str]:
    lines = (CORPUS_DIR / "train.jsonl").read_text().splitlines()
    return [json.loads(line)["text"] for line in lines[:n]]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    """HF_HOME holding NAME at `main` (one parquet train file and a validation jsonl file)."""
    home = tmp_path_factory.mktemp("hf_home")
    repo = home / "hub" / f"datasets--{NAME.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    (snapshot / "data").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    texts = _texts()
    pq.write_table(
        pa.table({"text": texts, "id": list(range(len(texts)))}), snapshot / "data" / "train-00000-of-00001.parquet"
    )
    (snapshot / "data" / "validation-00000-of-00001.jsonl").write_text(json.dumps({"text": texts[0]}) + "\n")
    return home


def _cli(hf_home: Path, *args: str):
    env = {"HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub"), "HF_DATASETS_CACHE": str(hf_home / "ds")}
    return run_cli(*TINY, *args, env=env)


def test_by_name_resolves_offline_and_plans(hf_home, monkeypatch, tmp_path):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hf_home / "hub"))
    src, problems = hf_data_source.resolve(HFData(name=NAME))
    assert problems == [] and src is not None
    assert (src.builder, [Path(f).name for f in src.files]) == ("parquet", ["train-00000-of-00001.parquet"])
    exp = SimpleNamespace(data=HFData(name=NAME))  # plan_lines reads the data section only
    [line] = hf_data_files.plan_lines(exp)  # the plan's data line (qwen3exp.plan.render)
    assert NAME in line and COMMIT in line and "1 parquet file(s)" in line and "train-00000-of-00001.parquet" in line
    val, _ = hf_data_source.resolve(HFData(name=f"{NAME}@main", split="validation"))
    assert val is not None and val.builder == "json"
    r = _cli(hf_home, "name=hf_plan", "dry_run=true", "data=hf", f"data.name={NAME}", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert NAME in r.stdout


def test_missing_name_exits_2_with_the_fetch_command(hf_home, tmp_path):
    r = _cli(hf_home, "name=hf_missing", "dry_run=true", "data=hf", "data.name=qwen3exp-tests/absent@v1")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "data.name = 'qwen3exp-tests/absent@v1'" in r.stderr
    assert "hf download qwen3exp-tests/absent --repo-type dataset --revision v1" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_text_field_exits_2(hf_home):
    r = _cli(hf_home, "name=hf_field", "dry_run=true", "data=hf", f"data.name={NAME}", "data.text_field=body")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "data.text_field = 'body'" in r.stderr and "its columns: text, id" in r.stderr


def test_bad_split_and_subset_name_their_keys(hf_home, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hf_home / "hub"))
    _, problems = hf_data_source.resolve(HFData(name=NAME, split="test"))
    assert [p.key for p in problems] == ["data.split"] and "train, validation" in problems[0].allowed
    _, problems = hf_data_source.resolve(HFData(name=NAME, subset="en"))
    assert [p.key for p in problems] == ["data.subset"]


def test_readme_configs_choose_subset_and_split(tmp_path):
    for sub in ("en", "fr"):
        (tmp_path / sub).mkdir()
        for split in ("train", "test"):
            (tmp_path / sub / f"{split}.jsonl").write_text(json.dumps({"text": f"{sub} {split}"}) + "\n")
    (tmp_path / "README.md").write_text(
        "---\nconfigs:\n- config_name: en\n  default: true\n  data_files:\n  - split: train\n    path: en/train.jsonl\n"
        "- config_name: fr\n  data_files: {train: fr/train.jsonl, test: fr/test.jsonl}\n---\n# card\n"
    )
    (builder, files), problems = hf_data_source.folder_files(tmp_path, "train", None)
    assert problems == [] and builder == "json" and files == (str(tmp_path / "en" / "train.jsonl"),)
    (_, files), _ = hf_data_source.folder_files(tmp_path, "test", "fr")
    assert files == (str(tmp_path / "fr" / "test.jsonl"),)
    _, problems = hf_data_source.folder_files(tmp_path, "train", "de")
    assert problems[0].key == "data.subset" and problems[0].allowed == "en, fr"


def test_too_few_tokens_and_held_out_split_are_refused(tmp_path):
    from qwen3exp.config.sections.data import Validation
    from qwen3exp.config.sections.training import Training

    f = tmp_path / "one.csv"
    f.write_text('text\n"a single short document"\n')
    problems = hf_data_files.hf_problems(HFData(files=str(f)), Training(seq_len=4096, local_batch_size=8), Validation())
    assert [p.key for p in problems] == ["data.files", "validation.fraction"]


def test_held_out_rows_are_complementary(tmp_path, monkeypatch):
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", str(tmp_path / "cache"))  # not the user's cache
    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": [f"doc {i}" for i in range(50)]}), f)
    for streaming in (False, True):
        data = HFData(files=str(f), streaming=streaming)
        parts = [
            [r["text"] for r in dataset._load_hf("", data=data, part=part, fraction=0.2)]
            for part in (dataset.TRAIN, dataset.VALIDATION)
        ]
        assert parts[0] and parts[1] and sorted(parts[0] + parts[1]) == sorted(f"doc {i}" for i in range(50))


def test_local_files_csv_and_parquet_dry_run(hf_home, tmp_path):
    texts = _texts()
    with open(tmp_path / "docs.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["body"])
        w.writerows([t] for t in texts)
    pq.write_table(pa.table({"text": texts}), tmp_path / "docs.parquet")
    for files, extra in ((tmp_path / "docs.csv", ["data.text_field=body"]), (tmp_path / "*.parquet", [])):
        r = _cli(hf_home, "name=hf_files", "dry_run=true", "data=hf", f"data.files={files}", *extra)
        assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.slow
def test_trains_on_a_named_dataset(hf_home, run_dir):
    r = _cli(
        hf_home,
        "name=hf_train",
        "data=hf",
        f"data.name={NAME}",
        "training.steps=3",
        "validation.enable=false",
        "launcher.nproc_per_node=2",
        f"hydra.run.dir={run_dir}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(run_dir)
    assert (s["status"], s["steps_completed"], s["world_size"]) == ("completed", 3, 2)
