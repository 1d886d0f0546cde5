"""peft=lora with model=hf (issue 24): qwen3exp's LoRA adapters on transformers' projections
(`qwen3exp.titan.hf_lora`), the base frozen, exported as a PEFT adapter folder.

- the converted model (built as torchtitan builds it, in a fresh process: building the backend's
  model patches transformers process-wide): the trainable parameters are exactly the adapters,
  a targeted projection computes W x + alpha / rank * B A x (dropout on the adapters' input, in
  training only), the adapters' PEFT keys and the state dict adapter that leaves them out of
  Hugging Face checkpoints; the plan counts the same parameters and refuses tensor parallelism;
- one real 2-rank (FSDP over gloo) training from a transformers checkpoint (hf_roundtrip, float32
  export, merge_lora), all seven targets: trainable = plan's = the adapter tensors written; the base
  bit-identical after training; the loss falls; PEFT on the exported base gives the ranks' last
  validation loss to 1e-4, and so does the merged folder in plain transformers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, compose, read_metrics, read_summary, read_validation, run_cli
from hf_fixtures import masked_loss_here, write_checkpoint
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.schema import validate_experiment
from qwen3exp.errors import ConfigError
from qwen3exp.plan.build import make_plan
from qwen3exp.plan.chat_render import load_tokenizer, messages_of, records, render
from qwen3exp.plan.data_files import held_out
from test_lora import ALL, expected_trainable


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("lora_hf") / "ckpt", tied=True, seed=3)


def _hf_plan(ckpt: Path, *overrides: str):
    exp = compose("experiment=tiny_lora", "model=hf", f"model.hf_assets_path={ckpt}", "platform=cpu", *overrides)
    return make_plan(validate_experiment(exp), "/tmp/unused")


def converted_here(folder: str) -> dict:
    """The backend's model built on the meta device as the Trainer builds it, the adapters added
    (rank 4, alpha 8, dropout 0.5, all targets), materialised and initialised; what the test checks."""
    from types import SimpleNamespace

    import torch
    from torchtitan.experiments.transformers_modeling_backend import TitanModelConfig

    from qwen3exp.config.sections.peft import Lora
    from qwen3exp.titan import hf_export, hf_lora
    from qwen3exp.titan.hf_model import HFQwen3SdpaModel

    config = HFQwen3SdpaModel.Config(model_config=TitanModelConfig(attn_mask_type="block_causal"))
    job = SimpleNamespace(
        hf_model=folder, training=SimpleNamespace(seq_len=32), parallelism=None,
        debug=SimpleNamespace(deterministic=False), loss=SimpleNamespace(),
    )  # fmt: skip
    config.update_from_config(config=job)
    with torch.device("meta"):
        model = config.build()
    peft = Lora(rank=4, alpha=8.0, dropout=0.5, targets=ALL)
    converted = hf_lora.add_adapters(model, peft)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    q = model.get_submodule("model.model.layers.0.self_attn.q_proj")
    b_zero = bool((q.lora_b.weight == 0).all())
    with torch.no_grad():
        torch.nn.init.normal_(q.lora_b.weight)
        x = torch.randn(2, 3, q.in_features)
        q.eval()
        want = x @ q.weight.T + 2.0 * (x @ q.lora_a.weight.T) @ q.lora_b.weight.T
        q.train()
        drops = not torch.equal(q(x), q(x))
        q.eval()
        exact = torch.allclose(q(x), want, atol=1e-5) and torch.equal(q(x), q(x))
    adapter = hf_lora.HFLoraStateDictAdapter(config, None)
    return {
        "converted": converted, "trainable": trainable, "b_zero": b_zero, "eval_exact": exact,
        "train_drops": drops, "peft_keys": [hf_export.peft_key(n) for n in trainable],
        "hf_keys": sorted(adapter.to_hf(model.state_dict())),
    }  # fmt: skip


def in_fresh_process(name: str, *args):
    """`<name>(*args)` of this module in a fresh Python process, its JSON result returned: the
    backend's model is never built, and transformers never computes a reference, in the pytest
    process (see hf_fixtures.in_fresh_process)."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", HF_HUB_OFFLINE="1")
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "args.json"
        saved.write_text(json.dumps(args))
        code = f"import json, test_lora_hf as t; print(json.dumps(t.{name}(*json.loads(open({str(saved)!r}).read()))))"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def references_here(export: str, inputs: list, labels: list) -> list[dict]:
    """hf_fixtures.masked_loss of PEFT on the exported base, then of the merged folder in plain
    transformers: both in one process (one start of torch and transformers)."""
    return [
        masked_loss_here(export, inputs, labels, f"{export}/adapter"),
        masked_loss_here(f"{export}/merged", inputs, labels, None),
    ]


def test_converted_hf_model_trains_adapters_only_and_the_plan_counts_them(ckpt):
    got = in_fresh_process("converted_here", str(ckpt))
    cfg = json.loads((ckpt / "config.json").read_text())
    layers = cfg["num_hidden_layers"]
    assert got["converted"] == len(ALL) * layers
    assert all(".lora_a." in n or ".lora_b." in n for n in got["trainable"]) and len(got["trainable"]) == 2 * 7 * layers
    assert sum(got["trainable"].values()) == expected_trainable(cfg, 4, ALL)
    assert got["b_zero"] and got["eval_exact"] and got["train_drops"], got
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in got["peft_keys"]
    assert "model.layers.0.self_attn.q_proj.weight" in got["hf_keys"]
    assert not [k for k in got["hf_keys"] if "lora" in k]

    # The plan: the same count (rank 4, all targets); tensor parallelism refused before any worker.
    plan = _hf_plan(ckpt, "peft.rank=4", f"peft.targets=[{','.join(ALL)}]")
    assert plan.parameters.trainable == expected_trainable(cfg, 4, ALL)
    with pytest.raises(ConfigError, match="parallelism.tp"):
        _hf_plan(ckpt, "parallelism.tp=2", "parallelism.dp_shard=1")


def held_out_batch(export: Path, seq_len: int = 192) -> tuple[list, list]:
    """The validation batch of a 2-rank tiny_lora run (validation.steps=1, local_batch_size 4):
    inputs and labels (-100 where not trained), padded to seq_len, as test_lora builds them."""
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


@pytest.mark.slow
def test_tiny_hf_lora_trains_adapters_only_and_peft_loads_them(ckpt, tmp_path):
    import torch
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    r = run_cli(
        "experiment=tiny_lora", "model=hf", f"model.hf_assets_path={ckpt}", "checkpoint=hf_roundtrip",
        "checkpoint.dtype=float32", "checkpoint.merge_lora=true", f"peft.targets=[{','.join(ALL)}]", "platform=cpu",
        "platform.threads_per_rank=1",
        "training.steps=8", "training.warmup_steps=1", "training.local_batch_size=4", "validation.freq=100",
        "validation.steps=1", "metrics.tensorboard=false", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and summary["export"]["ok"], summary["export"]
    export = run_dir / "export" / "step-8"

    # The trainable count: the plan's, the ranks' (the adapter weights they wrote) and rank x (in + out).
    cfg = json.loads((ckpt / "config.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text())
    tensors = load_file(export / "adapter" / "adapter_model.safetensors")
    assert plan["parameters"]["trainable"] == expected_trainable(cfg, 8, ALL)
    assert sum(t.numel() for t in tensors.values()) == plan["parameters"]["trainable"]
    assert len(tensors) == 2 * len(ALL) * cfg["num_hidden_layers"]
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in tensors
    assert all(t.abs().sum() > 0 for k, t in tensors.items() if "lora_B" in k)  # every adapter trained

    # The base weights are bit-identical after training.
    loaded, exported = load_file(ckpt / "model.safetensors"), {}
    for f in export.glob("model-*.safetensors"):
        exported |= load_file(f)
    assert exported and set(exported) <= set(loaded)
    for key, value in exported.items():
        assert torch.equal(value, loaded[key]), key

    # The loss falls.
    losses, vals = [m["loss"] for m in read_metrics(run_dir)], read_validation(run_dir)
    assert losses[-1] < losses[0] - 0.5, losses
    assert vals[-1]["step"] == 8 and vals[-1]["val_loss"] < vals[0]["val_loss"], vals

    # PEFT on the exported base, and the merged export in plain transformers: the ranks' last
    # validation loss on the same held-out batch.
    assert summary["export"]["merged"]["ok"], summary["export"]
    ref, merged = in_fresh_process("references_here", str(export), *held_out_batch(export))
    assert abs(ref["loss"] - vals[-1]["val_loss"]) < 1e-4 and ref["generated"] == [1, 12], (ref, vals[-1])
    assert abs(merged["loss"] - ref["loss"]) < 1e-4 and merged["generated"] == [1, 12], (merged, ref)
