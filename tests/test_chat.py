"""`qwen3exp chat RUN`: the answers of a real tiny SFT run's Hugging Face export equal transformers'
own `model.generate` on that export with the same chat template (greedy, and sampled with a seed),
`--compare` prints both runs' answers, the interactive loop keeps going until `/exit`, and runs
chat cannot use exit 2 with one line."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from hf_fixtures import in_fresh_process
from qwen3exp import cli

PROMPT = "hi"
NEW = 8
SEED = 7
FOLLOW_UP = "and then?"


@pytest.fixture(scope="module")
def run(sft_run) -> Path:
    """conftest.py's shared tiny SFT run: a float32 Hugging Face export of its step 3 and a signed
    DCP checkpoint of it."""
    return sft_run


def dcp_only(run: Path, to: Path) -> Path:
    """A copy of `run` without its export: experiment.yaml and the DCP checkpoint."""
    to.mkdir()
    shutil.copyfile(run / "experiment.yaml", to / "experiment.yaml")
    shutil.copytree(run / "checkpoint", to / "checkpoint")
    return to


def reference_answers(folder: str, prompt: str, new: int, seed: int) -> dict:
    """transformers by itself (run in a fresh process): the export loaded with AutoModelForCausalLM
    and AutoTokenizer, the prompt rendered by the chat template, `model.generate` greedy and sampled
    (temperature 1 after torch.manual_seed(seed), and after seed + 1), the new tokens decoded; and
    the greedy answer to FOLLOW_UP after that conversation (`follow-up`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    text = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    out: dict = {}
    for name, kw in (("greedy", {"do_sample": False}), ("sampled", {"do_sample": True, "temperature": 1.0})):
        for s in (seed, seed + 1):
            torch.manual_seed(s)
            new_ids = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, **kw)
            new_ids = new_ids[0, ids.shape[1] :].tolist()
            out[f"{name}-{s}"] = {"ids": new_ids, "text": tok.decode(new_ids, skip_special_tokens=True)}
    history = [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": out[f"greedy-{seed}"]["text"]},
        {"role": "user", "content": FOLLOW_UP},
    ]
    text = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    new_ids = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
    out["follow-up"] = tok.decode(new_ids[0, ids.shape[1] :].tolist(), skip_special_tokens=True)
    return out


@pytest.fixture(scope="module")
def reference(run) -> dict:
    return in_fresh_process("test_chat.reference_answers", str(run / "export" / "step-3"), PROMPT, NEW, SEED)


def chat(*args: str):
    """`qwen3exp chat ARGS` in a subprocess, the way a user runs it."""
    return run_cli("chat", *args)


def chat_here(capsys, monkeypatch, *args: str, stdin: str = "") -> tuple[int, str, str]:
    """`qwen3exp chat ARGS` in this process (the same `cli.main`, without a new interpreter's torch
    and transformers imports), reading `stdin`: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    capsys.readouterr()
    code = cli.main(["chat", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_prompt_answer_equals_transformers_generate(run, reference):
    greedy = reference[f"greedy-{SEED}"]
    assert len(greedy["ids"]) == NEW and greedy["text"].strip()
    r = chat(str(run), "--prompt", PROMPT, "--max-new-tokens", str(NEW))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == greedy["text"] + "\n"


@pytest.mark.slow
def test_a_run_with_only_a_dcp_checkpoint_answers_like_its_export(run, reference, tmp_path, capsys, monkeypatch):
    """model=native without an export: the signed DCP checkpoint, converted in-process, gives
    transformers' answer on the export of the same step (the same float32 weights)."""
    dcp = str(dcp_only(run, tmp_path / "dcp"))
    code, out, err = chat_here(capsys, monkeypatch, dcp, "--prompt", PROMPT, "--max-new-tokens", str(NEW))
    assert code == 0, err[-3000:]
    assert out == reference[f"greedy-{SEED}"]["text"] + "\n"
    assert "Warning" not in err, err[-3000:]


@pytest.mark.slow
def test_sampling_is_seeded_and_compare_prints_both_runs(run, reference, tmp_path, capsys, monkeypatch):
    """Sampled with a seed: both runs' answers equal transformers' after torch.manual_seed(seed),
    which differs from the next seed's (so the seed is what makes it reproducible)."""
    sampled, other = reference[f"sampled-{SEED}"], reference[f"sampled-{SEED + 1}"]
    assert sampled["ids"] != other["ids"]
    twin = tmp_path / "twin"
    shutil.copytree(run, twin, ignore=shutil.ignore_patterns("checkpoint", "logs"))
    args = ["--prompt", PROMPT, "--max-new-tokens", str(NEW), "--temperature", "1", "--seed", str(SEED)]
    code, out, err = chat_here(capsys, monkeypatch, str(run), *args, "--compare", str(twin))
    assert code == 0, err[-3000:]
    assert out == (
        f"=== {run} ({run / 'export' / 'step-3'}) ===\n{sampled['text']}\n"
        f"=== {twin} ({twin / 'export' / 'step-3'}) ===\n{sampled['text']}\n"
    )


@pytest.mark.slow
def test_interactive_loop_keeps_the_conversation_until_exit(run, reference, capsys, monkeypatch):
    """Each line is a user message answered with the conversation so far (the second answer is
    transformers' to the whole history); a blank line is skipped, nothing after /exit is read."""
    stdin = f"{PROMPT}\n\n{FOLLOW_UP}\n/exit\nnever read\n"
    code, out, err = chat_here(capsys, monkeypatch, str(run), "--max-new-tokens", str(NEW), stdin=stdin)
    assert code == 0, err[-3000:]
    assert out == f"{reference[f'greedy-{SEED}']['text']}\n{reference['follow-up']}\n"


def test_an_answer_that_ends_at_once_is_said_not_printed_as_an_empty_line(tmp_path, capsys, monkeypatch):
    """The model's first new token ends its turn: the bundled tokenizer decodes it (special tokens
    skipped) to "", which `--prompt` and the loop printed as a bare empty line."""
    from transformers import AutoTokenizer

    from qwen3exp.analysis import chat as chat_module
    from qwen3exp.assets import TOKENIZER_DIR

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    monkeypatch.setattr(chat_module, "_check_run", lambda run: None)
    monkeypatch.setattr(chat_module, "find_weights", lambda run: chat_module.Weights(tmp_path))
    monkeypatch.setattr(chat_module, "load", lambda weights, convert=None: (None, tok))
    monkeypatch.setattr(chat_module, "generate", lambda model, tok, ids, **decoding: [tok.eos_token_id])
    said = "(the model ended its turn without text)\n"
    assert chat_here(capsys, monkeypatch, str(tmp_path), "--prompt", PROMPT) == (0, said, "")
    assert chat_here(capsys, monkeypatch, str(tmp_path), stdin=f"{PROMPT}\n{FOLLOW_UP}\n") == (0, said * 2, "")


def refused(capsys, *args: str) -> str:
    """The one line `qwen3exp chat ARGS` (in this process: refused before torch is imported) exits
    2 with."""
    code = cli.main(["chat", *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (args, code, out, err)
    return err


def test_paths_that_are_no_runs_and_bad_numbers_exit_2(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    run = str(tmp_path / "run")
    assert "not a qwen3exp run directory (no experiment.yaml)" in refused(capsys, run, "--prompt", "x")
    assert "missing: not a directory" in refused(capsys, str(tmp_path / "missing"), "--prompt", "x")
    assert "--max-new-tokens 0: must be a positive integer" in refused(capsys, run, "--max-new-tokens", "0")
    assert "--temperature -1.0: must be a finite number >= 0" in refused(capsys, run, "--temperature", "-1")
    assert "--temperature nan: must be a finite number >= 0" in refused(capsys, run, "--temperature", "nan")
    assert "--compare needs --prompt" in refused(capsys, run, "--compare", run)


@pytest.mark.slow
def test_runs_without_loadable_weights_exit_2(run, tmp_path, capsys):
    """No export and no checkpoint; DCP checkpoints without signatures, with a changed file, of a
    model=hf run: refused before anything is read."""
    no_export = tmp_path / "no_export"
    no_export.mkdir()
    shutil.copyfile(run / "experiment.yaml", no_export / "experiment.yaml")
    unsigned = dcp_only(run, tmp_path / "unsigned")
    for sig in (unsigned / "checkpoint" / "step-3").glob(".qwen3exp-signed-*.json"):
        sig.unlink()
    tampered = dcp_only(run, tmp_path / "tampered")
    with open(tampered / "checkpoint" / "step-3" / "__0_0.distcp", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    hf_backend = dcp_only(run, tmp_path / "hf_backend")
    exp = yaml.safe_load((hf_backend / "experiment.yaml").read_text())
    exp["model"]["backend"] = "hf"
    (hf_backend / "experiment.yaml").write_text(yaml.safe_dump(exp))
    cases = [
        (no_export, "no Hugging Face export and no weights; rerun with checkpoint.export=end"),
        (unsigned, "no Hugging Face export and unsigned DCP checkpoints; rerun with checkpoint.export=end"),
        (tampered, "step-3/__0_0.distcp changed since qwen3exp wrote it; never loaded"),
        (hf_backend, "model=native without peft only (model.backend=hf, peft.kind=none)"),
    ]
    for path, why in cases:
        assert why in refused(capsys, str(path), "--prompt", "x"), path


@pytest.mark.slow
def test_a_tokenizer_without_a_chat_template_exits_2(run, tmp_path, capsys, monkeypatch):
    no_template = tmp_path / "no_template"
    shutil.copytree(run, no_template, ignore=shutil.ignore_patterns("checkpoint", "logs"))
    config = no_template / "export" / "step-3" / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data.pop("chat_template")
    config.write_text(json.dumps(data))
    code, out, err = chat_here(capsys, monkeypatch, str(no_template), "--prompt", "x")
    assert code == 2 and out == "", (out, err[-2000:])
    assert err.startswith("qwen3exp chat: ") and len(err.strip().splitlines()) == 1, err[-2000:]
    assert "the tokenizer has no chat template" in err
