"""eval.samples: prompts answered at every validation by the model being trained.

One real tiny training per backend (model=native and model=hf; 2 CPU ranks, FSDP over dp_shard=2;
12 steps, validation every 5 steps, 2 prompts, 8 new tokens, sampled with a seed) checked by
several tests: the records in samples.jsonl (validations at steps 1, 5, 10 and the last step 12:
4 x 2 records), the same tokens drawn from the float32 Hugging Face export of step 12 by
transformers' forward pass with the documented sampling rule, TensorBoard's text, the console's
lines. Then, in-process: the generation loop on made-up logits (greedy, seeded, stop ids, full
rows), the console's reader, the plan's cost line and the refusals (exit 2 before any worker).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import read_summary, run_cli
from hf_fixtures import in_fresh_process
from qwen3exp import api
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.errors import ConfigError
from qwen3exp.run import metrics_file, rundir

PROMPTS = ["Return a new list", "hi"]
NEW = 8
TEMPERATURE = 1.5
SEED = 3
STEPS = [1, 5, 10, 12]  # step 1, every validation.freq=5 steps and the last step (qwen3exp.titan.validator)
ARGS = (
    "platform=cpu",
    "platform.threads_per_rank=1",
    "training.steps=12",
    "training.warmup_steps=1",
    "training.seq_len=64",
    "training.local_batch_size=2",
    "validation.freq=5",
    "validation.steps=1",
    f"eval.samples=[{','.join(PROMPTS)}]",
    f"eval.sample_tokens={NEW}",
    f"eval.sample_temperature={TEMPERATURE}",
    f"eval.sample_seed={SEED}",
    "checkpoint=hf_export",
    "checkpoint.dtype=float32",
)


@pytest.fixture(scope="module", params=["native"])
def run(request, tmp_path_factory) -> tuple[Path, str]:
    """(run directory, console output) of the 12-step run of one backend. params=["native", "hf"]
    runs both (each passed when written); the suite keeps model=native for its time budget."""
    path = tmp_path_factory.mktemp(f"samples-{request.param}") / "run"
    experiment = "tiny_native" if request.param == "native" else "tiny_hf"
    r = run_cli(f"experiment={experiment}", *ARGS, f"hydra.run.dir={path}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert read_summary(path)["status"] == "completed"
    return path, r.stdout


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "samples.jsonl").read_text(encoding="utf-8").splitlines()]


def reference_tokens(folder: str, prompts: list[str], new: int, temperature: float, seed: int) -> list[list[int]]:
    """The documented rule, with transformers by itself (in a fresh process): the prompt rendered
    by the chat template, then per new token softmax(logits / temperature) of the export's last
    position, one draw from a CPU generator seeded with `seed` + the prompt's index; stop at an eos id."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    stops = {*(eos if isinstance(eos, list) else [eos]), tok.eos_token_id}
    out = []
    for i, prompt in enumerate(prompts):
        text = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        gen, answer = torch.Generator().manual_seed(seed + i), []
        with torch.no_grad():
            while len(answer) < new and (not answer or answer[-1] not in stops):
                logits = model(torch.tensor([ids + answer])).logits[0, -1].float()
                answer.append(int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)))
        out.append(answer)
    return out


# ------------------------------------------------------------------ the training runs
@pytest.mark.slow
def test_every_validation_writes_one_record_per_prompt(run):
    path, _ = run
    rows = records(path)
    assert [(r["step"], r["prompt"]) for r in rows] == [(s, p) for s in STEPS for p in PROMPTS]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    for r in rows:
        assert 1 <= len(r["tokens"]) <= NEW and all(isinstance(t, int) for t in r["tokens"])
        assert r["text"] == tok.decode(r["tokens"], skip_special_tokens=True)
    assert any(r["text"].strip() for r in rows)  # sampled at temperature 1.5: some text, not only stops


@pytest.mark.slow
def test_the_last_answers_are_what_the_exported_model_gives_by_the_documented_rule(run):
    path, _ = run
    last = [r["tokens"] for r in records(path) if r["step"] == STEPS[-1]]
    folder = str(path / "export" / f"step-{STEPS[-1]}")
    assert last == in_fresh_process("test_samples.reference_tokens", folder, PROMPTS, NEW, TEMPERATURE, SEED)


@pytest.mark.slow
def test_tensorboard_has_each_answer_as_text_at_its_step(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path, _ = run
    (events,) = path.glob("tb/*/events.out.tfevents.*")
    acc = EventAccumulator(str(events.parent), size_guidance={"tensors": 0})
    acc.Reload()
    rows = records(path)
    for i, prompt in enumerate(PROMPTS):
        texts = acc.Tensors(f"samples/{i}/text_summary")
        assert [e.step for e in texts] == STEPS
        for e, r in zip(texts, [r for r in rows if r["prompt"] == prompt], strict=True):
            shown = e.tensor_proto.string_val[0].decode()
            assert f"    {prompt}" in shown and f"answer ({len(r['tokens'])} tokens)" in shown
            assert all(f"    {line}" in shown for line in r["text"].splitlines())


@pytest.mark.slow
def test_the_console_shows_the_first_answers_first_line_after_each_validation(run):
    from qwen3exp.run.sample_lines import first_line

    path, out = run
    lines = out.splitlines()
    first = {r["step"]: r for r in reversed(records(path))}  # the first record of each step
    for step in STEPS:
        i = lines.index(f"qwen3exp: sample at step {step}: {first_line(first[step]['text'])}")
        assert lines[i - 1].startswith(f"qwen3exp: validation at step {step}: loss ")


# ------------------------------------------------------------------ in-process
def _sampler(prompts, **kw):
    from qwen3exp.titan.samples import Sampler

    settings = dict(tokenizer_path=str(TOKENIZER_DIR), seq_len=64, max_new=4, temperature=0.0, seed=0) | kw
    return Sampler(prompts, **settings)


def _next_token_logits(vocab: int, seen: list, rule):
    """Fake logits: the highest for `rule(previous token)`; records what the model was given."""
    import torch

    def last_logits(rows, last):
        seen.append((rows.clone(), last.clone()))
        logits = torch.zeros(len(rows), vocab)
        for i in range(len(rows)):
            logits[i, rule(int(rows[i, last[i]]))] = 10.0
        return logits

    return last_logits


def test_greedy_answers_follow_the_logits_at_each_rows_last_token():
    seen: list = []
    s = _sampler(PROMPTS, max_new=4)
    s.stops = {0}
    answers = s.answer(_next_token_logits(2048, seen, lambda t: 1 + t % 2000), "cpu")
    for ids, answer in zip(s.ids, answers, strict=True):
        expected, t = [], ids[-1]
        for _ in range(4):
            t = 1 + t % 2000
            expected.append(t)
        assert answer == expected
    rows, last = seen[-1]
    assert rows.shape == (2, 64) and last.tolist() == [len(ids) + 2 for ids in s.ids]
    assert rows[0, : len(s.ids[0]) + 3].tolist() == s.ids[0] + answers[0][:3]


def test_an_answer_ends_at_a_stop_id_or_a_full_row():
    s = _sampler(["hi"], max_new=8)
    s.stops = {7}
    assert s.answer(_next_token_logits(2048, [], lambda t: 7), "cpu") == [[7]]  # kept in tokens
    s = _sampler(["hi"], max_new=8, seq_len=len(s.ids[0]) + 1)
    s.stops = set()
    assert s.answer(_next_token_logits(2048, [], lambda t: 5), "cpu") == [[5, 5]]  # the row holds one new token


def test_sampling_is_seeded_per_prompt():
    import torch

    def flat(rows, last):
        return torch.zeros(len(rows), 2048)

    one = _sampler(["hi"], max_new=8, temperature=1.0, seed=1).answer(flat, "cpu")
    both = _sampler(["hi", "Return a new list"], max_new=8, temperature=1.0, seed=1).answer(flat, "cpu")
    second = _sampler(["hi"], max_new=8, temperature=1.0, seed=2).answer(flat, "cpu")
    # the seed + the prompt's index and the logits decide, not what the other prompts draw
    assert both == [one[0], second[0]] and one[0] != second[0]


def test_the_console_reader_says_each_steps_first_answer_once(tmp_path):
    from qwen3exp.run.sample_lines import SampleLines

    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps({"step": 3, "prompt": "a", "text": "old", "tokens": [1]}) + "\n")
    lines = SampleLines(path)
    with path.open("a") as f:
        f.write(json.dumps({"step": 5, "prompt": "a", "text": "\n  first line \nsecond", "tokens": [1]}) + "\n")
        f.write(json.dumps({"step": 5, "prompt": "b", "text": "other", "tokens": [1]}) + "\n")
        f.write(json.dumps({"step": 10, "prompt": "a", "text": "\n\n", "tokens": [1]}) + '\n{"step": 1')
    assert lines.poll() == [
        (5, "qwen3exp: sample at step 5: first line"),
        (10, "qwen3exp: sample at step 10: '\\n\\n'"),
    ]
    assert lines.poll() == []


@pytest.mark.parametrize("ticks", [{0, 1, 2, 3}, {3}, {1, 3}, {0, 2, 3}], ids=["each", "end", "race", "late"])
def test_the_sample_line_follows_its_validation_however_the_polls_fall(tmp_path, ticks, monkeypatch):
    """The metrics rank writes: the validation row, the answers, the next step's row. Polled between
    any of those writes (or once after all), the console says them in that order."""
    from qwen3exp.run.progress import Watch

    metrics, samples = tmp_path / "metrics.jsonl", tmp_path / "samples.jsonl"
    writes = [
        (metrics, {"step": 5, "loss": 7.0, "step_seconds": 0.1}),
        (metrics, {"step": 5, "val_loss": 6.9}),
        (samples, {"step": 5, "prompt": "a", "text": "hello", "tokens": [1]}),
        (metrics, {"step": 6, "loss": 6.8, "step_seconds": 0.1}),
    ]
    said: list[str] = []
    monkeypatch.setattr(Watch, "say", lambda self, text, live: said.append(text))
    watch = Watch(metrics, 10, verbose=False, node_rank=0, stopping=lambda: False)
    for i, (path, row) in enumerate(writes):
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if i in ticks:  # "race": the validation seen, then its answers and the next step in one poll
            watch.tick()
    watch.finish()
    kinds = [text.split(":")[1].split()[0] for text in said]
    assert kinds == ["step", "validation", "sample", "step"], said


def test_the_last_sample_line_comes_before_training_completed(tmp_path, monkeypatch):
    """Rank 0 writes the last validation and its answers, then logs "Training completed": the
    console says the sample line first, however long since the last poll."""
    from qwen3exp.run.progress import Watch

    metrics, samples = tmp_path / "metrics.jsonl", tmp_path / "samples.jsonl"
    said: list[str] = []
    monkeypatch.setattr(Watch, "say", lambda self, text, live: said.append(text))
    watch = Watch(metrics, 12, verbose=False, node_rank=0, stopping=lambda: False)
    metrics.write_text(json.dumps({"step": 12, "val_loss": 6.9}) + "\n")
    samples.write_text(json.dumps({"step": 12, "prompt": "a", "text": "bye", "tokens": [1]}) + "\n")
    watch.line("[titan] 2026-12-03 08:00:00,000 - root - INFO - Training completed\n")
    watch.finish()
    assert [text.split(":")[1].split()[0] for text in said] == ["validation", "sample", "training"], said


def test_the_plan_shows_the_bounded_cost():
    from qwen3exp.plan.render import render

    exp = api.compose(["platform=cpu", *ARGS[2:12]])
    text = render(api.plan(exp))
    assert "validation: 1 batch(es) at step(s) 1, 5, 10, 12" in text
    assert (
        "samples:    2 prompt(s) x at most 8 new tokens = 16 per validation, x 4 validation(s) = at most 64 new "
        "tokens (sampled at temperature 1.5, seed 3); per validation at most 8 forward passes over 2 x 64 tokens"
    ) in text
    assert "samples:" not in render(api.plan(api.compose(["platform=cpu"])))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["validation.enable=false"], "are answered at every validation, and validation.enable is false"),
        (["training.seq_len=16"], "prompt 1 of 1 is 27 tokens once rendered with the tokenizer's chat template"),
        (["parallelism.cp=2"], "parallelism.cp=2 splits each sequence"),
        (["model.flavor=tiny_moe", "parallelism.pp=2"], "parallelism.pp=2 splits the model into pipeline stages"),
    ],
)
def test_samples_that_cannot_be_answered_are_refused_before_launch(overrides, message):
    exp = api.compose(["platform=cpu", "eval.samples=[hi]", *overrides])
    with pytest.raises(ConfigError) as e:
        api.plan(exp)
    (ours,) = [p for p in e.value.problems if p.key == "eval.samples"]  # (cp=2 on CPU has its own problem too)
    assert message in ours.message


def test_a_resumed_run_keeps_the_answers_up_to_its_checkpoint(tmp_path):
    """Before the ranks start, node 0 cuts samples.jsonl at the step resumed from (the validations
    after it run again) and a fresh run starts without one."""
    path = tmp_path / rundir.SAMPLES
    path.write_text(
        "".join(json.dumps({"step": s, "prompt": "p", "text": "t", "tokens": [1]}) + "\n" for s in (1, 5, 10))
    )
    metrics_file.truncate_samples(tmp_path, 5)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 5]
    metrics_file.truncate_samples(tmp_path, None)
    assert not path.exists()
