"""objective=dpo|orpo|simpo on model=hf (issue 40): the Transformers backend's model in the
preference trainer (`qwen3exp.titan.hf_preference`), as tests/test_preference.py checks model=native.

- model=hf with a pair objective plans (it was refused with exit 2) and each rank's torchtitan config
  is the preference trainer with the backend's `hf_model`; tensor parallelism is still refused;
- must show: for the fixed pair of tests/test_preference.py (a system message, a multi-turn prompt),
  the step-1 loss and reward_margin of DPO (the policy as its own reference: exactly ln 2), ORPO and
  SimPO on model=hf equal the formulas on transformers' log-probs of the same weights, and on 2
  ranks with FSDP (DPO, full fine-tune) the step-2 loss equals the formula on transformers'
  log-probs of the step-1 export against the start (the frozen, sharded copy is the reference);
- DPO with LoRA on model=hf (2 ranks, FSDP): ln 2 at step 1, the loss falls, and the exported
  adapter loads in PEFT, whose log-probs give the logged step-2 loss (the reference: the base with
  the adapters off); the merged export, written by the same code as SFT's, gives the same.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from conftest import compose, read_metrics, read_summary, run_cli
from hf_fixtures import TOKENIZER_FILES, in_fresh_process, tiny_config, write_checkpoint
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.schema import validate_experiment
from qwen3exp.data.chat.render import load_tokenizer
from qwen3exp.data.preference.pairs import pair_of, render_pair
from test_preference import PAIRS, SEQ_LEN, logps_of, mean_formula


def test_model_hf_plans_a_pair_objective_and_still_refuses_tensor_parallelism(tmp_path):
    from qwen3exp.errors import ConfigError
    from qwen3exp.plan.build import make_plan
    from qwen3exp.titan.hf_preference import HFPreferenceTrainer  # lazy: imports torchtitan
    from qwen3exp.titan.job_config import to_torchtitan

    ckpt = tmp_path / "ckpt"  # what a dry run reads: config.json and the tokenizer (no weights)
    tiny_config(tied=True).save_pretrained(ckpt)
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER_DIR / name, ckpt / name)
    hf = ["experiment=tiny_dpo", "model=hf", f"model.hf_assets_path={ckpt}", "platform=cpu", "dry_run=true"]
    plan = make_plan(validate_experiment(compose(*hf)), tmp_path / "run")  # DPO with LoRA, 2 ranks
    assert plan.exp.model.backend == "hf" and plan.parameters.trainable, plan.parameters
    config = to_torchtitan(plan.exp, plan.platform, tmp_path / "run")  # what each rank builds
    assert type(config) is HFPreferenceTrainer.Config and config.lora, type(config)
    assert Path(config.hf_model).resolve() == ckpt.resolve()  # the backend builds its model from this folder
    with pytest.raises(ConfigError) as e:  # a full fine-tune with ORPO: only tensor parallelism is refused
        make_plan(validate_experiment(compose(*hf, "peft=none", "objective=orpo", "parallelism.tp=2")), tmp_path / "r")
    assert [p.key for p in e.value.problems] == ["parallelism.tp"], e.value.problems
    assert "not implemented yet for preference objectives" in e.value.problems[0].message


def references_here(base: str, full: str, adapter: str, merged: str, rows, masks) -> list:
    """transformers' log-probs of the rows: the start, the full fine-tune's step-1 export, PEFT's
    model (the base with the step-1 adapter) and the merged step-1 export (in a fresh process)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    load = lambda folder: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()  # noqa: E731
    peft = PeftModel.from_pretrained(load(base), adapter).eval()
    return [logps_of(m, rows, masks) for m in (load(base), load(full), peft, load(merged))]


@pytest.mark.slow  # trains: 4 runs of 1-4 steps of a tiny model on model=hf (one on 2 ranks), PEFT in a fresh process
def test_hf_step_losses_equal_the_formulas_on_transformers_logps(tmp_path):
    """2 ranks, FSDP (DPO, full fine-tune for 2 steps and LoRA for 4): each step reads pair 0 on
    rank 0 and pair 1 on rank 1, and its loss is the mean over both; 1 rank: ORPO and SimPO, pair 0."""
    ckpt = write_checkpoint(tmp_path / "ckpt", tied=True, seed=5)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    export = ["checkpoint.export=interval", "checkpoint.export_interval=1", "checkpoint.dtype=float32"]
    one = ["launcher.nproc_per_node=1", "training.local_batch_size=2", "training.steps=1"]
    variants = {
        "dpo_full": ["objective=dpo", "peft=none", "launcher.nproc_per_node=2", "training.local_batch_size=2",
                       "training.steps=2", "training.lr=0.05", *export],
        "dpo_lora": ["objective=dpo", "launcher.nproc_per_node=2", "training.local_batch_size=2", "training.steps=4",
                     "training.lr=0.01", *export, "checkpoint.merge_lora=true"],
        "orpo": ["objective=orpo", "peft=none", *one],
        "simpo": ["objective=simpo", "peft=none", *one],
    }  # fmt: skip
    runs = {}
    for name, overrides in variants.items():
        runs[name] = tmp_path / name
        r = run_cli(
            "experiment=tiny_dpo", "model=hf", *overrides, f"model.hf_assets_path={ckpt}", "checkpoint.load=hf",
            f"data.path={data}", "platform=cpu", "platform.threads_per_rank=1", f"training.seq_len={SEQ_LEN}",
            "training.warmup_steps=1", "validation.enable=false", "metrics.tensorboard=false",
            f"hydra.run.dir={runs[name]}",
        )  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    tok = load_tokenizer(ckpt)
    sides = [render_pair(tok, pair_of(json.dumps(p))) for p in PAIRS]
    rows = [s.ids for pair in sides for s in pair]
    masks = [s.trained for pair in sides for s in pair]
    lora1 = runs["dpo_lora"] / "export/step-1"
    folders = [ckpt, runs["dpo_full"] / "export/step-1", lora1 / "adapter", lora1 / "merged"]
    start, full, peft, merged = in_fresh_process("test_preference_hf.references_here", *map(str, folders), rows, masks)
    both, steps = [0, 1], {"dpo_full": 2, "dpo_lora": 4, "orpo": 1, "simpo": 1}
    diffs = {}
    for name in variants:
        m = read_metrics(runs[name])
        assert len(m) == steps[name], m
        kind, pairs = name.split("_")[0], (both if name.startswith("dpo") else [0])
        loss, margin = mean_formula(kind, pairs, start, start)
        diffs[f"{name} step 1"] = max(abs(m[0]["loss"] - loss), abs(m[0]["reward_margin"] - margin))
        if kind != "dpo":
            continue
        assert abs(m[0]["loss"] - math.log(2)) < 1e-6 and m[0]["reward_margin"] == 0.0, m[0]
        moved = {"dpo_full": [full], "dpo_lora": [peft, merged]}[name]
        for label, policy in zip(("", " (merged)"), moved, strict=False):
            loss, margin = mean_formula("dpo", both, policy, start)
            assert abs(loss - math.log(2)) > 1e-3  # the policy moved: a real check of the reference
            diffs[f"{name} step 2{label}"] = max(abs(m[1]["loss"] - loss), abs(m[1]["reward_margin"] - margin))
    print("model=hf: max abs diff to the formula on transformers' log-probs:", diffs)
    assert max(diffs.values()) < 1e-4, diffs
    lora = [row["loss"] for row in read_metrics(runs["dpo_lora"])]  # the same two pairs every step
    assert all(b < a for a, b in zip(lora, lora[1:], strict=False)), lora
    summary = read_summary(runs["dpo_lora"])  # the export is SFT's: an adapter folder for PEFT and merged weights
    assert summary["export"]["ok"] and sorted(p.name for p in lora1.iterdir()) == ["adapter", "merged"], summary
    config = json.loads((lora1 / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(ckpt.resolve()) and config["peft_type"] == "LORA", config
