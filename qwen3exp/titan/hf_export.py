"""The Hugging Face export of a run: complete it into a `from_pretrained` folder, then verify it.

torchtitan's last-step HF save (`last_save_in_hf`) writes only the weights and
`model.safetensors.index.json` to `<run dir>/export/step-N`. `complete()` adds config.json
(the source checkpoint's, with every architecture key set from the trained architecture and the
export dtype) and the tokenizer files, so `AutoModelForCausalLM.from_pretrained(folder)` and
`AutoTokenizer.from_pretrained(folder)` work. `verify()` loads it with `AutoModelForCausalLM` and
reports missing and unexpected keys: only `lm_head.weight` may be missing, and only when tied.
Runs in the launcher after the ranks have finished (imports torch and transformers lazily).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, cast

from qwen3exp.config.flavors import Arch
from qwen3exp.config.hf_config import hf_config_from_arch
from qwen3exp.run import rundir

# Files of a Hugging Face model folder that are not weights (copied when the source has them).
ASSET_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)


def export_folder(run_dir: Path, steps: int) -> Path:
    return run_dir / rundir.EXPORT / f"step-{steps}"


def complete(
    folder: Path,
    *,
    arch: Arch,
    assets: Path,
    config_source: Path | None,
    dtype: str,
    max_shard_bytes: int | None = None,
) -> None:
    """Make torchtitan's export folder a complete Hugging Face model folder: config.json (the
    source's, every architecture key set from the trained architecture, `dtype` the export dtype),
    generation_config.json (the source's, else derived from config.json as transformers does), the
    tokenizer files and chat template of `assets`, and the weights split into files of at most
    `max_shard_bytes` with model.safetensors.index.json (when torchtitan wrote one file; a source
    index already decided the split). Every file honours the umask (plain `open`, no copied modes)."""
    base = None
    if config_source is not None and (config_source / "config.json").is_file():
        base = json.loads((config_source / "config.json").read_text())
    cfg = hf_config_from_arch(arch, base)
    cfg["dtype"] = dtype
    cfg.pop("torch_dtype", None)  # transformers 4.x name of the same key
    rundir.atomic_write_json(folder / "config.json", cfg)
    for source in (config_source, assets):
        if source is None:
            continue
        for name in ASSET_FILES:
            if (source / name).is_file() and not (folder / name).exists():
                shutil.copyfile(source / name, folder / name)  # content only: the mode follows the umask
    if not (folder / GENERATION_CONFIG).exists():
        rundir.atomic_write_json(folder / GENERATION_CONFIG, derived_generation_config(cfg))
    # The per-rank pieces torchtitan consolidated into the model-*.safetensors files: not part of
    # a Hugging Face folder, and as large as the weights.
    shutil.rmtree(folder / "sharded", ignore_errors=True)
    if max_shard_bytes is None:
        max_shard_bytes = recorded_max_shard_bytes(folder)
    if max_shard_bytes is not None:
        reshard(folder, max_shard_bytes)


def recorded_max_shard_bytes(folder: Path) -> int | None:
    """checkpoint.max_shard_mb of the run the export `<run dir>/export/step-N` belongs to, from
    its experiment.yaml (for a caller that does not pass it)."""
    data = rundir.read_experiment(folder.parent.parent) or {}
    mb = (data.get("checkpoint") or {}).get("max_shard_mb")
    return int(mb) * 10**6 if isinstance(mb, int) and mb > 0 else None


GENERATION_CONFIG = "generation_config.json"
INDEX = "model.safetensors.index.json"


def derived_generation_config(cfg: dict) -> dict:
    """generation_config.json for a model whose source has none: what transformers derives from
    config.json (`GenerationConfig.from_model_config`: bos/eos/pad token ids, ...)."""
    from transformers import GenerationConfig, PretrainedConfig  # lazy: seconds to import; only for an HF export

    return GenerationConfig.from_model_config(PretrainedConfig.from_dict(cfg)).to_diff_dict()


def reshard(folder: Path, max_shard_bytes: int) -> list[str]:
    """Split a one-file export (torchtitan's `model-00001-of-00001.safetensors`) larger than
    `max_shard_bytes` into `model-0000i-of-0000n.safetensors` files of at most that size (a tensor
    larger than it gets a file of its own), in the file's tensor order, and rewrite
    model.safetensors.index.json. Returns the file names (unchanged when one file fits)."""
    from safetensors import safe_open  # lazy: only where an export's weights are rewritten
    from safetensors.torch import save_file  # lazy: pulls in torch; the launcher imports this module

    files = sorted(folder.glob("model-*.safetensors"))
    if len(files) != 1 or files[0].stat().st_size <= max_shard_bytes:
        return [f.name for f in files]
    src = files[0]
    with safe_open(str(src), framework="pt") as f:
        names = list(f.keys())
        metadata = f.metadata() or {}
        sizes = {n: f.get_slice(n).get_shape() for n in names}
        dtypes = {n: f.get_slice(n).get_dtype() for n in names}
        groups: list[list[str]] = [[]]
        used = 0
        for n in names:
            nbytes = _nbytes(sizes[n], dtypes[n])
            if groups[-1] and used + nbytes > max_shard_bytes:
                groups.append([])
                used = 0
            groups[-1].append(n)
            used += nbytes
        total = len(groups)
        weight_map, out = {}, []
        for i, group in enumerate(groups, 1):
            name = f"model-{i:05d}-of-{total:05d}.safetensors"
            save_file(
                {n: f.get_tensor(n) for n in group}, str(folder / f".{name}.tmp"), metadata={**metadata, "format": "pt"}
            )
            weight_map.update({n: name for n in group})
            out.append(name)
    mode = 0o666 & ~rundir.umask()  # safetensors creates its files 0600
    for name in out:
        (folder / f".{name}.tmp").chmod(mode)
        (folder / f".{name}.tmp").replace(folder / name)
    if src.name not in out:
        src.unlink()
    total_size = sum(_nbytes(sizes[n], dtypes[n]) for n in names)
    rundir.atomic_write_json(folder / INDEX, {"metadata": {"total_size": total_size}, "weight_map": weight_map})
    return out


_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


def _nbytes(shape, dtype: str) -> int:
    n = _DTYPE_BYTES.get(dtype, 4)
    for d in shape:
        n *= d
    return n


def verify(folder: Path, *, tied: bool) -> dict:
    """Load the folder with AutoModelForCausalLM; the report goes into summary.json as `export`."""
    import torch  # lazy: the launcher imports this module; torch only when an export is verified
    from transformers import AutoModelForCausalLM  # lazy: seconds to import; only to verify an export
    from transformers.utils import logging as hf_logging  # lazy: the same

    # The launcher's console stays quiet (qwen3exp.run.noise): the progress bar of this check's own
    # load says nothing a person acts on.
    hf_logging.disable_progress_bar()

    report: dict = {
        "path": str(folder),
        "ok": False,
        "missing_keys": None,
        "unexpected_keys": None,
        "mismatched_keys": None,
        "error": None,
    }
    try:
        # output_loading_info=True returns (model, info); transformers annotates the model only.
        _, info = cast(
            "tuple[Any, dict]",
            AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, dtype=torch.float32),
        )
    except Exception as e:  # a broken export must fail the run with the reason, not crash the launcher
        report["error"] = f"{type(e).__name__}: {e}"
        return report
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(info.get("unexpected_keys") or [])
    mismatched = sorted(str(k) for k in (info.get("mismatched_keys") or []))
    allowed_missing = ["lm_head.weight"] if tied else []
    report.update(missing_keys=missing, unexpected_keys=unexpected, mismatched_keys=mismatched)
    problems = []
    if [k for k in missing if k not in allowed_missing]:
        problems.append(
            f"missing keys {[k for k in missing if k not in allowed_missing]}"
            + (" (only lm_head.weight may be missing, and only when tied)" if not tied else "")
        )
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if mismatched:
        problems.append(f"keys with mismatched shapes {mismatched}")
    report["ok"] = not problems
    report["error"] = "; ".join(problems) or None
    return report


_PEFT_MODULES = {
    "attention.qkv_linear.wq": "self_attn.q_proj",
    "attention.qkv_linear.wk": "self_attn.k_proj",
    "attention.qkv_linear.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w2": "mlp.down_proj",
    "feed_forward.w3": "mlp.up_proj",
}


_HF_BACKEND_LAYERS = "model.model.layers."
"""model=hf: the Transformers backend keeps transformers' model as `model`, so its FQNs are
transformers' own names under one more `model.` (`qwen3exp.titan.hf_lora`)."""


def peft_key(fqn: str) -> str:
    """PEFT's name of a LoRA weight: `layers.3.attention.qkv_linear.wq.lora_a.weight` (model=native) or
    `model.model.layers.3.self_attn.q_proj.lora_a.weight` (model=hf) ->
    `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`."""
    head, _, tail = fqn.partition(".lora_")
    which = {"a.weight": "lora_A.weight", "b.weight": "lora_B.weight"}[tail]
    if head.startswith(_HF_BACKEND_LAYERS):
        return f"base_model.model.{head.removeprefix('model.')}.{which}"
    _, layer, module = head.split(".", 2)
    return f"base_model.model.model.layers.{layer}.{_PEFT_MODULES[module]}.{which}"


def adapter_config(
    *, rank: int, alpha: float, dropout: float, targets: list[str], base: str, revision: str | None = None
) -> dict:
    """adapter_config.json of a PEFT LoRA adapter (the keys `peft.LoraConfig` reads); `base`: the
    base model's Hub id or folder, `revision` its Hub revision (None: main)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "revision": revision,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
