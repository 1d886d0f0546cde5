"""LoRA on the Transformers backend (`model=hf`): adapters on transformers' own `nn.Linear` projections.

torchtitan 0.3.0's LoRA converter (`torchtitan.components.lora`, used for model=native in
`qwen3exp.titan.lora`) rewrites a model *config* tree of torchtitan `Linear.Config`s before the
model is built. The backend's config is one `HFTransformerModel.Config` (a transformers
`PretrainedConfig`) with no per-module configs: the q_proj ... down_proj it builds are plain
`torch.nn.Linear`s made by transformers, which the converter never sees. So here each targeted
projection is replaced, after the model is built (on the meta device) and before it is
parallelized, by a `LoraLinear`: the same frozen weight (and bias), plus trainable `lora_a`
(rank x in, kaiming-uniform as PEFT) and `lora_b` (out x rank, zeros), computing
`W x + alpha / rank * B A dropout(x)`, exactly PEFT's LoRA layer. The modules keep transformers'
names (`model.model.layers.N.self_attn.q_proj.lora_a.weight`), so `qwen3exp.titan.lora`'s export
(`is_adapter`, `merged`, `save_adapter`) applies unchanged, and the adapters are trained with FSDP
like every other parameter (replicated over tensor parallelism, which LoRA on model=hf refuses).
"""

from __future__ import annotations

import functools
import math

import spmd_types as spmd  # type: ignore[import-untyped]
import torch
import torch.nn.functional as F
from torch import nn
from torchtitan.models.common.decoder_sharding import dense_param_placement
from torchtitan.protocols.sharding import ShardingConfig

from qwen3exp.config.sections.peft import Lora
from qwen3exp.titan import lora
from qwen3exp.titan.hf_experts import HFQwen3StateDictAdapter

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
"""PEFT's targets that live in a decoder layer's `self_attn` (the others in its `mlp`)."""


class LoraLinear(nn.Linear):
    """A transformers `nn.Linear` (its weight and bias, frozen) with a LoRA adapter: PEFT's math."""

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float, dropout: float) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        for param in self.parameters():
            param.requires_grad_(False)
        like = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_a = nn.Linear(base.in_features, rank, bias=False, **like)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False, **like)
        self.scaling = alpha / rank
        self.dropout = dropout

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = F.dropout(input, p=self.dropout, training=self.training)
        return F.linear(input, self.weight, self.bias) + self.scaling * self.lora_b(self.lora_a(x))

    def reset_adapter(self) -> None:
        """PEFT's init: A kaiming-uniform (a = sqrt 5, nn.Linear's default), B zeros (the adapter adds 0)."""
        nn.init.kaiming_uniform_(self.lora_a.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b.weight)


def add_adapters(model: nn.Module, peft: Lora) -> int:
    """Replace every targeted projection of every decoder layer of the backend's model by a
    `LoraLinear` and freeze every other parameter; returns the projections converted."""
    converted = 0
    for index, layer in model.get_submodule("model.model.layers").named_children():
        for target in peft.targets:
            owner = getattr(layer, "self_attn" if target in ATTENTION else "mlp")
            base = getattr(owner, target, None)
            if type(base) is not nn.Linear:
                # An MoE layer's experts are fused tensors (MLP targets are refused before launch).
                raise ValueError(f"peft.targets: layer {index} has no nn.Linear {target} ({type(base).__name__})")
            adapter = LoraLinear(base, rank=peft.rank, alpha=peft.alpha, dropout=peft.dropout)
            _replicate_adapters(adapter)
            setattr(owner, target, adapter)
            converted += 1
    for name, param in model.named_parameters():
        if not lora.is_adapter(name):
            param.requires_grad_(False)
    return converted


def _replicate_adapters(adapter: LoraLinear) -> None:
    """The sharding configs the backend's Module protocol needs on every module with parameters (as
    `qwen3exp.titan.hf_moe.replicate_hf_moe_blocks` gives transformers' MoE blocks): the adapters
    are replicated over tensor parallelism and sharded by FSDP like every other weight."""
    for sub in (adapter.lora_a, adapter.lora_b):
        sub._sharding_config = ShardingConfig(state_shardings={"weight": dense_param_placement(tp=spmd.R)})


def init_adapters(model: nn.Module) -> int:
    """`reset_adapter` of every `LoraLinear` (after the backend's init, which leaves them as
    `to_empty` made them); returns how many."""
    adapters = [m for m in model.modules() if isinstance(m, LoraLinear)]
    with torch.no_grad():
        for adapter in adapters:
            adapter.reset_adapter()
    return len(adapters)


def with_adapters(parallelize_fn, peft: Lora):
    """`parallelize_fn` after `add_adapters` (the model is built, on the meta device), then every
    weight but the adapters frozen again (`qwen3exp.titan.lora.keep_base_frozen`: the same
    upstream bug re-enables gradients when the backend distributes its parameters; without it
    tests/test_lora.py::test_tiny_lora_trains_adapters_only_and_peft_loads_them[hf] fails: the
    merged export's embedding moved)."""

    @functools.wraps(parallelize_fn)
    def parallelize(model, **kwargs):
        add_adapters(model, peft)
        return parallelize_fn(model, **kwargs)

    return lora.keep_base_frozen(parallelize)


class HFLoraStateDictAdapter(HFQwen3StateDictAdapter):
    """The backend's state dict adapter without the LoRA weights: a Hugging Face checkpoint has
    none (hf_load leaves the initialised adapters as they are), and an export writes them to the
    PEFT folder only (`qwen3exp.titan.lora.save_adapter`)."""

    def to_hf(self, state_dict):
        return super().to_hf({k: v for k, v in state_dict.items() if not lora.is_adapter(k)})
