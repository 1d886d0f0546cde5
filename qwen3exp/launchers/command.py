"""A launch from the command line (`qwen3exp [overrides]`, `-m` for a sweep), after its flags were read:

1. the run is composed through Hydra's compose API and checked (`config.precheck`): a typo, an unknown
   option or key, a broken interpolation is exit 2 with the key, the value and what is allowed;
2. the run directory (a sweep: the sweep directory) is claimed: new, empty, a run or sweep that may
   continue there; anything else is refused (`qwen3exp.run.claim`);
3. a single run is a one-job batch of qwen3exp's launcher with that composition (`single`); a sweep
   runs through Hydra (`hydra.main`) as a multirun, whose sweeper hands every batch of jobs to
   qwen3exp's launcher (`batch`), which checks and plans it before any job of it starts;
4. afterwards a run's exit code is its summary's; a sweep prints its end table and writes its report
   from the sweep's manifest. Exit code: 0 all completed, 1 a job failed or did not run, 2 refused
   before anything started, 130/143 stopped by Ctrl-C/SIGTERM. A refused launch removes only what it
   created.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import hydra
from omegaconf import OmegaConf

from qwen3exp.config.argv import Invocation, quote_value
from qwen3exp.config.names import register_resolvers
from qwen3exp.config.precheck import Master, precheck
from qwen3exp.errors import EXIT_CHECK_CRASHED, EXIT_CONFIG_ERROR, ConfigError, printable
from qwen3exp.launchers import search, single, sweep
from qwen3exp.launchers.job import task
from qwen3exp.launchers.registry import launcher_of
from qwen3exp.launchers.state import begin, job_started, started_launcher
from qwen3exp.plan import placement
from qwen3exp.run import claim, identity, rundir, stopping
from qwen3exp.run.redact import redact_text


def checked_launch(inv: Invocation, command: list[str]) -> int:
    """Check, claim, launch; the exit code (see the module docstring)."""
    begin()
    held, dry, refused = None, False, False  # a refusal, even one found inside the job, leaves nothing behind
    try:
        master = precheck(inv)
        stopping.check()  # a signal that Hydra's or pydantic's code swallowed: nothing is claimed
        dry = bool(OmegaConf.select(master.cfg, "dry_run", default=False))
        with stopping.held():  # a signal waits until the claim is whole: `finally` then removes it
            held = _claim(master)
        out = Path(master.output_dir)
        if master.adaptive:
            if dry:  # nobody knows an adaptive sweeper's points before it runs: the space, checked
                return search.dry_run(master, inv)
            search.check_space(master, inv)
            master.extra.extend(search.resume_overrides(master, out))
        return _launch(inv, master, out, command)
    except ConfigError as e:
        stopping.check()  # a signal that library code turned into a mistake is still the signal
        print(e.render(), file=sys.stderr)
        refused = True
        return EXIT_CONFIG_ERROR
    except SystemExit as e:
        if e.code not in (EXIT_CONFIG_ERROR, EXIT_CHECK_CRASHED):
            raise
        refused = True
        return int(e.code)  # refused (or a check crashed): the launcher said why
    finally:
        # Until a job has started, whatever ends the launch (a refusal, a crash in a check, Ctrl-C or
        # SIGHUP while planning) leaves nothing behind; a dry run never keeps anything. A signal
        # during the removal waits for its end.
        if held is not None:
            with stopping.held():
                held.release(discard=dry or refused or not job_started())


def _claim(master: Master):
    """Claim the run or sweep directory before anything is written into it; the launcher then
    checks what a run's folder holds against the planned experiment (resume or refuse)."""
    out = Path(master.output_dir)
    key = "hydra.sweep.dir" if master.multirun else "hydra.run.dir"
    node, exp = _node(master)
    # The nodes' launchers share the folder: each records the run (identity) it belongs to.
    run = identity.of(exp) if node is not None and exp is not None else None
    held = claim.claim(out, key=key, lock=claim.lock_name(node), run=run)
    problem = claim.not_a_sweep_problem(held) if master.multirun else claim.not_a_run_problem(held)
    if problem is not None:
        held.release(discard=True)
        raise ConfigError([problem])
    return held


def _node(master: Master):
    """(this launcher's node rank of a multi-node run, else None; the single run's experiment, as
    the command line validated it, or None)."""
    exp = master.prechecked.checked.exp if master.prechecked is not None else None
    if exp is None or exp.launcher.nnodes == 1:
        return None, exp
    try:
        return placement.resolve(exp, os.environ).node_rank, exp
    except ConfigError:
        return None, exp


def _launch(inv: Invocation, master: Master, out: Path, command: list[str]) -> int:
    since = sweep.manifest_size(out)
    started = time.time()
    stopped = None
    gave_up = False
    try:
        if master.multirun:
            resume = redact_text(
                sweep.resume_command(command, out)
            )  # a secret of the command line stays off the screen
            print(f"  to resume this sweep later, run: {printable(resume)}", flush=True)
            run_hydra(inv, [*master.extra, f"hydra.sweep.dir={quote_value(str(out))}"], multirun=True)
        else:
            single.launch_run(inv, master)
    except KeyboardInterrupt:  # Ctrl-C between two jobs (launcher=slurm: while waiting for them)
        stopped = 130
    except stopping.Terminated:  # SIGTERM (a scheduler's preemption) or SIGHUP (the terminal went away)
        stopped = 143
    except SystemExit as e:  # a job stopped by a signal, a refusal (2), or Hydra itself gave up
        if e.code in (EXIT_CONFIG_ERROR, EXIT_CHECK_CRASHED):
            raise
        if e.code in (130, 143):
            stopped = int(e.code)
        else:
            gave_up = True
            print(f"qwen3exp: stopped early (exit {e.code})", file=sys.stderr)
    return _ended(master, out, command, since, started, stopped, gave_up)


def _ended(
    master: Master, out: Path, command: list[str], since: int, started: float, stopped: int | None, gave_up: bool
) -> int:
    """The launch's exit code, once Hydra or the single run returned."""
    if not job_started():
        if stopped:
            print("qwen3exp: stopped while checking, before anything started; nothing was kept", file=sys.stderr)
        return stopped or (1 if gave_up else 0)
    variant = launcher_of(started_launcher())
    if stopped and variant.hands_over:
        variant.cancel(out)
    if master.adaptive:  # the whole search, earlier launches included (each trial once)
        code = sweep.finish(sweep.recorded(out), out, command, stopped=stopped, adaptive=True)
        return max(code, 1) if gave_up else code
    if master.multirun:
        return sweep.finish(sweep.recorded(out, since), out, command, stopped=stopped)
    return _run_outcome(out, started, stopped, variant, _node(master)[0])


def _run_outcome(run_dir: Path, started: float, stopped: int | None, variant, node: int | None) -> int:
    """A run's exit code: its summary's (written by this launch; another node's launcher of a
    multi-node run writes summary_node<R>.json), or the signal that stopped it."""
    name = rundir.SUMMARY if not node else rundir.SUMMARY.replace(".json", f"_node{node}.json")
    summary = rundir.read_json(run_dir / name)
    if not isinstance(summary, dict) or (run_dir / name).stat().st_mtime < started - 1:
        logs = variant.job_logs(run_dir)
        where = f" (job logs: {logs})" if logs else ""
        print(f"qwen3exp: the run wrote no summary{where}", file=sys.stderr)
        return stopped or 1
    if variant.hands_over:
        error = summary.get("error")
        print(f"qwen3exp: {summary.get('status')}: {run_dir}" + (f"\n  error: {error}" if error else ""), flush=True)
    return stopped or int(summary.get("exit_code", 1))


def run_hydra(inv: Invocation, extra: list[str], *, multirun: bool) -> None:
    """Hydra's own entry (`hydra.main`) with this command line: a sweep, or a command Hydra answers
    by itself (--cfg, --info, --hydra-help)."""
    register_resolvers()
    main = hydra.main(config_path=str(inv.config_dir), config_name=inv.config_name, version_base="1.3")(task)
    saved = sys.argv
    sys.argv = [saved[0], *inv.hydra_argv(extra, multirun=multirun)]
    try:
        main()
    finally:
        sys.argv = saved
