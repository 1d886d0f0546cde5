"""objective.reference in the ranks: DPO's separate reference model, frozen and sharded like the policy.

The reference is a Qwen3 model of its own architecture (its folder's config.json), built by the same
builder as the policy (`qwen3exp.titan.model.qwen3_model_spec`, the policy's attention path), on the
meta device, parallelised by the same torchtitan function with the trainer's parallel dims (FSDP:
each rank holds its shard), then filled from the folder's safetensors the way torchtitan's checkpoint
manager loads `checkpoint.load=hf` (the state-dict adapter's `to_hf`, `dcp.load` with its Hugging Face
storage reader, `from_hf`). Every parameter is frozen (no gradients, not in the optimizer, never
saved: a resume loads it again from the folder). The pre-launch checks
(`qwen3exp.plan.reference_model`) have read the folder's config.json, tokenizer and safetensors.
"""

from __future__ import annotations

import json
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torchtitan.components.checkpointer.base import ModelWrapper
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from qwen3exp.config.hf_config import arch_from_hf_config, read_hf_config
from qwen3exp.plan.attention_path import AttentionPath
from qwen3exp.titan.model import qwen3_model_spec


def describe(folder: str, attention: AttentionPath, force_sum_reductions: bool) -> str:
    """What the trainer's config carries to build the reference (JSON: the config stays plain data)."""
    return json.dumps(
        {"folder": folder, "kernel": attention.kernel, "mask": attention.mask, "force_sum": force_sum_reductions}
    )


def build(trainer, described: str) -> torch.nn.Module:
    """The frozen reference model of `described` (`describe`), sharded like the trainer's policy."""
    r = json.loads(described)
    logger.info(f"Building the reference model from {r['folder']}")
    arch = arch_from_hf_config(read_hf_config(r["folder"]), backend="native")
    path = AttentionPath(r["kernel"], r["mask"], "the policy's")
    spec = qwen3_model_spec(arch, flavor="auto", attention=path, force_sum_reductions=r["force_sum"])
    config = trainer.config
    spec.model.update_from_config(config=config)
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
        model = spec.model.build()
    model.requires_grad_(False)
    model = spec.parallelize_fn(
        model,
        parallel_dims=trainer.parallel_dims,
        training=config.training,
        parallelism=config.parallelism,
        compile_config=config.compile,
        ac_config=config.activation_checkpoint,
        dump_folder=config.dump_folder,
    )
    model.to_empty(device=trainer.device)
    # The weights' random init is overwritten by the load below; only the buffers (RoPE) matter. The
    # training's random stream is left as it was, and DTensor's warning about random ops on a CPU
    # mesh (said once already for the policy) is not said again.
    with torch.no_grad(), torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DTensor random operators", category=UserWarning)
        model.init_weights(buffer_device=None)
    _load(model, spec, r["folder"])
    model.requires_grad_(False)
    return model


def _load(model: torch.nn.Module, spec, folder: str) -> None:
    """The folder's safetensors into the (sharded) model, as torchtitan's `dcp_load` with from_hf."""
    wrapper = ModelWrapper(model)
    adapter = spec.state_dict_adapter(spec.model, folder)
    hf_state = adapter.to_hf(wrapper.state_dict())
    dcp.load(hf_state, storage_reader=adapter.get_hf_storage_reader(folder, False))
    wrapper.load_state_dict(adapter.from_hf(hf_state))
