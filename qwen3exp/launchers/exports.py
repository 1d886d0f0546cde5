"""The Hugging Face exports of a completed run (checkpoint.export), after the ranks: torchtitan wrote
the weights of `export/step-N` (and of `export/step-N/merged` with checkpoint.merge_lora); each is
completed into a `from_pretrained` folder (`qwen3exp.titan.hf_export.complete`) and the last one is
verified by loading it with transformers (the merged one too). A peft=lora export whose adapter
names its base model (`qwen3exp.plan.lora_base`) holds no copy of the base: its adapter is verified
against the base's safetensors headers instead (each A is rank x in, each B out x rank, of a
projection the base has)."""

from __future__ import annotations

import time
from pathlib import Path

from qwen3exp.config.schema import Experiment
from qwen3exp.plan import lora_base, model_files, weight_files
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
    whole = exports if lora_base.exports_base(exp) else []
    parts = [*whole, *(p / lora_merged_folder(exp) for p in exports if merged != folder)]
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
    if whole or files.weights is None:
        result = hf_export.verify(folder, tied=files.arch.tied)
    else:
        result = verify_adapter(folder / rundir.ADAPTER, files.weights)
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


def verify_adapter(adapter: Path, base: Path) -> dict:
    """An adapter-only export against its base folder, from the safetensors headers: every tensor
    of adapter_model.safetensors is a lora_A (rank x in) or lora_B (out x rank) of a weight the base
    has (out x in). The report goes into summary.json as `export`."""
    report: dict = {"path": str(adapter), "base": str(base), "ok": False, "error": None}
    config = adapter / "adapter_config.json"
    if not config.is_file():
        return {**report, "error": f"{config} was not written"}
    shapes, problems = weight_files.read_headers([adapter / "adapter_model.safetensors"])
    files, more = weight_files.safetensors_files(base)
    base_shapes, more2 = weight_files.read_headers(files)
    problems += more + more2
    for name, shape in sorted(shapes.items()):
        head, _, which = name.removeprefix("base_model.model.").rpartition(".lora_")
        want = base_shapes.get(f"{head}.weight")
        if want is None or len(shape) != 2 or which not in ("A.weight", "B.weight"):
            problems.append(f"{name}: the base has no weight {head}.weight")
        elif (shape[1] if which == "A.weight" else shape[0]) != want[1 if which == "A.weight" else 0]:
            problems.append(f"{name}: shape {list(shape)} does not fit the base's {list(want)}")
    if not shapes:
        problems.append("adapter_model.safetensors holds no adapter")
    return {**report, "ok": not problems, "tensors": len(shapes), "error": "; ".join(problems) or None}
