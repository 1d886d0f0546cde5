"""objective=dpo|orpo|simpo on data=preference (issue 40, first slice).

- the counted tokens of a pair, one by one: exactly the final answer's content and `<|im_end|>`
  (never the system or earlier turns, the role header or Qwen3's empty thinking block), the same in
  the explicit and the implicit-prompt format, and the same rows in the ranks' first batch;
- bad pairs and objective/data mismatches exit 2 before any worker, naming the record and its key;
- must show: the step-1 loss and reward_margin of each objective equal the formula on transformers'
  log-probs of the same weights (a fixed pair with a system message and a multi-turn prompt; 1 rank
  for DPO with LoRA, ORPO and SimPO, 2 ranks with FSDP for DPO's full fine-tune); DPO's step 1 is
  exactly ln 2 (its reference is the starting policy) and its step 2, after one update, the formula
  on transformers' log-probs of the step-1 export against the start: with a full fine-tune (a
  frozen copy, sharded) and with LoRA (the base with the adapters off);
- experiment=tiny_dpo as shipped learns: ln 2 at step 1, then the loss falls.
"""

from __future__ import annotations

import json
import math

import pytest

from conftest import compose, read_metrics, read_summary, read_validation, run_cli
from hf_fixtures import in_fresh_process, write_checkpoint
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.schema import validate_experiment
from qwen3exp.data.chat.records import BadRecord
from qwen3exp.data.chat.render import load_tokenizer
from qwen3exp.data.preference.pairs import pair_of, render_pair

PROMPT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "2 plus 3 is 5."},
    {"role": "user", "content": "Say hello to Ada."},
]
PAIRS = [
    {"prompt": PROMPT, "chosen": "Hello, Ada!", "rejected": [{"role": "assistant", "content": "The pig is green."}]},
    {"prompt": "Repeat after me: blue owl", "chosen": "blue owl", "rejected": "7 plus 4 is 11."},
]
SEQ_LEN = 96


def counted(tok, r) -> str:
    return tok.decode([t for t, on in zip(r.ids, r.trained, strict=True) if on])


def test_counted_tokens_are_exactly_the_final_answer_and_end_of_turn():
    tok = load_tokenizer(TOKENIZER_DIR)
    c, r = render_pair(tok, pair_of(json.dumps(PAIRS[0])))
    assert counted(tok, c) == "Hello, Ada!<|im_end|>" and counted(tok, r) == "The pig is green.<|im_end|>"
    text = tok.apply_chat_template([*PROMPT, {"role": "assistant", "content": "Hello, Ada!"}], tokenize=False)
    assert c.ids == tok(text, add_special_tokens=False)["input_ids"]  # the template's own tokens
    head = text[: text.index("Hello, Ada!")]
    assert head.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # header and empty think: not counted
    assert tok.decode([t for t, on in zip(c.ids, c.trained, strict=True) if not on]) == head + "\n"
    implicit = {"chosen": [*PROMPT, {"role": "assistant", "content": "Hello, Ada!"}]}
    implicit["rejected"] = [*PROMPT, {"role": "assistant", "content": "The pig is green."}]
    assert render_pair(tok, pair_of(json.dumps(implicit))) == (c, r)


@pytest.mark.parametrize(
    "record, key, message",
    [
        ({"prompt": "hi", "chosen": "a"}, "rejected", "is missing"),
        ({"prompt": "hi", "chosen": "a", "rejected": "a"}, "rejected", "is identical to chosen"),
        ({"prompt": "hi", "chosen": " ", "rejected": "a"}, "chosen", "is an empty answer"),
        ({"prompt": "hi", "chosen": "a", "rejected": "b", "score": 1}, "score", "is not a field"),
        (
            {
                "chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                "rejected": [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}],
            },
            "chosen",
            "shares no prompt with rejected",
        ),
        ({"prompt": [{"role": "bot", "content": "x"}], "chosen": "a", "rejected": "b"}, "prompt[0].role", "'bot'"),
    ],
)
def test_bad_pairs_are_named(record, key, message):
    with pytest.raises(BadRecord) as e:
        pair_of(json.dumps(record))
    assert e.value.key == key and message in e.value.message, (e.value.key, e.value.message)


def test_objective_and_data_must_agree_and_bad_records_are_named_before_launch(tmp_path):
    """In process, the launcher's own checks (`qwen3exp.plan.build`): exit-2 problems, no worker."""
    from qwen3exp.errors import ConfigError
    from qwen3exp.plan.build import make_plan

    bad = tmp_path / "pairs.jsonl"
    bad.write_text(
        json.dumps(PAIRS[0]) + "\n" + json.dumps({"prompt": "x", "chosen": "same", "rejected": "same"}) + "\n"
    )
    cases = [
        (["objective=dpo"], "objective", "data=bundled has none"),
        (["data=preference", "validation.enable=false"], "data.source", "objective=sft does not train on"),
        (["experiment=tiny_dpo", f"data.path={bad}"], "data.path", "pairs.jsonl line 2: rejected is identical"),
        (["experiment=tiny_dpo", "training.local_batch_size=3"], "training.local_batch_size", "must be even"),
        (["sweep.objective=val_reward_accuracy"], "sweep.objective", "needs a preference objective and validation"),
    ]
    for overrides, key, message in cases:
        exp = validate_experiment(compose(*overrides, "dry_run=true"))
        with pytest.raises(ConfigError) as e:
            make_plan(exp, tmp_path / "run")
        found = [p for p in e.value.problems if p.key == key and message in p.message]
        assert found, (overrides, [(p.key, p.message) for p in e.value.problems])


def test_the_ranks_first_batch_holds_each_pair_side_by_side():
    from qwen3exp.titan.preference_dataset import PreferenceDataLoader, loader_config  # lazy: imports torchtitan

    exp = validate_experiment(compose("experiment=tiny_dpo", "validation.enable=false"))  # no held-out split
    config = loader_config(exp, str(TOKENIZER_DIR))
    loader = PreferenceDataLoader(config, dp_world_size=2, dp_rank=1, seq_len=192, local_batch_size=4)
    inputs, labels = next(iter(loader))
    tok = load_tokenizer(TOKENIZER_DIR)
    lines = (TOKENIZER_DIR.parent / "preference" / "train.jsonl").read_text().splitlines()
    for k, line in enumerate(lines[1::2][:2]):  # rank 1 of 2: pairs 1, 3, ...
        for side, r in enumerate(render_pair(tok, pair_of(line))):
            row = 2 * k + side
            n = len(r.ids) - 1
            assert inputs["input"][row].tolist()[:n] == r.ids[:-1]
            want = [t if on else -100 for t, on in zip(r.ids[1:], r.trained[1:], strict=True)]
            assert labels[row].tolist() == want + [-100] * (192 - n)


def pair_logps_here(folders: list[str], rows: list[list[int]], masks: list[list[bool]]) -> list[list[list[float]]]:
    """transformers' summed log-probs and counts of each row's counted tokens, per model folder
    (run in a fresh process: `hf_fixtures.in_fresh_process`)."""
    import torch
    from transformers import AutoModelForCausalLM

    load = AutoModelForCausalLM.from_pretrained
    return [logps_of(load(folder, dtype=torch.float32).eval(), rows, masks) for folder in folders]


def logps_of(model, rows: list[list[int]], masks: list[list[bool]]) -> list[list[float]]:
    """(summed log-prob of each row's counted tokens, their count) under a transformers model."""
    import torch

    out = []
    for ids, mask in zip(rows, masks, strict=True):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0].float()
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        on = torch.tensor(mask[1:])
        out.append([float((logp * on).sum()), float(on.sum())])
    return out


def formula(kind: str, policy, reference=None) -> tuple[float, float]:
    """(loss, reward_margin) of one pair by the issue's formulas (TRL's), from (sum, count) rows."""
    (lc, nc), (lr, nr) = policy
    ls = lambda x: -math.log1p(math.exp(-x))  # noqa: E731  # logsigmoid
    if kind == "dpo":
        (rc, _), (rr, _) = reference
        c, r = 0.1 * (lc - rc), 0.1 * (lr - rr)
        return -ls(c - r), c - r
    mc, mr = lc / nc, lr / nr
    if kind == "orpo":
        odds = (mc - mr) - (math.log1p(-math.exp(mc)) - math.log1p(-math.exp(mr)))
        return -mc - 0.1 * ls(odds), 0.1 * (mc - mr)
    return -ls(2.0 * (mc - mr) - 0.5), 2.0 * (mc - mr)


def mean_formula(kind: str, pairs: list[int], policy, reference) -> tuple[float, float]:
    """(loss, reward_margin) of a step: the means over its pairs (rows 2k and 2k + 1 of pair k)."""
    each = [formula(kind, policy[2 * k : 2 * k + 2], reference[2 * k : 2 * k + 2]) for k in pairs]
    return sum(e[0] for e in each) / len(each), sum(e[1] for e in each) / len(each)


@pytest.mark.slow  # trains: 4 runs of 2 steps of a tiny model (one on 2 ranks), transformers in a fresh process
def test_step_losses_equal_the_formulas_on_transformers_logps(tmp_path):
    """1 rank: step 1 reads pair 0, step 2 pair 1; 2 ranks (DPO, full fine-tune, FSDP): each step
    reads pair 0 on rank 0 and pair 1 on rank 1, and the step's loss is the mean over both."""
    ckpt = write_checkpoint(tmp_path / "ckpt", tied=True, seed=5)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    export = ["checkpoint.export=interval", "checkpoint.export_interval=1", "checkpoint.dtype=float32"]
    variants = {"dpo_2ranks": ["objective=dpo", "peft=none", "launcher.nproc_per_node=2", *export]}
    variants["dpo_lora"] = ["objective=dpo", "launcher.nproc_per_node=1", *export, "checkpoint.merge_lora=true"]
    for kind in ("orpo", "simpo"):
        variants[kind] = [f"objective={kind}", "peft=none", "launcher.nproc_per_node=1"]
    runs = {}
    for name, overrides in variants.items():
        runs[name] = tmp_path / name
        r = run_cli(
            "experiment=tiny_dpo", *overrides, "model.flavor=auto", f"model.hf_assets_path={ckpt}",
            "checkpoint.load=hf", f"data.path={data}", "platform=cpu", "platform.threads_per_rank=1",
            "training.steps=2", f"training.seq_len={SEQ_LEN}", "training.local_batch_size=2",
            "training.warmup_steps=1", "training.lr=0.05", "validation.enable=false", "metrics.tensorboard=false",
            f"hydra.run.dir={runs[name]}",
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    tok = load_tokenizer(ckpt)
    sides = [render_pair(tok, pair_of(json.dumps(p))) for p in PAIRS]
    rows = [s.ids for pair in sides for s in pair]
    masks = [s.trained for pair in sides for s in pair]
    step1 = [runs["dpo_2ranks"] / "export/step-1", runs["dpo_lora"] / "export/step-1/merged"]
    start, full, lora = in_fresh_process("test_preference.pair_logps_here", [str(ckpt), *map(str, step1)], rows, masks)
    diffs = {}
    for name in variants:
        m1, m2 = read_metrics(runs[name])[:2]
        kind, pairs = name.split("_")[0], {1: [0], 2: [1]} if name != "dpo_2ranks" else {1: [0, 1], 2: [0, 1]}
        loss, margin = mean_formula(kind, pairs[1], start, start)
        diffs[f"{name} step 1"] = max(abs(m1["loss"] - loss), abs(m1["reward_margin"] - margin))
        if kind == "dpo":
            assert abs(m1["loss"] - math.log(2)) < 1e-6 and m1["reward_margin"] == 0.0, m1
            loss, margin = mean_formula("dpo", pairs[2], full if name == "dpo_2ranks" else lora, start)
            assert abs(loss - math.log(2)) > 1e-3  # the policy moved: a real check of the reference
            diffs[f"{name} step 2"] = max(abs(m2["loss"] - loss), abs(m2["reward_margin"] - margin))
    print("max abs diff to the formula on transformers' log-probs:", diffs)
    assert max(diffs.values()) < 1e-4, diffs


@pytest.mark.slow  # trains: experiment=tiny_dpo as shipped (2 ranks, FSDP, LoRA, 30 steps of the tiny model)
def test_tiny_dpo_learns_to_prefer_the_real_answers(tmp_path):
    # sweep.objective changes nothing the run computes: what it would return to a sweeper
    overrides = ["sweep.objective=val_reward_accuracy", "platform=cpu", "metrics.tensorboard=false"]
    r = run_cli("experiment=tiny_dpo", *overrides, f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "step 30/30 (100%)  loss " in r.stdout and "  reward acc " in r.stdout, r.stdout[-2000:]  # the console
    rows = read_metrics(tmp_path)
    assert len(rows) == 30 and set(rows[0]) >= {"loss", "reward_margin", "reward_accuracy", "logps_chosen"}
    assert abs(rows[0]["loss"] - math.log(2)) < 1e-6  # the reference is the base: adapters off
    first, last = (sum(r["loss"] for r in part) / len(part) for part in (rows[:5], rows[-5:]))
    accuracy = sum(r["reward_accuracy"] for r in rows[-5:]) / 5
    print(f"tiny_dpo: mean loss of steps 1-5 {first:.4f}, of steps 26-30 {last:.4f}; reward accuracy {accuracy:.2f}")
    assert last < first - 0.05 and accuracy > 0.6, (first, last, accuracy)
    val = read_validation(tmp_path)  # the held-out pairs: loss and reward accuracy at steps 1, 15, 30
    print("tiny_dpo validation:", [(v["step"], round(v["val_loss"], 4), v["val_reward_accuracy"]) for v in val])
    assert [v["step"] for v in val] == [1, 15, 30]
    assert val[-1]["val_loss"] < val[0]["val_loss"] and val[-1]["val_reward_accuracy"] > val[0]["val_reward_accuracy"]
    summary = read_summary(tmp_path)
    want = {"metric": "val_reward_accuracy", "direction": "maximize", "value": val[-1]["val_reward_accuracy"]}
    assert summary["objective"] == want and summary["val_reward_accuracy"] == want["value"], summary


def test_data_show_marks_each_side_of_a_pair():
    from qwen3exp.data.sample import first_samples

    s = first_samples(validate_experiment(compose("experiment=tiny_dpo")), TOKENIZER_DIR, 1)
    assert [x.label for x in s.samples] == [
        "pair 1, chosen (train.jsonl line 1)",
        "pair 1, rejected (train.jsonl line 1)",
    ]
    assert [[text for text, on in x.pieces if on] for x in s.samples] == [
        ["The pig is green.<|im_end|>"],
        ["yellow cat<|im_end|>"],
    ]


def test_gamma_is_simpo_only():  # objective.reference: tests/test_preference_reference.py
    from qwen3exp.errors import ConfigError

    assert validate_experiment(compose("objective=simpo", "objective.gamma=1")).objective.gamma == 1.0
    for overrides, key in [
        (["objective=dpo", "objective.gamma=1"], "objective.gamma"),  # the command line (Hydra's struct mode)
    ]:
        with pytest.raises(ConfigError) as e:
            validate_experiment(compose(*overrides))
        assert [p.key for p in e.value.problems] == [key], e.value.problems
    with pytest.raises(ConfigError) as e:  # an experiment file or the Python API: pydantic's extra=forbid
        validate_experiment({**compose("objective=dpo"), "objective": {"kind": "dpo", "gamma": 1.0}})
    assert [p.key for p in e.value.problems] == ["objective.gamma"], e.value.problems
