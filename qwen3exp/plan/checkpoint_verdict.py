"""The checkpoint verdict of a plan: what is loaded and saved, and whether what is loaded may be.

A dcp resume is allowed only from a checkpoint this user's qwen3exp signed (`qwen3exp.run.signing`:
DCP reads checkpoints with pickle); Hugging Face weights were checked file by file by
`qwen3exp.plan.model_files` before the verdict is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen3exp.config.schema import Experiment
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
    """What is loaded and saved, and whether what is loaded fits the model (compatible=False is an
    error). `files`: the checked `model_files.ModelFiles` (weights headers and shapes already match)."""
    c = exp.checkpoint
    match c.kind:
        case "none":
            return CheckpointVerdict(
                None, "checkpoint=none: nothing is loaded (random initialisation), nothing is saved"
            )
        case "dcp":
            return _dcp_verdict(c, run_dir)
        case "hf_load" | "hf_roundtrip":
            export = f"; exports the last step ({c.dtype}) and reloads it" if c.kind == "hf_roundtrip" else ""
            return CheckpointVerdict(
                True,
                f"checkpoint={c.kind}: loads {files.weights} at step 0: every tensor "
                f"the model needs is present with its shape{export}",
            )
        case "hf_export":
            return CheckpointVerdict(
                None,
                f"checkpoint=hf_export: nothing is loaded; exports the last step "
                f"({c.dtype}) as a Hugging Face folder and reloads it",
            )
    return CheckpointVerdict(None, f"checkpoint={c.kind}: not checked")


def _dcp_verdict(c, run_dir: Path) -> CheckpointVerdict:
    """checkpoint=dcp: start fresh, or resume from the newest checkpoint its ranks signed, after
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
        return CheckpointVerdict(None, f"checkpoint=dcp: starts fresh; {saves}")
    note = (
        f" (step-{', step-'.join(map(str, skipped))} carries no signature: a stop came between its save and "
        "its signature, or qwen3exp did not write it; never loaded)"
        if skipped
        else ""
    )
    return CheckpointVerdict(
        True, f"checkpoint=dcp: resumes from {folder}/step-{step}{note} (identical experiment); {saves}"
    )


def _unsigned(run_dir: Path, step: int, problem: str) -> CheckpointVerdict:
    where = run_dir / rundir.CHECKPOINT / f"step-{step}"
    return CheckpointVerdict(
        False,
        f"checkpoint=dcp would resume from {where}, but {problem}: qwen3exp resumes "
        "only checkpoints it wrote under this user's key (loading one runs pickled code)",
        "a checkpoint this user's qwen3exp wrote (see qwen3exp/run/signing.py)",
        f"if you trust it: delete {where} to resume from an earlier step, or start anew in a new directory",
    )
