"""The tensors of a Hugging Face Qwen3 checkpoint: names and shapes, from an `Arch`.

What the pre-launch checks compare a folder's safetensors headers against (`qwen3exp.plan.weight_files`).
"""

from __future__ import annotations

from qwen3exp.config.flavors import Arch


def hf_param_shapes(arch: Arch) -> dict[str, tuple[int, ...]]:
    """The tensors of the Hugging Face checkpoint that holds `arch` (names as published Qwen3
    safetensors spell them; MoE experts one by one). lm_head.weight is listed only when untied."""
    d, hd = arch.dim, arch.head_dim
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, d), "model.norm.weight": (d,)}
    if not arch.tied:
        out["lm_head.weight"] = (arch.vocab_size, d)
    for i in range(arch.n_layers):
        p = f"model.layers.{i}."
        out.update(
            {
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (arch.n_heads * hd, d),
                p + "self_attn.k_proj.weight": (arch.n_kv_heads * hd, d),
                p + "self_attn.v_proj.weight": (arch.n_kv_heads * hd, d),
                p + "self_attn.o_proj.weight": (d, arch.n_heads * hd),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
            }
        )
        if arch.moe is None:
            f = arch.hidden_dim
            out.update(
                {
                    p + "mlp.gate_proj.weight": (f, d),
                    p + "mlp.up_proj.weight": (f, d),
                    p + "mlp.down_proj.weight": (d, f),
                }
            )
        else:
            f = arch.moe.hidden_dim
            out[p + "mlp.gate.weight"] = (arch.moe.num_experts, d)
            for e in range(arch.moe.num_experts):
                q = f"{p}mlp.experts.{e}."
                out.update(
                    {q + "gate_proj.weight": (f, d), q + "up_proj.weight": (f, d), q + "down_proj.weight": (d, f)}
                )
    return out
