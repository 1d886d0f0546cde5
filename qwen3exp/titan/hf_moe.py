"""transformers' own MoE blocks under torchtitan's Transformers backend (model=hf with a Qwen3-MoE).

torchtitan 0.3.0's backend never swaps its own MoE in (UPSTREAM BUG, `moe_load_balancing_hook`), so
the model trains transformers' MoE block: these give it the sharding configs FSDP needs and register
the load-balancing hook only for layers that hold a torchtitan MoE.
"""

from __future__ import annotations

import functools

import torch


def replicate_hf_moe_blocks(model: torch.nn.Module) -> int:
    """Give transformers' own MoE blocks (router, fused experts) replicated sharding configs, so the
    backend's FSDP shards their parameters like every other; returns the blocks configured. Only
    with tp = ep = 1 (checked before launch): transformers' block has no tensor/expert-parallel plan.
    Part of the workaround documented in `moe_load_balancing_hook` (the same upstream bug: the
    torchtitan MoE that would carry its own sharding config is never swapped in)."""
    import spmd_types as spmd  # type: ignore[import-untyped]  # lazy: torch's SPMD typing, for FSDP on the ranks
    from torchtitan.models.common.decoder_sharding import dense_param_placement  # lazy: only with an HF MoE
    from torchtitan.protocols.sharding import ShardingConfig  # lazy: only with an HF MoE

    blocks = 0
    for layer in model.layers.values():
        mlp = getattr(layer, "mlp", None)
        if not getattr(layer, "moe_enabled", False) or mlp is None or hasattr(layer, "moe"):
            continue
        for sub in mlp.modules():
            states = [n for n, _ in (*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False))]
            if states and getattr(sub, "_sharding_config", None) is None:
                sub._sharding_config = ShardingConfig(
                    state_shardings={n: dense_param_placement(tp=spmd.R) for n in states}
                )
        blocks += 1
    return blocks


def with_hf_moe_blocks(parallelize_fn):
    """`parallelize_fn` after `replicate_hf_moe_blocks` (keeping its name)."""

    @functools.wraps(parallelize_fn)
    def parallelize(model, **kwargs):
        replicate_hf_moe_blocks(model)
        return parallelize_fn(model, **kwargs)

    return parallelize


def moe_load_balancing_hook(optimizers, model_parts, parallel_dims) -> None:
    """torchtitan's MoE load-balancing hook, for the layers that hold a torchtitan MoE only.

    # UPSTREAM BUG: torchtitan 0.3.0's Transformers backend marks every Hugging Face MoE layer
    # `moe_enabled` but never swaps its torchtitan MoE in: `parallelize_hf_transformers` tests
    # `any(getattr(b, "moe_enabled", False) for b in model.layers)`, and iterating the layers'
    # ModuleDict yields their names, so `build_and_swap_native_moe` never runs and no layer gets the
    # `.moe` attribute. `register_moe_load_balancing_hook` (the backend's post_optimizer_build_fn)
    # then reads `layer.moe` of every `moe_enabled` layer and the trainer dies with
    # "'FSDPQwen3MoeDecoderLayer' object has no attribute 'moe'" before step 1. The model trains
    # transformers' own MoE block (`Qwen3MoeSparseMoeBlock`: the router and the fused
    # `experts.gate_up_proj` / `experts.down_proj`, exactly transformers' numerics), which has no
    # auxiliary-loss-free expert bias to update, so the hook is registered only for layers that do
    # hold a torchtitan MoE (none today; all of them once upstream swaps them in), and
    # `replicate_hf_moe_blocks` gives transformers' blocks the sharding configs FSDP needs (without
    # it, 2 ranks fail: "all parameters must be DTensors ... Got plain tensor for 'gate_up_proj'").
    # Test: tests/test_hf_moe.py::test_upstream_moe_swap_still_skipped (asserts the upstream
    # behaviour, so it tells when this can go) and the MoE trainings there (fail without this).
    """
    from torchtitan.components.optimizer import register_moe_load_balancing_hook  # lazy: after the optimizer is built

    layers = [
        layer
        for part in model_parts
        for layer in part.get_submodule("layers").values()
        if getattr(layer, "moe_enabled", False)
    ]
    if any(not hasattr(layer, "moe") for layer in layers):
        return  # transformers' own MoE blocks: nothing to balance by expert bias
    register_moe_load_balancing_hook(optimizers, model_parts, parallel_dims)
