"""Kernel override `nki_rope` (`kernels=nki_rope`, i.e. `kernels.rope.impl=nki`): torchtitan's
`CosSinRoPE` nodes become `NKIRoPE`, which calls the `qwen3exp::rope` operator (`rope`: nkilib
`rope_hf` on Neuron through `neuron`, PyTorch elsewhere, bit-identical to `CosSinRoPE`).

What the launcher knows about it without torch: the section that activates it, its torchtitan
`@override` factory (in `qwen3exp.titan.nki_rope`: only qwen3exp.titan imports torchtitan), the
nodes it claims unless `kernels.rope.fqns` narrows them, and what it refuses before launch.
"""

from __future__ import annotations

from typing import Any

from qwen3exp.config.sections.kernels import RopeKernel
from qwen3exp.errors import Problem
from qwen3exp.kernels import neuron

SECTION = RopeKernel
IMPL = "nki"
FACTORY = "qwen3exp.titan.nki_rope.nki_rope"
DEFAULT_FQNS = ["model_spec.model.layers.*.attention.rope"]
LOCAL_ONLY = ("tp", "cp")
"""The operator gets local (non-sharded) tensors only: these parallelism degrees must be 1."""


def kwargs(section: RopeKernel) -> dict[str, Any]:
    return {}


def neuron_problems(exp, key: str, section: RopeKernel, lnc: int) -> list[Problem]:
    """rope_hf tiles the sequence: 128 rows per logical core."""
    m = neuron.ROPE_SEQ_TILE * lnc
    if not exp.training.seq_len % m:
        return []
    return [
        Problem(
            "training.seq_len",
            exp.training.seq_len,
            f"nkilib rope_hf needs a multiple of 128 x LNC = {m} (LNC={lnc})",
            f"a multiple of {m}",
            f"e.g. {max(m, exp.training.seq_len // m * m)}",
        )
    ]


def no_match_problem(key: str, candidates: list[str]) -> Problem | None:
    return None  # every Qwen3 layer has a CosSinRoPE node: the generic message says what is there
