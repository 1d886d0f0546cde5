"""The plan shows the data, and the separator of plain-text documents is chosen on purpose (issue 24).

- data.eos null is the end-of-text token (the bundled tokenizer's `<|endoftext|>`, id 0, also its
  eos_token: the golden losses keep it); another token of the tokenizer is used as given, and one
  that is not a single token exits 2 naming data.eos;
- the first batch a rank sees (torchtitan's text dataloader, built in-process from the converted
  config) has the chosen separator's id right after the first document;
- the plan prints documents, tokens and epochs for bundled, local, hf and chat data; plan.json and
  summary.json hold the same figures under "data" (chat: dropped and truncated).
"""

from __future__ import annotations

import json

import pytest

from conftest import compose, run_cli
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.schema import validate_experiment

DOCS = [f"Document number {i} says hello to the reader {i} times." for i in range(40)]


def _jsonl(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    return path


def _plan(*overrides: str, run_dir):
    from qwen3exp.plan.build import make_plan

    exp = validate_experiment(compose("platform=cpu", "dry_run=true", *overrides))
    return make_plan(exp, run_dir)


@pytest.mark.parametrize(("eos", "token", "want"), [(None, "<|endoftext|>", 0), ("'<|im_end|>'", "<|im_end|>", 2)])
def test_the_separator_follows_each_document_in_a_ranks_first_batch(tmp_path, eos, token, want):
    from tokenizers import Tokenizer

    from qwen3exp.plan.build import prepare
    from qwen3exp.titan.job_config import to_torchtitan

    path = _jsonl(tmp_path)
    overrides = ["platform=cpu", "data=local", f"data.path={path}", "validation.enable=false", "training.seq_len=64"]
    exp = validate_experiment(compose(*overrides, *([f"data.eos={eos}"] if eos else [])))
    plan = _plan(*overrides[1:], *([f"data.eos={eos}"] if eos else []), run_dir=tmp_path / "plan")
    assert (plan.data["separator"], plan.data["separator_id"]) == (token, want)
    config = to_torchtitan(exp, prepare(exp).facts, tmp_path / "run")
    tok = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    assert tok.eos_id == want
    loader = config.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=64, local_batch_size=2)
    inputs, labels = next(iter(loader))
    ids = [Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json")).encode(d).ids for d in DOCS[:2]]
    row = labels[0].tolist()
    # inputs: each document without its separator; labels: the next token, the separator after the last one
    assert inputs["input"][0].tolist()[: len(ids[0]) + 1] == ids[0] + ids[1][:1]
    assert row[: len(ids[0]) + len(ids[1])] == ids[0][1:] + [want] + ids[1][1:] + [want]


def test_a_token_not_in_the_tokenizer_exits_2(tmp_path):
    r = run_cli("dry_run=true", "platform=cpu", "data.eos='<|im_endd|>'", f"hydra.run.dir={tmp_path}")
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out[-3000:]
    assert "data.eos = '<|im_endd|>': is not a single token of the run's tokenizer" in out, out[-3000:]
    assert "did you mean <|im_end|>?" in out


def test_the_plan_shows_the_data_of_bundled_and_local_text(tmp_path):
    from tokenizers import Tokenizer

    r = run_cli("dry_run=true", "platform=cpu", "training.steps=30", f"hydra.run.dir={tmp_path / 'a'}")
    out = r.stdout
    assert r.returncode == 0, (out + r.stderr)[-3000:]
    assert "data:       bundled corpus" in out
    assert "729 documents, " in out and "tokens (counted); 30 steps x 4,096 tokens = " in out, out
    assert "separator <|endoftext|> (id 0; data.eos, null: the end-of-text token)" in out
    plan = _plan("data=local", f"data.path={_jsonl(tmp_path)}", "validation.enable=false", run_dir=tmp_path / "b")
    data = plan.as_json()["data"]
    assert data["source"] == "local" and data["documents"] == 40 and data["tokens_from"] == "counted"
    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    assert data["tokens"] == sum(len(tok.encode(d).ids) + 1 for d in DOCS)  # one separator per document
    assert data["epochs"] == pytest.approx(plan.batches.tokens_per_step * plan.exp.training.steps / data["tokens"])


def test_the_plan_shows_hf_data_and_chat_epochs(tmp_path):
    files = tmp_path / "hf"
    files.mkdir()
    (files / "train.jsonl").write_text("".join(json.dumps({"text": d * 20}) + "\n" for d in DOCS))
    r = run_cli("dry_run=true", "platform=cpu", "data=hf", f"data.files={files}", f"hydra.run.dir={tmp_path / 'a'}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "            40 documents, " in r.stdout and "separator <|endoftext|> (id 0;" in r.stdout, r.stdout
    r = run_cli("dry_run=true", "experiment=tiny_sft", "training.steps=10", f"hydra.run.dir={tmp_path / 'b'}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert " 0 dropped, 0 truncated (data.max_len_policy=drop); 10 steps x " in r.stdout, r.stdout
    assert " conversations = " in r.stdout and "epoch(s)" in r.stdout


def test_plan_json_and_summary_hold_the_chat_figures(tmp_path):
    from qwen3exp.launchers.outcome import summarize

    plan = _plan("experiment=tiny_sft", "training.seq_len=64", "data.max_len_policy=truncate", run_dir=tmp_path)
    data = plan.as_json()["data"]
    assert data["source"] == "chat" and data["documents"] == 320 and data["separator"] is None
    assert data["truncated"] > 0 and data["dropped"] == 0 and 0 < data["trained"] < data["tokens"]
    assert data["epochs"] > 0
    summary = summarize(plan, tmp_path, exit_code=0, status="completed", wall=1.0, error=None)
    assert summary["data"] == data
    assert json.loads((tmp_path / "summary.json").read_text())["data"]["truncated"] == data["truncated"]
