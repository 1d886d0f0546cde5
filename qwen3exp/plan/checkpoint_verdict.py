"""The checkpoint verdict of a plan: what is loaded and saved, and whether what is loaded may be.

A dcp resume is allowed only from a checkpoint this user's qwen3exp signed (`qwen3exp.run.signing`:
DCP reads checkpoints with pickle); Hugging Face weights were checked file by file by
`qwen3exp.plan.model_files` before the verdict is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen3exp.config.schema import Experiment
from qwen3exp.plan import lora_base
from qwen3exp.run import rundir, signing


@dataclass(frozen=True)
class CheckpointVerdict:
    compatible: bool | None
    """True / False, or None when there is nothing to load."""
    detail: str
    allowed: str | None = None
    """What would be accepted, when compatible is False (default: a checkpoint of this architecture)."""
    hint: str | None = None


def checkpoint_verdict(exp: Experiment, files, run_dir: Path) -> CheckpointVerdict:
    """What is loaded, saved and exported, and whether what is loaded fits the model and may be
    loaded (compatible=False is an error). `files`: the checked `model_files.ModelFiles` (weights
    headers and shapes already match). A resumable run that has a checkpoint of its own resumes
    from it, and `checkpoint.load` is not read again."""
    c = exp.checkpoint
    resume = _dcp_verdict(c, run_dir) if c.save else None
    if resume is not None and resume.compatible is not None:
        load = resume
    elif c.load == "hf":
        load = CheckpointVerdict(
            True, f"loads {files.weights} at step 0: every tensor the model needs is present with its shape"
        )
    elif c.load == "dcp":
        load = _foreign_dcp(Path(str(c.path)).expanduser())
    else:
        load = CheckpointVerdict(None, "nothing is loaded (random initialisation)")
    if load.compatible is False:
        return load
    parts = [load.detail]
    if resume is not None and resume is not load:
        parts.append(resume.detail)
    elif not c.save:
        parts.append("keeps no resumable checkpoint")
    if c.exports:
        every = f" and every {c.every_export} steps" if c.every_export else ""
        merged = " (with the LoRA adapters merged too)" if c.merge_lora else ""
        what = "the last step"
        if (base := lora_base.named_base(exp)) is not None:  # the adapter on its own, naming its base
            what = f"the LoRA adapter of the last step (base model {base.name_or_path}, not copied)"
            merged = " (and the merged weights)" if c.merge_lora else ""
        parts.append(f"exports {what}{every} ({c.dtype}){merged} to export/step-N and reloads the last")
    return CheckpointVerdict(load.compatible, f"{c.summary}: " + "; ".join(parts))


def _foreign_dcp(step_dir: Path) -> CheckpointVerdict:
    """checkpoint.load=dcp: another run's step folder, loaded only if this user's qwen3exp signed it."""
    if not (step_dir / ".metadata").is_file():
        return CheckpointVerdict(
            False,
            f"checkpoint.load=dcp reads {step_dir}, which is not a dcp checkpoint (no .metadata)",
            "a <run dir>/checkpoint/step-N folder a qwen3exp run saved",
        )
    if (problem := signing.problem(step_dir)) is not None:
        return CheckpointVerdict(
            False,
            f"checkpoint.load=dcp would load {step_dir}, but {problem}: qwen3exp loads only checkpoints it "
            "wrote under this user's key (loading one runs pickled code)",
            "a checkpoint this user's qwen3exp wrote (see qwen3exp/run/signing.py)",
        )
    return CheckpointVerdict(True, f"loads the model weights of {step_dir} at step 0 (signed by this user's qwen3exp)")


def _dcp_verdict(c, run_dir: Path) -> CheckpointVerdict:
    """checkpoint.save=true: start fresh, or resume from the newest checkpoint its ranks signed, after
    checking every file of it (`qwen3exp.run.signing`: DCP reads checkpoints with pickle). A newer
    checkpoint without a signature is skipped (a stop between its save and its signature) and said
    so; a signature that does not check, or checkpoints none of which is signed, refuse the launch."""
    saves = f"saves checkpoint/step-N every {c.interval} steps and at the last step, keeps {c.keep_latest_k or 'all'}"
    step = rundir.latest_checkpoint_step(run_dir)
    skipped = [s for s in rundir.complete_checkpoint_steps(run_dir) if step is None or s > step]
    folder = run_dir / rundir.CHECKPOINT
    if step is not None and (problem := signing.problem(folder / f"step-{step}")) is not None:
        return _unsigned(run_dir, step, problem)
    if step is None and skipped:
        return _unsigned(run_dir, skipped[-1], f"step-{skipped[-1]} carries no qwen3exp signature")
    if step is None:
        return CheckpointVerdict(None, saves)
    note = (
        f" (step-{', step-'.join(map(str, skipped))} carries no signature: a stop came between its save and "
        "its signature, or qwen3exp did not write it; never loaded)"
        if skipped
        else ""
    )
    again = f", not from checkpoint.load={c.load} again" if c.load != "none" else ""
    return CheckpointVerdict(True, f"resumes from {folder}/step-{step}{note} (identical experiment{again}); {saves}")


def _unsigned(run_dir: Path, step: int, problem: str) -> CheckpointVerdict:
    where = run_dir / rundir.CHECKPOINT / f"step-{step}"
    return CheckpointVerdict(
        False,
        f"checkpoint.save=true would resume from {where}, but {problem}: qwen3exp resumes "
        "only checkpoints it wrote under this user's key (loading one runs pickled code)",
        "a checkpoint this user's qwen3exp wrote (see qwen3exp/run/signing.py)",
        f"if you trust it: delete {where} to resume from an earlier step, or start anew in a new directory",
    )
