"""The `qwen3exp::rope` operator: rotary position embedding with a packed cos|sin cache.

    q_out, k_out = torch.ops.qwen3exp.rope(q, k, cache, backward=False)

q `[B, S, Hq, D]`, k `[B, S, Hk, D]` (torchtitan's layout), cache `[S, 2D]` (shared by the batch) or
`[B, S, 2D]` (per-sample positions), cos in the first half and sin in the second: the layout of
torchtitan's `CosSinRoPE` cache, so `cache[:S]` needs no gather. Rotate-half convention:
`y = x * cos + rotate_half(x) * sin`. With `backward=True` the op applies the inverse rotation
(the transpose of the forward one), which is also its gradient: the autograd formula calls the
op itself with the flag flipped, saving only the cache (no gradient flows into the cache).

Implementations: on a Neuron device (when the Neuron packages import) nkilib `rope_hf`, which wants
`[B, H, S, D]`, so q/k are transposed inside the op; elsewhere PyTorch, computing in float32 for
16/32-bit inputs exactly as `CosSinRoPE` does (bit-identical results) and in float64 for float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qwen3exp.kernels import neuron


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_half_transposed(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], -x[..., :half]), dim=-1)


def _broadcast(cache: Tensor, head_dim: int, compute: torch.dtype) -> tuple[Tensor, Tensor]:
    c = cache.to(compute)
    c = c[None, :, None, :] if c.dim() == 2 else c[:, :, None, :]
    return c[..., :head_dim], c[..., head_dim:]


def rope_pytorch(q: Tensor, k: Tensor, cache: Tensor, backward: bool = False) -> tuple[Tensor, Tensor]:
    compute = torch.promote_types(q.dtype, torch.float32)
    cos, sin = _broadcast(cache, q.shape[-1], compute)

    def apply(x: Tensor) -> Tensor:
        xf = x.to(compute)
        if backward:  # transpose of the rotation: x * cos + rotate_half^T(x * sin)
            return ((xf * cos) + _rotate_half_transposed(xf * sin)).to(x.dtype)
        return ((xf * cos) + (_rotate_half(xf) * sin)).to(x.dtype)

    return apply(q), apply(k)


def rope_neuron(q: Tensor, k: Tensor, cache: Tensor, backward: bool = False) -> tuple[Tensor, Tensor]:
    lnc = neuron.lnc_from_env()
    q_bhsd = q.transpose(1, 2).contiguous()
    k_bhsd = k.transpose(1, 2).contiguous()
    # The kernel loads cos/sin tiles in the dtype of q.
    q_out, k_out = neuron.rope_hf(q_bhsd, k_bhsd, cache.to(q.dtype).contiguous(), backward=backward, lnc=lnc)
    return q_out.transpose(1, 2).contiguous(), k_out.transpose(1, 2).contiguous()


def _check(q: Tensor, k: Tensor, cache: Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"qwen3exp::rope wants q, k as [B, S, H, D], got {list(q.shape)} and {list(k.shape)}")
    B, S, _, D = q.shape
    if k.shape[0] != B or k.shape[1] != S or k.shape[3] != D:
        raise ValueError(f"q {list(q.shape)} and k {list(k.shape)} differ in batch, sequence or head dim")
    if D % 2:
        raise ValueError(f"head dim {D} is odd; rotate-half needs an even head dim")
    ok = (cache.dim() == 2 and tuple(cache.shape) == (S, 2 * D)) or (
        cache.dim() == 3 and tuple(cache.shape) == (B, S, 2 * D)
    )
    if not ok:
        raise ValueError(f"rope cache must be [S, 2D] = [{S}, {2 * D}] or [B, S, 2D], got {list(cache.shape)}")


@torch.library.custom_op("qwen3exp::rope", mutates_args=())
def rope(q: Tensor, k: Tensor, cache: Tensor, backward: bool = False) -> tuple[Tensor, Tensor]:
    _check(q, k, cache)
    if neuron.on_neuron(q):
        return rope_neuron(q, k, cache, backward)
    return rope_pytorch(q, k, cache, backward)


@rope.register_fake
def _(q: Tensor, k: Tensor, cache: Tensor, backward: bool = False) -> tuple[Tensor, Tensor]:
    _check(q, k, cache)
    return torch.empty_like(q), torch.empty_like(k)


def _setup_context(ctx, inputs, output) -> None:
    _, _, cache, backward = inputs
    ctx.save_for_backward(cache)
    ctx.backward_flag = backward


def _backward(ctx, grad_q: Tensor | None, grad_k: Tensor | None):
    (cache,) = ctx.saved_tensors
    gq, gk = rope(grad_q, grad_k, cache, not ctx.backward_flag)
    return gq, gk, None, None


rope.register_autograd(_backward, setup_context=_setup_context)
