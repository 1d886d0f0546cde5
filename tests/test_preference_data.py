"""data=preference from a dataset's files (data.files: parquet, json, csv) and by name from the local
Hugging Face cache (data.name), as data=hf reads text; nothing is downloaded.

The dataset is built here from the bundled pairs (qwen3exp/assets/preference): a parquet file of the
explicit-prompt records with a column that holds no part of a pair, and a cached dataset
(`datasets--org--name/snapshots/<commit>/data/train-00000-of-00001.parquet`, under a temporary
HF_HOME) of the same pairs in the implicit-prompt format (chosen and rejected whole conversations,
lists of {role, content} structs). Asserted: the plan, the ranks' first batch and `data show` read
exactly the pairs data.path's JSON lines give; a bad row is named by its file, row and key before
launch (exit 2); the keys choose one source of records.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import compose
from qwen3exp.assets import ASSETS, TOKENIZER_DIR
from qwen3exp.config.schema import validate_experiment
from qwen3exp.errors import ConfigError

NAME = "qwen3exp-tests/tiny-pairs"
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
N = 40
BASE = ("experiment=tiny_dpo", "dry_run=true")


def _records(n: int = N) -> list[dict]:
    return [json.loads(line) for line in (ASSETS / "preference" / "train.jsonl").read_text().splitlines()[:n]]


def _implicit(r: dict) -> dict:
    return {side: [*r["prompt"], {"role": "assistant", "content": r[side]}] for side in ("chosen", "rejected")}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A folder with pairs.jsonl (the first N bundled pairs), pairs.parquet (the same, plus a score
    column), pairs.json (a JSON array of them) and hf/ (HF_HOME holding NAME: the implicit format)."""
    root = tmp_path_factory.mktemp("pairs")
    records = _records()
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    table = {k: [r[k] for r in records] for k in ("prompt", "chosen", "rejected")}
    pq.write_table(pa.table({**table, "score": [1.0] * N}), root / "pairs.parquet")
    (root / "pairs.json").write_text(json.dumps(records))
    repo = root / "hf" / "hub" / f"datasets--{NAME.replace('/', '--')}"
    (repo / "snapshots" / COMMIT / "data").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    implicit = [_implicit(r) for r in records]
    cols = {side: [r[side] for r in implicit] for side in ("chosen", "rejected")}
    pq.write_table(pa.table(cols), repo / "snapshots" / COMMIT / "data" / "train-00000-of-00001.parquet")
    return root


@pytest.fixture
def cache(data, monkeypatch) -> Path:
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(data / "hf" / "hub"))
    return data


def _plan(tmp_path, *overrides: str):
    from qwen3exp.plan.build import make_plan
    from qwen3exp.plan.render import render

    exp = validate_experiment(compose(*BASE, *overrides))
    return exp, render(make_plan(exp, tmp_path / "run"))


def test_a_parquet_file_and_a_cached_dataset_read_the_pairs_of_the_jsonl_file(cache, tmp_path):
    """The plan's figures (pairs, tokens, counted tokens) are those of the same pairs as JSON lines."""
    from qwen3exp.data.preference import files as preference_files

    figures, texts = {}, {}
    for how in (f"data.path={cache / 'pairs.jsonl'}", f"data.files={cache / 'pairs.parquet'}", f"data.name={NAME}"):
        key = how.split("=")[0]
        exp, texts[key] = _plan(tmp_path, how)
        figures[key] = preference_files.stats(exp.data, TOKENIZER_DIR, exp.training.seq_len)
        assert f"pairs:      {N} pairs: " in texts[key], texts[key]
    assert figures["data.path"] == figures["data.files"] == figures["data.name"]
    assert figures["data.path"].total == N and figures["data.path"].chosen > 0
    assert "1 parquet file(s): " in texts["data.files"] and "not read: score" in texts["data.files"]
    assert f"{NAME}@main (Hugging Face cache snapshot {COMMIT})" in texts["data.name"]
    assert "not read" not in texts["data.name"] and "data:       " not in texts["data.path"]


def test_the_ranks_read_the_same_batches_from_a_dataset(cache):
    from qwen3exp.titan.preference_dataset import PreferenceDataLoader, loader_config  # lazy: imports torchtitan

    batches = {}
    for how in (f"data.path={cache / 'pairs.jsonl'}", f"data.name={NAME}", f"data.files={cache / 'pairs.json'}"):
        for validation in (False, True):
            exp = validate_experiment(compose(*BASE, how, "validation.fraction=0.25"))
            config = loader_config(exp, str(TOKENIZER_DIR), validation=validation)
            loader = PreferenceDataLoader(config, dp_world_size=2, dp_rank=1, seq_len=192, local_batch_size=4)
            inputs, labels = next(iter(loader))
            batches[how.split("=")[0], validation] = (inputs["input"].tolist(), labels.tolist())
    for validation in (False, True):
        want = batches["data.path", validation]
        assert batches["data.name", validation] == want and batches["data.files", validation] == want


def test_data_show_names_the_row_of_each_pair(cache):
    from qwen3exp.data.sample import first_samples

    s = first_samples(validate_experiment(compose(*BASE, f"data.name={NAME}")), TOKENIZER_DIR, 1)
    assert [x.label for x in s.samples] == [
        "pair 1, chosen (data/train-00000-of-00001.parquet row 1)",
        "pair 1, rejected (data/train-00000-of-00001.parquet row 1)",
    ]
    assert [[t for t, on in x.pieces if on] for x in s.samples] == [
        ["The pig is green.<|im_end|>"],
        ["yellow cat<|im_end|>"],
    ]
    assert NAME in s.source


def test_arrow_and_csv_rows_are_the_records(tmp_path):
    """An arrow file (the stream format `datasets` writes) and a csv file give the records of the
    same pairs (csv: strings only), their other columns not read."""
    from qwen3exp.config.sections.data import PreferenceData
    from qwen3exp.data.preference import source

    records = _records(6)
    table = pa.table({**{k: [r[k] for r in records] for k in ("prompt", "chosen", "rejected")}, "id": list(range(6))})
    with pa.OSFile(str(tmp_path / "train.arrow"), "wb") as f:
        with pa.ipc.new_stream(f, table.schema) as writer:
            writer.write_table(table)
    flat = [{"prompt": f"q{i}", "chosen": f"a{i}", "rejected": f"b{i}", "id": str(i)} for i in range(3)]
    with (tmp_path / "train.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(flat[0]))
        w.writeheader()
        w.writerows(flat)
    for name, want in (("train.arrow", records), ("train.csv", flat)):
        src, problems = source.resolve(PreferenceData(files=str(tmp_path / name)))
        assert src is not None and not problems, problems
        got = [(number, record) for _, number, record in source.rows(src)]
        assert got == [(i + 1, {k: r[k] for k in source.COLUMNS}) for i, r in enumerate(want)], got
        assert source.other_columns(src) == ["id"] and source.count(src, 2**20) == len(want)


def test_a_bad_row_is_named_by_file_row_and_key(tmp_path):
    records = _records(4)
    records[2] = {**records[2], "rejected": records[2]["chosen"]}
    records[3] = {"prompt": records[3]["prompt"], "chosen": records[3]["chosen"], "rejected": " "}
    table = {k: [r[k] for r in records] for k in ("prompt", "chosen", "rejected")}
    pq.write_table(pa.table(table), tmp_path / "bad.parquet")
    with pytest.raises(ConfigError) as e:
        _plan(tmp_path, f"data.files={tmp_path / 'bad.parquet'}")
    messages = [(p.key, p.message) for p in e.value.problems]
    assert (
        "data.files",
        "bad.parquet row 3: rejected is identical to chosen (a pair must prefer one answer over another)",
    ) in messages
    assert ("data.files", "bad.parquet row 4: rejected is an empty answer") in messages


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["data.path=a.jsonl", "data.files=b.parquet"], "data.files"),
        (["data.name=org/x", "data.files=b.parquet"], "data.files"),
        (["data.split=test"], "data.split"),
        (["data.subset=en"], "data.subset"),
    ],
)
def test_one_source_of_records(overrides, key):
    with pytest.raises(ConfigError) as e:
        validate_experiment(compose(*BASE, *overrides))
    assert [p.key for p in e.value.problems] == [key], e.value.problems


USER = {"role": "user", "content": "hi"}
BAD_RECORDS = [
    ({"prompt": "hi", "rejected": "b"}, "line 2: chosen is missing"),
    ({"prompt": "hi", "chosen": "a"}, "line 3: rejected is missing"),
    ({"prompt": "hi", "chosen": "a", "rejected": "a"}, "line 4: rejected is identical to chosen"),
    ({"prompt": "hi", "chosen": "", "rejected": "b"}, "line 5: chosen is an empty answer"),
    (
        {
            "chosen": [USER, {"role": "assistant", "content": "a"}],
            "rejected": [{"role": "user", "content": "ho"}, {"role": "assistant", "content": "b"}],
        },
        "line 6: chosen shares no prompt with rejected",
    ),
]
"""The issue's bad records, one per line after a good one (each is named: 5 = chat_files.MAX_REPORTED)."""


@pytest.mark.parametrize("case", ["records", "dpo_on_chat", "gamma_in_orpo"])
def test_bad_preference_input_exits_2_before_any_worker(case, tmp_path):
    """The issue's list of bad input: exit 2 from the real command line's dry run, naming the key
    (and the file, line and record key of each bad record), no traceback, no worker. The rest of
    the list is asserted in process in tests/test_preference.py (objective=dpo on data=bundled,
    data=preference with objective=sft, objective.gamma with objective=dpo)."""
    from conftest import run_cli

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [_records(1)[0], *(r for r, _ in BAD_RECORDS)]))
    overrides, key, messages = {
        "records": (["experiment=tiny_dpo", f"data.path={path}"], "data.path", [m for _, m in BAD_RECORDS]),
        "dpo_on_chat": (["objective=dpo", "data=chat"], "objective", ["data=chat has none"]),
        "gamma_in_orpo": (["objective=orpo", "data=preference", "objective.gamma=1"], "objective.gamma", []),
    }[case]
    r = run_cli(*overrides, "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and key in r.stderr, r.stderr[-2000:]
    assert all(f"pairs.jsonl {m}" in r.stderr if case == "records" else m in r.stderr for m in messages), r.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


def test_data_show_marks_exactly_each_completions_counted_tokens():
    """`qwen3exp data show` on experiment=tiny_dpo: each side of a pair is the whole rendered
    conversation, only the final answer's content and `<|im_end|>` marked (the prompt, the role
    header and the empty thinking block unmarked), its header counting the side's tokens and the
    counted ones, the same the ranks' loss counts (`render_pair`)."""
    import re

    from conftest import run_cli
    from qwen3exp.data.chat.render import load_tokenizer
    from qwen3exp.data.preference.pairs import pair_of, render_pair

    r = run_cli("data", "show", "-n", "2", "experiment=tiny_dpo")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "trained: the final answer and its end-of-turn token" in r.stdout
    tok, lines = load_tokenizer(TOKENIZER_DIR), (ASSETS / "preference" / "train.jsonl").read_text().splitlines()
    head = re.compile(
        r"^--- sample \d of 4: pair (\d+), (chosen|rejected) \(train.jsonl line (\d+)\): (\d+) tokens, (\d+) trained",
        re.M,
    )
    found = list(head.finditer(r.stdout))
    assert [m[2] for m in found] == ["chosen", "rejected"] * 2, r.stdout
    ends = [m.start() for m in found[1:]] + [r.stdout.index("--- 4 sample(s)")]
    for m, end in zip(found, ends, strict=True):
        body = r.stdout[m.end() : end].split("\n", 1)[1]
        side = render_pair(tok, pair_of(lines[int(m[3]) - 1]))[m[2] == "rejected"]
        record = json.loads(lines[int(m[3]) - 1])
        assert re.findall(r"\[\[(.*?)\]\]", body, re.S) == [record[m[2]] + "<|im_end|>"], body
        assert body.replace("[[", "").replace("]]", "").rstrip("\n") == tok.decode(side.ids).rstrip("\n")
        assert (int(m[4]), int(m[5])) == (len(side.ids), sum(side.trained[1:])), m[0]
        assert (
            tok.decode([t for t, on in zip(side.ids, side.trained, strict=True) if on]) == record[m[2]] + "<|im_end|>"
        )
