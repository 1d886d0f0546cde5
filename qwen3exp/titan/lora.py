"""LoRA on the native Qwen3 model with torchtitan 0.3.0's own converter (`torchtitan.components.lora`).

The converter rewrites the model config tree before the model is built: each targeted `Linear`
becomes a `LoRALinear` (base weight frozen, trainable `lora_a` (rank x in) and `lora_b`
(out x rank, zeros), output `W x + alpha / rank * B A x`), and every other module's own parameters
are frozen at build time, so the optimizer and FSDP's gradients hold only the adapters.

PEFT's target names map to torchtitan's Qwen3 modules (the keys of torchtitan's
`Qwen3StateDictAdapter`): q_proj -> attention.qkv_linear.wq, k_proj -> attention.qkv_linear.wk,
v_proj -> attention.qkv_linear.wv, o_proj -> attention.wo, gate_proj -> feed_forward.w1,
down_proj -> feed_forward.w2, up_proj -> feed_forward.w3. The model is built with separate q/k/v
projections (no fused `wqkv`); torchtitan builds wk and wv from one config (`wkv`), so before
converting, each layer's `QKVLinear` config becomes a `SplitQKVLinear` config with a config of its
own for wk and for wv (`split_kv`): k_proj and v_proj get adapters independently, any subset of
the seven is PEFT's own, and the module names (and state dict keys) stay wq / wk / wv.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from qwen3exp.config.sections.peft import Lora
from qwen3exp.plan.lora_base import Base
from qwen3exp.run import rundir
from qwen3exp.titan import hf_export

TITAN_NAMES = {
    "q_proj": "wq",
    "k_proj": "wk",
    "v_proj": "wv",
    "o_proj": "wo",
    "gate_proj": "w1",
    "down_proj": "w2",
    "up_proj": "w3",
}
"""PEFT's target name -> the last segment of torchtitan's config FQN that the converter matches."""


def convert(model_config, peft: Lora):
    """The model config with LoRA adapters on `peft.targets` and everything else frozen."""
    targets = sorted({TITAN_NAMES[t] for t in peft.targets})
    config = _converter_cls().Config(rank=peft.rank, alpha=peft.alpha, target_modules=targets, dropout=peft.dropout)
    return config.build().convert(split_kv(model_config))


def split_kv(model_config):
    """`model_config` with each layer's `QKVLinear` config replaced by a `SplitQKVLinear` config:
    wk and wv each built from a config of its own (copies of `wkv`)."""
    from torchtitan.models.common.attention import QKVLinear  # lazy: torchtitan in the ranks only

    split = _split_qkv_cls()
    for layer in model_config.layers:
        qkv = layer.attention.qkv_linear
        if type(qkv) is QKVLinear.Config:
            kept = {f.name: getattr(qkv, f.name) for f in fields(qkv) if f.init}
            layer.attention.qkv_linear = split.Config(**kept, wk=replace(qkv.wkv), wv=replace(qkv.wkv))
    return model_config


@cache
def _split_qkv_cls():
    """torchtitan's `QKVLinear` (three projections, its forward) whose wk and wv come from separate
    configs `wk` and `wv`, so the LoRA converter (which matches a config's name) can target one of
    them. It stays a `QKVLinear.Config`, so torchtitan's tensor-parallel plan
    (`set_qkv_linear_sharding`) still sets `wkv`'s sharding, which wk and wv take when built."""
    from torchtitan.models.common.attention import BaseQKVLinear, QKVLinear  # lazy: torchtitan in the ranks only

    class SplitQKVLinear(QKVLinear):
        @dataclass(kw_only=True, slots=True)
        class Config(QKVLinear.Config):
            wk: Any
            """k_proj's config (a `Linear.Config`, or a LoRA one)."""
            wv: Any
            """v_proj's config."""

        def __init__(self, config) -> None:
            BaseQKVLinear.__init__(self, config)
            sharding = config.wkv.sharding_config
            self.wq = config.wq.build()
            self.wk = replace(config.wk, sharding_config=sharding).build()
            self.wv = replace(config.wv, sharding_config=sharding).build()

    return SplitQKVLinear


def keep_base_frozen(parallelize_fn):
    """The parallelize function, then every parameter but the adapters' frozen again.

    # UPSTREAM BUG: torchtitan 0.3.0's `Module._spmd_distribute_state` (protocols/module.py)
    # re-registers each distributed parameter as `nn.Parameter(tensor)`, whose requires_grad is
    # True: the LoRA converter's frozen base becomes trainable again when the model is parallelized,
    # and AdamW updates every weight (the exported base weights moved by about lr per step). Frozen
    # here after parallelizing, before the optimizer is built.
    # Test: tests/test_lora.py::test_tiny_lora_trains_adapters_only_and_peft_loads_them (the merged
    # export's untargeted weights are bit-identical to the loaded ones).
    """

    def parallelize(model, **kwargs):
        model = parallelize_fn(model, **kwargs)
        for name, param in model.named_parameters():
            if ".lora_a." not in name and ".lora_b." not in name:
                param.requires_grad_(False)
        return model

    return parallelize


@cache
def _converter_cls():
    """torchtitan's LoRAConverter whose adapters also apply `dropout` to their input, as PEFT's
    `lora_dropout` does (torchtitan 0.3.0's LoRALinear has no dropout)."""
    from torchtitan.components.lora import LoRAConverter, _get_lora_cls  # lazy: torchtitan in the ranks only

    class DropoutLoRAConverter(LoRAConverter):
        @dataclass(kw_only=True, slots=True)
        class Config(LoRAConverter.Config):
            dropout: float = 0.0
            """PEFT's lora_dropout."""

        def _make_lora_config(self, cfg):
            base = super()._make_lora_config(cfg)
            if self.config.dropout == 0.0:
                return base
            owner = _dropout_cls(_get_lora_cls(cfg._owner))
            kept = {f.name: getattr(base, f.name) for f in fields(base) if f.init}
            return owner.Config(**kept, dropout=self.config.dropout)

    return DropoutLoRAConverter


@cache
def _dropout_cls(lora_cls):
    """A LoRALinear subclass with dropout on the adapters' input (functional: no extra module)."""
    import torch.nn.functional as F  # lazy: torch in the ranks only

    class DropoutLoRALinear(lora_cls):  # type: ignore[valid-type, misc]
        @dataclass(kw_only=True, slots=True)
        class Config(lora_cls.Config):  # type: ignore[name-defined]
            dropout: float = 0.0

        def __init__(self, config) -> None:
            super().__init__(config)
            self._lora_dropout = config.dropout

        def forward(self, input):
            base_out = super(lora_cls, self).forward(input)
            x = F.dropout(input, p=self._lora_dropout, training=self.training)
            return base_out + self._lora_scaling * self.lora_b(self.lora_a(x))

    DropoutLoRALinear.__name__ = DropoutLoRALinear.__qualname__ = f"Dropout{lora_cls.__name__}"
    return DropoutLoRALinear


def is_adapter(fqn: str) -> bool:
    return ".lora_a." in fqn or ".lora_b." in fqn


def merged(state_dict: dict, *, scaling: float, dtype) -> dict:
    """The model's weights with each adapter merged into its base (W + scaling * B A), adapters left
    out, in `dtype`: what `PeftModel.merge_and_unload()` gives. A sharded weight stays sharded
    alike (the adapters' product is computed whole, one projection at a time)."""
    from torch.distributed.tensor import DTensor, distribute_tensor  # lazy: torch in the ranks only

    def whole(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    out = {}
    for fqn, value in state_dict.items():
        if is_adapter(fqn):
            continue
        head = fqn.removesuffix(".weight")
        a, b = state_dict.get(f"{head}.lora_a.weight"), state_dict.get(f"{head}.lora_b.weight")
        if a is not None and b is not None:
            delta = scaling * (whole(b).float() @ whole(a).float())
            if isinstance(value, DTensor):
                delta = distribute_tensor(delta.to(value.dtype), value.device_mesh, value.placements)
            value = (value.float() + delta.float()) if not isinstance(value, DTensor) else value + delta
        out[fqn] = value.to(dtype) if value.is_floating_point() else value
    return out


def adapter_json(peft: Lora, base: Base | None) -> str:
    """What each export's adapter_config.json needs (the checkpoint manager's `adapter`): the LoRA
    keys and the named base model (`qwen3exp.plan.lora_base`; None: the export holds the base)."""
    named = {"base": base.name_or_path, "revision": base.revision} if base is not None else {}
    return json.dumps(
        {"rank": peft.rank, "alpha": peft.alpha, "dropout": peft.dropout, "targets": peft.targets} | named
    )


def save_adapter(state_dict: dict, folder: Path, adapter: dict, dtype) -> None:
    """Gather every LoRA weight (all ranks, in one order) and let rank 0 write the PEFT folder
    (`<folder>/adapter`), whose base_model_name_or_path is the named base, else `folder` (the
    export's copy of the base)."""
    import torch.distributed as dist  # lazy: torch in the ranks only
    from safetensors.torch import save_file  # lazy: the same
    from torch.distributed.tensor import DTensor  # lazy: the same

    tensors = {}
    for fqn in sorted(k for k in state_dict if is_adapter(k)):
        value = state_dict[fqn]
        full = value.full_tensor() if isinstance(value, DTensor) else value
        tensors[hf_export.peft_key(fqn)] = full.detach().to(dtype).cpu().contiguous()
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    out = folder / rundir.ADAPTER
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    lora_keys = {k: adapter[k] for k in ("rank", "alpha", "dropout", "targets")}
    base = adapter.get("base") or str(folder)
    config = hf_export.adapter_config(**lora_keys, base=base, revision=adapter.get("revision"))
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
