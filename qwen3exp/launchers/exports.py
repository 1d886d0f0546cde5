"""The Hugging Face exports of a completed run (checkpoint.export), after the ranks: torchtitan wrote
the weights of `export/step-N` (and of `export/step-N/merged` with checkpoint.merge_lora); each is
completed into a `from_pretrained` folder (`qwen3exp.titan.hf_export.complete`) and the last one is
verified by loading it with transformers (the merged one too)."""

from __future__ import annotations

import time
from pathlib import Path

from qwen3exp.config.schema import Experiment
from qwen3exp.plan import model_files
from qwen3exp.plan.build import Plan
from qwen3exp.run import console, rundir
from qwen3exp.titan import hf_export


def finish_export(plan: Plan, run_dir: Path) -> dict:
    """Complete torchtitan's HF exports into from_pretrained folders (the interval exports, the
    last one, its merged LoRA weights) and verify the last (and the merged), each shown as a phase
    (on a 0.6B model they take as long as the training)."""
    exp, files = plan.exp, plan.files
    folder = hf_export.export_folder(run_dir, exp.training.steps)
    if not exp.checkpoint.exports:
        raise AssertionError(f"checkpoint.export={exp.checkpoint.export} exports nothing")
    if not folder.is_dir():
        return {"path": str(folder), "ok": False, "error": "torchtitan wrote no export folder"}
    source = model_files.hf_model_folder(exp)[1] if exp.model.backend == "hf" else files.folder
    log = console.logger("qwen3exp.launch")
    log.info("qwen3exp: completing the Hugging Face export (config, tokenizer, shards)", extra=console.LIVE)
    begun = time.monotonic()
    merged = folder / lora_merged_folder(exp)
    exports = [p for p in folder.parent.glob("step-*") if p.is_dir()]
    parts = [*exports, *(p / lora_merged_folder(exp) for p in exports if merged != folder)]
    for f in sorted(p for p in parts if p.is_dir() and not (p / "config.json").exists()):
        hf_export.complete(
            f,
            arch=files.arch,
            assets=files.folder,
            config_source=source,
            dtype=exp.checkpoint.dtype,
            max_shard_bytes=exp.checkpoint.max_shard_mb * 10**6,
        )
    completed = time.monotonic()
    log.info("qwen3exp: verifying the export (loading it with transformers)", extra=console.LIVE)
    result = hf_export.verify(folder, tied=files.arch.tied)
    if merged != folder and result["ok"]:
        checked = hf_export.verify(merged, tied=files.arch.tied)
        result = {**result, "merged": checked} if checked["ok"] else {**checked, "error": f"merged: {checked['error']}"}
    return {
        **result,
        "complete_seconds": round(completed - begun, 3),
        "verify_seconds": round(time.monotonic() - completed, 3),
    }


def lora_merged_folder(exp: Experiment) -> str:
    """The merged weights' folder inside an export (checkpoint.merge_lora), "" when none is written."""
    return rundir.MERGED if exp.checkpoint.merge_lora and exp.peft.kind == "lora" else ""
