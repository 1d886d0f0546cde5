"""The launcher: run directory, torchrun command, child processes, signals, summary.

`prepare()` does everything that can fail on a bad configuration (platform, mesh, batches, node
placement; `build_torchtitan_config` builds torchtitan's `Trainer.Config` once so torchtitan's own
checks run) and raises ConfigError. `launch()` writes the run directory (with `provenance.json`:
where the run came from), starts torchrun (or srun starting one torchrun agent per node) and
supervises it:
- Ctrl-C or SIGTERM: torchrun is asked to stop its ranks (SIGTERM, which ends a rank even while it
  waits in a collective); after `launcher.stop_timeout_s` everything left is killed; summary
  `interrupted`, exit code 130 / 143. Before torchrun runs, the signal abandons the launch.
- A rank that raises: torchrun stops the others at once; the summary carries that rank's own error
  (`logs/error_rank<R>.json`, written by the worker), not torchrun's wrapper text.
- No orphans: the launcher is a child subreaper, torchrun dies with the launcher (even a SIGKILLed
  one) and every rank dies with torchrun (`qwen3exp.run.procs`); whatever is left is killed at the end.
- `summary.json` (node 0; with the experiment's content hash) is written atomically; after a
  SIGKILLed launcher there is none, and a relaunch in the same directory resumes from the latest
  complete checkpoint when checkpointing is on.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qwen3exp.plan import model_files, placement as placement_, tracking

from qwen3exp.run import procs, provenance, rundir
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.titan.overrides import merge_applied
from qwen3exp.plan.placement import Placement
from qwen3exp.platforms import PlatformFacts, experiment_problems, resolve
from qwen3exp.plan.build import Batches, Mesh, resolve_batches, resolve_mesh
from qwen3exp.plan.model_files import ModelFiles
from qwen3exp.config.schema import Experiment, LocalLauncher

EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}


@dataclass
class Prepared:
    exp: Experiment
    facts: PlatformFacts
    mesh: Mesh
    batches: Batches
    files: ModelFiles
    placement: Placement | None = None
    """Where the agents run (None where only torchtitan's config is built, for the kernel checks)."""
    overrides: list[dict] = field(default_factory=list)
    """torchtitan overrides the experiment activates, with the config nodes each one replaces."""


def prepare(exp: Experiment, env: Mapping[str, str] | None = None) -> Prepared:
    """Check the model's files, resolve the platform, the mesh and the node placement; raise
    ConfigError on any mismatch (cheap: no torchtitan, only JSON and safetensors headers are read,
    unless the experiment activates kernel overrides: their matches are computed on the config
    tree). `env`: the scheduler's environment (default: this process's)."""
    from qwen3exp.titan import overrides

    files = model_files.check(exp)
    facts = resolve(exp.platform, nproc_per_node=exp.launcher.nproc_per_node, dry_run=exp.dry_run)
    problems = experiment_problems(exp, facts) + tracking.check(exp)
    if problems:
        raise ConfigError(problems)
    mesh = resolve_mesh(exp, facts)
    where = placement_.resolve(exp, os.environ if env is None else env)
    prep = Prepared(exp, facts, mesh, resolve_batches(exp, mesh), files, where)
    prep.overrides = overrides.check(exp, facts, lambda: build_torchtitan_config(prep, Path("/nonexistent/pre-launch")))
    return prep


def build_torchtitan_config(prep: Prepared, run_dir: Path):
    """Build Trainer.Config once in the launcher: torchtitan's own checks fail here, not in 64 ranks."""
    from qwen3exp.titan.job_config import to_torchtitan

    try:
        return to_torchtitan(prep.exp, prep.facts, run_dir)
    except (ValueError, AssertionError, TypeError, KeyError) as e:
        raise ConfigError([Problem("(torchtitan Trainer.Config)", type(e).__name__, str(e) or repr(e))]) from None


def torchrun_commands(prep: Prepared, run_dir: Path) -> list[list[str]]:
    """The command of every node's torchrun agent: one per node rank when a launcher runs on each
    node; one (srun starting them all) in a SLURM job."""
    if prep.mesh.nnodes == 1 or prep.placement.agent_prefix:
        return [torchrun_argv(prep, run_dir)]
    return [torchrun_argv(prep, run_dir, node_rank=r) for r in range(prep.mesh.nnodes)]


def torchrun_argv(prep: Prepared, run_dir: Path, *, node_rank: int | None = None) -> list[str]:
    """The command that starts this node's torchrun agent (with srun: every node's agent)."""
    la, mesh, where = prep.exp.launcher, prep.mesh, prep.placement
    # qwen3exp.run.agent is torchrun's own main plus a record of how each failed rank died (a rank
    # killed by a signal writes nothing itself): see first_rank_error.
    argv = [*where.agent_prefix, sys.executable, "-m", "qwen3exp.run.agent",
            "--nnodes", str(mesh.nnodes), "--nproc-per-node", str(mesh.nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", where.rdzv_endpoint, "--rdzv-id", where.rdzv_id]
    if mesh.nnodes > 1 and not where.agent_prefix:
        # For the record only (which node's agent this is): c10d assigns the ranks itself, and
        # torchrun says so in a warning.
        argv += ["--node-rank", str(where.node_rank if node_rank is None else node_rank)]
    argv += ["--max-restarts", str(la.max_restarts),
             "--log-dir", str(run_dir / rundir.LOGS), "--tee", "3", "--local-ranks-filter", "0",
             "-m", "qwen3exp.worker.main", str(run_dir)]
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


def run_experiment(exp: Experiment) -> Experiment:
    """The experiment as written to the run directory and hashed. Across nodes it must be one: the
    node's own rank is per launcher and is not part of it."""
    la = exp.launcher
    if la.nnodes > 1 and isinstance(la, LocalLauncher) and la.node_rank is not None:
        return exp.model_copy(update={"launcher": la.model_copy(update={"node_rank": None})})
    return exp


def experiment_hash(exp: Experiment) -> str:
    return rundir.experiment_hash(run_experiment(exp).model_dump(mode="json"))


def may_join(exp: Experiment, run_dir: Path) -> bool:
    """True when `run_dir` holds the same multi-node run, not finished, started by another node's
    launcher (every node's launcher writes the run files; whichever comes first)."""
    if exp.launcher.nnodes == 1 or (run_dir / rundir.SUMMARY).exists():
        return False
    there = rundir.read_experiment(run_dir)
    return there is not None and rundir.experiment_hash(there) == experiment_hash(exp)


def node_file(name: str, where: Placement) -> str:
    """summary.json / command.txt of node 0; `summary_node<R>.json` ... of the other nodes."""
    if where.node_rank == 0:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}_node{where.node_rank}{dot}{ext}"


def write_run_files(prep: Prepared, run_dir: Path, trainer_config, argv: list[str], plan=None) -> None:
    from qwen3exp.plan.build import make_plan

    plan = plan if plan is not None else make_plan(prep.exp, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_json(run_dir / node_file(rundir.PLAN, prep.placement), plan.as_json())
    rundir.atomic_write_text(run_dir / rundir.EXPERIMENT,
                             rundir.experiment_yaml(run_experiment(prep.exp).model_dump(mode="json")))
    rundir.atomic_write_json(run_dir / rundir.PLATFORM, asdict(prep.facts))
    rundir.atomic_write_json(run_dir / rundir.TORCHTITAN_CONFIG, trainer_config.to_dict())
    rundir.atomic_write_text(run_dir / node_file(rundir.COMMAND, prep.placement), shlex.join(provenance.redact_argv(argv)) + "\n")


def first_rank_error(run_dir: Path) -> str | None:
    """The root cause of a failed run, from the ranks' error files and the agents' records of how
    ranks died (`qwen3exp.run.agent.root_cause`): a rank killed by a signal, or gone without an error
    report, comes before the communication errors it caused in the other ranks."""
    from qwen3exp.run import agent
    return agent.root_cause(run_dir / rundir.LOGS)


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
        "experiment_hash": experiment_hash(prep.exp),
        "overrides": merge_applied(prep.overrides, run_dir),
        "nnodes": prep.placement.nnodes,
        "node_rank": prep.placement.node_rank,
    }
    rundir.atomic_write_json(run_dir / node_file(rundir.SUMMARY, prep.placement), summary)
    return summary


def finish_export(prep: Prepared, run_dir: Path) -> dict:
    """Complete torchtitan's HF export into a from_pretrained folder and verify it."""
    from qwen3exp.titan import hf_export
    exp, files = prep.exp, prep.files
    folder = hf_export.export_folder(run_dir, exp.training.steps)
    if not folder.is_dir():
        return {"path": str(folder), "ok": False, "error": "torchtitan wrote no export folder"}
    source = model_files.hf_model_folder(exp)[1] if exp.model.backend == "hf" else files.folder
    hf_export.complete(folder, arch=files.arch, assets=files.folder, config_source=source, dtype=exp.checkpoint.dtype)
    return hf_export.verify(folder, tied=files.arch.tied)


class _Interrupted(Exception):
    """Ctrl-C / SIGTERM before torchrun was started: the launch is abandoned."""


class _StopSignals:
    """SIGINT and SIGTERM for the whole launch (in a SLURM job this also replaces submitit's
    handler, which ignores SIGTERM). Before torchrun runs, a signal abandons the launch at once;
    while it runs, the first signal is remembered and torchrun is asked to stop its ranks."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at: float | None = None
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> _StopSignals:
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum, _frame) -> None:
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
        if self.proc is None:
            raise _Interrupted(signum)
        self.stop_torchrun()

    def stop_torchrun(self) -> None:
        # SIGTERM, also for Ctrl-C: torchrun passes it on, and a rank ends on SIGTERM even while it
        # waits in a collective (SIGINT would become a KeyboardInterrupt that waits for the collective).
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def run_torchrun(argv: list[str], env: dict, stop_timeout_s: float, stop: _StopSignals) -> int:
    """Start torchrun (or srun) in its own session and supervise it until it and every process it
    started are gone; returns its exit code."""
    procs.become_subreaper()
    me = os.getpid()
    # Processes that were already ours before this run (e.g. of a test harness) are not touched.
    before = set(procs.descendants(me))
    if stop.signum is not None:  # a signal some library code swallowed during the preparation
        raise _Interrupted(stop.signum)
    try:
        stop.proc = subprocess.Popen(argv, env=env, start_new_session=True,
                                     preexec_fn=lambda: procs.die_with_parent(signal.SIGTERM, me))
        if stop.signum is not None:  # it came while torchrun was being started
            stop.stop_torchrun()
        while True:
            try:
                return stop.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                if stop.at is not None and time.monotonic() - stop.at > stop_timeout_s:
                    procs.kill_tree(me, exclude=before | {stop.proc.pid})
                    _kill_group(stop.proc.pid)
    finally:
        # No orphans: ranks torchrun left behind (re-parented to us) and anything else it started.
        procs.kill_tree(me, exclude=before)
        if stop.proc is not None:
            _kill_group(stop.proc.pid)


def _kill_group(pgid: int) -> None:
    """No orphans: whatever is left of the process group is killed."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_until_free(run_dir: Path, timeout_s: float) -> None:
    """A relaunch must not train next to a previous launch's ranks (they may still be dying after
    their launcher was SIGKILLed): wait for them, then refuse."""
    deadline = time.monotonic() + timeout_s
    while busy := procs.workers_of(run_dir):
        if time.monotonic() > deadline:
            raise ConfigError([Problem(
                "hydra.run.dir", str(run_dir), f"is in use by running process(es) {', '.join(map(str, busy))}",
                "a directory no live run uses", "stop that run first")])
        time.sleep(0.2)


def _reset_metrics(prep: Prepared, run_dir: Path) -> int | None:
    """Node 0, before any rank starts: a fresh run starts an empty metrics.jsonl; a run resuming
    from a checkpoint keeps the rows up to that step (the later ones are trained again).
    Returns the step resumed from."""
    step = rundir.latest_checkpoint_step(run_dir) if prep.exp.checkpoint.kind == "dcp" else None
    if step is None:
        (run_dir / rundir.METRICS).unlink(missing_ok=True)
    else:
        rundir.truncate_metrics(run_dir, step)
    return step


def launch(prep: Prepared, run_dir: Path, plan=None, *, origin: provenance.Origin | None = None) -> dict:
    """Write the run directory (plan.json and provenance.json included), run torchrun, write
    summary.json; returns the summary. `plan`: the checked plan of this run (computed here when not
    given); `origin`: the command line and Hydra overrides, for provenance.json."""
    where = prep.placement
    start = time.monotonic()
    resumed_from = None
    with _StopSignals() as stop:
        try:
            trainer_config = build_torchtitan_config(prep, run_dir)
            argv = torchrun_argv(prep, run_dir)
            if where.nnodes == 1:
                _wait_until_free(run_dir, prep.exp.launcher.stop_timeout_s + 5)
            write_run_files(prep, run_dir, trainer_config, argv, plan)
            provenance.write(run_dir, prep.facts, experiment_hash(prep.exp), origin)
            # Node 0 only: the ranks (also those of the other nodes) cannot start before its agent joins.
            resumed_from = _reset_metrics(prep, run_dir) if where.node_rank == 0 else None
            env = rank_env(prep, run_dir)
            env.update(tracking.env(prep.exp, run_dir, sweep_dir=origin.sweep_dir if origin else None))
            node = f"node {where.node_rank}/{where.nnodes} ({where.how}), " if where.nnodes > 1 else ""
            print(f"qwen3exp: {prep.exp.name}: {prep.mesh.world_size} rank(s) on {prep.facts.name} "
                  f"({prep.facts.reason}); {node}run directory {run_dir}"
                  + (f"; resuming from checkpoint step {resumed_from}" if resumed_from is not None else ""),
                  flush=True)
            start = time.monotonic()
            code = run_torchrun(argv, env, prep.exp.launcher.stop_timeout_s, stop)
        except _Interrupted:
            code = None
    wall = time.monotonic() - start
    if stop.signum is not None:
        status, code = "interrupted", EXIT_SIGNAL[stop.signum]
        error = f"stopped by {signal.Signals(stop.signum).name}" + ("" if stop.proc else " before the ranks started")
    elif code == 0:
        status, error = "completed", None
    else:
        status = "failed"
        error = first_rank_error(run_dir) or (f"torchrun was killed by {signal.Signals(-code).name}" if code < 0
                                              else f"torchrun exited with code {code}")
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
