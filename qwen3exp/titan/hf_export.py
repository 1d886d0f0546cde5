"""The Hugging Face export of a run: complete it into a `from_pretrained` folder, then verify it.

torchtitan's last-step HF save (`last_save_in_hf`) writes only the weights and
`model.safetensors.index.json` to `<run dir>/checkpoint/step-N`. `complete()` adds config.json
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

from qwen3exp.config.flavors import Arch, hf_config_from_arch
from qwen3exp.run import rundir

# Files of a Hugging Face model folder that are not weights (copied when the source has them).
ASSET_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
               "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json")


def export_folder(run_dir: Path, steps: int) -> Path:
    return run_dir / rundir.CHECKPOINT / f"step-{steps}"


def complete(folder: Path, *, arch: Arch, assets: Path, config_source: Path | None, dtype: str) -> None:
    """Write config.json and copy the tokenizer files into torchtitan's export folder."""
    base = None
    if config_source is not None and (config_source / "config.json").is_file():
        base = json.loads((config_source / "config.json").read_text())
    cfg = hf_config_from_arch(arch, base)
    cfg["dtype"] = dtype
    cfg.pop("torch_dtype", None)  # transformers 4.x name of the same key
    rundir.atomic_write_json(folder / "config.json", cfg)
    for name in ASSET_FILES:
        if (assets / name).is_file() and not (folder / name).exists():
            shutil.copy(assets / name, folder / name)
    # The per-rank pieces torchtitan consolidated into the model-*.safetensors files: not part of
    # a Hugging Face folder, and as large as the weights.
    shutil.rmtree(folder / "sharded", ignore_errors=True)


def verify(folder: Path, *, tied: bool) -> dict:
    """Load the folder with AutoModelForCausalLM; the report goes into summary.json as `export`."""
    import torch
    from transformers import AutoModelForCausalLM

    report: dict = {"path": str(folder), "ok": False, "missing_keys": None, "unexpected_keys": None,
                    "mismatched_keys": None, "error": None}
    try:
        # output_loading_info=True returns (model, info); transformers annotates the model only.
        _, info = cast("tuple[Any, dict]",
                       AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, dtype=torch.float32))
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
        problems.append(f"missing keys {[k for k in missing if k not in allowed_missing]}"
                        + (" (only lm_head.weight may be missing, and only when tied)" if not tied else ""))
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if mismatched:
        problems.append(f"keys with mismatched shapes {mismatched}")
    report["ok"] = not problems
    report["error"] = "; ".join(problems) or None
    return report
