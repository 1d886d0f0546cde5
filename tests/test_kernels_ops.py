"""The qwen3exp operators against the torchtitan modules they replace (PyTorch implementations, CPU).

- qwen3exp::rope == CosSinRoPE bit for bit (float32 q and k, shared and per-sample positions);
- qwen3exp::moe_blockwise == GroupedExperts (output and gradients) on uneven routing: some experts
  empty, some with more tokens than a block; float32 within 1e-5, and bfloat16 (GroupedExperts' own
  compute dtype, the one training uses) bit for bit;
- the routing metadata is dropless and padded as the nkilib kernels expect;
- torch.library.opcheck passes for every operator; gradcheck (and gradgradcheck for RoPE) in float64.
"""

from __future__ import annotations

import pytest
import torch

from qwen3exp.kernels.moe_blockwise import (
    max_blocks,
    moe_blockwise,
    moe_blockwise_backward,
    route,
    route_grouped,
)
from qwen3exp.kernels.rope import rope


# ------------------------------------------------------------------------------------ RoPE
def _cos_sin_rope(head_dim=32, max_seq_len=512):
    from torchtitan.models.common import CosSinRoPE

    return CosSinRoPE.Config(dim=head_dim, max_seq_len=max_seq_len, theta=1e6).build()


def test_rope_equals_cos_sin_rope_exactly():
    torch.manual_seed(0)
    stock = _cos_sin_rope()
    q, k = torch.randn(2, 128, 4, 32), torch.randn(2, 128, 2, 32)
    want_q, want_k = stock(q, k)
    got_q, got_k = rope(q, k, stock.cache[:128])
    assert (got_q - want_q).abs().max().item() == 0.0
    assert (got_k - want_k).abs().max().item() == 0.0
    # torchtitan's per-document positions (the trainer passes them): the op gets cache[positions].
    positions = torch.stack([torch.arange(128), torch.cat([torch.arange(50), torch.arange(78)])])
    want_q, want_k = stock(q, k, positions)
    got_q, got_k = rope(q, k, stock.cache[positions])
    assert (got_q - want_q).abs().max().item() == 0.0
    assert (got_k - want_k).abs().max().item() == 0.0


def test_rope_backward_is_the_inverse_rotation_and_the_cache_gets_no_gradient():
    torch.manual_seed(0)
    stock = _cos_sin_rope(head_dim=16)
    q = torch.randn(1, 64, 2, 16, requires_grad=True)
    k = torch.randn(1, 64, 1, 16, requires_grad=True)
    cache = stock.cache[:64].clone().requires_grad_()
    oq, ok = rope(q, k, cache)
    back_q, back_k = rope(oq, ok, cache, True)  # rotation, then its inverse: the identity
    torch.testing.assert_close(back_q, q, rtol=0, atol=1e-6)
    (oq.square().sum() + ok.sum()).backward()
    assert cache.grad is None
    ref_q, ref_k = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    sq, sk = stock(ref_q, ref_k)
    (sq.square().sum() + sk.sum()).backward()
    torch.testing.assert_close(q.grad, ref_q.grad, rtol=0, atol=1e-6)
    torch.testing.assert_close(k.grad, ref_k.grad, rtol=0, atol=1e-6)


def test_rope_gradcheck_float64():
    torch.manual_seed(0)
    cache = _cos_sin_rope(head_dim=8, max_seq_len=16).cache[:6].double()
    q = torch.randn(2, 6, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 6, 1, 8, dtype=torch.float64, requires_grad=True)
    fn = lambda a, b: rope(a, b, cache)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k))
    assert torch.autograd.gradgradcheck(fn, (q, k))
    per_sample = cache[torch.tensor([[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 2]])]
    assert torch.autograd.gradcheck(lambda a, b: rope(a, b, per_sample), (q, k))


@pytest.mark.parametrize("backward", [False, True])
def test_rope_opcheck(backward):
    cache = _cos_sin_rope(head_dim=16).cache[:32].clone()
    q = torch.randn(2, 32, 4, 16, requires_grad=True)
    k = torch.randn(2, 32, 2, 16, requires_grad=True)
    torch.library.opcheck(rope, (q, k, cache, backward))
    torch.library.opcheck(rope, (q.detach().bfloat16(), k.detach().bfloat16(), cache, backward))


def test_rope_rejects_mismatched_cache():
    with pytest.raises(ValueError, match=r"rope cache must be \[S, 2D\]"):
        rope(torch.randn(1, 8, 2, 4), torch.randn(1, 8, 2, 4), torch.randn(8, 4))


# ---------------------------------------------------------------------------------------- MoE
E, D, FF, BLOCK = 5, 32, 48, 16
COUNTS = [0, 2 * BLOCK + 3, 7, 0, BLOCK]  # empty, over two blocks, partial, empty, exactly one block


def _grouped_experts():
    from torchtitan.models.common.moe import GroupedExperts

    torch.manual_seed(0)
    ge = GroupedExperts.Config(dim=D, hidden_dim=FF, num_experts=E).build()
    for p in ge.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return ge


def _stock(ge, x, counts, *, float32: bool):
    """GroupedExperts.forward; float32=True lifts its hard-coded bfloat16 casts (the only way to run
    torchtitan's module in float32: its forward calls .bfloat16() on inputs and weights)."""
    if not float32:
        return ge(x, counts)
    original = torch.Tensor.bfloat16
    torch.Tensor.bfloat16 = lambda self: self
    try:
        return ge(x, counts)
    finally:
        torch.Tensor.bfloat16 = original


def _blockwise(ge, x, counts, dtype):
    R = x.shape[0]
    r = route_grouped(counts, num_rows=R, block_size=BLOCK, dtype=dtype)
    hidden = torch.cat([x, x.new_zeros(1, D)])
    gate_up = torch.stack((ge.w1_EFD.transpose(-2, -1), ge.w3_EFD.transpose(-2, -1)), 2).to(dtype)
    down = ge.w2_EDF.transpose(-2, -1).to(dtype)
    return moe_blockwise(hidden, r.affinities, gate_up, down, r.token_position_to_id, r.block_to_expert, BLOCK)[0][:R]


def _grads(ge, x):
    out = [x.grad.clone()] + [p.grad.clone() for p in (ge.w1_EFD, ge.w2_EDF, ge.w3_EFD)]
    x.grad = None
    for p in ge.parameters():
        p.grad = None
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_moe_blockwise_matches_grouped_experts(dtype):
    ge = _grouped_experts()
    counts = torch.tensor(COUNTS)
    x = torch.randn(sum(COUNTS), D, requires_grad=True)
    want = _stock(ge, x, counts, float32=dtype == torch.float32)
    grad_out = torch.randn_like(want)
    want.backward(grad_out)
    want_grads = _grads(ge, x)
    got = _blockwise(ge, x, counts, dtype)
    got.backward(grad_out)
    got_grads = _grads(ge, x)
    tol = 1e-5 if dtype == torch.float32 else 0.0
    assert (got - want).abs().max().item() <= tol
    for name, a, b in zip(["x", "w1", "w2", "w3"], got_grads, want_grads, strict=True):
        assert (a - b).abs().max().item() <= tol, name


def test_routing_metadata_is_dropless_and_padded():
    counts = torch.tensor(COUNTS)
    R = sum(COUNTS)
    r = route_grouped(counts, num_rows=R, block_size=BLOCK, dtype=torch.float32)
    N = max_blocks(R, E, BLOCK)
    assert r.token_position_to_id.shape == (N * BLOCK,) and r.block_to_expert.shape == (N,)
    assert r.affinities.shape == ((R + 1) * E, 1)
    slots = r.token_position_to_id.view(N, BLOCK)
    # every row exactly once (dropless); everything else points at the padding row R
    real = slots[slots != R]
    assert sorted(real.tolist()) == list(range(R))
    # expert e owns ceil(count / B) blocks, in expert order, its rows in their original order
    owned = [int(b) for b in r.block_to_expert[: sum(-(-c // BLOCK) for c in COUNTS)]]
    assert owned == [e for e, c in enumerate(COUNTS) for _ in range(-(-c // BLOCK))]
    expert_of_row = torch.repeat_interleave(torch.arange(E), counts)
    for n in range(N):
        rows = slots[n][slots[n] != R]
        assert (expert_of_row[rows] == r.block_to_expert[n]).all()
        assert (rows.diff() > 0).all()
    aff = r.affinities.view(R + 1, E)
    assert (aff[torch.arange(R), expert_of_row] == 1).all() and aff.sum() == R and (aff[R] == 0).all()


def _topk_problem(dtype=torch.float64, T=24, dim=D, ff=FF, block=BLOCK):
    """Top-2 routing with uneven load: expert 1 takes most tokens (over a block), expert 3 none."""
    torch.manual_seed(1)
    first = torch.where(torch.arange(T) < T - 4, 1, 2)
    second = torch.where(torch.arange(T) % 2 == 0, 0, 4)
    ids = torch.stack([first, second], 1)
    scores = torch.rand(T, 2, dtype=dtype)
    r = route(
        torch.arange(T).repeat_interleave(2),
        ids.reshape(-1),
        scores.reshape(-1),
        num_tokens=T,
        num_experts=E,
        block_size=block,
    )
    hidden = torch.cat([torch.randn(T, dim, dtype=dtype), torch.zeros(1, dim, dtype=dtype)])
    gate_up = torch.randn(E, dim, 2, ff, dtype=dtype) * 0.2
    down = torch.randn(E, ff, dim, dtype=dtype) * 0.2
    return ids, scores, r, hidden, gate_up, down


def test_moe_blockwise_top_k_semantics():
    """out[t] = sum_k score[t, k] * SwiGLU_{expert[t, k]}(x[t]) (the moe_cte contract), plus the
    checkpointed activations in nkilib's layouts."""
    ids, scores, r, hidden, gate_up, down = _topk_problem()
    out, gate_up_t, down_act = moe_blockwise(
        hidden, r.affinities, gate_up, down, r.token_position_to_id, r.block_to_expert, BLOCK
    )
    T = ids.shape[0]
    want = torch.zeros(T + 1, D, dtype=hidden.dtype)
    for t in range(T):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = torch.nn.functional.silu(hidden[t] @ gate_up[e, :, 0]) * (hidden[t] @ gate_up[e, :, 1])
            want[t] += scores[t, k] * (h @ down[e])
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    N = r.block_to_expert.shape[0]
    assert gate_up_t.shape == (N, 2, FF, BLOCK) and down_act.shape == (N, BLOCK, D)
    slot = int((r.token_position_to_id == 5).nonzero()[0])  # token 5's first slot
    n, j = divmod(slot, BLOCK)
    e = int(r.block_to_expert[n])
    torch.testing.assert_close(gate_up_t[n, 0, :, j], hidden[5] @ gate_up[e, :, 0])
    pad = int((r.token_position_to_id == T).nonzero()[0])
    assert gate_up_t[pad // BLOCK, :, :, pad % BLOCK].abs().sum() == 0


def test_moe_blockwise_gradcheck_float64():
    ids, _, r, hidden, gate_up, down = _topk_problem(T=10, dim=4, ff=3, block=4)
    assert int((ids == 1).sum()) > 4  # expert 1 spans two blocks of 4
    inputs = [t.clone().requires_grad_() for t in (hidden, r.affinities, gate_up, down)]
    fn = lambda h, a, g, d: moe_blockwise(h, a, g, d, r.token_position_to_id, r.block_to_expert, 4)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs)


def test_moe_ops_opcheck():
    _, _, r, hidden, gate_up, down = _topk_problem(dtype=torch.float32, T=12)
    args = (
        hidden.requires_grad_(),
        r.affinities.requires_grad_(),
        gate_up.requires_grad_(),
        down.requires_grad_(),
        r.token_position_to_id,
        r.block_to_expert,
        BLOCK,
    )
    torch.library.opcheck(moe_blockwise, args)
    out, gu, da = moe_blockwise(*args)
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    torch.library.opcheck(
        moe_blockwise_backward, (torch.randn_like(out), *detached[:4], gu.detach(), da.detach(), *detached[4:])
    )
    # bfloat16 weights (the compute dtype training uses) with float32 hidden states
    bf = (
        hidden.detach(),
        r.affinities.detach().bfloat16(),
        gate_up.detach().bfloat16(),
        down.detach().bfloat16(),
        r.token_position_to_id,
        r.block_to_expert,
        BLOCK,
    )
    torch.library.opcheck(moe_blockwise, bf)


def test_blockwise_experts_module_equals_grouped_experts():
    """The override's module: same parameters, same bf16 numerics as the stock module."""
    from qwen3exp.titan.nki_moe import BlockwiseExperts, nki_moe

    ge = _grouped_experts()
    be = nki_moe(ge.__class__.Config(dim=D, hidden_dim=FF, num_experts=E), block_size=BLOCK).build()
    assert isinstance(be, BlockwiseExperts) and be.block_size == BLOCK
    be.load_state_dict(ge.state_dict())
    assert set(be.state_dict()) == set(ge.state_dict())
    counts = torch.tensor(COUNTS)
    x = torch.randn(sum(COUNTS), D)
    assert torch.equal(be(x, counts), ge(x, counts))


def test_override_modules_compile_with_fullgraph():
    """torchtitan compiles every block with fullgraph=True: the routing metadata traces with static
    shapes and the operators have fake implementations (aot_eager: tracing, no code generation)."""
    from torchtitan.models.common.moe import GroupedExperts

    from qwen3exp.titan.nki_moe import nki_moe
    from qwen3exp.titan.nki_rope import nki_rope

    torch._dynamo.reset()
    ge = _grouped_experts()
    be = nki_moe(GroupedExperts.Config(dim=D, hidden_dim=FF, num_experts=E), block_size=BLOCK).build()
    be.load_state_dict(ge.state_dict())
    counts = torch.tensor(COUNTS)
    x = torch.randn(sum(COUNTS), D, requires_grad=True)
    compiled = torch.compile(be, backend="aot_eager", fullgraph=True)
    out = compiled(x, counts)
    assert torch.equal(out, ge(x, counts))
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0

    stock = _cos_sin_rope(head_dim=16)
    nki = nki_rope(stock.config).build()
    q, k = torch.randn(2, 64, 2, 16), torch.randn(2, 64, 1, 16)
    positions = torch.cat([torch.arange(20), torch.arange(44)]).expand(2, 64)
    got = torch.compile(nki, backend="aot_eager", fullgraph=True)(q, k, positions)
    want = stock(q, k, positions)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
