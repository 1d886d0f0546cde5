"""peft=lora with model=hf (issue 24): qwen3exp's LoRA adapters on transformers' projections
(`qwen3exp.titan.hf_lora`), the base frozen, exported as a PEFT adapter folder.

- the converted model (built as torchtitan builds it, in a fresh process: building the backend's
  model patches transformers process-wide): the trainable parameters are exactly the adapters,
  a targeted projection computes W x + alpha / rank * B A x (dropout on the adapters' input, in
  training only), the adapters' PEFT keys and the state dict adapter that leaves them out of
  Hugging Face checkpoints; the plan counts the same parameters and refuses tensor parallelism.
The real 2-rank training of both backends: tests/test_lora.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import compose
from hf_fixtures import in_fresh_process, write_checkpoint
from qwen3exp.config.schema import validate_experiment
from qwen3exp.errors import ConfigError
from qwen3exp.plan.build import make_plan
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


@pytest.mark.slow  # it trains (torchrun or steps in a fresh process): the full tier
def test_converted_hf_model_trains_adapters_only_and_the_plan_counts_them(ckpt):
    got = in_fresh_process("test_lora_hf.converted_here", str(ckpt))
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
