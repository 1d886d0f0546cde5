"""A preference run's memory and step time in the plan (`qwen3exp.plan.memory_pref`,
`qwen3exp.plan.layout_cost.reference_flops`): planned only, no training. The predictions against
measured peaks are tests/test_memory_score.py's (the dpo rows of tests/bench/bench_memory.py)."""

from __future__ import annotations

import json

import pytest

from qwen3exp import api
from qwen3exp.config.sections.objective import DpoObjective
from qwen3exp.plan import memory, memory_peak, memory_pref
from qwen3exp.plan.memory_fit import memory_fit
from qwen3exp.plan.render import render as plan_text

TINY_DPO = ["experiment=tiny_dpo", "platform=cpu", "validation.enable=false"]
SFT_SAME_BATCH = ["experiment=tiny_native", "platform=cpu", "training.seq_len=192", "training.local_batch_size=8"]


def _plan(overrides, tmp_path, name):
    return api.plan(api.compose([*overrides, "dry_run=true"]), tmp_path / name)


def test_a_dpo_plan_holds_its_reference_and_its_unchunked_logits_and_sft_has_neither(tmp_path):
    sft = _plan(SFT_SAME_BATCH, tmp_path, "sft")
    full = _plan([*TINY_DPO, "peft=none"], tmp_path, "full")
    lora = _plan(TINY_DPO, tmp_path, "lora")
    orpo = _plan([*TINY_DPO, "objective=orpo"], tmp_path, "orpo")
    assert (sft.memory.reference_mode, sft.memory.reference) == ("", 0)
    # full fine-tune: a frozen copy of the trainable weights, sharded like them
    assert (full.memory.reference_mode, full.memory.reference) == ("copy", full.memory.parameters)
    assert (lora.memory.reference_mode, lora.memory.reference) == ("adapters", 0)
    assert (orpo.memory.reference_mode, orpo.memory.reference) == ("none", 0)
    # the same tokens per micro-batch; the pair loss keeps the full logits and their log-softmax
    assert full.memory.tokens_per_microbatch == sft.memory.tokens_per_microbatch
    tokens = full.memory.tokens_per_microbatch
    unchunked = 2 * memory_pref.logits_bytes(full.arch, 1, tokens) - 2 * memory_peak.chunk_bytes(full.arch, 1, tokens)
    assert full.memory.activations == sft.memory.activations + unchunked
    m = full.memory
    parts = m.parameters + m.gradients + m.optimizer + m.fsdp_buffers + m.activations + m.attention_mask
    assert m.total == parts + m.reference
    assert full.memory.peak > sft.memory.peak
    text = plan_text(full)
    assert "  reference " in text and "a frozen copy of the trainable weights" in text
    assert "  reference " not in plan_text(sft)
    saved = json.loads(json.dumps(full.as_json()))["memory"]  # as plan.json holds it
    assert (saved["reference_mode"], saved["reference"]) == ("copy", full.memory.reference)
    assert json.loads(json.dumps(full.as_json()))["step"]["reference_s"] == full.step.reference_s > 0


def test_a_dpo_step_adds_the_reference_forward_to_the_predicted_time(tmp_path):
    lora = _plan(TINY_DPO, tmp_path, "lora")
    orpo = _plan([*TINY_DPO, "objective=orpo"], tmp_path, "orpo")
    assert orpo.step.reference_s == 0
    # a third of a forward + backward of the same model over the same tokens
    assert lora.step.reference_s == pytest.approx(orpo.step.compute_s / 3, rel=0.02)
    assert lora.step.compute_s == pytest.approx(orpo.step.compute_s + lora.step.reference_s)
    assert "the reference forward" in plan_text(lora)


def test_a_separate_reference_and_precomputed_log_probs_are_planned_from_their_config(tmp_path):
    from bench import bench_memory

    paths = bench_memory.folders(tmp_path)
    base = ["model=native", "model.flavor=auto", f"model.hf_assets_path={paths['0p6b']}", *TINY_DPO[1:]]
    base += ["data=preference", "objective=dpo", "training.seq_len=256", "training.local_batch_size=2"]
    exp = api.compose([*base, "peft=none", "dry_run=true"])
    plan = api.plan(exp, tmp_path / "copy")
    g, arch = plan.mesh.degrees, plan.arch
    separate = exp.model_copy(
        update={"objective": DpoObjective.model_construct(reference=paths["0p6b_4l"], reference_logps="live")}
    )
    pairs = memory_pref.of(separate)
    assert pairs is not None and pairs.reference == "separate"
    assert pairs.reference_arch is not None and pairs.reference_arch.n_layers == 4
    fit = memory_fit(separate, arch, plan.mesh, plan.platform, arch.param_counts()[0], [])[0]
    assert fit.reference_mode == "separate"
    assert fit.reference == memory.params_per_rank(pairs.reference_arch, g) * 4 > plan.memory.reference
    pre = exp.model_copy(
        update={"objective": DpoObjective.model_construct(reference=None, reference_logps="precomputed")}
    )
    pairs = memory_pref.of(pre)
    assert pairs is not None and pairs.reference == "precomputed"
    fit = memory_fit(pre, arch, plan.mesh, plan.platform, arch.param_counts()[0], [])[0]
    assert fit.reference == 0 and fit.precompute_peak > 0
    assert fit.total == plan.memory.total - plan.memory.reference
    assert fit.peak == fit.runtime + max(fit.total + fit.transients, fit.precompute_peak)
    assert fit.peak < plan.memory.peak  # no copy held, no reference forward in the step
    assert "a first pass stores its log-probs" in "\n".join(memory_pref.plan_lines(fit, str))
