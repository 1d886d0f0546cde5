"""The command line: `qwen3exp [overrides]` (`-m` for a sweep, `dry_run=true` to plan) and the
commands `qwen3exp init | ls | cp | report | diff | chat | eval | relaunch | data show`.

Hydra's flags are read first (`config.argv.parse_argv`: a flag no check would see is refused);
`--help` is qwen3exp's own (every group and key), `--cfg`, `--info` and `--hydra-help` are Hydra's;
everything else is a launch (`launchers.command`). A word that is no override (`reprot`, `train`,
`training.lr 1e-3`, `x.yaml`) is a slip named with the command that was meant (`config.slips`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from importlib import metadata

from qwen3exp import help, scaffold
from qwen3exp.analysis import diff, relaunch, report
from qwen3exp.config import catalog
from qwen3exp.config.argv import parse_argv
from qwen3exp.config.precheck import check_files
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError
from qwen3exp.launchers import chat_dcp, data_show, eval_command
from qwen3exp.launchers.command import checked_launch, run_hydra
from qwen3exp.launchers.job import COMMAND_ENV
from qwen3exp.launchers.state import job_started
from qwen3exp.run import console, stopping

COMMANDS = {
    "init": scaffold.main,
    "ls": catalog.main_ls,
    "cp": catalog.main_cp,
    "report": report.main,
    "diff": diff.main,
    "chat": chat_dcp.main,
    "eval": eval_command.main,
    "data": data_show.main,
}
"""The commands besides a launch (and `relaunch`, which launches again through `main`)."""


def main(argv: list[str] | None = None, *, command: list[str] | None = None) -> int:
    """`command`: the command line to record (default: `python -m qwen3exp ARGV`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    if argv[:1] == ["relaunch"]:
        return relaunch.main(argv[1:], main)
    if argv == ["--version"]:
        print(versions())
        return 0
    command = command or [sys.executable, "-m", "qwen3exp", *argv]
    os.environ[COMMAND_ENV] = json.dumps(command)
    console.command_started()  # a run's wall time is the command's (launchers.local)
    # Ctrl-C, SIGTERM (a scheduler's preemption) and SIGHUP (the terminal went away) stop a launch
    # with 130 / 143: with the summary, or, before any job started, leaving nothing behind. The
    # command installed the handler first (qwen3exp.entry); an in-process call has it for the call.
    old = {} if stopping.installed() else stopping.install()
    try:
        return stopping.exit_code(_command_line(argv, command))
    except BaseException:
        if stopping.received() is None:
            raise
        # The signal, or what library code raised while the signal unwound it (omegaconf, Hydra).
        if not job_started():
            print("qwen3exp: stopped while checking, before anything started; nothing was kept", file=sys.stderr)
        return stopping.exit_code(130)
    finally:
        stopping.restore(old)


def _command_line(argv: list[str], command: list[str]) -> int:
    """Hydra's flags, qwen3exp's help, or a launch."""
    try:
        inv = parse_argv(argv, commands=[*COMMANDS, "relaunch"])
        if inv.info_flags in (["--help"], ["-h"]):  # qwen3exp's own help: commands, groups, every key
            print(help.render(inv))
            return 0
        if inv.info_flags:  # --hydra-help, --cfg job, ...: Hydra answers by itself, nothing runs
            check_files(inv)  # the config files' size and alias limits, before Hydra parses them
            run_hydra(inv, [], multirun=inv.multirun)
            return 0
    except ConfigError as e:
        stopping.check()  # a signal the config's code turned into a mistake is still the signal
        print(e.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return checked_launch(inv, command)


def versions() -> str:
    """`qwen3exp --version`: qwen3exp's and the versions it runs with (read from the installed
    packages' metadata; nothing is imported)."""

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return "  ".join(f"{name} {version(name)}" for name in ("qwen3exp", "torchtitan", "torch", "hydra-core"))


def entry() -> None:
    """`python -m qwen3exp` and the `qwen3exp` script: main(), then a prompt exit. Everything a run
    writes is already on disk (atomic, fsynced), and the interpreter's own teardown of torch and
    torchtitan (imported to build the config) took 5-11 s on a loaded 2-core machine: long enough
    to turn a Ctrl-C that stopped every rank in 2 s into a launcher that lingers."""
    try:
        try:
            stopping.check()  # a signal some import swallowed
            code = main()
        finally:
            stopping.silence()  # the teardown below is not cut short: a signal only sets the code
    except SystemExit as e:  # Hydra jobs end with SystemExit (interrupted runs: 130 / 143)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except (KeyboardInterrupt, stopping.Terminated):
        code = 130
    except Exception:
        if stopping.received() is None:
            raise
        code = 130  # what a library raised while the signal unwound it: the signal's code (below)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    code = stopping.last_code(code)  # a signal during all of the above too
    if "torch" not in sys.modules:  # nothing slow to tear down: a normal exit runs the exit hooks
        sys.exit(code)  # (joblib's, for sweep.parallel_jobs, removes its temporary folder)
    os._exit(code)


if __name__ == "__main__":
    entry()
