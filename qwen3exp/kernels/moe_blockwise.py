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

Implementations: on a Neuron device nkilib's kernels (via `neuron`); elsewhere PyTorch
(`moe_pytorch`), which skips padding slots (they contribute exactly zero) and runs one grouped
matmul per projection over the slots' tokens sorted by expert, like torchtitan's `GroupedExperts`
(bit-identical in bfloat16).
The backward is an operator too (`qwen3exp::moe_blockwise_backward`), so both trace under
torch.compile / AOT autograd with fake tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qwen3exp.kernels import neuron
from qwen3exp.kernels.moe_pytorch import moe_backward_pytorch, moe_forward_pytorch


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


# ----------------------------------------------------------------------------------- operators
def _checkpoint_layout(n_blocks: int, block_size: int, width: int, like: Tensor, *, on_neuron: bool) -> Tensor:
    """An empty gate/up checkpoint `[N, 2, I, B]`. The kernel writes it contiguous; the PyTorch
    implementation stores it slot-major (`[N, B, 2, I]` in memory, the same logical layout) so that
    neither direction needs a transposing copy."""
    if on_neuron:
        return like.new_empty(n_blocks, 2, width, block_size)
    return like.new_empty(n_blocks, block_size, 2, width).permute(0, 2, 3, 1)


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
