"""data=mix before any worker starts: the plan's figures of each source, its warnings, `qwen3exp data
show`, and every mistake refused with exit 2 naming `data.sources.<name>.<key>` (dry runs through the
real command line, or the plan in-process; nothing trains here)."""

from __future__ import annotations

import json

import pytest

from conftest import compose, run_cli
from qwen3exp.assets import ASSETS, CORPUS_DIR, TOKENIZER_DIR

MIX = ("experiment=tiny_mix", "dry_run=true")


def plan_of(tmp_path, *overrides: str):
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.plan.build import make_plan
    from qwen3exp.titan.job_config import override_claims

    exp = validate_experiment(compose(*overrides))
    return make_plan(exp, tmp_path, claims_of=override_claims)


def refused(*args: str) -> str:
    """The message of a dry run that must exit 2 before anything starts, without a traceback."""
    r = run_cli(*args)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "nothing was started" in r.stderr, out[-3000:]
    return r.stderr


# (id, overrides, "key = value" the message names, text of its allowed line)
REFUSALS = [
    ("negative weight", ["data.sources.corpus.weight=-0.5"], "data.sources.corpus.weight = -0.5", "a number >= 0"),
    (
        "all weights 0",
        ["data.sources.corpus.weight=0", "data.sources.chats.weight=0"],
        "data.sources = {",
        "at least one weight above 0",
    ),
    ("unknown source", ["data.sources.nope.weight=1"], "data.sources.nope.weight = '1'", "data.sources.corpus"),
    ("unknown source added", ["+data.sources.nope.weight=1"], "data.sources.nope = {'weight': 1}", "corpus, chats"),
    ("invalid name", ["+data.sources.Web={source: bundled}"], "data.sources.Web = 'Web'", "a name matching"),
    ("dpo on text", ["objective=dpo"], "data.sources.corpus.source = 'bundled'", "preference"),
    (
        "sft on pairs",
        ["+data.sources.pairs={source: preference, weight: 0.1}"],
        "data.sources.pairs.source = 'preference'",
        "bundled, local, hf or chat",
    ),
    (
        "same files",
        [f"+data.sources.again={{source: local, path: {CORPUS_DIR / 'train.jsonl'}, weight: 0.2}}"],
        "data.sources.again.path = ",
        "each file in one source only",
    ),
    ("over max_epochs", ["+data.sources.chats.max_epochs=1"], "data.sources.chats.max_epochs = 1.0", "at least 1.39"),
    ("a key the source does not set", ["data.sources.chats.max_epochs=1"], "data.sources.chats.max_epochs", "weight"),
    ("validation.path", [f"validation.path={CORPUS_DIR}"], "validation.path = ", "null with data=mix"),
    (
        "a source's missing file",
        ["+data.sources.more={source: local, path: /nonexistent/web.jsonl}"],
        "data.sources.more.path = '/nonexistent/web.jsonl'",
        "an existing",
    ),
    ("a source's required key", ["+data.sources.x={source: local, weight: 0.1}"], "data.sources.x.path", "A .jsonl"),
    (
        "a source's validation file",
        ["+data.sources.chats.validation_path=/nonexistent/val.jsonl"],
        "data.sources.chats.validation_path = '/nonexistent/val.jsonl'",
        ".jsonl file",
    ),
]


@pytest.mark.parametrize("overrides,key,allowed", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_a_mistake_in_a_mixture_exits_2_naming_the_source_and_key(overrides, key, allowed):
    err = refused(*MIX, *overrides)
    assert f"  {key}" in err, err
    line = err[err.index(f"  {key}") :].splitlines()
    assert any(allowed in text for text in line[:3]), err


def test_a_sweep_over_a_source_that_does_not_exist_is_refused():
    err = refused("-m", *MIX, "data.sources.nope.weight=0.2,0.5")
    assert "data.sources.nope.weight = '0.2': source 'nope' does not exist: the sources are corpus, chats" in err


def test_plain_text_sources_with_different_separators_are_refused_before_launch(tmp_path):
    """One tokenizer appends one eos_id to every text document: a second separator would be
    dropped. Compared as resolved (null: the tokenizer's <|endoftext|>, which equals it spelled out)."""
    web = tmp_path / "web.jsonl"
    web.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(40)))
    source = f"{{source: local, path: {web}, weight: 0.2, eos: '%s'}}"
    err = refused(*MIX, "+data.sources.web=" + source % "<|im_end|>")
    assert "  data.sources.web.eos = '<|im_end|>': ends its documents with <|im_end|>, and source corpus" in err
    r = run_cli(*MIX, "+data.sources.web=" + source % "<|endoftext|>")
    assert r.returncode == 0, r.stderr[-3000:]


def test_bare_data_mix_asks_for_its_sources():
    err = refused("data=mix", "dry_run=true")
    assert "data.sources = (missing)" in err


def test_a_source_whose_held_out_split_is_empty(tmp_path):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"text": "a single document"}) + "\n")
    err = refused(*MIX, f"+data.sources.one={{source: local, path: {one}, weight: 0.1}}")
    assert "validation.fraction = 0.1: source one: holds out 1 of the 1 document(s)" in err, err


def _corpus_tokens() -> tuple[int, int]:
    """(documents, tokens) of the bundled corpus, counted here: every document tokenized, one separator each."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    texts = [json.loads(line)["text"] for line in (CORPUS_DIR / "train.jsonl").read_text().splitlines() if line.strip()]
    return len(texts), sum(len(e.ids) + 1 for e in tok.encode_batch(texts, add_special_tokens=False))


def test_the_plan_shows_each_source_counted_independently(tmp_path):
    p = plan_of(tmp_path, "experiment=tiny_mix")
    f = p.data
    assert f["source"] == "mix" and set(f["sources"]) == {"corpus", "chats"}
    corpus, chats = f["sources"]["corpus"], f["sources"]["chats"]
    docs, tokens = _corpus_tokens()
    assert (corpus["records"], corpus["tokens"], corpus["tokens_from"]) == (docs, tokens, "counted")
    conversations = (ASSETS / "chat" / "train.jsonl").read_text().splitlines()
    assert chats["records"] == len(conversations) == 320 and chats["unit"] == "conversations"
    assert (corpus["weight"], chats["weight"]) == pytest.approx((0.7, 0.3))
    # The run's sequences are shared out, and each source gives its weight's share of the trained tokens.
    sequences = p.batches.global_batch_size * p.exp.training.steps
    assert corpus["sequences"] + chats["sequences"] == pytest.approx(sequences)
    assert corpus["trained"] / f["trained"] == pytest.approx(0.7, abs=1e-3)
    # Plain text: every position of a packed sequence is a label; the held-out 10% is not read.
    seq_len = p.exp.training.seq_len
    assert corpus["trained_per_sequence"] == seq_len
    assert corpus["epochs"] == pytest.approx(corpus["sequences"] * seq_len / (tokens * 0.9))
    # Conversations: one per sequence, 32 of the 320 held out (validation.fraction 0.1).
    assert chats["epochs"] == pytest.approx(chats["sequences"] / 288) and chats["estimated"]
    # A conversation's trained tokens: its assistant turns (the chat kind's own count, as data=chat plans it).
    sft = plan_of(tmp_path / "sft", "experiment=tiny_sft")
    assert chats["tokens"] == sft.data["tokens"] and chats["kind"]["trained"] == sft.data["trained"]
    assert chats["trained_per_sequence"] == pytest.approx(sft.data["trained"] / 320)
    saved = json.loads(json.dumps(p.as_json()))["data"]  # plan.json carries the per-source figures
    assert saved["sources"]["chats"]["sequences"] == pytest.approx(chats["sequences"])
    assert not p.warnings


def test_one_source_plans_as_its_kind_alone(tmp_path):
    """A mixture of one source makes the epochs and tokens the one-kind run's plan shows."""
    one = plan_of(tmp_path, "data=mix", "data.sources={corpus: {source: bundled}}", "training.steps=40")
    alone = plan_of(tmp_path / "alone", "data=bundled", "training.steps=40")
    src = one.data["sources"]["corpus"]
    assert (src["tokens"], src["records"], src["weight"]) == (alone.data["tokens"], alone.data["documents"], 1.0)
    assert src["epochs"] == pytest.approx(alone.data["epochs"])


def test_the_plan_warns_of_repeats_and_of_a_source_never_reached(tmp_path):
    p = plan_of(tmp_path, "experiment=tiny_mix", "training.steps=300", "data.sources.chats.weight=0.00001")
    assert any(w.startswith("source corpus repeats 6.") and "more than 4" in w for w in p.warnings), p.warnings
    assert any(w.startswith("source chats is never reached") for w in p.warnings), p.warnings


def test_a_capped_source_leaves_its_place_to_the_others(tmp_path):
    cap = ("+data.sources.chats.max_epochs=1", "+data.sources.chats.over_max_epochs=cap")
    p = plan_of(tmp_path, "experiment=tiny_mix", *cap)
    chats, corpus = p.data["sources"]["chats"], p.data["sources"]["corpus"]
    assert chats["capped"] and chats["epochs"] == pytest.approx(1.0) and chats["sequences"] == pytest.approx(288)
    assert corpus["sequences"] == pytest.approx(p.batches.global_batch_size * p.exp.training.steps - 288)


def test_every_source_capped_before_the_last_step_is_refused(tmp_path):
    from qwen3exp.errors import ConfigError

    caps = [
        f"+data.sources.{n}.{k}"
        for n, e in (("chats", 1), ("corpus", 0.1))
        for k in (f"max_epochs={e}", "over_max_epochs=cap")
    ]
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, "experiment=tiny_mix", *caps)
    [p] = e.value.problems
    assert (p.key, p.value, p.allowed) == ("training.steps", 30, "at most 22"), p
    assert "every source reaches its max_epochs (over_max_epochs=cap) after about 22 of the 30 steps" in p.message


def test_the_dry_run_prints_each_source():
    r = run_cli(*MIX)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "data:       a mixture of 2 sources (data=mix)" in out
    assert "  corpus: bundled, bundled corpus" in out and "  chats: chat, bundled chat data" in out
    assert "weight 0.7 (data.sources.corpus.weight=0.7, normalised)" in out
    assert "plain text and conversations in one run: plain text trains every token, a conversation" in out
    assert "--- sample 1: source corpus (bundled): document 1" in out
    # Validation is per source (not "the training documents"): each source's own held-out records.
    assert "validation: 2 batch(es) per source at step(s) 1, 10, 20, 30; each source's 10% held out" in out


def test_data_show_names_each_samples_source():
    r = run_cli("data", "show", "experiment=tiny_mix", "-n", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    headers = [line for line in r.stdout.splitlines() if line.startswith("--- sample ")]
    assert len(headers) == 4 and headers[0].startswith("--- sample 1 of 4: source corpus (bundled): document 1")
    assert any(": source chats (chat): conversation 1" in h for h in headers), headers


def test_weights_are_sweep_and_search_parameters():
    """A grid over one weight plans each point with its normalised share; an Optuna search over the
    raw weights is checked at both ends of every interval before it starts."""
    r = run_cli("-m", *MIX, "data.sources.chats.weight=0.1,0.6")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "weight 0.125 (data.sources.chats.weight=0.1, normalised)" in r.stdout  # 0.1 / (0.7 + 0.1)
    assert "weight 0.462 (data.sources.chats.weight=0.6, normalised)" in r.stdout  # 0.6 / (0.7 + 0.6)
    search = ("hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "data.sources.chats.weight=interval(0.1,1.0)")
    r = run_cli("-m", *MIX, *search)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "checked 2 representative point(s)" in r.stdout and "all pass" in r.stdout, r.stdout[:3000]


def test_help_describes_each_sources_keys():
    r = run_cli(*MIX, "--help")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "  data.sources.corpus.weight (float >= 0) = 0.7\n      The source's share of the trained tokens" in r.stdout
    assert "  data.sources.chats.source (chat) = chat" in r.stdout
