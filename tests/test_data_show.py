"""`qwen3exp data show` and the dry run's sample: the first training samples, the trained tokens
marked (`[[...]]` in a pipe), through the real command line; nothing trains.

- data=chat (tiny_sft): each sample is the conversation exactly as the tokenizer's chat template
  renders it, and the marks surround exactly each assistant turn's content and its `<|im_end|>`;
  the samples are the first training conversations (the held-out ones skipped); `-n 2` shows two;
- plain text: each document followed by the separator data.eos, every token but the first marked;
- a dry run prints the first sample (data.loss_on=last_assistant: the last answer only marked);
- bad input exits 2 with the launch's message and no traceback, and writes nothing;
- a long sample is cut to its lines, a trained span open at the cut closed.
"""

from __future__ import annotations

import json
import re

from conftest import run_cli
from qwen3exp.assets import ASSETS, TOKENIZER_DIR
from qwen3exp.data.chat.render import load_tokenizer
from qwen3exp.data.files import held_out
from qwen3exp.data.marks import sample_lines
from qwen3exp.data.sample import Sample

HEADER = re.compile(r"^--- sample (\d+)(?: of (\d+))?: (.*?): ([\d,]+) tokens, ([\d,]+) trained", re.M)
SPAN = re.compile(r"\[\[(.*?)\]\]", re.S)
CHATS = [json.loads(line) for line in (ASSETS / "chat" / "train.jsonl").read_text().splitlines() if line.strip()]


def samples(out: str) -> list[dict]:
    """Each sample of the output: its header's fields and its text (up to the next `---` line)."""
    heads = list(HEADER.finditer(out))
    found = []
    for i, m in enumerate(heads):
        start = out.index("\n", m.end()) + 1
        end = heads[i + 1].start() if i + 1 < len(heads) else out.index("\n---", m.end()) + 1
        text = out[start : end - 1]  # less the newline that ends the sample's last line
        found.append(
            {
                "label": m.group(3),
                "tokens": int(m.group(4).replace(",", "")),
                "trained": int(m.group(5).replace(",", "")),
                "text": text,
            }
        )
    return found


def answers(messages: list[dict], last_only: bool = False) -> list[str]:
    contents = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
    return contents[-1:] if last_only else contents


def test_chat_samples_mark_exactly_the_assistant_turns(tmp_path):
    run = tmp_path / "run"
    r = run_cli("data", "show", "experiment=tiny_sft", "-n", "2", f"hydra.run.dir={run}")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "data=chat: the bundled conversations" in out and "data.loss_on=assistant" in out
    assert "[[like this]] = trained" in out and "\x1b[" not in out  # a pipe: brackets, no colour
    found = samples(out)
    assert len(found) == 2, out
    # the first two training conversations: the ones validation (10% of 320) does not hold out
    held = set(held_out(len(CHATS), 0.1))
    lines = [i + 1 for i in range(len(CHATS)) if i not in held][:2]
    assert [s["label"] for s in found] == [f"conversation {n} (train.jsonl line {n})" for n in lines]
    tok = load_tokenizer(TOKENIZER_DIR)
    for s, n in zip(found, lines, strict=True):
        messages = CHATS[n - 1]["messages"]
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert s["text"].replace("[[", "").replace("]]", "") == rendered  # the whole conversation
        assert SPAN.findall(s["text"]) == answers(messages)  # exactly the answers and their <|im_end|>
        assert s["tokens"] == len(tok(rendered, add_special_tokens=False)["input_ids"])
        assert 0 < s["trained"] < s["tokens"]
    total = sum(s["tokens"] for s in found), sum(s["trained"] for s in found)
    assert f"--- 2 sample(s): {total[0]:,} tokens, {total[1]:,} trained" in out
    assert not run.exists()  # nothing written


def test_dry_run_prints_the_first_sample_marked(tmp_path):
    run = tmp_path / "run"
    r = run_cli("experiment=tiny_sft", "dry_run=true", "data.loss_on=last_assistant", f"hydra.run.dir={run}")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    plan, sample = out.split("\nsample:     the first training sample", 1)
    assert "chat data:" in plan and "data.loss_on=last_assistant" in sample
    [s] = samples(sample + "\n---")
    assert s["label"] == "conversation 1 (train.jsonl line 1)"
    assert SPAN.findall(s["text"]) == answers(CHATS[0]["messages"], last_only=True)
    assert len(s["text"].splitlines()) <= 40


def test_plain_text_documents_end_with_the_separator(tmp_path):
    docs = ["Hello world, this is the first document.", "A second one,\nover two lines.", "The third."]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    r = run_cli(
        "data", "show", "data=local", f"data.path={path}", "data.eos='<|im_end|>'", "validation.enable=false",
        "--count=2",
    )  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"data=local: {path}" in r.stdout and "ends with <|im_end|> (data.eos)" in r.stdout
    found = samples(r.stdout)
    assert [s["label"] for s in found] == ["document 1 (docs.jsonl line 1)", "document 2 (docs.jsonl line 2)"]
    for s, doc in zip(found, docs, strict=False):
        first, span = s["text"].rstrip("\n").split("[[", 1)
        assert span.endswith("<|im_end|>]]") and "[[" not in span[:-2] and "]]" not in span[:-2]
        assert first and doc.startswith(first) and first + span[:-2] == doc + "<|im_end|>"
        assert s["trained"] == s["tokens"] - 1  # every token but the document's first is a label
    # the bundled corpus: its documents end with the tokenizer's end-of-text token
    r = run_cli("data", "show")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "data=bundled: the bundled corpus" in r.stdout and "<|endoftext|>]]\n--- 1 sample(s)" in r.stdout


def test_bad_input_exits_2_without_traceback(tmp_path):
    run = tmp_path / "run"
    for args, said in (
        (["experiment=tiny_sft", "data.loss_on=answers"], "data.loss_on = 'answers'"),
        (["experiment=tiny_sft", f"data.path={tmp_path / 'missing.jsonl'}"], "does not exist"),
        (["experiment=tiny_sft", "-n", "0"], "'-n 0': is not a number of samples"),
        (["-m", "training.lr=1e-3,3e-3"], "is not for data show"),
    ):
        r = run_cli("data", "show", *args, f"hydra.run.dir={run}")
        assert r.returncode == 2, (args, r.stdout[-2000:], r.stderr[-2000:])
        assert said in r.stderr and "Traceback" not in r.stderr + r.stdout and r.stdout == "", (args, r.stderr)
    r = run_cli("data")
    assert r.returncode == 2 and "usage: qwen3exp data show" in r.stderr
    assert not run.exists()


def test_a_long_sample_is_cut_and_its_open_mark_closed():
    text = "".join(f"line {i}\n" for i in range(100))
    s = Sample("document 1 (a.txt paragraph 1)", (("line", False), (text[4:], True)), 300, 299)
    lines = sample_lines(s, "1", colour=False, max_lines=40)
    assert lines[0] == "--- sample 1: document 1 (a.txt paragraph 1): 300 tokens, 299 trained (99.7%)"
    body, left = lines[1:-1], lines[-1]
    assert len(body) == 40 and body[0] == "line[[ 0" and body[-1] == "line 39]]"
    assert left == "... (61 more line(s) of this sample not shown)"
    colour = sample_lines(s, "1", colour=True, max_lines=3)
    assert colour[1:4] == ["line\x1b[1;32m 0", "line 1", "line 2\x1b[0m"]
