"""The PyTorch implementation of the `qwen3exp::moe_blockwise` operator and of its backward
(`qwen3exp.kernels.moe_blockwise` holds the contract and the operators; they call these off Neuron).

Padding slots are skipped (they contribute exactly zero); each projection is one grouped matmul
over the slots' tokens sorted by expert, like torchtitan's `GroupedExperts`, and the backward runs
the operations autograd runs through it, so the bfloat16 results agree bit for bit. The gate/up
checkpoint is stored slot-major (`[N, B, 2, I]` in memory, the logical `[N, 2, I, B]` layout), so
that neither direction needs a transposing copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import Tensor


def _aligned(t: Tensor) -> bool:
    return all(st * t.element_size() % 16 == 0 for st, n in zip(t.stride(), t.shape, strict=True) if st != 1 and n > 1)


def _grouped_mm(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """a [M, K] rows grouped by `offs`, b [G, K, N] -> [M, N]; or a [K, M], b [M, N] -> [G, K, N]."""
    fast = a.dtype in (torch.float32, torch.bfloat16, torch.float16) and (
        a.device.type == "cpu" or a.dtype == torch.bfloat16
    )
    if fast and _aligned(a) and _aligned(b):  # torch._grouped_mm wants 16-byte aligned strides
        return torch._grouped_mm(a, b, offs=offs)
    # float64 (gradcheck) and devices without a grouped GEMM for this dtype: one matmul per group.
    bounds = [0, *offs.tolist()]
    if b.dim() == 3:
        return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(pairwise(bounds))], 0)
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in pairwise(bounds)], 0)


@dataclass(frozen=True)
class _Slots:
    slots: Tensor  # [M] indices of non-padding slots, sorted by expert
    pad_slots: Tensor  # indices of padding slots
    tokens: Tensor  # [M] token row of each
    experts: Tensor  # [M] expert of each
    offs: Tensor  # [E] int32 cumulative counts per expert
    in_order: bool  # tokens == 0..M-1 (rows already grouped by expert): no gather / scatter needed


def _slots(positions: Tensor, block_to_expert: Tensor, num_rows: int, num_experts: int, block_size: int) -> _Slots:
    is_pad = positions == num_rows - 1
    slot_expert = block_to_expert.long().repeat_interleave(block_size)
    slots = (~is_pad).nonzero().squeeze(1)
    experts = slot_expert[slots]
    order = torch.argsort(experts, stable=True)
    slots, experts = slots[order], experts[order]
    offs = torch.cumsum(torch.bincount(experts, minlength=num_experts), 0).to(torch.int32)
    tokens = positions[slots].long()
    in_order = bool(torch.equal(tokens, torch.arange(tokens.numel(), device=tokens.device)))
    return _Slots(slots, is_pad.nonzero().squeeze(1), tokens, experts, offs, in_order)


def _rows(t: Tensor, s: _Slots) -> Tensor:
    return t[: s.tokens.numel()] if s.in_order else t[s.tokens]


def _sum_to_rows(out: Tensor, s: _Slots, op, *args) -> Tensor:
    """out [T+1, H] = op(*args) ([M, H], one row per slot) summed per token; the padding row stays 0.
    Rows already in order are written in place (no scatter, no extra copy or cast)."""
    M = s.tokens.numel()
    if s.in_order:
        op(*args, out=out[:M])
        out[M:].zero_()
        return out
    return out.zero_().index_add_(0, s.tokens, op(*args).to(out.dtype))


def _like(param: Tensor, value: Tensor) -> Tensor:
    """`value` with the strides of `param` (what the fake implementation promises: empty_like)."""
    return value if value.stride() == param.stride() else torch.empty_like(param).copy_(value)


def moe_forward_pytorch(
    hidden: Tensor,
    affinities: Tensor,
    gate_up: Tensor,
    down: Tensor,
    positions: Tensor,
    block_to_expert: Tensor,
    block_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    T1, H = hidden.shape
    E, _, _, I = gate_up.shape
    N, B = block_to_expert.shape[0], block_size
    s = _slots(positions, block_to_expert, T1, E, B)
    x = _rows(hidden, s).to(gate_up.dtype)
    gate = _grouped_mm(x, gate_up[:, :, 0, :], s.offs)
    up = _grouped_mm(x, gate_up[:, :, 1, :], s.offs)
    d = _grouped_mm(F.silu(gate) * up, down, s.offs)
    a = affinities.view(T1, E)[s.tokens, s.experts].to(d.dtype)
    out = _sum_to_rows(torch.empty_like(hidden), s, torch.mul, d, a[:, None])
    gu_ckpt = gate_up.new_empty(N * B, 2, I).index_fill_(0, s.pad_slots, 0)
    gu_ckpt[s.slots, 0] = gate
    gu_ckpt[s.slots, 1] = up
    d_ckpt = gate_up.new_empty(N * B, H).index_fill_(0, s.pad_slots, 0)
    d_ckpt[s.slots] = d
    return out, gu_ckpt.view(N, B, 2, I).permute(0, 2, 3, 1), d_ckpt.view(N, B, H)


def moe_backward_pytorch(
    grad_out: Tensor,
    hidden: Tensor,
    affinities: Tensor,
    gate_up: Tensor,
    down: Tensor,
    gate_up_t: Tensor,
    down_act: Tensor,
    positions: Tensor,
    block_to_expert: Tensor,
    block_size: int,
    affinity_grad: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    T1, H = hidden.shape
    E, _, _, I = gate_up.shape
    s = _slots(positions, block_to_expert, T1, E, block_size)
    M = s.tokens.numel()
    gu = gate_up_t.permute(0, 3, 1, 2).reshape(-1, 2, I)  # a view of the slot-major checkpoint
    gate, up = gu[:, 0][s.slots], gu[:, 1][s.slots]
    a = affinities.view(T1, E)[s.tokens, s.experts]
    g = _rows(grad_out, s)
    d_aff = torch.zeros(T1 * E, dtype=affinities.dtype, device=affinities.device)
    if affinity_grad:
        d = down_act.reshape(-1, H)[s.slots]
        d_aff.index_put_(
            (s.tokens * E + s.experts,), (g.float() * d.float()).sum(-1).to(affinities.dtype), accumulate=True
        )
    # Same operations as autograd through torchtitan's GroupedExperts (silu_backward, per-expert
    # grouped GEMMs, casts), so that the bfloat16 results agree bit for bit.
    gd = torch.mul(g, a[:, None].to(g.dtype), out=g.new_empty(M, H, dtype=down.dtype))
    act = F.silu(gate)
    dh = _grouped_mm(gd, down.transpose(-2, -1), s.offs)
    d_up = dh * act
    d_gate = torch.ops.aten.silu_backward(dh * up, gate)
    x = _rows(hidden, s).to(gate_up.dtype)
    # Weight gradients computed as [E, I, H] / [E, H, I] (the layouts autograd produces for
    # GroupedExperts' transposed weights), returned with the strides of the weights given.
    d_gate_up = torch.empty_like(gate_up)
    d_gate_up[:, :, 0, :] = _grouped_mm(d_gate.t(), x, s.offs).transpose(-2, -1)
    d_gate_up[:, :, 1, :] = _grouped_mm(d_up.t(), x, s.offs).transpose(-2, -1)
    d_down = _like(down, _grouped_mm(gd.t(), act * up, s.offs).transpose(-2, -1))
    # Summed in the dtype of `hidden`, as autograd sums the gradients of the two casts of x.
    dx_gate = _grouped_mm(d_gate, gate_up[:, :, 0, :].transpose(-2, -1), s.offs).to(hidden.dtype)
    dx_up = _grouped_mm(d_up, gate_up[:, :, 1, :].transpose(-2, -1), s.offs)
    d_hidden = _sum_to_rows(torch.empty_like(hidden), s, torch.add, dx_gate, dx_up)
    d_aff = d_aff.view_as(affinities)
    return d_hidden, d_aff, d_gate_up, d_down
