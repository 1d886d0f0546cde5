"""peft=lora (issues 24, 39): LoRA adapters on a frozen base, model=native (and the trained model=hf).

- the plan: trainable parameters = rank x (in + out) per targeted projection and layer, gradients and
  optimizer state for those only (a full fine-tune's figures unchanged); any subset of the seven
  targets validates (k_proj without v_proj included); a target named twice, bad targets and MLP
  targets on an MoE model exit 2 before any worker (model=hf: tests/test_lora_hf.py);
- one real 2-rank training per backend of experiment=tiny_lora from a transformers checkpoint
  (hf_roundtrip, float32 export) with PEFT's Qwen3 default targets [q_proj, v_proj]: the export holds
  the adapter on its own (exactly the named targets, naming the checkpoint as its base) and the
  merged weights; the adapter's parameter count equals the plan's, PEFT's and rank x (in + out); the
  merged export's untargeted weights are bit-identical to the loaded ones; the loss falls; PEFT
  loads the adapter on the transformers base, and its loss on the held-out batch equals the ranks'
  last validation loss to 1e-4; PEFT's merge_and_unload() equals the merged export to 1e-4;
  `generate` and `qwen3exp chat` run (chat alike with and without the merged folder);
- an adapter-only export's base is found (and checked) from adapter_config.json.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import pytest

from conftest import compose, read_metrics, read_summary, read_validation, run_cli
from hf_fixtures import hub_cache, lora_references, write_checkpoint
from qwen3exp import cli
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.schema import validate_experiment
from qwen3exp.data.chat.render import load_tokenizer, messages_of, records, render
from qwen3exp.data.files import held_out
from qwen3exp.errors import ConfigError
from qwen3exp.plan.build import make_plan

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def expected_trainable(cfg: dict, rank: int, targets: list[str]) -> int:
    """rank x (in + out) of each targeted projection (out x in), times the layers (config.json's names)."""
    d, f, hd = (
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
    )
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shape = {"q_proj": (q, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, q)}
    shape |= {"gate_proj": (f, d), "up_proj": (f, d), "down_proj": (d, f)}
    return cfg["num_hidden_layers"] * sum(rank * sum(shape[t]) for t in targets)


def _plan(*overrides: str):
    return make_plan(validate_experiment(compose(*overrides, "platform=cpu")), "/tmp/unused")


def test_plan_trainable_parameters_and_memory():
    full = _plan("experiment=tiny_sft")
    lora = _plan("experiment=tiny_lora", "peft.rank=4", f"peft.targets=[{','.join(ALL)}]")
    a = lora.arch
    cfg = {
        "hidden_size": a.dim, "intermediate_size": a.hidden_dim, "head_dim": a.head_dim,
        "num_hidden_layers": a.n_layers, "num_attention_heads": a.n_heads, "num_key_value_heads": a.n_kv_heads,
    }  # fmt: skip
    assert lora.parameters.trainable == expected_trainable(cfg, 4, ALL)
    assert full.parameters.trainable is None
    assert full.memory.gradients == full.memory.parameters  # a full fine-tune: unchanged figures
    assert lora.memory.parameters == full.memory.parameters
    per_rank = -(-lora.parameters.trainable // 2)  # FSDP over 2 ranks
    assert lora.memory.gradients == per_rank * 4 and lora.memory.optimizer == 2 * per_rank * 4
    with pytest.raises(ConfigError, match="peft.targets"):
        validate_experiment(compose("experiment=tiny_lora", "peft.targets=[qproj]"))
    with pytest.raises(ConfigError, match="grouped tensors"):
        _plan("experiment=tiny_lora", "model.flavor=tiny_moe", "peft.targets=[q_proj,gate_proj]")


PEFT_DEFAULT = ["q_proj", "v_proj"]
"""PEFT's own default LoRA targets for Qwen3 (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)."""


def test_every_subset_of_the_seven_targets_is_accepted():
    """peft.targets takes any non-empty subset (the refusal of k_proj without v_proj is gone); a
    target named twice is refused. PEFT's own Qwen3 default [q_proj, v_proj] validates on both
    backends, and the plan counts rank x (in + out) of the named projections only."""
    from itertools import combinations

    from qwen3exp.config.sections.peft import Lora

    subsets = [list(c) for n in range(1, len(ALL) + 1) for c in combinations(ALL, n)]
    assert len(subsets) == 127 and all(Lora(targets=t).targets == t for t in subsets)
    for targets in ("[q_proj,v_proj]", "[k_proj]", "[q_proj,k_proj,o_proj,down_proj]"):
        assert validate_experiment(compose("experiment=tiny_lora", f"peft.targets={targets}"))
    assert validate_experiment(compose("experiment=tiny_lora", "model=hf", "peft.targets=[q_proj,v_proj]"))
    with pytest.raises(ConfigError, match="more than once"):
        validate_experiment(compose("experiment=tiny_lora", "peft.targets=[q_proj,v_proj,q_proj]"))
    plan = _plan("experiment=tiny_lora", "peft.rank=4", "peft.targets=[q_proj,v_proj]")
    a = plan.arch
    assert plan.parameters.trainable == a.n_layers * 4 * (
        (a.dim + a.n_heads * a.head_dim) + (a.dim + a.n_kv_heads * a.head_dim)
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "hf"])
def test_tiny_lora_trains_adapters_only_and_peft_loads_them(tmp_path, backend, capsys, monkeypatch):
    """Both backends: model=native (torchtitan's converter, k and v split) and model=hf
    (qwen3exp/titan/hf_lora.py), with PEFT's default targets [q_proj, v_proj]."""
    import torch
    from safetensors.torch import load_file

    ckpt = write_checkpoint(tmp_path / "ckpt", tied=True, seed=3)
    run_dir = tmp_path / "run"
    r = run_cli(
        "experiment=tiny_lora", "model.flavor=auto" if backend == "native" else "model=hf",
        f"model.hf_assets_path={ckpt}", "checkpoint=hf_roundtrip",
        "checkpoint.dtype=float32", "checkpoint.merge_lora=true", "peft.targets=[q_proj,v_proj]", "platform=cpu",
        "platform.threads_per_rank=1",
        "training.steps=8", "training.warmup_steps=1", "training.local_batch_size=4", "validation.freq=100",
        "validation.steps=1", "metrics.tensorboard=false", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and summary["export"]["ok"], summary["export"]
    export = run_dir / "export" / "step-8"
    adapter = export / "adapter"

    # The adapter on its own (no copy of the base), naming the model the user named.
    assert sorted(p.name for p in export.iterdir()) == ["adapter", "merged"]
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(ckpt.resolve()) and config["revision"] is None
    assert config["peft_type"] == "LORA" and config["r"] == 8 and config["lora_alpha"] == 16.0
    assert config["target_modules"] == PEFT_DEFAULT and config["task_type"] == "CAUSAL_LM"

    # The trainable count: the plan's, the rank's (the adapter weights it wrote) and rank x (in + out).
    cfg = json.loads((ckpt / "config.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text())
    tensors = load_file(adapter / "adapter_model.safetensors")
    assert plan["parameters"]["trainable"] == expected_trainable(cfg, 8, PEFT_DEFAULT)
    assert sum(t.numel() for t in tensors.values()) == plan["parameters"]["trainable"]
    assert len(tensors) == 2 * len(PEFT_DEFAULT) * cfg["num_hidden_layers"]
    assert {k.split(".")[-3] for k in tensors} == set(PEFT_DEFAULT)  # exactly the named targets
    assert "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight" in tensors

    # The base weights are bit-identical after training: every weight of the merged export but the
    # targeted ones (k_proj included, which has no adapter) equals the loaded one.
    loaded, merged_weights = load_file(ckpt / "model.safetensors"), {}
    for f in (export / "merged").glob("model-*.safetensors"):
        merged_weights |= load_file(f)
    assert merged_weights and set(merged_weights) <= set(loaded)
    untouched = [k for k in merged_weights if not k.endswith(("q_proj.weight", "v_proj.weight"))]
    assert any(k.endswith("k_proj.weight") for k in untouched)
    for key in untouched:
        assert torch.equal(merged_weights[key], loaded[key]), key

    # The loss falls.
    losses, vals = [m["loss"] for m in read_metrics(run_dir)], read_validation(run_dir)
    assert losses[-1] < losses[0] - 0.5, losses
    assert vals[-1]["step"] == 8 and vals[-1]["val_loss"] < vals[0]["val_loss"], vals

    assert all(t.abs().sum() > 0 for k, t in tensors.items() if "lora_B" in k)  # every adapter trained

    # PEFT on the transformers base (the checkpoint the run loaded) and the merged export
    # (checkpoint.merge_lora) in plain transformers: the ranks' last validation loss on the same
    # held-out batch; generate runs on both; PEFT's merge_and_unload() equals the merged export.
    assert summary["export"]["merged"]["ok"], summary["export"]
    ref, merged = lora_references(ckpt, adapter, export / "merged", *held_out_batch(ckpt))
    assert ref["adapter_parameters"] == expected_trainable(cfg, 8, PEFT_DEFAULT), ref
    assert abs(ref["loss"] - vals[-1]["val_loss"]) < 1e-4 and ref["generated"] == [1, 12], (ref, vals[-1])
    assert abs(merged["loss"] - ref["loss"]) < 1e-4 and merged["generated"] == [1, 12], (merged, ref)
    assert not merged["keys_differ"] and merged["max_abs_diff"] < 1e-4, merged
    print(f"{backend}: adapter {ref['adapter_parameters']} parameters, merged vs PEFT {merged['max_abs_diff']:.3g}")

    # `qwen3exp chat` answers alike from the merged export and, without it, from the named base
    # model with the adapter applied (what a run without checkpoint.merge_lora leaves).
    answers = [chat_answer(capsys, monkeypatch, run_dir)]
    shutil.move(export / "merged", tmp_path / "merged")
    answers.append(chat_answer(capsys, monkeypatch, run_dir))
    assert answers[0] == answers[1] and answers[0].strip(), answers


def chat_answer(capsys, monkeypatch, run_dir: Path) -> str:
    """`qwen3exp chat RUN --prompt hi` in this process (greedy, 6 new tokens): its answer."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    capsys.readouterr()
    code = cli.main(["chat", str(run_dir), "--prompt", "hi", "--max-new-tokens", "6"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    return out


def held_out_batch(export: Path, seq_len: int = 192) -> tuple[list, list]:
    """The validation batch of a 2-rank tiny_lora run (validation.steps=1, local_batch_size 4):
    inputs and labels (-100 where not trained), padded to seq_len, as the ranks build them."""
    tok = load_tokenizer(export)
    lines = [line for _, _, line in records(TOKENIZER_DIR.parent / "chat")]
    held = sorted(held_out(len(lines), 0.1))
    inputs, labels = [], []
    for rank in range(2):
        for i in held[rank::2][:4]:
            x = render(tok, messages_of(lines[i]))
            n = len(x.ids) - 1
            inputs.append(x.ids[:-1] + [tok.pad_token_id] * (seq_len - n))
            labels.append([t if on else -100 for t, on in zip(x.ids[1:], x.trained[1:], strict=True)])
            labels[-1] += [-100] * (seq_len - n)
    return inputs, labels


def test_adapters_compute_base_plus_scaled_lora_with_dropout_in_training_only():
    """The converted model (no training): every base weight frozen, the adapters trainable; a
    targeted projection computes W x + alpha / rank * B A x in eval mode, and peft.dropout drops
    adapter inputs in train mode only."""
    import torch

    from qwen3exp.titan import lora
    from qwen3exp.titan.job_config import resolve_arch
    from qwen3exp.titan.model import qwen3_model_config

    exp = validate_experiment(compose("experiment=tiny_lora", "peft.dropout=0.5", "peft.alpha=8", "peft.rank=4"))
    config = lora.convert(qwen3_model_config(resolve_arch(exp), attention="sdpa", fuse_qkv=False), exp.peft)
    torch.manual_seed(0)
    model = config.build()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_a." in n or ".lora_b." in n for n in trainable)
    assert len(trainable) == 2 * 4 * exp.model.arch().n_layers  # q, k, v, o: A and B each
    wq = model.layers["0"].attention.qkv_linear.wq
    for p in wq.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(2, 3, wq.weight.shape[1])
    wq.eval()
    want = x @ wq.weight.T + 2.0 * (x @ wq.lora_a.weight.T) @ wq.lora_b.weight.T
    assert torch.allclose(wq(x), want, atol=1e-4) and torch.equal(wq(x), wq(x))
    wq.train()
    assert not torch.equal(wq(x), wq(x))

    # k_proj alone (torchtitan builds wk and wv from one config; split per projection here): only wk
    # has an adapter, wv stays a frozen plain projection, the state dict keys are unchanged.
    only_k = exp.peft.model_copy(update={"targets": ["k_proj"]})
    model = lora.convert(qwen3_model_config(resolve_arch(exp), attention="sdpa", fuse_qkv=False), only_k).build()
    trainable = {n.split(".", 2)[2] for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"attention.qkv_linear.wk.lora_a.weight", "attention.qkv_linear.wk.lora_b.weight"}
    assert "layers.0.attention.qkv_linear.wv.weight" in model.state_dict()


def test_an_adapter_on_its_own_names_its_base_and_is_checked_against_it(tmp_path, monkeypatch):
    """An adapter-only export (a LoRA run from a named base): chat and eval load the base that
    adapter_config.json names (a local folder; a Hub id that is not in the local cache is refused
    with the command that fetches it), and the launcher checks each adapter tensor against the base's
    weight shapes (safetensors headers only)."""
    import numpy as np
    from safetensors.numpy import save_file

    from qwen3exp.analysis import chat
    from qwen3exp.launchers.exports import verify_adapter

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    base = tmp_path / "base"
    base.mkdir()
    save_file(
        {"model.layers.0.self_attn.v_proj.weight": np.zeros((64, 128), np.float32)}, str(base / "model.safetensors")
    )
    adapter = tmp_path / "run" / "export" / "step-4" / "adapter"
    adapter.mkdir(parents=True)
    key = "base_model.model.model.layers.0.self_attn.v_proj.lora_"
    tensors = {f"{key}A.weight": np.zeros((8, 128), np.float32), f"{key}B.weight": np.zeros((64, 8), np.float32)}
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    config = {"base_model_name_or_path": str(base), "revision": None}
    (adapter / "adapter_config.json").write_text(json.dumps(config))

    assert chat.export_steps(tmp_path / "run") == [4]
    weights = chat.find_weights(tmp_path / "run")
    assert weights.folder == base and weights.adapter == adapter
    assert verify_adapter(adapter, base) | {"error": None} == {
        "path": str(adapter), "base": str(base), "ok": True, "error": None, "tensors": 2,
    }  # fmt: skip
    save_file({**tensors, f"{key}B.weight": np.zeros((32, 8), np.float32)}, str(adapter / "adapter_model.safetensors"))
    bad = verify_adapter(adapter, base)
    assert not bad["ok"] and "does not fit the base's [64, 128]" in bad["error"], bad

    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "Org/Missing-7B"}))
    with pytest.raises(chat.Refused, match="hf download Org/Missing-7B"):
        chat.find_weights(tmp_path / "run")


def test_the_adapter_names_the_model_the_user_named(tmp_path, monkeypatch):
    """adapter_config.json's base: the Hub id (and revision) as named, the Hub id and commit of a
    cache snapshot folder given as a path, the absolute path of another local folder; none (the
    export then holds the base) without checkpoint.load=hf."""
    from huggingface_hub import constants

    from qwen3exp.plan import lora_base

    source = tmp_path / "source"
    source.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (source / name).write_bytes((TOKENIZER_DIR / name).read_bytes())
    commit = "c" * 40
    snapshot = hub_cache(tmp_path / "hub", "org/tiny-base", source, commit=commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)

    def base(*overrides: str):
        exp = validate_experiment(compose("experiment=tiny_lora", "model.flavor=auto", *overrides))
        return lora_base.named_base(exp)

    assert base("model.hf_assets_path=org/tiny-base", "checkpoint=hf_load") == lora_base.Base("org/tiny-base")
    at = base("model.hf_assets_path=org/tiny-base", f"checkpoint.path=org/tiny-base@{commit}", "checkpoint.load=hf")
    assert at == lora_base.Base("org/tiny-base", commit)
    assert base(f"model.hf_assets_path={snapshot}", "checkpoint=hf_load") == lora_base.Base("org/tiny-base", commit)
    assert base("model.hf_assets_path=source", "checkpoint=hf_load") == lora_base.Base(str(source.resolve()))
    assert base("model.hf_assets_path=source") is None  # random initialisation: the base is exported too
