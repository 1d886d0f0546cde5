"""A user kernel attached through torchtitan's override registry (the README's worked example).

    PYTHONPATH=examples python -m qwen3exp kernels=nki_rope \
        'kernels.overrides=[{target: my_kernels.silu_mul_ffn, fqns: [model_spec.model.layers.1.feed_forward], kwargs: {upcast: true}}]'

1. The kernel, as a PyTorch operator (`torch.library.custom_op` + fake + autograd), so that it
   works in eager mode, under torch.compile and in training. Replace the body of `silu_mul` with a
   call to your kernel (Triton, NKI via `torch_neuronx.wrap_nki(kernel)[lnc](...)`, CUDA, ...).
2. A module calling it: a subclass of the module it replaces, so parameters, initialisation and
   checkpoints stay those of the stock module.
3. The factory: `@override(target=<the replaced Config>, fqns=[default selection])` returning the
   new Config (`derive` copies the shared fields). Its keyword arguments come from `kwargs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torchtitan.config import derive, override
from torchtitan.models.common.feed_forward import FeedForward


@torch.library.custom_op("my_kernels::silu_mul", mutates_args=())
def silu_mul(gate: torch.Tensor, up: torch.Tensor, upcast: bool = False) -> torch.Tensor:
    if upcast:
        return (F.silu(gate.float()) * up.float()).to(gate.dtype)
    return F.silu(gate) * up


@silu_mul.register_fake
def _(gate, up, upcast=False):
    return torch.empty_like(gate)


def _setup(ctx, inputs, output):
    gate, up, upcast = inputs
    ctx.save_for_backward(gate, up)


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    d_gate = torch.ops.aten.silu_backward(grad * up, gate)
    return d_gate, grad * F.silu(gate), None


silu_mul.register_autograd(_backward, setup_context=_setup)


class SiluMulFeedForward(FeedForward):
    @dataclass(kw_only=True, slots=True)
    class Config(FeedForward.Config):
        upcast: bool = False

    def __init__(self, config: Config):
        super().__init__(config)
        self.upcast = config.upcast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(silu_mul(self.w1(x), self.w3(x), self.upcast))


@override(target=FeedForward.Config, fqns=["model_spec.model.layers.*.feed_forward"], exact=True,
          description="SwiGLU with the my_kernels::silu_mul operator")
def silu_mul_ffn(cfg: FeedForward.Config, upcast: bool = False) -> SiluMulFeedForward.Config:
    return derive(cfg, SiluMulFeedForward.Config, upcast=upcast)
