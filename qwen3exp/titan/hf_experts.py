"""MoE experts between transformers' fused tensors and Hugging Face safetensors' per-expert tensors.

The state dict adapter of model=hf (`HFQwen3StateDictAdapter`): hf_load reads published Qwen3-MoE
checkpoints through it, and the export writes what transformers, vLLM and the native backend read.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torchtitan.experiments.transformers_modeling_backend.state_dict_adapter import HFTransformerStateDictAdapter

# Hugging Face safetensors keep one tensor per expert (`mlp.experts.<j>.gate_proj.weight` ...);
# transformers 5 fuses them in the module (`mlp.experts.gate_up_proj` [E, 2I, D] = stack over j of
# cat(gate_j, up_j), `mlp.experts.down_proj` [E, D, I]) and converts at load and save time
# (transformers.conversion_mapping, "qwen2_moe", used by qwen3_moe). torchtitan's checkpointer reads
# and writes the safetensors keys with the model's own names, so the adapter maps the experts.
_FUSED = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<name>gate_up_proj|down_proj)$")
_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<j>\d+)\.(?P<name>gate_proj|up_proj|down_proj)\.weight$")


def _full(value: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor  # lazy: only where a state dict is converted

    return value.full_tensor() if isinstance(value, DTensor) else value


def experts_to_hf(state_dict: dict[str, Any], keep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fused expert tensors -> one tensor per expert (Hugging Face safetensors keys); other keys
    unchanged. A sharded (DTensor) expert tensor is gathered first. `keep`, when given, records each
    fused key's original value (its placement) for `experts_from_hf`."""
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        m = _FUSED.match(key)
        if m is None:
            out[key] = value
            continue
        if keep is not None:
            keep[key] = value
        full = _full(value).detach()
        prefix = m["prefix"]
        if m["name"] == "gate_up_proj":
            gate, up = full.chunk(2, dim=1)
            for j in range(full.shape[0]):
                out[f"{prefix}.{j}.gate_proj.weight"] = gate[j].clone()
                out[f"{prefix}.{j}.up_proj.weight"] = up[j].clone()
        else:
            for j in range(full.shape[0]):
                out[f"{prefix}.{j}.down_proj.weight"] = full[j].clone()
    return out


def experts_from_hf(hf_state_dict: dict[str, Any], like: dict[str, Any] | None = None) -> dict[str, Any]:
    """One tensor per expert -> the fused tensors of transformers' module; with `like` (the values
    `experts_to_hf` kept), each fused tensor gets the placement of the parameter it loads into."""
    from torch.distributed.tensor import DTensor, distribute_tensor  # lazy: only where a state dict is converted

    groups: dict[tuple[str, str], dict[int, dict[str, torch.Tensor]]] = {}
    out: dict[str, Any] = {}
    for key, value in hf_state_dict.items():
        m = _PER_EXPERT.match(key)
        if m is None:
            out[key] = value
            continue
        fused = "down_proj" if m["name"] == "down_proj" else "gate_up_proj"
        groups.setdefault((m["prefix"], fused), {}).setdefault(int(m["j"]), {})[m["name"]] = value
    for (prefix, fused), experts in groups.items():
        order = [experts[j] for j in sorted(experts)]
        if fused == "gate_up_proj":
            value = torch.stack([torch.cat([e["gate_proj"], e["up_proj"]], dim=0) for e in order])
        else:
            value = torch.stack([e["down_proj"] for e in order])
        key = f"{prefix}.{fused}"
        target = (like or {}).get(key)
        if isinstance(target, DTensor):
            value = distribute_tensor(value.to(target.dtype), target.device_mesh, target.placements)
        out[key] = value
    return out


class HFQwen3StateDictAdapter(HFTransformerStateDictAdapter):
    """The backend's adapter (a `model.` prefix, tied embeddings) with MoE experts mapped between
    transformers' fused tensors and the per-expert tensors of Hugging Face safetensors, both ways
    (hf_load reads published Qwen3-MoE checkpoints; the export writes what transformers, vLLM and
    the native backend read)."""

    def __init__(self, model_config, hf_assets_path):
        super().__init__(model_config, hf_assets_path)
        self._fused: dict[str, Any] = {}

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        self._fused = {}
        return experts_to_hf(super().to_hf(state_dict), keep=self._fused)

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        return super().from_hf(experts_from_hf(hf_state_dict, like=self._fused))
