"""torchtitan override `nki_rope`: `CosSinRoPE` -> `NKIRoPE`, which calls the `qwen3exp::rope` operator.

Activated by `kernels=nki_rope` (`kernels.rope.impl=nki`); `kernels.rope.fqns` narrows it to chosen
layers. What the launcher knows about it (its default nodes, its pre-launch checks) is in
`qwen3exp.kernels.nki_rope`; this is the torchtitan half. On Neuron the operator runs nkilib
`rope_hf`; elsewhere its PyTorch implementation, which is bit-identical to `CosSinRoPE`. The cache
is torchtitan's own (same buffer, same initialisation): without per-sample positions the op gets the
prefix `cache[:S]` (no gather); with torchtitan's per-document positions it gets `cache[positions]`
`[B, S, 2D]`, a layout `rope_hf` accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchtitan.config import derive, override
from torchtitan.models.common.rope import CosSinRoPE

import qwen3exp.kernels.rope  # noqa: F401  (registers torch.ops.qwen3exp.rope)
from qwen3exp.kernels.nki_rope import DEFAULT_FQNS


class NKIRoPE(CosSinRoPE):
    @dataclass(kw_only=True, slots=True)
    class Config(CosSinRoPE.Config):
        pass

    def forward(self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor | None = None):
        seq_len = query.shape[1]
        if positions is None:
            cache = self.cache[:seq_len]
        elif positions.shape[0] == 1:
            cache = self.cache[positions[0]]
        else:
            cache = self.cache[positions]
        return torch.ops.qwen3exp.rope(query, key, cache)


@override(
    target=CosSinRoPE.Config,
    fqns=DEFAULT_FQNS,
    exact=True,
    description="qwen3exp::rope operator (nkilib rope_hf on Neuron)",
)
def nki_rope(cfg: CosSinRoPE.Config) -> NKIRoPE.Config:
    if cfg.scaling != "none":
        raise ValueError(f"nki_rope supports unscaled RoPE only; this node uses scaling={cfg.scaling!r}")
    return derive(cfg, NKIRoPE.Config)
