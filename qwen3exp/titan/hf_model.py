"""Hugging Face Transformers v5 as torchtitan's modeling backend (`model=hf`), adapted for qwen3exp.

torchtitan 0.3.0's `experiments/transformers_modeling_backend` builds an `AutoModelForCausalLM`
class from `hf_model`'s config.json on the meta device, parallelizes it and initialises it with
`init_states`. qwen3exp adds these, each for a stated reason:
1. RoPE after meta init (UPSTREAM BUG, below): the rotary `inv_freq` buffer is recomputed.
2. Attention. The backend routes attention through FlexAttention with a document-causal
   BlockMask; FlexAttention has no CPU backward and Trainium selects SDPA. `attention=sdpa` uses
   transformers' own SDPA attention with a dense document-causal mask built from the per-document
   positions, so packed documents never attend to each other (the same mask as the flex path).
   Where no document boundary needs a mask (`qwen3exp.plan.attention_path`), `HFQwen3CausalSdpaModel`
   passes no mask at all: transformers' SDPA then calls `is_causal=True`.
3. Packed documents: the flavor uses `attn_mask_type="block_causal"` (the backend's default
   `causal` lets documents packed into one row attend to each other).
4. No code from model folders (UPSTREAM BUG, below): the backend passes `trust_remote_code=True`
   to transformers; qwen3exp refuses a config.json that asks for remote code and loads the config
   with `trust_remote_code=False`, so a model folder is read as data in every rank.
5. peft=lora: adapters on transformers' projections (`qwen3exp.titan.hf_lora`: torchtitan's LoRA
   converter rewrites torchtitan `Linear` configs, which this backend's model has none of).
FSDP over gloo (plain SUM reductions) is applied by the caller, as for the native model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torchtitan.experiments.transformers_modeling_backend import TitanModelConfig, model as _backend
from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel
from transformers.configuration_utils import PretrainedConfig

from qwen3exp.plan.attention_path import AttentionPath
from qwen3exp.titan import hf_lora
from qwen3exp.titan.attention import positions_mask
from qwen3exp.titan.hf_experts import HFQwen3StateDictAdapter
from qwen3exp.titan.hf_moe import moe_load_balancing_hook, with_hf_moe_blocks
from qwen3exp.titan.model import with_sum_reductions


class RemoteCodeRefused(ValueError):
    """A model folder's config.json asks transformers to run Python shipped in the folder."""


def refuse_remote_code(hf_model: str) -> None:
    """Raise `RemoteCodeRefused` when `hf_model`'s config.json has an `auto_map` (the key through
    which transformers imports Python from the folder). Reads the JSON only."""
    config_dict, _ = PretrainedConfig.get_config_dict(hf_model)
    auto_map = config_dict.get("auto_map")
    if auto_map:
        raise RemoteCodeRefused(
            f"the config.json of {hf_model!r} has auto_map = {auto_map!r}, which asks "
            "transformers to import and run Python files shipped in the model folder. qwen3exp reads "
            "model folders as data and never runs code from them. Use a folder whose config.json "
            "names a model_type that transformers ships (e.g. qwen3) and has no auto_map."
        )


@contextmanager
def local_code_only(hf_model: str) -> Iterator[None]:
    """While active, the backend's `AutoConfig.from_pretrained` of `hf_model` runs with
    `trust_remote_code=False`: the model type of its config.json is, for that call, one the backend
    itself lists as never to be trusted with remote code.

    # UPSTREAM BUG: torchtitan 0.3.0 `HFTransformerModel.Config.update_from_config` calls
    # `AutoConfig.from_pretrained(hf_model, trust_remote_code=True)` for every model_type outside a
    # two-entry denylist (`_REMOTE_CONFIG_DENYLIST`), so a config.json with `auto_map:
    # {"AutoConfig": "x.Cls"}` makes transformers import x.py from the model folder (arbitrary code)
    # in every rank. The decision is a local variable of that method with no parameter to turn it
    # off; the narrowest seam is the denylist it reads: for the duration of the call it also holds
    # this folder's model_type (read as the method reads it), so exactly that one decision is False
    # and AutoConfig stays transformers' own. A folder that needs remote code then fails in
    # transformers with "contains custom code"; `refuse_remote_code` runs first for a clear message.
    # Test: tests/test_security.py::test_hf_adapter_forces_trust_remote_code_false (fails without this).
    """
    config_dict, _ = PretrainedConfig.get_config_dict(hf_model)
    real = _backend._REMOTE_CONFIG_DENYLIST
    _backend._REMOTE_CONFIG_DENYLIST = real | {config_dict.get("model_type", "")}
    try:
        yield
    finally:
        _backend._REMOTE_CONFIG_DENYLIST = real


def fix_rotary_inv_freq(model: torch.nn.Module) -> int:
    """Recompute every HF rotary embedding's `inv_freq` (and `original_inv_freq`) from its config;
    returns the number of rotary modules fixed.

    # UPSTREAM BUG: torchtitan 0.3.0 `HFTransformerModel.init_states` recomputes `inv_freq` only for
    # rotary modules that have a `rope_init_fn` attribute. transformers 5.x rotary embeddings
    # (Qwen3RotaryEmbedding, ...) no longer keep one: they call `compute_default_rope_parameters` or
    # `ROPE_INIT_FUNCTIONS[rope_type]` in `__init__` only. After meta-device init + `to_empty()`
    # the non-persistent `inv_freq` buffer holds uninitialised memory (often zeros), so RoPE is
    # silently off and a loaded checkpoint gives a different loss than in transformers.
    # Test: tests/test_hf_backend.py::test_rotary_inv_freq_workaround (fails without this).
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # lazy: only when a model is initialised

    fixed = 0
    for module in model.modules():
        buffer = getattr(module, "inv_freq", None)
        if not isinstance(buffer, torch.Tensor) or getattr(module, "rope_init_fn", None) is not None:
            continue
        rope_type = getattr(module, "rope_type", "default")
        init_fn = (
            getattr(module, "compute_default_rope_parameters", None)
            if rope_type == "default"
            else ROPE_INIT_FUNCTIONS.get(rope_type)
        )
        if init_fn is None:
            continue
        device = buffer.device
        inv_freq, scaling = init_fn(module.config)  # exactly as the module's __init__ calls it
        with torch.no_grad():
            buffer.copy_(inv_freq.to(device=device, dtype=buffer.dtype))
            original = getattr(module, "original_inv_freq", None)
            if isinstance(original, torch.Tensor):
                original.copy_(inv_freq.to(device=device, dtype=original.dtype))
        module.attention_scaling = scaling  # a float, as the module's __init__ sets it
        fixed += 1
    return fixed


class HFQwen3Model(HFTransformerModel):
    """The backend's model with RoPE initialised correctly (flex attention), loading its
    config.json without remote code."""

    @dataclass(kw_only=True, slots=True, init=False)
    class Config(HFTransformerModel.Config):
        # An explicit __init__: transformers' PretrainedConfig.__init_subclass__ replaces a
        # subclass's inherited __init__ with a generated one that rejects `model_config`.
        def __init__(self, model_config, **kwargs):
            HFTransformerModel.Config.__init__(self, model_config, **kwargs)

        def update_from_config(self, *, config=None, **kwargs):
            # The backend's only load of the HF config (see `local_code_only`).
            refuse_remote_code(getattr(config, "hf_model", ""))
            with local_code_only(getattr(config, "hf_model", "")):
                return HFTransformerModel.Config.update_from_config(self, config=config, **kwargs)

    def init_states(self, *, buffer_device: torch.device | None = None) -> None:
        HFTransformerModel.init_states(self, buffer_device=buffer_device)
        fix_rotary_inv_freq(self.model)
        hf_lora.init_adapters(self.model)  # peft=lora: the backend's init leaves them unset


class HFQwen3SdpaModel(HFQwen3Model):
    """transformers' SDPA attention with a dense document-causal mask (CPU, Trainium)."""

    @dataclass(kw_only=True, slots=True, init=False)
    class Config(HFQwen3Model.Config):
        def __init__(self, model_config, **kwargs):
            HFTransformerModel.Config.__init__(self, model_config, **kwargs)

        def _configure_hf_attention(self):
            # Select transformers' built-in "sdpa" instead of the backend's flex shim. The
            # underscore field is what transformers reads; the injected arg survives
            # update_from_config (which reloads the HF config with this implementation).
            self._titan_injected_model_args["attn_implementation"] = "sdpa"
            # Attributes of the backend's Config (which mypy cannot see: torchtitan is untyped), not
            # new slots of this empty subclass.
            self.attn_implementation = "sdpa"  # type: ignore[misc]
            self._attn_implementation = "sdpa"  # type: ignore[misc]

    def get_attention_masks(self, positions: torch.Tensor):
        return positions_mask(positions)  # the native SDPA's mask, as dense


CAUSAL_SDPA = "qwen3exp_causal_sdpa"
"""transformers' own SDPA attention function under a name of its own: transformers builds masks only for
the implementations it knows (`masking_utils._preprocess_mask_arguments`), so with no mask given it
builds none, and reads no positions to find packed sequences (a host sync); SDPA gets is_causal=True."""


class HFQwen3CausalSdpaModel(HFQwen3SdpaModel):
    """transformers' SDPA attention with `is_causal=True` and no mask (one document per sequence, or
    data.cross_document_attention=true)."""

    @dataclass(kw_only=True, slots=True, init=False)
    class Config(HFQwen3SdpaModel.Config):
        def __init__(self, model_config, **kwargs):
            HFTransformerModel.Config.__init__(self, model_config, **kwargs)

        def _configure_hf_attention(self):
            from transformers import AttentionInterface  # lazy: with the model only
            from transformers.integrations.sdpa_attention import sdpa_attention_forward  # lazy: the same

            AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)  # transformers' public registry
            self._titan_injected_model_args["attn_implementation"] = CAUSAL_SDPA
            self.attn_implementation = CAUSAL_SDPA  # type: ignore[misc]
            self._attn_implementation = CAUSAL_SDPA  # type: ignore[misc]

    def get_attention_masks(self, positions: torch.Tensor):
        return None


def hf_model_config(*, attention: str, causal: bool = False):
    """`causal`: the SDPA path without a mask (`qwen3exp.plan.attention_path`)."""
    cls = HFQwen3SdpaModel if attention == "sdpa" else HFQwen3Model
    cls = HFQwen3CausalSdpaModel if causal else cls
    # Every architecture field stays None so AutoConfig's values (config.json) are used as-is.
    return cls.Config(model_config=TitanModelConfig(attn_mask_type="block_causal"))


def hf_model_spec(*, attention: AttentionPath, force_sum_reductions: bool, lora=None):
    """torchtitan's model spec; `lora` (a `peft=lora` section): LoRA adapters on transformers'
    projections, the base frozen (`qwen3exp.titan.hf_lora`); `attention`: the kernel and its mask."""
    from torchtitan.experiments.transformers_modeling_backend.parallelize import (  # lazy: the backend's parallelism
        parallelize_hf_transformers,
    )
    from torchtitan.experiments.transformers_modeling_backend.pipeline import (  # lazy: the backend's pipelining
        pipeline_hf_transformers,
    )
    from torchtitan.protocols.model_spec import ModelSpec  # lazy: torchtitan's model registry

    parallelize = with_hf_moe_blocks(parallelize_hf_transformers)
    if force_sum_reductions:
        parallelize = with_sum_reductions(parallelize)
    if lora is not None:
        parallelize = hf_lora.with_adapters(parallelize, lora)
    return ModelSpec(
        name="transformers_modeling_backend",
        flavor="qwen3exp_" + attention.kernel,
        model=hf_model_config(attention=attention.kernel, causal=attention.causal),
        parallelize_fn=parallelize,
        pipelining_fn=pipeline_hf_transformers,
        post_optimizer_build_fn=moe_load_balancing_hook,
        state_dict_adapter=HFQwen3StateDictAdapter if lora is None else hf_lora.HFLoraStateDictAdapter,
    )
