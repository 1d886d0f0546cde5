"""The `qwen3exp::moe_blockwise` operator: dropless grouped experts (SwiGLU) over fixed-size blocks.

    out, gate_up_T, down_act = torch.ops.qwen3exp.moe_blockwise(
        hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, block_size)

The contract of nkilib's `moe_cte` (forward) and `blockwise_mm_bwd` (backward):
- `hidden [T+1, H]`: T token rows plus a last, all-zero padding row (index T). The projections
  run in the dtype of the weights (nkilib's `compute_dtype`); `out` and the hidden-state gradient
  come back in the dtype of `hidden`.
- `affinities [(T+1)*E, 1]`: the masked expert affinities, row `t*E + e` = weight of expert e for
  token t, 0 where t is not routed to e (and for the padding row).
- `gate_up [E, H, 2, I]` (gate at index 0, up at 1), `down [E, I, H]`.
- Routing metadata (`Routing`, built below): tokens grouped per expert into N blocks of
  `block_size` slots; `token_position_to_id [N*B]` names the token row of each slot (T = padding),
  `block_to_expert [N]` the expert of each block. Dropless: N is large enough for every token.
- `out[t] = sum_e affinities[t, e] * down_e(silu(x_t @ gate_e) * (x_t @ up_e))`, and the two
  checkpointed activations the backward reads: `gate_up_T [N, 2, I, B]` (gate and up projections
  before the activation, per block, transposed) and `down_act [N, B, H]` (down projection before
  the affinity); zero in padding slots.

Implementations: on a Neuron device nkilib's kernels (via `neuron`); elsewhere PyTorch, which skips
padding slots (they contribute exactly zero) and runs one grouped matmul per projection over the
slots' tokens sorted by expert, like torchtitan's `GroupedExperts` (bit-identical in bfloat16).
The backward is an operator too (`qwen3exp::moe_blockwise_backward`), so both trace under
torch.compile / AOT autograd with fake tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import Tensor

from qwen3exp.kernels import neuron


# ----------------------------------------------------------------------------- routing metadata
@dataclass(frozen=True)
class Routing:
    token_position_to_id: Tensor
    """[N*B] int32: token row of every block slot; T (the padding row) for empty slots."""
    block_to_expert: Tensor
    """[N] int32: expert of every block (unused trailing blocks: the last expert, all slots empty)."""
    affinities: Tensor
    """[(T+1)*E, 1]: masked affinities."""
    block_size: int


def max_blocks(num_items: int, num_experts: int, block_size: int) -> int:
    """Blocks needed in the worst case for `num_items` (token, expert) pairs: sum_e ceil(c_e / B) <=
    (items + E * (B - 1)) / B. A static bound, so the routing needs no host sync (Neuron compiles
    one graph per shape)."""
    return max(1, (num_items + num_experts * (block_size - 1)) // block_size)


def route(
    token_ids: Tensor, expert_ids: Tensor, scores: Tensor, *, num_tokens: int, num_experts: int, block_size: int
) -> Routing:
    """Blocks for M (token, expert, score) pairs: pairs grouped per expert (stable: a token keeps its
    order within an expert), each expert's pairs packed into ceil(count / B) blocks, padded."""
    device = expert_ids.device
    T, E, B = num_tokens, num_experts, block_size
    M = expert_ids.numel()
    N = max_blocks(M, E, B)
    expert_ids = expert_ids.reshape(-1).long()
    token_ids = token_ids.reshape(-1).long()
    order = torch.argsort(expert_ids, stable=True)
    e_sorted = expert_ids[order]
    counts = torch.zeros(E, dtype=torch.long, device=device).scatter_add_(0, expert_ids, torch.ones_like(expert_ids))
    blocks = (counts + B - 1) // B
    block_end = torch.cumsum(blocks, 0)
    first_block = block_end - blocks
    first_item = torch.cumsum(counts, 0) - counts
    rank = torch.arange(M, device=device) - first_item[e_sorted]
    slot = first_block[e_sorted] * B + rank
    positions = torch.full((N * B,), T, dtype=torch.int32, device=device)
    positions[slot] = token_ids[order].to(torch.int32)
    block_to_expert = torch.searchsorted(block_end, torch.arange(N, device=device), right=True)
    block_to_expert = block_to_expert.clamp(max=E - 1).to(torch.int32)
    affinities = torch.zeros((T + 1) * E, dtype=scores.dtype, device=device)
    affinities[token_ids * E + expert_ids] = scores.reshape(-1)
    return Routing(positions, block_to_expert, affinities.view(-1, 1), B)


def route_grouped(num_tokens_per_expert: Tensor, *, num_rows: int, block_size: int, dtype: torch.dtype) -> Routing:
    """Routing for rows already grouped by expert (torchtitan's `GroupedExperts` input): row r goes
    to its expert with affinity 1 (torchtitan's dispatcher applies the router scores in combine)."""
    E = num_tokens_per_expert.numel()
    device = num_tokens_per_expert.device
    experts = torch.repeat_interleave(
        torch.arange(E, device=device), num_tokens_per_expert.long(), output_size=num_rows
    )
    rows = torch.arange(num_rows, device=device)
    return route(
        rows,
        experts,
        torch.ones(num_rows, dtype=dtype, device=device),
        num_tokens=num_rows,
        num_experts=E,
        block_size=block_size,
    )


# --------------------------------------------------------------------------- PyTorch implementation
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


def _checkpoint_layout(n_blocks: int, block_size: int, width: int, like: Tensor, *, on_neuron: bool) -> Tensor:
    """An empty gate/up checkpoint `[N, 2, I, B]`. The kernel writes it contiguous; the PyTorch
    implementation stores it slot-major (`[N, B, 2, I]` in memory, the same logical layout) so that
    neither direction needs a transposing copy."""
    if on_neuron:
        return like.new_empty(n_blocks, 2, width, block_size)
    return like.new_empty(n_blocks, block_size, 2, width).permute(0, 2, 3, 1)


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


# ----------------------------------------------------------------------------------- operators
def _check(
    hidden: Tensor,
    affinities: Tensor,
    gate_up: Tensor,
    down: Tensor,
    positions: Tensor,
    block_to_expert: Tensor,
    block_size: int,
) -> None:
    T1, H = hidden.shape
    if gate_up.dim() != 4 or gate_up.shape[1] != H or gate_up.shape[2] != 2:
        raise ValueError(f"gate_up must be [E, H={H}, 2, I], got {list(gate_up.shape)}")
    E, _, _, I = gate_up.shape
    if tuple(down.shape) != (E, I, H):
        raise ValueError(f"down must be [E, I, H] = [{E}, {I}, {H}], got {list(down.shape)}")
    if tuple(affinities.shape) != (T1 * E, 1):
        raise ValueError(f"affinities must be [(T+1)*E, 1] = [{T1 * E}, 1], got {list(affinities.shape)}")
    if (
        block_size < 1
        or positions.dim() != 1
        or block_to_expert.dim() != 1
        or positions.shape[0] != block_to_expert.shape[0] * block_size
    ):
        raise ValueError(
            f"token_position_to_id [N*B] and block_to_expert [N] disagree with block_size {block_size}: "
            f"{list(positions.shape)} vs {list(block_to_expert.shape)}"
        )


@torch.library.custom_op("qwen3exp::moe_blockwise", mutates_args=())
def moe_blockwise(
    hidden: Tensor,
    affinities: Tensor,
    gate_up: Tensor,
    down: Tensor,
    token_position_to_id: Tensor,
    block_to_expert: Tensor,
    block_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    _check(hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, block_size)
    if neuron.on_neuron(hidden):
        return neuron.moe_cte(
            hidden,
            affinities,
            gate_up,
            down,
            token_position_to_id,
            block_to_expert,
            block_size=block_size,
            lnc=neuron.lnc_from_env(),
        )
    return moe_forward_pytorch(hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, block_size)


@moe_blockwise.register_fake
def _(hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, block_size):
    _check(hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, block_size)
    E, H, _, I = gate_up.shape
    N = block_to_expert.shape[0]
    return (
        hidden.new_empty(hidden.shape),
        _checkpoint_layout(N, block_size, I, gate_up, on_neuron=neuron.on_neuron(hidden)),
        gate_up.new_empty(N, block_size, H),
    )


@torch.library.custom_op("qwen3exp::moe_blockwise_backward", mutates_args=())
def moe_blockwise_backward(
    grad_out: Tensor,
    hidden: Tensor,
    affinities: Tensor,
    gate_up: Tensor,
    down: Tensor,
    gate_up_t: Tensor,
    down_act: Tensor,
    token_position_to_id: Tensor,
    block_to_expert: Tensor,
    block_size: int,
    affinity_grad: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    if neuron.on_neuron(hidden):
        return neuron.blockwise_mm_bwd(
            grad_out,
            hidden,
            affinities,
            gate_up,
            down,
            gate_up_t,
            down_act,
            token_position_to_id,
            block_to_expert,
            block_size=block_size,
            lnc=neuron.lnc_from_env(),
        )
    return moe_backward_pytorch(
        grad_out,
        hidden,
        affinities,
        gate_up,
        down,
        gate_up_t,
        down_act,
        token_position_to_id,
        block_to_expert,
        block_size,
        affinity_grad,
    )


@moe_blockwise_backward.register_fake
def _(
    grad_out,
    hidden,
    affinities,
    gate_up,
    down,
    gate_up_t,
    down_act,
    token_position_to_id,
    block_to_expert,
    block_size,
    affinity_grad=True,
):
    return (torch.empty_like(hidden), torch.empty_like(affinities), torch.empty_like(gate_up), torch.empty_like(down))


def _setup_context(ctx, inputs, output) -> None:
    hidden, affinities, gate_up, down, positions, block_to_expert, block_size = inputs
    _, gate_up_t, down_act = output
    ctx.mark_non_differentiable(gate_up_t, down_act)
    ctx.save_for_backward(hidden, affinities, gate_up, down, gate_up_t, down_act, positions, block_to_expert)
    ctx.block_size = block_size


def _backward(ctx, grad_out, _grad_gate_up_t, _grad_down_act):
    hidden, affinities, gate_up, down, gate_up_t, down_act, positions, block_to_expert = ctx.saved_tensors
    d_hidden, d_aff, d_gate_up, d_down = moe_blockwise_backward(
        grad_out.contiguous(),
        hidden,
        affinities,
        gate_up,
        down,
        gate_up_t,
        down_act,
        positions,
        block_to_expert,
        ctx.block_size,
        ctx.needs_input_grad[1],
    )
    return d_hidden, d_aff, d_gate_up, d_down, None, None, None


moe_blockwise.register_autograd(_backward, setup_context=_setup_context)
