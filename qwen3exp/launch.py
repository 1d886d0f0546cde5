"""The launcher: run directory, torchrun command, child process, signals, summary.

`prepare()` does everything that can fail on a bad configuration (platform, mesh, batches, and
building torchtitan's `Trainer.Config` once so torchtitan's own checks run) and raises ConfigError.
`launch()` writes the run directory (with `provenance.json`: where the run came from), starts
torchrun in its own process group, forwards Ctrl-C and SIGTERM to the whole group (SIGKILL after
`launcher.stop_timeout_s`), and writes `summary.json` (with the experiment's content hash).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qwen3exp import model_files, provenance, rundir, tracking
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.kernels.overrides import merge_applied
from qwen3exp.platforms import PlatformFacts, experiment_problems, resolve
from qwen3exp.plan import Batches, Mesh, resolve_batches, resolve_mesh
from qwen3exp.model_files import ModelFiles
from qwen3exp.schema import Experiment

EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}


@dataclass
class Prepared:
    exp: Experiment
    facts: PlatformFacts
    mesh: Mesh
    batches: Batches
    files: ModelFiles
    overrides: list[dict] = field(default_factory=list)
    """torchtitan overrides the experiment activates, with the config nodes each one replaces."""


def prepare(exp: Experiment) -> Prepared:
    """Check the model's files, resolve the platform and the mesh; raise ConfigError on any
    mismatch (cheap: no torchtitan, only JSON and safetensors headers are read, unless the
    experiment activates kernel overrides: their matches are computed on the config tree)."""
    from qwen3exp.kernels import overrides

    files = model_files.check(exp)
    facts = resolve(exp.platform, nproc_per_node=exp.launcher.nproc_per_node, dry_run=exp.dry_run)
    problems = experiment_problems(exp, facts) + tracking.check(exp)
    if problems:
        raise ConfigError(problems)
    mesh = resolve_mesh(exp, facts)
    prep = Prepared(exp, facts, mesh, resolve_batches(exp, mesh), files)
    prep.overrides = overrides.check(exp, facts, lambda: build_torchtitan_config(prep, Path("/nonexistent/pre-launch")))
    return prep


def build_torchtitan_config(prep: Prepared, run_dir: Path):
    """Build Trainer.Config once in the launcher: torchtitan's own checks fail here, not in 64 ranks."""
    from qwen3exp.to_torchtitan import to_torchtitan

    try:
        return to_torchtitan(prep.exp, prep.facts, run_dir)
    except (ValueError, AssertionError, TypeError, KeyError) as e:
        raise ConfigError([Problem("(torchtitan Trainer.Config)", type(e).__name__, str(e) or repr(e))]) from None


def torchrun_commands(prep: Prepared, run_dir: Path) -> list[list[str]]:
    """The torchrun command of every node (one per node rank)."""
    if prep.mesh.nnodes == 1:
        return [torchrun_argv(prep, run_dir)]
    return [torchrun_argv(prep, run_dir, node_rank=r) for r in range(prep.mesh.nnodes)]


def torchrun_argv(prep: Prepared, run_dir: Path, *, node_rank: int | None = None) -> list[str]:
    la, mesh = prep.exp.launcher, prep.mesh
    node_rank = la.node_rank if node_rank is None else node_rank
    argv = [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(mesh.nnodes), "--nproc-per-node", str(mesh.nproc_per_node)]
    if mesh.nnodes == 1 and not la.rdzv_endpoint:
        # Like --standalone, but with a fixed run id so per-rank log paths are predictable.
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", "qwen3exp"]
    else:
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", la.rdzv_endpoint,
                 "--rdzv-id", prep.exp.name, "--node-rank", str(node_rank)]
    argv += ["--max-restarts", str(la.max_restarts),
             "--log-dir", str(run_dir / rundir.LOGS), "--tee", "3", "--local-ranks-filter", "0",
             "-m", "qwen3exp.worker", str(run_dir)]
    return argv


def rank_env(prep: Prepared, run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(prep.facts.env)
    # Folders the platform keeps inside the run directory (e.g. the Neuron compile cache).
    env.update({k: str(run_dir / v) for k, v in prep.facts.run_dir_env.items()})
    # Nothing is downloaded at run time: tokenizer, data and weights are local.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def write_run_files(prep: Prepared, run_dir: Path, trainer_config, argv: list[str], plan=None) -> None:
    from qwen3exp.plan import make_plan

    plan = plan if plan is not None else make_plan(prep.exp, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_json(run_dir / rundir.PLAN, plan.as_json())
    rundir.atomic_write_text(run_dir / rundir.EXPERIMENT, rundir.experiment_yaml(prep.exp.model_dump(mode="json")))
    rundir.atomic_write_json(run_dir / rundir.PLATFORM, asdict(prep.facts))
    rundir.atomic_write_json(run_dir / rundir.TORCHTITAN_CONFIG, trainer_config.to_dict())
    rundir.atomic_write_text(run_dir / rundir.COMMAND, shlex.join(argv) + "\n")


def first_rank_error(run_dir: Path) -> str | None:
    errors = [rundir.read_json(p) for p in (run_dir / rundir.LOGS).glob("error_rank*.json")]
    errors = [e for e in errors if e]
    if not errors:
        return None
    first = min(errors, key=lambda e: e.get("time", 0))
    return f"rank {first['rank']}: {first['type']}: {first['message']}"


def summarize(prep: Prepared, run_dir: Path, *, exit_code: int, status: str, wall: float,
              error: str | None, resumed_from: int | None = None, export: dict | None = None) -> dict:
    rows = rundir.read_metrics(run_dir)
    step1 = next((r["loss"] for r in rows if r["step"] == 1), None)
    weights = prep.files.weights
    summary = {
        "status": status,
        "exit_code": exit_code,
        "world_size": prep.mesh.world_size,
        "steps_completed": rows[-1]["step"] if rows else 0,
        "first_loss": rows[0]["loss"] if rows else None,
        "last_loss": rows[-1]["loss"] if rows else None,
        "wall_seconds": round(wall, 3),
        "error": error,
        "platform": prep.facts.name,
        "name": prep.exp.name,
        # The 6.54-vs-12.43 check in one look: step-1 loss and where the step-0 weights came from.
        "step1_loss": step1,
        "weights_loaded": weights is not None and step1 is not None,
        "weights_source": str(weights) if weights is not None else None,
        "checkpoint": prep.exp.checkpoint.kind,
        "resumed_from_step": resumed_from,
        "export": export,
        "experiment_hash": rundir.experiment_hash(prep.exp.model_dump(mode="json")),
        "overrides": merge_applied(prep.overrides, run_dir),
    }
    rundir.atomic_write_json(run_dir / rundir.SUMMARY, summary)
    return summary


def finish_export(prep: Prepared, run_dir: Path) -> dict:
    """Complete torchtitan's HF export into a from_pretrained folder and verify it."""
    from qwen3exp import hf_export

    exp, files = prep.exp, prep.files
    folder = hf_export.export_folder(run_dir, exp.training.steps)
    if not folder.is_dir():
        return {"path": str(folder), "ok": False, "error": "torchtitan wrote no export folder"}
    source = model_files.hf_model_folder(exp)[1] if exp.model.backend == "hf" else files.folder
    hf_export.complete(folder, arch=files.arch, assets=files.folder, config_source=source, dtype=exp.checkpoint.dtype)
    return hf_export.verify(folder, tied=files.arch.tied)


def run_torchrun(argv: list[str], env: dict, stop_timeout_s: float) -> tuple[int, int | None]:
    """Start torchrun in its own process group; forward SIGINT/SIGTERM to the group.
    Returns (exit code, the signal that stopped us or None)."""
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    received: list[int] = []
    first_at: list[float] = []

    def forward(signum, _frame):
        received.append(signum)
        first_at.append(time.monotonic())
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if first_at and time.monotonic() - first_at[0] > stop_timeout_s:
                    os.killpg(proc.pid, signal.SIGKILL)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _kill_group(proc.pid)
    return code, (received[0] if received else None)


def _kill_group(pgid: int) -> None:
    """No orphans: whatever is left of the process group is killed."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def launch(prep: Prepared, run_dir: Path, plan=None, *, origin: provenance.Origin | None = None) -> dict:
    """Write the run directory (plan.json and provenance.json included), run torchrun, write
    summary.json; returns the summary. `plan`: the checked plan of this run (computed here when not
    given); `origin`: the command line and Hydra overrides, for provenance.json."""
    trainer_config = build_torchtitan_config(prep, run_dir)
    argv = torchrun_argv(prep, run_dir)
    resumed_from = rundir.latest_checkpoint_step(run_dir) if prep.exp.checkpoint.kind == "dcp" else None
    write_run_files(prep, run_dir, trainer_config, argv, plan)
    provenance.write(run_dir, prep.facts, rundir.experiment_hash(prep.exp.model_dump(mode="json")), origin)
    if resumed_from is not None:  # torchtitan resumes there; the later rows are written again
        rundir.truncate_metrics(run_dir, resumed_from)
    else:
        (run_dir / rundir.METRICS).unlink(missing_ok=True)
    env = rank_env(prep, run_dir)
    env.update(tracking.env(prep.exp, run_dir, sweep_dir=origin.sweep_dir if origin else None))
    print(f"qwen3exp: {prep.exp.name}: {prep.mesh.world_size} rank(s) on {prep.facts.name} "
          f"({prep.facts.reason}); run directory {run_dir}"
          + (f"; resuming from checkpoint step {resumed_from}" if resumed_from is not None else ""), flush=True)
    start = time.monotonic()
    code, sig = run_torchrun(argv, env, prep.exp.launcher.stop_timeout_s)
    wall = time.monotonic() - start
    if sig is not None:
        status, code, error = "interrupted", EXIT_SIGNAL[sig], f"stopped by {signal.Signals(sig).name}"
    elif code == 0:
        status, error = "completed", None
    else:
        status = "failed"
        error = first_rank_error(run_dir) or f"torchrun exited with code {code}"
    export = None
    if status == "completed" and prep.exp.checkpoint.kind in ("hf_export", "hf_roundtrip"):
        export = finish_export(prep, run_dir)
        if not export["ok"]:
            status, code, error = "failed", 1, f"the Hugging Face export does not verify: {export['error']}"
    summary = summarize(prep, run_dir, exit_code=code, status=status, wall=wall, error=error,
                        resumed_from=resumed_from, export=export)
    last = summary["last_loss"]
    print(f"qwen3exp: {status}: {run_dir}  last loss {last if last is None else f'{last:.4f}'}  "
          f"wall {wall:.1f}s" + (f"\n  error: {error}" if error else ""), flush=True)
    return summary
