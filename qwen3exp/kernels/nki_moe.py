"""Kernel override `nki_moe` (`kernels=nki_moe`, i.e. `kernels.moe.impl=nki`, `kernels.moe.block_size`):
torchtitan's `GroupedExperts` nodes become `BlockwiseExperts`, which calls the blockwise
`qwen3exp::moe_blockwise` operator (`moe_blockwise`: nkilib `moe_cte` / `blockwise_mm_bwd` on Neuron
through `neuron`, PyTorch elsewhere).

What the launcher knows about it without torch: the section that activates it, its torchtitan
`@override` factory (in `qwen3exp.titan.nki_moe`: only qwen3exp.titan imports torchtitan) and its
keyword arguments, the nodes it claims unless `kernels.moe.fqns` narrows them, and what it refuses
before launch.
"""

from __future__ import annotations

from typing import Any

from qwen3exp.config.sections.kernels import MoeKernel
from qwen3exp.errors import Problem, one_of
from qwen3exp.kernels import neuron

SECTION = MoeKernel
IMPL = "nki"
FACTORY = "qwen3exp.titan.nki_moe.nki_moe"
DEFAULT_FQNS = ["model_spec.model.layers.*.moe.routed_experts.inner_experts"]
LOCAL_ONLY = ("tp", "cp", "ep")
"""The operator gets local (non-sharded) tensors only: these parallelism degrees must be 1."""


def kwargs(section: MoeKernel) -> dict[str, Any]:
    return {"block_size": section.block_size}


def neuron_problems(exp, key: str, section: MoeKernel, lnc: int) -> list[Problem]:
    """nkilib's blockwise kernels have fixed block sizes, and the backward shards the hidden size over LNC."""
    problems = []
    if section.block_size not in neuron.MOE_BLOCK_SIZES:
        problems.append(
            Problem(
                f"{key}.block_size",
                section.block_size,
                "not a block size of nkilib's blockwise MoE kernels",
                one_of(neuron.MOE_BLOCK_SIZES),
            )
        )
    arch = exp.model.arch()
    if arch is not None and arch.dim % lnc:
        problems.append(
            Problem(
                "model.flavor",
                exp.model.flavor,
                f"hidden size {arch.dim} is not divisible by LNC={lnc} (blockwise_mm_bwd shards it)",
            )
        )
    return problems


def no_match_problem(key: str, candidates: list[str]) -> Problem | None:
    """No GroupedExperts node at all: the model is dense (also when the schema cannot know, flavor=auto)."""
    if candidates:
        return None
    return Problem(
        f"{key}.impl",
        IMPL,
        "the model is dense: no GroupedExperts node to replace",
        "torchtitan for dense models",
        "kernels=nki_moe needs an MoE flavor (tiny_moe, 30B-A3B, ...)",
    )
