"""The launcher: run directory, torchrun, child processes, signals, summary.

It runs a Plan (`qwen3exp.plan.build.make_plan`: every check that can fail on a bad configuration,
and everything resolved: platform, mesh, batches, node placement, override claims, this node's
torchrun command) and resolves nothing again. `launch(plan, run_dir)` writes the run directory
(with `provenance.json`: where the run came from), starts torchrun (or srun starting one torchrun
agent per node) at once and supervises it:
- torchtitan's own config checks run in the ranks, before the trainer is built (the launcher does
  not import torch or torchtitan for a plain experiment: the ranks import them anyway). A rank they
  refuse records a ConfigError (`qwen3exp.titan.job_config.write_refusal`); the launcher stops
  torchrun at once and raises that ConfigError (exit 2, before any training step).
- Ctrl-C or SIGTERM: torchrun is asked to stop its ranks (SIGTERM, which ends a rank even while it
  waits in a collective); after `launcher.stop_timeout_s` everything left is killed; summary
  `interrupted`, exit code 130 / 143; one line says what is saved and the command that resumes
  (`qwen3exp.launchers.outcome`). Before torchrun runs, the signal abandons the launch.
- A rank that raises: torchrun stops the others at once; the summary carries that rank's own error
  (`logs/error_rank<R>.json`, written by the worker), not torchrun's wrapper text.
- No orphans: the launcher is a child subreaper, torchrun dies with the launcher (even a SIGKILLed
  one) and every rank dies with torchrun (`qwen3exp.run.procs`); whatever is left is killed at the end.
- `summary.json` (node 0; with the experiment's content hash) is written atomically, also when the
  disk fills (`qwen3exp.launchers.outcome`); its wall time is the command's, an HF export and its
  verification included; after a SIGKILLed launcher there is none, and a relaunch in the same
  directory resumes from the latest complete checkpoint when checkpointing is on.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

from qwen3exp.config.schema import Experiment, SlurmLauncher
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.launchers import outcome
from qwen3exp.launchers.outcome import experiment_hash, node_file
from qwen3exp.plan import tracking
from qwen3exp.plan.build import Plan, Prepared, prepare as _prepare
from qwen3exp.platforms import PlatformFacts
from qwen3exp.run import console, identity, procs, progress, provenance, rundir, timelimit
from qwen3exp.titan import job_config


def rank_env(facts: PlatformFacts, run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(facts.env)
    # Folders the platform keeps inside the run directory (e.g. the Neuron compile cache).
    env.update({k: str(run_dir / v) for k, v in facts.run_dir_env.items()})
    # Nothing is downloaded at run time: tokenizer, data and weights are local.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def may_join(exp: Experiment, run_dir: Path) -> bool:
    """True when `run_dir` holds the same multi-node run, not finished, started by another node's
    launcher (every node's launcher writes the run files; whichever comes first)."""
    if exp.launcher.nnodes == 1 or (run_dir / rundir.SUMMARY).exists():
        return False
    return rundir.read_experiment(run_dir) is not None and identity.same(exp, run_dir)


def write_run_files(plan: Plan, run_dir: Path) -> None:
    """What the ranks read (experiment.yaml, platform.json) and the record of the launch (plan.json,
    command.txt). torchtitan_config.json is written by rank 0: the config it trains with."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.atomic_write_json(run_dir / node_file(rundir.PLAN, plan.placement), plan.as_json())
    rundir.atomic_write_text(run_dir / rundir.EXPERIMENT,
                             rundir.experiment_yaml(identity.recorded_data(plan.exp)))
    rundir.atomic_write_json(run_dir / rundir.PLATFORM, asdict(plan.platform))
    rundir.atomic_write_text(run_dir / node_file(rundir.COMMAND, plan.placement),
                             shlex.join(provenance.redact_argv(plan.command)) + "\n")


class _Interrupted(Exception):
    """Ctrl-C / SIGTERM before torchrun was started: the launch is abandoned."""


class _StopSignals:
    """SIGINT and SIGTERM for the whole launch (in a SLURM job this also replaces submitit's
    handler, which ignores SIGTERM). Before torchrun runs, a signal abandons the launch at once;
    while it runs, the first signal is remembered and torchrun is asked to stop its ranks."""

    def __init__(self, logs: Path | None = None) -> None:
        self.signum: int | None = None
        self.at: float | None = None
        self.proc: subprocess.Popen | None = None
        self.logs = logs

    def __enter__(self) -> _StopSignals:
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        # SLURM's pre-timeout signal, should it reach the launcher: a request for the ranks
        # (qwen3exp.run.timelimit); submitit's own handler runs after the launch, if at all.
        self._old[signal.SIGUSR2] = signal.signal(signal.SIGUSR2, self._time_limit)
        return self

    def _time_limit(self, _signum, _frame) -> None:
        if self.logs is not None:
            timelimit.request(self.logs, "launcher")

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
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def run_torchrun(argv: list[str], env: dict, stop_timeout_s: float, stop: _StopSignals,
                 refusal: Path | None = None, deadline: float | None = None,
                 on_line: Callable[[str], None] | None = None, on_tick: Callable[[], None] | None = None) -> int:
    """Start torchrun (or srun) in its own session and supervise it until it and every process it
    started are gone; returns its exit code. `refusal`: the file a rank writes when torchtitan
    refuses the configuration; once it exists torchrun and its ranks are killed at once (no rank
    has trained: they all build the same config before the trainer, and a rank that got past it
    only waits for the others; `launcher.max_restarts` must not restart a configuration error, and
    torchrun's own failure report would bury the message). `on_line`: called (from a reader thread)
    with each line torchrun prints (rank 0's output, teed), instead of passing it to the terminal;
    `on_tick`: called every 0.1 s while torchrun runs."""
    procs.become_subreaper()
    me = os.getpid()
    # Processes that were already ours before this run (e.g. of a test harness) are not touched.
    before = set(procs.descendants(me))
    if stop.signum is not None:  # a signal some library code swallowed during the preparation
        raise _Interrupted(stop.signum)
    reader = None
    try:
        pipe = subprocess.PIPE if on_line is not None else None
        stop.proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=pipe,
                                     stderr=subprocess.STDOUT if pipe else None,
                                     preexec_fn=lambda: procs.die_with_parent(signal.SIGTERM, me))
        if on_line is not None:
            reader = threading.Thread(target=_read_lines, args=(stop.proc.stdout, on_line), daemon=True,
                                      name="qwen3exp-torchrun-output")
            reader.start()
        if stop.signum is not None:  # it came while torchrun was being started
            stop.stop_torchrun()
        while True:
            if on_tick is not None:
                on_tick()
            try:
                return stop.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                if deadline is not None and time.time() >= deadline and stop.logs is not None:
                    timelimit.request(stop.logs, "launcher (the job's time limit is near)")
                    deadline = None
                if refusal is not None and stop.signum is None and refusal.exists():
                    _kill_group(stop.proc.pid)
                    procs.kill_tree(me, exclude=before | {stop.proc.pid})
                elif stop.at is not None and time.monotonic() - stop.at > stop_timeout_s:
                    procs.kill_tree(me, exclude=before | {stop.proc.pid})
                    _kill_group(stop.proc.pid)
    finally:
        # No orphans: ranks torchrun left behind (re-parented to us) and anything else it started.
        procs.kill_tree(me, exclude=before)
        if stop.proc is not None:
            _kill_group(stop.proc.pid)
        if reader is not None:  # the last lines torchrun printed come before the launcher's outcome
            reader.join(timeout=5)


def _read_lines(stream, on_line: Callable[[str], None]) -> None:
    for raw in iter(stream.readline, b""):
        try:
            on_line(raw.decode("utf-8", errors="replace"))
        except Exception as e:  # the console must never stop the launch
            print(f"qwen3exp: could not show a rank's line: {type(e).__name__}: {e}", flush=True)
    stream.close()


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
    said = False
    while busy := procs.workers_of(run_dir):
        if not said:
            console.logger("qwen3exp.launch").info(
                f"qwen3exp: waiting up to {timeout_s:.0f}s for the previous launch's rank(s) "
                f"{', '.join(map(str, busy))} in {run_dir} to end")
            said = True
        if time.monotonic() > deadline:
            raise ConfigError([Problem(
                "hydra.run.dir", str(run_dir), f"is in use by running process(es) {', '.join(map(str, busy))}",
                "a directory no live run uses", "stop that run first")])
        time.sleep(0.2)


def _reset_metrics(exp: Experiment, run_dir: Path) -> int | None:
    """Node 0, before any rank starts: a fresh run starts an empty metrics.jsonl; a run resuming
    from a checkpoint keeps the rows up to that step (the later ones are trained again).
    Returns the step resumed from."""
    step = rundir.latest_checkpoint_step(run_dir) if exp.checkpoint.kind == "dcp" else None
    if step is None:
        (run_dir / rundir.METRICS).unlink(missing_ok=True)
    else:
        rundir.truncate_metrics(run_dir, step)
    return step


def _time_limit_deadline(exp: Experiment) -> float | None:
    """A SLURM job with checkpoint=dcp: when the ranks are to checkpoint and stop."""
    if not isinstance(exp.launcher, SlurmLauncher) or exp.checkpoint.kind != "dcp":
        return None
    from qwen3exp.launchers import slurm

    return slurm.time_limit_deadline(exp.launcher, os.environ)


def launch(plan: Plan, run_dir: Path, *, origin: provenance.Origin | None = None) -> dict:
    """Run the checked `plan` in `run_dir` (the directory it was made for): write the run directory
    (plan.json and provenance.json included), run torchrun, complete an HF export, write
    summary.json; returns the summary. Raises ConfigError when torchtitan's own checks refuse the
    configuration in the ranks (torchrun is stopped first; no summary). `origin`: the command line
    and Hydra overrides, for provenance.json and the command that resumes. The wall time is the
    command's (`console.command_start`) for a run, the job's for a job of a sweep."""
    run_dir = Path(run_dir)
    if Path(plan.run_dir).resolve() != run_dir.resolve():
        raise ValueError(f"the plan was made for run directory {plan.run_dir}, not {run_dir}")
    exp, where = plan.exp, plan.placement
    console.tolerate_full_disk()
    begun, started = time.monotonic(), time.time()
    start = console.command_start(begun) if origin is not None and origin.mode == "RUN" else begun
    resumed_from = None
    logs = run_dir / rundir.LOGS
    earlier = timelimit.earlier_attempts(run_dir, experiment_hash(exp)) if where.node_rank == 0 else []
    reserve = outcome.SummaryReserve(logs / node_file(outcome.SUMMARY_RESERVE, where))
    with _StopSignals(logs) as stop:
        try:
            resumed_from, env = _prepare_run_dir(plan, run_dir, origin)
            reserve.make()
            watch = progress.Watch(run_dir / rundir.METRICS, exp.training.steps, verbose=exp.verbose,
                                   node_rank=where.node_rank, stopping=lambda: stop.signum is not None)
            code = run_torchrun(plan.command, env, exp.launcher.stop_timeout_s, stop, job_config.refusal_path(run_dir),
                                deadline=_time_limit_deadline(exp), on_line=watch.line, on_tick=watch.tick)
            watch.finish()
        except _Interrupted:
            code = None
        except BaseException:
            reserve.release()
            raise
        finally:
            console.end_live()  # what comes next (a refusal on stderr, the outcome) starts a line of its own
    try:
        if stop.signum is None and code != 0 and (refused := job_config.read_refusal(run_dir)) is not None:
            raise refused
        status, exit_code, error = outcome.status(plan, run_dir, code, stop.signum, ranks_started=stop.proc is not None,
                                                  since=started)
    finally:
        reserve.release()  # the ranks are gone: the room held for the summary and the last lines
    export = None
    if status == "completed" and exp.checkpoint.exports:
        export = outcome.finish_export(plan, run_dir)
        if not export["ok"]:
            status, exit_code, error = "failed", 1, f"the Hugging Face export does not verify: {export['error']}"
    wall = time.monotonic() - start
    # Node 0: every attempt in this run directory (requeues of a SLURM job, relaunches).
    this = timelimit.attempt_record(os.environ, number=len(earlier) + 1, status=status, started=started,
                                    wall=wall, resumed_from=resumed_from, error=error,
                                    steps=rundir.read_metrics(run_dir))
    summary = outcome.summarize(plan, run_dir, exit_code=exit_code, status=status, wall=wall, error=error,
                                resumed_from=resumed_from, export=export,
                                extra={"attempts": [*earlier, this]} if where.node_rank == 0 else None)
    if stop.signum is not None:
        console.logger("qwen3exp.launch").warning(
            outcome.stopped_line(plan, run_dir, stop.signum, origin, ranks_started=stop.proc is not None))
    else:
        outcome.say(summary, run_dir)
    return summary


def _prepare_run_dir(plan: Plan, run_dir: Path, origin: provenance.Origin | None) -> tuple[int | None, dict]:
    """Everything before torchrun starts: the run files, provenance, metrics.jsonl reset (node 0),
    the ranks' environment, the opening lines. Returns (the checkpoint step resumed from, the env)."""
    from qwen3exp.plan import render

    exp, where, facts = plan.exp, plan.placement, plan.platform
    log = console.logger("qwen3exp.launch")
    logs = run_dir / rundir.LOGS
    if where.nnodes == 1:
        _wait_until_free(run_dir, exp.launcher.stop_timeout_s + 5)
    write_run_files(plan, run_dir)
    provenance.write(run_dir, facts, experiment_hash(exp), origin)
    # Node 0 only: the ranks (also those of the other nodes) cannot start before its agent joins.
    resumed_from = _reset_metrics(exp, run_dir) if where.node_rank == 0 else None
    job_config.refusal_path(run_dir).unlink(missing_ok=True)  # an earlier launch's, in a relaunched directory
    if where.node_rank == 0:
        timelimit.clear(logs)
    env = rank_env(facts, run_dir)
    env.update(tracking.env(exp, run_dir, sweep_dir=origin.sweep_dir if origin else None))
    node = f"node {where.node_rank}/{where.nnodes} ({where.how}), " if where.nnodes > 1 else ""
    log.info(f"qwen3exp: {exp.name}: {plan.mesh.world_size} rank(s) on {facts.name} "
             f"({facts.reason}); {node}run directory {run_dir}"
             + (f"; resuming from checkpoint step {resumed_from}" if resumed_from is not None else ""))
    log.debug("%s", render.render(plan, title=f"the plan of {exp.name}:"))
    for w in plan.warnings:
        log.warning(f"qwen3exp: warning: {w}")
    log.debug("command: %s", shlex.join(provenance.redact_argv(plan.command)))
    if where.nnodes > 1:
        log.info(f"qwen3exp: waiting for {where.nnodes} node(s) to join the rendezvous "
                 f"(up to launcher.rdzv_timeout_s={exp.launcher.rdzv_timeout_s:g}s)", extra=console.LIVE)
    else:
        log.info(f"qwen3exp: starting {plan.mesh.world_size} rank(s)", extra=console.LIVE)
    return resumed_from, env


def prepare(exp: Experiment, env: Mapping[str, str] | None = None) -> Prepared:
    """`plan.build.prepare` with the torchtitan adapter's kernel override matcher (for tests and
    notebooks; a launch runs make_plan's Plan)."""
    from qwen3exp.titan.job_config import override_claims

    return _prepare(exp, env, claims_of=override_claims)
