"""Qwen3 architectures as plain numbers: torchtitan's flavors and our tiny ones (a Hugging Face
config.json is read into one by `qwen3exp.config.hf_config`).

Plain data so that composing, validating and planning never import torch or torchtitan. The
numbers of torchtitan's flavors are copied from `torchtitan.models.qwen3.qwen3_configs` (0.3.0);
`tests/test_flavors.py` builds every one with torchtitan and fails if they drift.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True)
class MoEArch:
    num_experts: int
    top_k: int
    hidden_dim: int
    """Hidden size of one expert's SwiGLU (HF `moe_intermediate_size`)."""


@dataclass(frozen=True, kw_only=True)
class Arch:
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    """Dense SwiGLU hidden size (HF `intermediate_size`); unused when every layer is MoE."""
    vocab_size: int
    tied: bool
    rope_theta: float
    max_seq_len: int
    """Length of the RoPE cache, i.e. the longest sequence the model accepts."""
    norm_eps: float = 1e-6
    moe: MoEArch | None = None

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def param_counts(self) -> tuple[int, int]:
        """(total, active per token) parameter counts, counted as torchtitan builds the model."""
        attn = self.dim * self.head_dim * (self.n_heads + 2 * self.n_kv_heads)  # wq, wk, wv
        attn += self.n_heads * self.head_dim * self.dim  # wo
        attn += 2 * self.head_dim  # q_norm, k_norm
        norms = 2 * self.dim
        if self.moe is None:
            ffn_total = ffn_active = 3 * self.dim * self.hidden_dim
        else:
            one_expert = 3 * self.dim * self.moe.hidden_dim
            router = self.dim * self.moe.num_experts
            ffn_total = self.moe.num_experts * one_expert + router
            ffn_active = self.moe.top_k * one_expert + router
        embed = self.vocab_size * self.dim
        head = 0 if self.tied else self.vocab_size * self.dim
        base = embed + head + self.dim  # final norm
        per_layer = attn + norms
        total = base + self.n_layers * (per_layer + ffn_total)
        active = base + self.n_layers * (per_layer + ffn_active)
        return total, active

    def reduced(self, *, n_layers: int | None, num_experts: int | None, top_k: int | None) -> Arch:
        """The walkthrough's reductions (fewer layers, fewer experts, smaller top-k)."""
        arch = self if n_layers is None else replace(self, n_layers=n_layers)
        if arch.moe is not None and (num_experts is not None or top_k is not None):
            arch = replace(
                arch,
                moe=replace(
                    arch.moe,
                    num_experts=num_experts if num_experts is not None else arch.moe.num_experts,
                    top_k=top_k if top_k is not None else arch.moe.top_k,
                ),
            )
        return arch


def _dense(
    n_layers, dim, n_heads, n_kv_heads, hidden_dim, *, tied, vocab=151936, head_dim=128, max_seq_len=40960, theta=1e6
) -> Arch:
    return Arch(
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        hidden_dim=hidden_dim,
        vocab_size=vocab,
        tied=tied,
        rope_theta=theta,
        max_seq_len=max_seq_len,
    )


def _moe(
    n_layers, dim, n_heads, n_kv_heads, experts, top_k, moe_hidden, *, vocab=151936, max_seq_len=40960, theta=1e6
) -> Arch:
    # torchtitan's MoE flavors make every layer MoE; the dense hidden size is then unused.
    return Arch(
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=128,
        hidden_dim=moe_hidden,
        vocab_size=vocab,
        tied=False,
        rope_theta=theta,
        max_seq_len=max_seq_len,
        moe=MoEArch(num_experts=experts, top_k=top_k, hidden_dim=moe_hidden),
    )


# Flavors that torchtitan 0.3.0 defines (name -> architecture).
TORCHTITAN_FLAVORS: dict[str, Arch] = {
    "debugmodel": _dense(8, 256, 16, 8, 3072, tied=True, vocab=2048, max_seq_len=4096),
    "debugmodel_non_fused_qkv": _dense(8, 256, 16, 8, 3072, tied=True, vocab=2048, max_seq_len=4096),
    "0.6B": _dense(28, 1024, 16, 8, 3072, tied=True),
    "1.7B": _dense(28, 2048, 16, 8, 6144, tied=True),
    "4B": _dense(36, 2560, 32, 8, 9728, tied=True),
    "8B": _dense(36, 4096, 32, 8, 12288, tied=False),
    "14B": _dense(40, 5120, 40, 8, 17408, tied=False),
    "32B": _dense(64, 5120, 64, 8, 25600, tied=False),
    "debugmodel_moe": _moe(8, 256, 16, 8, 64, 8, 768, vocab=2048, max_seq_len=4096),
    "30B-A3B": _moe(48, 2048, 32, 4, 128, 8, 768),
    "235B-A22B": _moe(94, 4096, 64, 4, 128, 8, 1536, theta=5e6),
}

# Flavors of our own, sized to train in seconds on a laptop CPU with the bundled tokenizer
# (vocab 2048). 'tiny' has ~0.9M parameters.
QWEN3EXP_FLAVORS: dict[str, Arch] = {
    "tiny": Arch(
        n_layers=2,
        dim=128,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        hidden_dim=384,
        vocab_size=2048,
        tied=True,
        rope_theta=1e6,
        max_seq_len=4096,
    ),
    "tiny_moe": Arch(
        n_layers=2,
        dim=128,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        hidden_dim=128,
        vocab_size=2048,
        tied=False,
        rope_theta=1e6,
        max_seq_len=4096,
        moe=MoEArch(num_experts=8, top_k=2, hidden_dim=128),
    ),
}

FLAVORS: dict[str, Arch] = {**TORCHTITAN_FLAVORS, **QWEN3EXP_FLAVORS}


def arch_differences(a: Arch, b: Arch) -> list[tuple[str, object, object]]:
    """(field, a's value, b's value) for every architecture field that differs (max_seq_len excepted:
    it only sizes the RoPE cache)."""
    out = []
    for name in (
        "n_layers",
        "dim",
        "n_heads",
        "n_kv_heads",
        "head_dim",
        "vocab_size",
        "tied",
        "rope_theta",
        "norm_eps",
    ):
        if getattr(a, name) != getattr(b, name):
            out.append((name, getattr(a, name), getattr(b, name)))
    if (a.moe is None) != (b.moe is None):
        out.append(("moe", a.moe is not None, b.moe is not None))
    elif a.moe is None:
        if a.hidden_dim != b.hidden_dim:
            out.append(("hidden_dim", a.hidden_dim, b.hidden_dim))
    else:
        for name in ("num_experts", "top_k", "hidden_dim"):
            if getattr(a.moe, name) != getattr(b.moe, name):
                out.append((f"moe.{name}", getattr(a.moe, name), getattr(b.moe, name)))
    return out
