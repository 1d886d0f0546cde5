"""What a launch does before torchrun starts (`qwen3exp.launchers.local.launch`): wait until no
earlier launch's ranks use the run directory, write the run files (experiment.yaml, platform.json,
plan.json, command.txt) and provenance.json, reset metrics.jsonl on node 0 (kept up to the step a
run resumes from), clear an earlier launch's refusal and time-limit request, build the ranks'
environment and say what starts.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict
from pathlib import Path

from qwen3exp.config.schema import Experiment
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.launchers.outcome import experiment_hash, node_file
from qwen3exp.launchers.torchrun import rank_env
from qwen3exp.plan import render, tracking
from qwen3exp.plan.build import Plan
from qwen3exp.run import console, identity, metrics_file, procs, provenance, redact, rundir, timelimit
from qwen3exp.titan import data_tokens, refusal, weights_record


def write_run_files(plan: Plan, run_dir: Path) -> None:
    """What the ranks read (experiment.yaml, platform.json) and the record of the launch (plan.json,
    command.txt). torchtitan_config.json is written by rank 0: the config it trains with."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_json(run_dir / node_file(rundir.PLAN, plan.placement), plan.as_json())
    rundir.atomic_write_text(run_dir / rundir.EXPERIMENT, rundir.experiment_yaml(identity.recorded_data(plan.exp)))
    rundir.atomic_write_json(run_dir / rundir.PLATFORM, asdict(plan.platform))
    rundir.atomic_write_text(
        run_dir / node_file(rundir.COMMAND, plan.placement), shlex.join(redact.redact_argv(plan.command)) + "\n"
    )


def _wait_until_free(run_dir: Path, timeout_s: float) -> None:
    """A relaunch must not train next to a previous launch's ranks (they may still be dying after
    their launcher was SIGKILLed): wait for them, then refuse."""
    deadline = time.monotonic() + timeout_s
    said = False
    while busy := procs.workers_of(run_dir):
        if not said:
            console.logger("qwen3exp.launch").info(
                f"qwen3exp: waiting up to {timeout_s:.0f}s for the previous launch's rank(s) "
                f"{', '.join(map(str, busy))} in {run_dir} to end"
            )
            said = True
        if time.monotonic() > deadline:
            raise ConfigError(
                [
                    Problem(
                        "hydra.run.dir",
                        str(run_dir),
                        f"is in use by running process(es) {', '.join(map(str, busy))}",
                        "a directory no live run uses",
                        "stop that run first",
                    )
                ]
            )
        time.sleep(0.2)


def _reset_metrics(exp: Experiment, run_dir: Path) -> int | None:
    """Node 0, before any rank starts: a fresh run starts an empty metrics.jsonl (and no samples.jsonl);
    a run resuming from a checkpoint keeps the rows (and answers) up to that step (the later ones are
    trained again).
    Returns the step resumed from."""
    step = rundir.latest_checkpoint_step(run_dir) if exp.checkpoint.resumable else None
    if step is None:
        (run_dir / rundir.METRICS).unlink(missing_ok=True)
    else:
        metrics_file.truncate_metrics(run_dir, step)
    metrics_file.truncate_samples(run_dir, step)
    return step


def prepare_run_dir(plan: Plan, run_dir: Path, origin: provenance.Origin | None) -> tuple[int | None, dict]:
    """Everything before torchrun starts: the run files, provenance, metrics.jsonl reset (node 0),
    the ranks' environment, the opening lines. Returns (the checkpoint step resumed from, the env)."""
    exp, where, facts = plan.exp, plan.placement, plan.platform
    log = console.logger("qwen3exp.launch")
    logs = run_dir / rundir.LOGS
    if where.nnodes == 1:
        _wait_until_free(run_dir, exp.launcher.stop_timeout_s + 5)
    write_run_files(plan, run_dir)
    provenance.write(run_dir, facts, experiment_hash(exp), origin)
    # Node 0 only: the ranks (also those of the other nodes) cannot start before its agent joins.
    resumed_from = _reset_metrics(exp, run_dir) if where.node_rank == 0 else None
    if where.node_rank == 0 and resumed_from is None:
        weights_record.clear(run_dir)  # the ranks report their own step-0 load
        data_tokens.clear(run_dir)  # data=mix: the ranks count from step 1 again
    refusal.refusal_path(run_dir).unlink(missing_ok=True)  # an earlier launch's, in a relaunched directory
    if where.node_rank == 0:
        timelimit.clear(logs)
    env = rank_env(facts, run_dir)
    env.update(tracking.env(exp, run_dir, sweep_dir=origin.sweep_dir if origin else None))
    node = f"node {where.node_rank}/{where.nnodes} ({where.how}), " if where.nnodes > 1 else ""
    log.info(
        f"qwen3exp: {exp.name}: {plan.mesh.world_size} rank(s) on {facts.name} "
        f"({facts.reason}); {node}run directory {run_dir}"
        + (f"; resuming from checkpoint step {resumed_from}" if resumed_from is not None else "")
        + (
            f" (not from checkpoint.load={exp.checkpoint.load})"
            if resumed_from is not None and exp.checkpoint.load != "none"
            else ""
        )
    )
    log.debug("%s", render.render(plan, title=f"the plan of {exp.name}:"))
    for w in plan.warnings:
        log.warning(f"qwen3exp: warning: {w}")
    log.debug("command: %s", shlex.join(redact.redact_argv(plan.command)))
    if where.nnodes > 1:
        log.info(
            f"qwen3exp: waiting for {where.nnodes} node(s) to join the rendezvous "
            f"(up to launcher.rdzv_timeout_s={exp.launcher.rdzv_timeout_s:g}s)",
            extra=console.LIVE,
        )
    else:
        log.info(f"qwen3exp: starting {plan.mesh.world_size} rank(s)", extra=console.LIVE)
    return resumed_from, env
