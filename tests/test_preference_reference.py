"""DPO's reference (issue 40): a separate model (objective.reference) and precomputed log-probs
(objective.reference_logps=precomputed), on model=native (and live on model=hf).

- a reference that is not there, or whose tokenizer or vocabulary is not the policy's, exits 2 before
  any worker, naming objective.reference (the plan's own checks, and the command line once);
- the plan says in one line which reference is used and, precomputed, the first pass's time;
- must show: with a separate reference (another architecture: 3 layers, untied, another seed; the
  policy's tokenizer), the step-1 loss and reward_margin of the fixed pair (a system message and a
  multi-turn prompt) equal the DPO formula on transformers' log-probs of the policy and of the
  reference, on both backends (model=hf: the native reference beside the Transformers policy);
  precomputed reference log-probs give the same step and validation losses as the live reference,
  the stored file exists and no reference model is built for training; the starting
  weights of a full fine-tune as a precomputed reference, on 2 ranks (FSDP), give step 1 = ln 2, and
  a run that fails at step 3 resumes from its dcp checkpoint reading the stored log-probs (the
  resumed losses equal the uninterrupted run's bit for bit: checked by hand, not repeated here).
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch  # noqa: F401  # hf_fixtures.write_checkpoint imports it anyway; loaded once per module

from conftest import compose, read_metrics, read_validation, run_cli
from hf_fixtures import hub_cache, in_fresh_process, write_checkpoint
from qwen3exp.config.schema import validate_experiment
from qwen3exp.data.chat.render import load_tokenizer
from qwen3exp.data.preference.pairs import pair_of, render_pair
from test_preference import PAIRS, SEQ_LEN, mean_formula

KEY = "objective.reference"
HELD_OUT = [  # validation.fraction=0.5 of 4 pairs holds out pairs 2 and 3: training reads PAIRS
    {"prompt": "Name a colour.", "chosen": "Blue.", "rejected": "Seven."},
    {"prompt": [{"role": "user", "content": "Count to two."}], "chosen": "One, two.", "rejected": "Green owl."},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(policy, reference, a reference with another tokenizer, one with another vocab_size)."""
    root = tmp_path_factory.mktemp("dref")
    policy = write_checkpoint(root / "policy", tied=True, seed=5)
    ref = write_checkpoint(root / "ref", tied=False, seed=11, num_hidden_layers=3, intermediate_size=128)
    other = write_checkpoint(root / "other_tokenizer", tied=True, seed=11, tokenizer=False)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(policy / name, other / name)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # the same size, two ids swapped
    (other / "tokenizer.json").write_text(json.dumps(tok))
    wider = write_checkpoint(root / "wider_vocab", tied=True, seed=11, vocab_size=4096)
    return policy, ref, other, wider


def plan_problems(tmp_path, *overrides: str):
    from qwen3exp.errors import ConfigError
    from qwen3exp.plan.build import make_plan

    exp = validate_experiment(compose("experiment=tiny_dpo", "peft=none", *overrides, "dry_run=true"))
    try:
        return make_plan(exp, tmp_path / "run"), []
    except ConfigError as e:
        return None, [(p.key, p.value, p.message, p.allowed, p.hint) for p in e.problems]


def test_a_reference_that_is_missing_or_not_the_policys_is_refused_before_launch(tmp_path, models, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub"))  # holds no Hub id
    policy, _, other, wider = models
    base = ["model.flavor=auto", f"model.hf_assets_path={policy}", "checkpoint.load=hf"]
    cases = [
        (tmp_path / "nowhere", "folder does not exist", "Hugging Face Hub id"),
        (
            "someorg/not-cached-model",
            "holds no Hub id someorg/not-cached-model",
            "hf download someorg/not-cached-model",
        ),
        (
            other,
            "its tokenizer differs from the policy's (2048 against 2048 tokens; 2 token(s) with another id",
            "tokenizer",
        ),
        (wider, "has vocab_size 4096, the policy 2048", "the policy's tokenizer"),
    ]
    for value, message, allowed_or_hint in cases:
        _, found = plan_problems(tmp_path, *base, f"objective.reference={value}")
        mine = [p for p in found if p[0] == KEY]
        assert len(mine) == 1 and mine[0][1] == str(value) and message in mine[0][2], (value, found)
        assert allowed_or_hint in f"{mine[0][3]} {mine[0][4]}", mine
    # The command line: exit 2, no traceback, the key and the value named.
    r = run_cli(
        "experiment=tiny_dpo", *base, f"objective.reference={other}", "dry_run=true", f"hydra.run.dir={tmp_path}/cli"
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"{KEY} = '{other}'" in r.stderr + r.stdout, r.stderr[-2000:]


def test_the_plan_names_the_reference_and_the_precompute_pass(tmp_path, models, monkeypatch):
    from huggingface_hub import constants

    policy, ref, _, _ = models
    base = ["model.flavor=auto", f"model.hf_assets_path={policy}", "checkpoint.load=hf"]
    plan, found = plan_problems(tmp_path, *base, f"objective.reference={ref}", "objective.reference_logps=precomputed")
    assert not found, found
    from qwen3exp.plan.render import render as render_plan

    text = render_plan(plan)
    assert f"reference = the separate model {ref} (frozen, sharded like the policy), its log-probs precomputed" in text
    line = next(x for x in text.splitlines() if x.startswith("precompute:"))  # 2 ranks of 8 sequences
    assert "320 pairs x 2 sides, 40 forward batch(es) per rank before step 1: ~" in line, line
    plan, found = plan_problems(tmp_path, "objective.reference_logps=precomputed", "checkpoint.save=true")
    assert not found, found  # a full fine-tune's stored log-probs survive a resume: checkpoint.save is fine
    assert "reference = the starting weights, its log-probs precomputed before step 1" in render_plan(plan)
    # A Hub id in the local Hugging Face cache, resolved as checkpoint.path is (offline).
    hub_cache(tmp_path / "hub", "org/tiny-ref", ref, commit="c" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    plan, found = plan_problems(tmp_path, "objective.reference=org/tiny-ref", *base)
    assert not found, found
    text = render_plan(plan)
    assert "reference = the separate model org/tiny-ref (frozen" in text and "computed live in each step" in text
    assert "precompute:" not in text


def test_the_native_reference_builds_its_attention_masks_beside_a_model_hf_policy():
    """model=hf's trainer builds no attention masks (the backend builds its own in its forward), so the
    native reference builds them as torchtitan's trainer does for a native policy (masked attention:
    the document mask of the positions); masks the trainer built are kept, the causal path gets none."""
    from qwen3exp.config.flavors import FLAVORS
    from qwen3exp.titan.attention import positions_mask
    from qwen3exp.titan.model import qwen3_model_config
    from qwen3exp.titan.reference_logps import own_kwargs

    positions = torch.arange(4).repeat(2, 2)  # two rows of two documents each
    hf_extra = {"positions": positions}  # what post_dataloading_process gives a model=hf policy
    with torch.device("meta"):
        masked = qwen3_model_config(FLAVORS["tiny"], attention="sdpa").build()
        causal = qwen3_model_config(FLAVORS["tiny"], attention="sdpa", causal=True).build()
    got = own_kwargs(masked, hf_extra)
    assert torch.equal(got["attention_masks"], positions_mask(positions)) and got["positions"] is positions
    native_extra = {"positions": positions, "attention_masks": object()}
    assert own_kwargs(masked, native_extra) is native_extra and own_kwargs(causal, hf_extra) is hf_extra


def logps_here(folders: list[str], rows, masks):
    """transformers' (sum, count) of each row per folder (`test_preference.pair_logps_here`)."""
    from test_preference import pair_logps_here

    return pair_logps_here(folders, rows, masks)


def train(tmp_path, name: str, policy, *overrides: str, ranks: int = 1, env: dict | None = None, hf: bool = False):
    run = tmp_path / name
    r = run_cli(
        "experiment=tiny_dpo", "peft=none", "model=hf" if hf else "model.flavor=auto", f"model.hf_assets_path={policy}",
        "checkpoint.load=hf", f"data.path={tmp_path / 'pairs.jsonl'}", "platform=cpu", "platform.threads_per_rank=1",
        f"launcher.nproc_per_node={ranks}", f"training.seq_len={SEQ_LEN}", "training.local_batch_size=2",
        "training.warmup_steps=1", "training.lr=0.05", "metrics.tensorboard=false", *overrides,
        f"hydra.run.dir={run}", env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return run, r.stdout


@pytest.mark.slow  # trains: 5 short runs of the tiny model (2 on 2 ranks, 1 model=hf), transformers in a subprocess
def test_a_separate_reference_live_and_precomputed(tmp_path, models):
    policy, ref, _, _ = models
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS + HELD_OUT))
    val = ["validation.fraction=0.5", "validation.freq=2", "validation.steps=2"]
    common = ["training.steps=3", f"objective.reference={ref}", *val]
    live, _ = train(tmp_path, "live", policy, *common)
    stored, out = train(tmp_path, "precomputed", policy, *common, "objective.reference_logps=precomputed")

    tok = load_tokenizer(policy)
    sides = [render_pair(tok, pair_of(json.dumps(p))) for p in PAIRS]
    rows = [s.ids for pair in sides for s in pair]
    masks = [s.trained for pair in sides for s in pair]
    pol, reference = in_fresh_process("test_preference_reference.logps_here", [str(policy), str(ref)], rows, masks)
    step1 = read_metrics(live)[0]
    loss, margin = mean_formula("dpo", [0], pol, reference)  # step 1: pair 0 (system + multi-turn prompt)
    diff = max(abs(step1["loss"] - loss), abs(step1["reward_margin"] - margin))
    print(f"separate reference, step 1: loss {step1['loss']:.6f} (formula {loss:.6f}), max abs diff {diff:.2e}")
    assert abs(loss - math.log(2)) > 0.01 and diff < 1e-4, (step1, loss, margin)  # not the policy: 0.03 off ln 2
    # model=hf: the Transformers backend's policy beside the native reference (one step: pair 0).
    hf, _ = train(tmp_path, "hf", policy, "training.steps=1", f"{KEY}={ref}", "validation.enable=false", hf=True)
    step1 = read_metrics(hf)[0]
    diff = max(abs(step1["loss"] - loss), abs(step1["reward_margin"] - margin))
    print(
        f"separate reference, model=hf, step 1: loss {step1['loss']:.6f} (formula {loss:.6f}), max abs diff {diff:.2e}"
    )
    assert diff < 1e-4, (step1, loss, margin)

    table = torch.load(stored / "reference_logps" / "train.pt", weights_only=True)["logps"]
    want = torch.tensor([[reference[0][0], reference[1][0]], [reference[2][0], reference[3][0]]])
    assert table.shape == (2, 2) and (table - want).abs().max() < 1e-4, (table, want)
    assert (stored / "reference_logps" / "validation.pt").is_file()
    assert "reference log-probs precomputed" in out and "no reference model is held while training" in out
    a, b = read_metrics(live), read_metrics(stored)
    va, vb = read_validation(live), read_validation(stored)
    steps = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b, strict=True))
    vals = max(abs(x["val_loss"] - y["val_loss"]) for x, y in zip(va, vb, strict=True))
    print(f"precomputed against live: max abs diff of 3 step losses {steps:.2e}, of {len(va)} val losses {vals:.2e}")
    assert len(a) == 3 and len(va) >= 2 and steps < 1e-5 and vals < 1e-5

    # The starting weights as reference, precomputed, a full fine-tune on 2 ranks (FSDP) with resumable
    # checkpoints: step 1 is ln 2; a failure at step 3 and the relaunch resume from checkpoint step 2 and
    # read the stored log-probs (the file is not written again: never recomputed from trained weights).
    own = ["training.steps=3", *val, "objective.reference_logps=precomputed", "checkpoint.save=true"]
    own += ["checkpoint.interval=1"]
    with pytest.raises(AssertionError, match="QWEN3EXP_FAULT_RAISE_AT_STEP=3"):
        train(tmp_path, "own", policy, *own, ranks=2, env={"QWEN3EXP_FAULT_RAISE_AT_STEP": "3"})
    stored = (tmp_path / "own" / "reference_logps" / "train.pt").read_bytes()
    run, out = train(tmp_path, "own", policy, *own, ranks=2)
    assert "resuming from checkpoint step 2" in out and "reference log-probs read from" in out, out[-3000:]
    assert "precomputing" not in out and (run / "reference_logps" / "train.pt").read_bytes() == stored
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3] and abs(rows[0]["loss"] - math.log(2)) < 1e-6, rows
