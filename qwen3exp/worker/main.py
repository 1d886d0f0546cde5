"""Runs in every rank under torchrun: `python -m qwen3exp.worker.main RUN_DIR`.

Order matters: die with torchrun (a rank must never outlive its agent), read the resolved files,
prepare the platform (before the first torchtitan import: torchtitan binds the device type at
import; `qwen3exp.titan.job_config` and `overrides`, imported at the top here, import it only inside
their functions), rebuild `Trainer.Config`, train. Hydra never runs here.

Building `Trainer.Config` here is where torchtitan's own config checks run for a plain experiment
(the launcher does not import torchtitan; the plan built it only when kernel overrides are active).
What they refuse is a configuration error, found before the trainer is built, so before any
training step: the rank records it (`logs/config_error.json`, `qwen3exp.titan.refusal`),
prints one line, no traceback, and exits with code 2; the launcher stops torchrun and exits 2 with
the message. Rank 0 writes the config it trains with to `torchtitan_config.json`.

Any other failure writes `logs/error_rank<R>.json` (rank, type, message, traceback) at once, before
any cleanup, so the launcher reports the rank's own error instead of torchrun's wrapper text. The
fault-injection test hooks (`qwen3exp.run.faults`) are read here.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from qwen3exp.config.schema import parse_experiment
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError
from qwen3exp.platforms import PlatformFacts, prepare_worker
from qwen3exp.run import faults, procs, rundir, timelimit
from qwen3exp.titan import overrides
from qwen3exp.titan.job_config import build_checked, init_logging
from qwen3exp.titan.refusal import write_refusal
from qwen3exp.titan.train_end import without_final_sleep
from qwen3exp.titan.warm import import_trainer


def load_run(run_dir: Path):
    """The experiment the launcher planned (checked by its digest, not validated again) and the
    platform's facts."""
    data = rundir.read_planned_experiment(run_dir, os.environ.get(rundir.EXPERIMENT_DIGEST_ENV))
    exp = parse_experiment(data)
    facts = PlatformFacts(**json.loads((run_dir / rundir.PLATFORM).read_text()))
    return exp, facts


def _write_error(run_dir: Path, exc: BaseException) -> None:
    rank = int(os.environ.get("RANK", "0"))
    rundir.atomic_write_json(
        run_dir / rundir.LOGS / f"error_rank{rank}.json",
        {
            "rank": rank,
            "time": time.time(),
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
        },
    )


def train(run_dir: Path) -> None:
    injected = faults.from_env(os.environ, run_dir)
    exp, facts = load_run(run_dir)
    # Also in a rank forked from its prepared agent (`warm`): the rank's own thread count, set on its
    # main thread before any other thread exists (`qwen3exp.platforms.cpu_device.prepare_worker`).
    prepare_worker(facts)
    init_logging()
    rank = int(os.environ.get("RANK", "0"))
    try:
        config = build_checked(exp, facts, run_dir)
    except ConfigError as e:  # torchtitan's own checks refused it: before the trainer, before any step
        _refuse(run_dir, e)
    if rank == 0:
        rundir.atomic_write_json(run_dir / rundir.TORCHTITAN_CONFIG, config.to_dict())
    # torchtitan applies the overrides while building; keep its [Override] lines as a record.
    with overrides.record_applied(run_dir, write=rank == 0):
        trainer = config.build()
    faults.install(trainer, injected, rank)
    if exp.checkpoint.resumable:  # SLURM's pre-timeout signal: checkpoint and stop (run/timelimit.py)
        timelimit.install(trainer, run_dir / rundir.LOGS)
    with without_final_sleep():
        trainer.train()
    _finish(trainer)


def _finish(trainer) -> None:
    """Make this rank's results durable and end its process groups: wait for an asynchronous
    checkpoint save still in flight (torchtitan's `close()` does not), close the checkpointer
    (purge thread, stager) and the metrics loggers (metrics.jsonl, TensorBoard, W&B flush and
    close their files here), destroy the process groups. The last-step checkpoint and the HF
    export are written synchronously inside `train()`, before "Training completed"."""
    import torch  # lazy: a rank imports torch only after `prepare_worker` (loaded by torchtitan by now)

    checkpointer = getattr(trainer, "checkpointer", None)
    if checkpointer is not None:
        checkpointer.maybe_wait_for_saving()
    trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _refuse(run_dir: Path, exc: ConfigError) -> None:
    """torchtitan refused the configuration before the trainer was built: record it for the launcher
    (which prints it and exits 2), say so in one line, exit 2 at once."""
    try:
        write_refusal(run_dir, exc)
        print(
            f"qwen3exp: rank {os.environ.get('RANK', '0')}: torchtitan refused the configuration "
            "(the launcher reports why)",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
    finally:
        os._exit(EXIT_CONFIG_ERROR)


def _fail_fast(run_dir: Path, exc: BaseException) -> None:
    """Record the error, then exit at once: the other ranks wait for this one in a collective, and
    torchrun stops them only when this process is gone (a normal interpreter shutdown with live
    process groups and dataloader threads took seconds here)."""
    try:
        try:
            _write_error(run_dir, exc)
        except OSError as e:  # e.g. the disk is full: the traceback below still says what failed
            print(
                f"qwen3exp: rank {os.environ.get('RANK', '0')} could not write its error report: {e}", file=sys.stderr
            )
        traceback.print_exception(exc)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(1)


def _exit_done(forked: bool) -> None:
    """End a rank whose work is done and whose results are closed (`_finish`): flush the logging
    handlers, stdout and stderr, then os._exit(0), without the interpreter's teardown. A forked rank
    returns instead: torchrun waits for its entrypoint's return value, and its process then ends
    with os._exit (multiprocessing's), without the teardown either."""
    # Why os._exit: a finished rank died in that teardown with "terminate called without an active
    # exception" (SIGABRT) in about 1 of 12 runs (issue 11; once also in the 20-line FSDP script of
    # tests/test_platform_cpu.py), so torchrun exited 1 and a completed run was recorded `failed`.
    # Measured here after destroy_process_group(): native threads Python does not own are still
    # running (gloo_tcp_loop, 2x pt_gloo_runloop: FSDP still holds the group; 8x pt_autograd_N,
    # started by FSDP's backward) next to the daemon thread tqdm_monitor. CPython <= 3.13 ends a
    # thread that takes the GIL during finalization with pthread_exit, and the forced unwind
    # through a C++ noexcept frame calls std::terminate with exactly that message (the known
    # autograd-thread exit race, pytorch issues 38228 / 38230 / 47776); no public API stops those
    # threads first. Skipping the teardown leaves no race to lose. Nothing is lost by it: the
    # results are closed and fsynced before (metrics.jsonl, TensorBoard, checkpoints, HF export),
    # the skipped atexit handlers only stop helper threads and compile-worker processes (which
    # exit with their parent; the launcher kills anything left), and the kernel frees the rest.

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if not forked:
        os._exit(0)


def warm(argv: list[str]) -> None:
    """In the agent, before it forks the ranks (a platform with `forked_ranks`, `qwen3exp.run.agent`):
    prepare the platform and import torchtitan's trainer once, for every rank to inherit."""
    _exp, facts = load_run(Path(argv[0]).resolve())
    prepare_worker(facts)
    import_trainer()


def forked(argv: list[str]) -> None:
    """A rank forked from its agent after `warm`: torchrun's entrypoint in the new process. The
    agent's signal handlers are undone first (a rank dies of SIGTERM, and Ctrl-C is a
    KeyboardInterrupt, as in a new interpreter), and the process is named for the agent's rank map
    (its command line is the agent's)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    procs.name_this_process(f"{procs.FORKED_RANK_PREFIX}{os.environ.get('RANK', '0')}")
    main(argv, forked=True)


def main(argv: list[str] | None = None, *, forked: bool = False) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # A rank's output goes to files in the run directory (torchrun's redirects): on a full disk every
    # log line would add logging's own "--- Logging error ---" traceback. The rank's real error (the
    # write that failed with ENOSPC) is reported anyway.
    logging.raiseExceptions = False
    # SIGKILL when torchrun dies, however it dies: no rank outlives its agent.
    procs.die_with_parent(signal.SIGKILL)
    timelimit.catch_signal(Path(argv[0]).resolve() / rundir.LOGS)  # SIGUSR2 is a request, not fatal
    run_dir = Path(argv[0]).resolve()
    # This rank's error report of an earlier launch into this run directory (a relaunch, a resume)
    # must not be read as this launch's.
    (run_dir / rundir.LOGS / f"error_rank{os.environ.get('RANK', '0')}.json").unlink(missing_ok=True)
    try:
        train(run_dir)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as e:
        _fail_fast(run_dir, e)
    _exit_done(forked)


if __name__ == "__main__":
    main()
