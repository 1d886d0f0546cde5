"""qwen3exp's flavor table (plain numbers, used for validation and planning without torchtitan)
must match torchtitan's own flavors exactly."""

from __future__ import annotations

import pytest

from qwen3exp.config.flavors import FLAVORS, TORCHTITAN_FLAVORS


def _arch_of_torchtitan(flavor: str) -> dict:
    from torchtitan.models.qwen3 import qwen3_configs

    cfg = qwen3_configs[flavor]("flex")
    layer = cfg.layers[0]
    att = layer.attention
    out = dict(
        n_layers=len(cfg.layers),
        dim=cfg.dim,
        n_heads=att.n_heads,
        n_kv_heads=att.n_kv_heads,
        head_dim=att.head_dim,
        vocab_size=cfg.vocab_size,
        tied=cfg.enable_weight_tying,
        rope_theta=att.rope.theta,
        max_seq_len=att.rope.max_seq_len,
    )
    if layer.moe is not None:
        ex = layer.moe.routed_experts.inner_experts
        out.update(num_experts=ex.num_experts, top_k=layer.moe.router.top_k, moe_hidden=ex.hidden_dim)
    else:
        out.update(hidden_dim=layer.feed_forward.w1.out_features)
    return out


def test_table_lists_every_torchtitan_flavor():
    from torchtitan.models.qwen3 import qwen3_configs

    assert set(TORCHTITAN_FLAVORS) == set(qwen3_configs)


@pytest.mark.parametrize("flavor", sorted(TORCHTITAN_FLAVORS))
def test_flavor_matches_torchtitan(flavor):
    a = FLAVORS[flavor]
    mine = dict(
        n_layers=a.n_layers,
        dim=a.dim,
        n_heads=a.n_heads,
        n_kv_heads=a.n_kv_heads,
        head_dim=a.head_dim,
        vocab_size=a.vocab_size,
        tied=a.tied,
        rope_theta=a.rope_theta,
        max_seq_len=a.max_seq_len,
    )
    if a.moe is not None:
        mine.update(num_experts=a.moe.num_experts, top_k=a.moe.top_k, moe_hidden=a.moe.hidden_dim)
    else:
        mine.update(hidden_dim=a.hidden_dim)
    assert mine == _arch_of_torchtitan(flavor)


@pytest.mark.parametrize("flavor", ["tiny", "tiny_moe", "debugmodel", "debugmodel_moe", "0.6B"])
def test_our_builder_reproduces_the_flavor_parameter_count(flavor):
    """qwen3exp.titan.model builds the same model as torchtitan's registry (counted on meta)."""
    import torch

    from qwen3exp.titan.model import qwen3_model_config

    arch = FLAVORS[flavor]
    with torch.device("meta"):
        model = qwen3_model_config(arch, attention="sdpa").build()
    n = sum(p.numel() for p in model.parameters())
    assert n == arch.param_counts()[0]
    if flavor in TORCHTITAN_FLAVORS:
        from torchtitan.models.qwen3 import qwen3_configs

        with torch.device("meta"):
            ref = qwen3_configs[flavor]("flex").build()
        assert n == sum(p.numel() for p in ref.parameters())
