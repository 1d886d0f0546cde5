"""data=chat: supervised fine-tuning on conversations (issue 24, pack=false).

- the trained mask, token by token, on a multi-turn conversation with a system prompt, for every
  data.loss_on (rendered by the bundled tokenizer's Qwen3-format chat template), and the same mask
  in the first batch of the ranks' dataloader (labels = next token where trained, else -100);
- bad conversations and a tokenizer without a chat template exit 2 before any worker, naming the
  key, the file, the line and the record's key;
- a real 2-rank training of experiment=tiny_sft from a transformers checkpoint: its step-1 loss
  equals transformers' loss on the same batch with labels -100 wherever the mask says.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import compose, read_metrics, read_summary, run_cli
from hf_fixtures import masked_loss, write_checkpoint
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.schema import validate_experiment
from qwen3exp.data.chat.render import fit, load_tokenizer, messages_of, records, render
from qwen3exp.data.files import held_out

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "2 plus 3 is 5."},
    {"role": "user", "content": "Say hello to Ada."},
    {"role": "assistant", "content": "Hello, Ada!"},
]


def runs(tok, ids: list[int], trained: list[bool]) -> list[tuple[bool, str]]:
    """The tokens grouped into maximal runs of equal trained flags, each run decoded."""
    out: list[tuple[bool, list[int]]] = []
    for i, t in zip(ids, trained, strict=True):
        if out and out[-1][0] == t:
            out[-1][1].append(i)
        else:
            out.append((t, [i]))
    return [(t, tok.decode(run)) for t, run in out]


@pytest.mark.parametrize("loss_on", ["assistant", "last_assistant", "all"])
def test_trained_tokens_are_exactly_the_assistant_content_and_end_of_turn(loss_on):
    tok = load_tokenizer(TOKENIZER_DIR)
    r = render(tok, CHAT, loss_on)
    text = tok.apply_chat_template(CHAT, tokenize=False)
    assert r.ids == tok(text, add_special_tokens=False)["input_ids"]  # the template's own tokens
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]  # single special tokens
    head1 = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n"
    head2 = "\n<|im_start|>user\nSay hello to Ada.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    if loss_on == "assistant":
        expected = [
            (False, head1 + "<|im_start|>assistant\n"),
            (True, "2 plus 3 is 5.<|im_end|>"),
            (False, head2),  # the empty thinking block Qwen3 gives the last turn: not trained
            (True, "Hello, Ada!<|im_end|>"),
            (False, "\n"),
        ]
    elif loss_on == "last_assistant":
        expected = [
            (False, head1 + "<|im_start|>assistant\n2 plus 3 is 5.<|im_end|>" + head2),
            (True, "Hello, Ada!<|im_end|>"),
            (False, "\n"),
        ]
    else:
        expected = [(True, text)]
    assert runs(tok, r.ids, r.trained) == expected
    # The older assistant turn has no thinking block, as Qwen3's template renders history.
    assert text.count("<think>") == 1


def test_prompt_completion_records_and_the_first_batch_of_the_ranks():
    """The first batch of data-parallel rank 1 (of 2) of experiment=tiny_sft, as its dataloader yields
    it: the rank's conversations (training side of the held-out split, every second one), padded
    with <|endoftext|>, labels = the next token where it is trained, else -100."""
    from qwen3exp.titan.chat_dataset import ChatDataLoader, loader_config  # lazy: imports torchtitan

    assert messages_of('{"prompt": "Hi?", "completion": "Hello."}').messages == [
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "Hello."},
    ]
    exp = validate_experiment(compose("experiment=tiny_sft", "training.seq_len=128", "training.local_batch_size=4"))
    config = loader_config(exp, str(TOKENIZER_DIR), validation=False)
    loader = ChatDataLoader(config, dp_world_size=2, dp_rank=1, seq_len=128, local_batch_size=4)
    inputs, labels = next(iter(loader))
    tok = load_tokenizer(TOKENIZER_DIR)
    lines = [line for _, _, line in records(exp.data.location)]
    held = set(held_out(len(lines), exp.validation.fraction))
    mine = [messages_of(line).messages for i, line in enumerate(lines) if i not in held][1::2]
    fitted = [(m, f) for m, f in ((m, fit(render(tok, m), 128, "drop")) for m in mine) if f is not None][:4]
    for row, (messages, r) in enumerate(fitted):
        n = len(r.ids) - 1
        assert inputs["input"][row].tolist() == r.ids[:-1] + [0] * (128 - n)
        assert inputs["positions"][row].tolist() == list(range(128))
        want = [t if on else -100 for t, on in zip(r.ids[1:], r.trained[1:], strict=True)] + [-100] * (128 - n)
        assert labels[row].tolist() == want
        trained_text = tok.decode([t for t in want if t != -100])
        assert trained_text == "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")


def _bad_file(folder: Path) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]},
        {"conversation": []},
        {"prompt": "ok?", "completion": "ok."},
    ]
    path = folder / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow  # quick tier: a table of commands
def test_bad_conversations_and_a_tokenizer_without_template_exit_2(tmp_path):
    bad = _bad_file(tmp_path)
    r = run_cli("experiment=tiny_sft", "dry_run=true", f"data.path={bad}", f"hydra.run.dir={tmp_path / 'a'}")
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out[-3000:]
    for line in (
        "bad.jsonl line 1: messages[1].role is 'bot', not one of system, user, assistant",
        "bad.jsonl line 2: messages has no assistant turn",
        "bad.jsonl line 3: messages[1].content is an empty assistant turn",
        "bad.jsonl line 4: messages has no 'messages' (nor prompt/completion)",
    ):
        assert line in out, out[-3000:]
    assert "data.messages_field" in out and "data.path" in out and "line 5" not in out
    plain = tmp_path / "plain_tokenizer"
    shutil.copytree(TOKENIZER_DIR, plain)
    cfg = json.loads((plain / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (plain / "tokenizer_config.json").write_text(json.dumps(cfg))
    r = run_cli(
        "experiment=tiny_sft", "dry_run=true", f"model.hf_assets_path={plain}", f"hydra.run.dir={tmp_path / 'b'}"
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out[-3000:]
    assert "data.source" in out and "has no chat template" in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "hf"])
def test_tiny_sft_step1_loss_equals_transformers_on_the_masked_batch(request, tmp_path, backend):
    """2 ranks, each backend, weights from a transformers checkpoint: the step-1 loss (torchtitan's
    sum over the trained labels of both ranks / their count) equals transformers' mean loss on the
    same 8 sequences, rebuilt here from the rendered conversations: rank r reads conversations
    r, r+2, ... (validation off: no held-out split), padded, labels -100 except trained tokens.
    model=native: the shared `sft_run` (conftest.py: the same settings, also used by test_chat.py)."""
    if backend == "native":
        run_dir = request.getfixturevalue("sft_run")
        ckpt = run_dir.parent / "ckpt"
    else:
        ckpt = write_checkpoint(tmp_path / "ckpt", tied=True, seed=3)
        run_dir = tmp_path / "run"
        r = run_cli(
            "experiment=tiny_sft", "model=hf", f"model.hf_assets_path={ckpt}", "checkpoint=hf_load",
            "platform=cpu", "platform.threads_per_rank=1", "training.steps=2", "training.warmup_steps=1",
            "training.local_batch_size=4", "validation.enable=false", "metrics.tensorboard=false",
            f"hydra.run.dir={run_dir}",
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert read_summary(run_dir)["world_size"] == 2
    step1 = read_metrics(run_dir)[0]["loss"]
    tok, seq_len = load_tokenizer(ckpt), 192
    lines = [line for _, _, line in records(TOKENIZER_DIR.parent / "chat")]
    inputs, labels = [], []
    for rank in range(2):
        for line in lines[rank::2][:4]:
            x = render(tok, messages_of(line))
            n = len(x.ids) - 1
            inputs.append(x.ids[:-1] + [tok.pad_token_id] * (seq_len - n))
            labels.append([t if on else -100 for t, on in zip(x.ids[1:], x.trained[1:], strict=True)])
            labels[-1] += [-100] * (seq_len - n)
    ref = masked_loss(ckpt, inputs, labels)["loss"]
    assert abs(step1 - ref) < 1e-4, (step1, ref)
