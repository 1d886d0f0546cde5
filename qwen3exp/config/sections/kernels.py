"""The `kernels` section: which torchtitan overrides replace stock modules (RoPE, MoE experts, your own)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from qwen3exp.config.sections.base import PosInt, Strict

FqnGlobs = Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]


class RopeKernel(Strict):
    impl: Literal["torchtitan", "nki"] = "torchtitan"
    """torchtitan: the stock `CosSinRoPE`. nki: the `qwen3exp::rope` operator (nkilib `rope_hf` on
    Neuron, its PyTorch implementation elsewhere), swapped in by torchtitan's override registry."""
    fqns: FqnGlobs | None = None
    """Limit the override to these nodes (fnmatch globs on torchtitan FQNs, which start with
    `model_spec.model.`, e.g. `model_spec.model.layers.[01].attention.rope`); null: every layer."""


class MoeKernel(Strict):
    impl: Literal["torchtitan", "nki"] = "torchtitan"
    """torchtitan: the stock `GroupedExperts`. nki: the blockwise `qwen3exp::moe_blockwise` operator
    (nkilib `moe_cte` / `blockwise_mm_bwd` on Neuron, its PyTorch implementation elsewhere)."""
    fqns: FqnGlobs | None = None
    """Limit the override to these nodes (torchtitan FQN globs); null: every MoE layer's experts."""
    block_size: PosInt = 128
    """Tokens per block of the blockwise kernel (Neuron: 128, 256, 512 or 1024)."""


class UserOverride(Strict):
    target: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")]
    """`module.function` of a torchtitan `@override` factory (importable on every rank)."""
    fqns: FqnGlobs | None = None
    """Replace the factory's own node selection by these torchtitan FQN globs; null: keep it."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the factory (torchtitan's `(target, kwargs)` import entry)."""


class Kernels(Strict):
    name: str = "default"
    """The kernels group option this came from (for the record)."""
    rope: RopeKernel = RopeKernel()
    moe: MoeKernel = MoeKernel()
    overrides: list[UserOverride] = Field(default_factory=list)
    """Your own torchtitan overrides, applied together with the ones above."""

    @property
    def active(self) -> bool:
        """Whether any torchtitan override is applied (the default kernels apply none)."""
        return self.rope.impl != "torchtitan" or self.moe.impl != "torchtitan" or bool(self.overrides)
