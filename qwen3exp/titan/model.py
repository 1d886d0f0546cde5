"""Build torchtitan's Qwen3 model config from a qwen3exp `Arch`.

One builder for every flavor (torchtitan's, ours, and `auto` from a checkpoint's config.json), so a
published checkpoint's exact dims, RoPE theta and norm eps reach the model. It reuses torchtitan's
own layer builders (private helpers of `torchtitan.models.qwen3` in 0.3.0), so parameter
initialisation is identical to upstream's flavors.

The launcher imports this module (through `qwen3exp.titan.job_config`) without torchtitan, which a
rank imports only once its platform is prepared: torchtitan is imported inside the functions.
"""

from __future__ import annotations

from qwen3exp.config.flavors import Arch
from qwen3exp.plan.attention_path import AttentionPath


def qwen3_model_config(arch: Arch, *, attention: str, fuse_qkv: bool = True, causal: bool = False):
    """`causal`: the SDPA path without a mask (`qwen3exp.plan.attention_path`); else the document mask."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear  # lazy: torchtitan in the ranks only
    from torchtitan.models.common.nn_modules import RMSNorm  # lazy: the same
    from torchtitan.models.qwen3 import (  # lazy: the same
        _EMBEDDING_INIT,
        _EMBEDDING_SKIP_INIT,
        _LINEAR_INIT,
        _build_qwen3_layers,
        _build_qwen3_moe_layers,
        _qwen3_norm,
    )
    from torchtitan.models.qwen3.model import Qwen3Model  # lazy: the same

    from qwen3exp.titan import attention as sdpa  # lazy: subclasses torchtitan's attention and model

    rope = CosSinRoPE.Config(dim=arch.head_dim, max_seq_len=arch.max_seq_len, theta=arch.rope_theta)
    common = dict(
        n_layers=arch.n_layers,
        dim=arch.dim,
        n_heads=arch.n_heads,
        n_kv_heads=arch.n_kv_heads,
        head_dim=arch.head_dim,
        fuse_qkv=fuse_qkv,
        rope=rope,
        # sdpa is rejected by torchtitan's builder; build with flex, then swap below.
        attn_backend="flex",
    )
    if arch.moe is None:
        layers = _build_qwen3_layers(hidden_dim=arch.hidden_dim, **common)
    else:
        layers = _build_qwen3_moe_layers(
            moe_hidden_dim=arch.moe.hidden_dim,
            num_experts=arch.moe.num_experts,
            top_k=arch.moe.top_k,
            moe_comm_backend="standard",
            **common,
        )
    inner = sdpa.CausalSDPAttention if causal else sdpa.DocumentSDPAttention
    if attention == "sdpa":
        for layer in layers:
            layer.attention.inner_attention = inner.Config()
    owner = sdpa.DocumentMaskQwen3Model if attention == "sdpa" and not causal else Qwen3Model  # one mask a step
    config = owner.Config(
        vocab_size=arch.vocab_size,
        dim=arch.dim,
        norm=_qwen3_norm(arch.dim),
        enable_weight_tying=arch.tied,
        tok_embeddings=Embedding.Config(
            num_embeddings=arch.vocab_size,
            embedding_dim=arch.dim,
            param_init=_EMBEDDING_SKIP_INIT if arch.tied else _EMBEDDING_INIT,
        ),
        lm_head=Linear.Config(in_features=arch.dim, out_features=arch.vocab_size, param_init=_LINEAR_INIT),
        layers=layers,
    )
    if arch.norm_eps != 1e-6:  # torchtitan's builders hard-code 1e-6
        for _, norm, _, _ in config.traverse(RMSNorm.Config):
            norm.eps = arch.norm_eps
    return config


def qwen3_model_spec(arch: Arch, *, flavor: str, attention: AttentionPath, force_sum_reductions: bool, lora=None):
    """torchtitan's model spec; `lora` (a `peft=lora` section): LoRA adapters on a frozen base
    (`qwen3exp.titan.lora`; q, k and v built as separate projections, as PEFT names them); `attention`:
    the kernel and its mask (`qwen3exp.plan.attention_path`)."""
    from torchtitan.components.optimizer import register_moe_load_balancing_hook  # lazy: torchtitan in the ranks
    from torchtitan.distributed.pipeline_parallel import pipeline_llm  # lazy: the same
    from torchtitan.models.qwen3 import parallelize_qwen3  # lazy: the same
    from torchtitan.protocols.model_spec import ModelSpec  # lazy: the same

    model = qwen3_model_config(arch, attention=attention.kernel, fuse_qkv=lora is None, causal=attention.causal)
    if lora is not None:
        from qwen3exp.titan import lora as adapters  # lazy: imports torchtitan

        model = adapters.convert(model, lora)
    parallelize = parallelize_qwen3
    if force_sum_reductions:
        parallelize = with_sum_reductions(parallelize_qwen3)
    if lora is not None:
        parallelize = adapters.keep_base_frozen(parallelize)
    return ModelSpec(
        name="qwen3",
        flavor=flavor,
        model=model,
        parallelize_fn=parallelize,
        pipelining_fn=pipeline_llm,
        post_optimizer_build_fn=register_moe_load_balancing_hook,
        state_dict_adapter=qwen3_state_dict_adapter(),
    )


def with_sum_reductions(parallelize_fn):
    """gloo has no ReduceOp.PREMUL_SUM, which FSDP uses once torchtitan sets a gradient divide
    factor; force plain SUM (torchtitan scales gradients by the global token count itself)."""

    def parallelize(model, **kwargs):
        from torch.distributed.fsdp import FSDPModule  # lazy: torch in the ranks only

        model = parallelize_fn(model, **kwargs)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
        return model

    return parallelize


_EXPERTS = "moe.routed_experts.inner_experts"


def qwen3_state_dict_adapter():
    """torchtitan's Qwen3StateDictAdapter with the MoE experts of a sharded model mapped through
    whole tensors.

    # UPSTREAM BUG: torchtitan 0.3.0 `Qwen3StateDictAdapter.to_hf` / `from_hf` split and re-stack
    # FSDP-sharded (DTensor) grouped expert weights per rank (`_get_local_experts_weights`,
    # `_concatenate_expert_weights_dtensor`); with 2 ranks (dp_shard 2) an `hf_load` of a
    # Hugging Face Qwen3-MoE checkpoint puts expert weights in the wrong places: the step-1 loss
    # was 0.22 away from transformers' on the same batch (1 rank: 7e-6). Here each sharded
    # `w1_EFD` / `w2_EDF` / `w3_EFD` is gathered (`full_tensor`) before the upstream adapter's
    # plain-tensor ("offline") path splits it into per-expert Hugging Face tensors, and the stacked
    # result is sharded again with the parameter's own mesh and placements (`distribute_tensor`).
    # Costs one all-gather of the expert weights at load and export time.
    # Test: tests/test_hf_moe.py::test_native_moe_loads_exports_and_reloads (2 ranks; fails without it).
    """
    from torch.distributed.tensor import DTensor, distribute_tensor  # lazy: torch in the ranks only
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter  # lazy: torchtitan in the ranks

    class Qwen3WholeExpertsStateDictAdapter(Qwen3StateDictAdapter):
        def to_hf(self, state_dict):
            self._sharded_experts = {k: v for k, v in state_dict.items() if _EXPERTS in k and isinstance(v, DTensor)}
            plain = {k: (v.full_tensor() if k in self._sharded_experts else v) for k, v in state_dict.items()}
            return super().to_hf(plain)

        def from_hf(self, hf_state_dict):
            out = super().from_hf(hf_state_dict)
            for key, like in getattr(self, "_sharded_experts", {}).items():
                if key in out and not isinstance(out[key], DTensor):
                    out[key] = distribute_tensor(out[key].to(like.dtype), like.device_mesh, like.placements)
            return out

    return Qwen3WholeExpertsStateDictAdapter
