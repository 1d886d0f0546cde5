"""The command line: `qwen3exp [overrides]` (`-m` for a sweep, `dry_run=true` to plan) and the
commands `qwen3exp init | report | diff | relaunch`.

1. Hydra's flags are read (`parse_argv`; a flag no check would see is refused) and the run is
   composed through Hydra's compose API (`precheck`): a typo, an unknown option or key, a broken
   interpolation is exit 2 with the key, the value and what is allowed, before anything is written.
2. The run directory (a sweep: the sweep directory) is claimed: new, empty, a run or sweep that may
   continue there; anything else is refused (`qwen3exp.run.claim`).
3. Hydra runs, always as a multirun through qwen3exp's Hydra launcher: a run is a one-job sweep whose
   job folder is the run directory (`hydra.sweep.subdir=.`). The launcher checks and plans every
   batch of jobs any sweeper hands it before a job of it starts (`qwen3exp.launchers.batch`).
4. Afterwards a run's exit code is its summary's; a sweep prints its end table and writes its
   report from the sweep's manifest. Exit code: 0 all completed, 1 a job failed or did not run,
   2 refused before anything started, 130/143 stopped by Ctrl-C/SIGTERM. A refused launch removes
   only what it created.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from qwen3exp.config.compose import Invocation, Master, parse_argv, precheck, quote_value
from qwen3exp.errors import EXIT_CHECK_CRASHED, EXIT_CONFIG_ERROR, ConfigError, printable

COMMANDS = ("init", "report", "diff", "relaunch")


def _command(name: str, argv: list[str]) -> int:
    if name == "init":
        from qwen3exp import scaffold

        return scaffold.main(argv)
    if name == "report":
        from qwen3exp.analysis import report

        return report.main(argv)
    if name == "diff":
        from qwen3exp.analysis import diff

        return diff.main(argv)
    from qwen3exp.analysis import relaunch

    return relaunch.main(argv, main)


def main(argv: list[str] | None = None, *, command: list[str] | None = None) -> int:
    """`command`: the command line to record (default: `python -m qwen3exp ARGV`)."""
    from qwen3exp.launchers.batch import COMMAND_ENV

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in COMMANDS:
        return _command(argv[0], argv[1:])
    if argv == ["--version"]:
        print(versions())
        return 0
    command = command or [sys.executable, "-m", "qwen3exp", *argv]
    os.environ[COMMAND_ENV] = json.dumps(command)
    from qwen3exp.run import console

    console.command_started()  # a run's wall time is the command's (launchers.local)
    try:
        inv = parse_argv(argv)
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if inv.info_flags in (["--help"], ["-h"]):  # qwen3exp's own help: commands, groups, every key
        from qwen3exp import help

        try:
            print(help.render(inv))
        except ConfigError as e:
            print(e.render(), file=sys.stderr)
            return EXIT_CONFIG_ERROR
        return 0
    if inv.info_flags:  # --hydra-help, --cfg job, ...: Hydra answers by itself, nothing runs
        from qwen3exp.config.compose import check_files

        try:
            check_files(inv)  # the config files' size and alias limits, before Hydra parses them
        except ConfigError as e:
            print(e.render(), file=sys.stderr)
            return EXIT_CONFIG_ERROR
        _run_hydra(inv, [], multirun=inv.multirun)
        return 0
    # SIGTERM (a scheduler's preemption) and SIGHUP (the terminal went away) stop a launch like
    # Ctrl-C: with the summary, or, before any job started, leaving nothing behind.
    old = {sig: signal.signal(sig, _on_sigterm) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _checked_launch(inv, command)
    except (KeyboardInterrupt, _Terminated) as e:
        print("qwen3exp: stopped while checking, before anything started; nothing was kept", file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 143
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _checked_launch(inv: Invocation, command: list[str]) -> int:
    from qwen3exp.launchers.batch import job_started

    try:
        master = precheck(inv)
        held = _claim(master)
    except ConfigError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    out = Path(master.output_dir)
    dry = _dry_run(master)
    refused = False  # a refusal, even one found inside the job, leaves nothing behind
    try:
        if master.adaptive:
            from qwen3exp.launchers import search

            if dry:  # nobody knows an adaptive sweeper's points before it runs: the space, checked
                return search.dry_run(master, inv)
            search.check_space(master, inv)
            master.extra.extend(search.resume_overrides(master, out))
        return _launch(inv, master, out, command, dry)
    except ConfigError as e:
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
        # SIGHUP while planning) leaves nothing behind; a dry run never keeps anything.
        held.release(discard=dry or refused or not job_started())


def versions() -> str:
    """`qwen3exp --version`: qwen3exp's and the versions it runs with (read from the installed
    packages' metadata; nothing is imported)."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return "  ".join(f"{name} {version(name)}" for name in ("qwen3exp", "torchtitan", "torch", "hydra-core"))


def _dry_run(master: Master) -> bool:
    from omegaconf import OmegaConf

    return bool(OmegaConf.select(master.cfg, "dry_run", default=False))


def _claim(master: Master):
    """Claim the run or sweep directory before anything is written into it; the launcher then
    checks what a run's folder holds against the planned experiment (resume or refuse)."""
    from qwen3exp.run import claim, identity

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


def _node_rank(master: Master) -> int | None:
    """A multi-node local run: each node's launcher holds a lock of its own in the one folder."""
    return _node(master)[0]


def _node(master: Master):
    """(this launcher's node rank of a multi-node run, else None; the experiment, validated once)."""
    from qwen3exp.config.compose import experiment_data
    from qwen3exp.config.schema import check_experiment

    if master.multirun:
        return None, None
    try:
        exp = check_experiment(experiment_data(master.cfg)[0]).exp
    except ConfigError:
        return None, None
    if exp is None or exp.launcher.nnodes == 1:
        return None, exp
    from qwen3exp.plan import placement

    try:
        return placement.resolve(exp, os.environ).node_rank, exp
    except ConfigError:
        return None, exp


class _Terminated(BaseException):
    """SIGTERM or SIGHUP outside a job (while checking, between two jobs): stop like Ctrl-C."""


def _on_sigterm(signum, _frame):
    from qwen3exp.launchers.batch import job_started

    if signum == signal.SIGHUP and job_started():
        # A job is running: its launcher stops the ranks and records the run on SIGTERM (qwen3exp's
        # local launcher installs that handler for the job's lifetime); a hang-up means the same.
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise _Terminated()


def _launch(inv: Invocation, master: Master, out: Path, command: list[str], dry: bool) -> int:
    from qwen3exp.launchers import sweep
    from qwen3exp.launchers.batch import job_started

    since = sweep.manifest_size(out)
    extra = [*master.extra, f"hydra.sweep.dir={quote_value(str(out))}"]
    if master.multirun:
        from qwen3exp.run.provenance import redact_text

        resume = redact_text(sweep.resume_command(command, out))  # a secret of the command line stays off the screen
        print(f"  to resume this sweep later, run: {printable(resume)}", flush=True)
    else:
        extra.append("hydra.sweep.subdir=.")
    started = time.time()
    stopped = None
    gave_up = False
    try:
        _run_hydra(inv, extra, multirun=True)
    except KeyboardInterrupt:  # Ctrl-C between two jobs (launcher=slurm: while waiting for them)
        stopped = 130
    except _Terminated:  # SIGTERM (a scheduler's preemption) or SIGHUP (the terminal went away)
        stopped = 143
    except SystemExit as e:  # a job stopped by a signal, a refusal (2), or Hydra itself gave up
        if e.code in (EXIT_CONFIG_ERROR, EXIT_CHECK_CRASHED):
            raise
        if e.code in (130, 143):
            stopped = int(e.code)
        else:
            gave_up = True
            print(f"qwen3exp: stopped early (exit {e.code})", file=sys.stderr)
    if not job_started():
        if stopped:
            print("qwen3exp: stopped while checking, before anything started; nothing was kept", file=sys.stderr)
        return stopped or (1 if gave_up else 0)
    slurm = _is_slurm(master)
    if slurm and stopped:
        _cancel(out)
    if master.adaptive:  # the whole search, earlier launches included (each trial once)
        code = sweep.finish(sweep.recorded(out), out, command, stopped=stopped, adaptive=True)
        return max(code, 1) if gave_up else code
    if master.multirun:
        return sweep.finish(sweep.recorded(out, since), out, command, stopped=stopped)
    return _run_outcome(out, started, stopped, slurm, _node_rank(master))


def _run_outcome(run_dir: Path, started: float, stopped: int | None, slurm: bool, node: int | None) -> int:
    """A run's exit code: its summary's (written by this launch; another node's launcher of a
    multi-node run writes summary_node<R>.json), or the signal that stopped it."""
    from qwen3exp.run import rundir

    name = rundir.SUMMARY if not node else rundir.SUMMARY.replace(".json", f"_node{node}.json")
    summary = rundir.read_json(run_dir / name)
    if not isinstance(summary, dict) or (run_dir / name).stat().st_mtime < started - 1:
        where = f" (job logs: {run_dir / '.submitit'})" if slurm else ""
        print(f"qwen3exp: the run wrote no summary{where}", file=sys.stderr)
        return stopped or 1
    if slurm:
        error = summary.get("error")
        print(f"qwen3exp: {summary.get('status')}: {run_dir}" + (f"\n  error: {error}" if error else ""), flush=True)
    return stopped or int(summary.get("exit_code", 1))


def _is_slurm(master: Master) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(master.cfg, "launcher.kind", default=None) == "slurm"


def _cancel(sweep_dir: Path) -> None:
    """Ctrl-C or SIGTERM while waiting for SLURM jobs: cancel them and wait until they have ended
    (their launchers record the runs as interrupted)."""
    from qwen3exp.launchers import slurm

    jobs = slurm.cancel_submitted(sweep_dir)
    print(f"qwen3exp: cancelled SLURM job(s) {', '.join(jobs) or '(none found)'}", file=sys.stderr, flush=True)
    slurm.wait_gone(jobs, timeout_s=60)


def _run_hydra(inv: Invocation, extra: list[str], *, multirun: bool) -> None:
    import hydra

    from qwen3exp.config.names import register_resolvers
    from qwen3exp.launchers.batch import task

    register_resolvers()
    main = hydra.main(config_path=str(inv.config_dir), config_name=inv.config_name, version_base="1.3")(task)
    saved = sys.argv
    sys.argv = [saved[0], *inv.hydra_argv(extra, multirun=multirun)]
    try:
        main()
    finally:
        sys.argv = saved


def entry() -> None:
    """`python -m qwen3exp` and the `qwen3exp` script: main(), then a prompt exit. Everything a run
    writes is already on disk (atomic, fsynced), and the interpreter's own teardown of torch and
    torchtitan (imported to build the config) took 5-11 s on a loaded 2-core machine: long enough
    to turn a Ctrl-C that stopped every rank in 2 s into a launcher that lingers."""
    import logging

    try:
        code = main()
    except SystemExit as e:  # Hydra jobs end with SystemExit (interrupted runs: 130 / 143)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if "torch" not in sys.modules:  # nothing slow to tear down: a normal exit runs the exit hooks
        sys.exit(code)              # (joblib's, for sweep.parallel_jobs, removes its temporary folder)
    os._exit(code)


if __name__ == "__main__":
    entry()
