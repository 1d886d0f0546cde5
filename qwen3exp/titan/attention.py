"""Document-masked SDPA attention for torchtitan 0.3.0 language models.

Why: torchtitan 0.3.0 rejects `attn_backend="sdpa"` for language models (its SDPA module only
knows `is_causal`, so packed documents would attend across boundaries), FlexAttention has no CPU
backward, and varlen needs flash attention. The Trainium walkthrough selects SDPA too. This module
keeps torchtitan's packed-document semantics: its Config subclasses `VarlenAttention.Config`, so the
trainer hands it per-document offsets (`VarlenMetadata`, built eagerly: no compiled block mask), and
the forward turns them into a dense block-causal mask for `F.scaled_dot_product_attention`.

`CausalSDPAttention` is the path without a mask (`qwen3exp.plan.attention_path`: one conversation per
sequence, or data.cross_document_attention=true): its Config is not a `VarlenAttention.Config`, so the
trainer builds no per-document offsets (which cost a host sync per step) and SDPA runs with
`is_causal=True`, torch's causal kernel, with no `[batch, seq, seq]` mask.

`DocumentMaskQwen3Model` is torchtitan's Qwen3Model whose `get_attention_masks` (called once per step
by the trainer and the validator) returns the dense mask itself, built from the positions on the
device: no per-document offsets (torchtitan's `create_varlen_metadata_for_document` loops over the
rows and reads a maximum back to the host every step, and the number of offsets changes the graph
per batch), one mask per step for every layer instead of one per layer, the same mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchtitan.models.common.attention import VarlenAttention, VarlenMetadata
from torchtitan.models.qwen3.model import Qwen3Model
from torchtitan.protocols.module import Module


def document_causal_mask(meta: VarlenMetadata, batch: int, seq_len: int, device) -> torch.Tensor:
    """[batch, seq_len, seq_len] bool: True where query i may attend key j (same document, j <= i)."""
    starts = torch.zeros(batch * seq_len + 1, dtype=torch.int32, device=device)
    starts[meta.cu_seq_q.to(device=device, dtype=torch.long)] = 1
    doc = torch.cumsum(starts[: batch * seq_len], 0).view(batch, seq_len)
    same_doc = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    return same_doc & causal


def positions_mask(positions: torch.Tensor) -> torch.Tensor:
    """[B, 1, S, S] bool, True where query i may attend key j: same document and j <= i. A document
    starts where its position is 0 (torchtitan's per-document positions); built on the device."""
    doc = torch.cumsum((positions == 0).to(torch.int32), dim=1)
    same_doc = doc[:, :, None] == doc[:, None, :]
    seq = positions.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=positions.device).tril()
    return (same_doc & causal)[:, None]


class DocumentMaskQwen3Model(Qwen3Model):
    @dataclass(kw_only=True, slots=True)
    class Config(Qwen3Model.Config):
        """torchtitan's Qwen3Model.Config; the model's attention masks are dense (`positions_mask`)."""

    def get_attention_masks(self, positions: torch.Tensor):
        return positions_mask(positions)


class DocumentSDPAttention(Module):
    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        """Subclassing VarlenAttention.Config makes the trainer build per-document offsets for us."""

    def __init__(self, config: Config) -> None:
        super().__init__()

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False, **kwargs):
        B, L = q_BLNH.shape[:2]
        q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
        if isinstance(attention_masks, torch.Tensor):  # DocumentMaskQwen3Model's, one per step
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_masks, scale=scale, enable_gqa=enable_gqa)
        elif isinstance(attention_masks, VarlenMetadata):  # torchtitan's own Qwen3Model
            mask = document_causal_mask(attention_masks, B, L, q.device)[:, None]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        else:  # no positions (e.g. a plain forward in a test): one causal document per row
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)


class CausalSDPAttention(Module):
    @dataclass(kw_only=True, slots=True)
    class Config(Module.Config):
        """A plain Module.Config: the trainer builds no attention masks for it."""

    def __init__(self, config: Config) -> None:
        super().__init__()

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False, **kwargs):
        q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)
