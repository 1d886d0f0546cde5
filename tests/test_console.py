"""The launcher's console in pieces: the noise filter (`qwen3exp.run.noise`), the progress lines
(`qwen3exp.run.progress`) and the terminal handler (`qwen3exp.run.console`). The whole of it runs
in tests/test_cli.py (a real training, output captured, and with -v)."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from qwen3exp.run import console, noise, progress

# Lines rank 0 printed in real runs on this machine (CPU, native and Transformers backends), with
# torchrun's prefix.
REAL = [
    "[default0]:[titan] 2026-12-01 18:29:14,452 - root - WARNING - initial_load_model_only=True has no effect "
    "without an initial_load_path.",
    "[default0]:[titan] 2026-12-01 18:29:14,458 - root - WARNING - ENV[TORCH_NCCL_ASYNC_ERROR_HANDLING] = 1 will "
    "be overridden to 3 based on job config",
    "[default0]:[titan] 2026-12-01 18:29:14,595 - root - WARNING - Error running lspci: [Errno 2] No such file or "
    "directory: 'lspci', fallback to use device_name",
    "[default0]:[titan] 2026-12-01 18:29:14,595 - root - WARNING - Peak flops undefined for: AMD EPYC, "
    "fallback to A100",
    "[default0]:[titan] 2026-12-01 18:29:15,082 - root - WARNING - model.safetensors.index.json not found at "
    "hf_assets_path: /x/model.safetensors.index.json.                     Defaulting to saving a single file",
    "[default0]:[titan] 2026-12-01 18:29:15,083 - root - WARNING - CUDA graph capture is only supported on NVIDIA "
    "CUDA; using eager execution.",
    "[default0]:[titan] 2026-12-01 18:34:15,681 - torchtitan.config.configurable - WARNING - Config field value of "
    "type dtype may not be JSON serializable",
    "[default0]:/v/lib/python3.11/site-packages/torch/distributed/tensor/_random.py:76: UserWarning: DTensor random "
    "operators may not have complete support on cpu device mesh",
    "[default0]:/v/lib/python3.11/site-packages/torchtitan/distributed/utils.py:311: UserWarning: DTensor "
    "manual_seed() may not have complete support on cpu device mesh",
    "[default0]:/v/lib/python3.11/site-packages/torchdata/stateful_dataloader/stateful_dataloader.py:379: "
    "UserWarning: 'set_vital' is deprecated, please do not call",
    "Loading weights:   0%|          | 0/24 [00:00<?, ?it/s]Loading weights: 100%|##########| 24/24 [00:00<00:00]",
    "[default0]:Generating train split: 729 examples [00:00, 125741.15 examples/s]",
]


def test_every_silenced_entry_matches_a_real_line_and_has_a_reason():
    matched = {noise.silenced(noise.parse(line).message).pattern for line in REAL}
    assert matched == {s.pattern for s in noise.SILENCED}
    assert all(len(s.reason) > 20 and s.source for s in noise.SILENCED)


def test_filter_hides_known_lines_and_info_but_shows_the_rest():
    f = noise.RankFilter(verbose=False)
    shown = [
        line
        for line in [
            REAL[7],
            "[default0]:  if not is_rng_supported_mesh(device_mesh):",  # the warning's source line
            "[default0]:[titan] 2026-12-01 18:29:14,485 - root - INFO - Building device mesh with parallelism: pp=1",
            "[default0]:[titan] 2026-12-01 18:29:14,485 - root - WARNING - Something new happened",
            "[default0]:/x/y.py:3: FutureWarning: an unknown warning",
            "[default0]:  its source line",
            "[default0]:Traceback (most recent call last):",
            '[default0]:  File "/x/y.py", line 3, in <module>',
            "[default0]:RuntimeError: boom",
        ]
        if f.shows(noise.parse(line))
    ]
    assert shown == [
        "[default0]:[titan] 2026-12-01 18:29:14,485 - root - WARNING - Something new happened",
        "[default0]:/x/y.py:3: FutureWarning: an unknown warning",
        "[default0]:  its source line",
        "[default0]:Traceback (most recent call last):",
        '[default0]:  File "/x/y.py", line 3, in <module>',
        "[default0]:RuntimeError: boom",
    ]
    assert f.hidden == {"known warnings": 2, "torchtitan info lines": 1}
    assert "2 known warnings, 1 torchtitan info lines" in f.summary()
    # A rank's stdout and stderr interleave: a torchtitan line between a known warning and its
    # source line (a resumed run, issue 22) does not let the source line through; an empty line says nothing.
    assert not [
        line
        for line in [
            REAL[9],
            "[default0]:[titan] 2026-12-01 18:29:14,485 - root - INFO - Loading the checkpoint from /c/step-2.",
            '[default0]:  torch.set_vital("Dataloader", "enabled", "True")  # type: ignore[attr-defined]',
            "[default0]:",
        ]
        if f.shows(noise.parse(line))
    ]
    verbose = noise.RankFilter(verbose=True)
    assert all(verbose.shows(noise.parse(line)) for line in REAL) and verbose.summary() is None


def test_phases_from_torchtitan_lines():
    def phase(message):
        return progress.phase_of(noise.parse(f"[default0]:[titan] 2026-12-01 18:29:14,485 - root - INFO - {message}"))

    assert phase("Building qwen3 tiny") == "building the model (qwen3 tiny)"
    assert phase("Loading from HF safetensors from --checkpoint.initial_load_path: /w/m") == "loading weights from /w/m"
    assert phase("Compiling each TransformerBlock with torch.compile").startswith("compiling")
    assert phase("Training starts at step 7") == "training from step 7"
    assert phase("Preparing qwen3exp_validation dataset from /c") is None
    assert phase("Preparing qwen3exp_local dataset from /c") == "preparing the data (/c)"
    assert phase("Applied FSDP to the model") is None


def test_progress_lines_with_eta(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    said: list[tuple[str, bool]] = []
    clock = iter([100.0, 102.0, 104.0, 106.0, 108.0]).__next__
    p = progress.Progress(metrics, 10, lambda text, live: said.append((text, live)), now=clock)
    p.poll()  # no file yet
    row = {"loss": 7.5, "tokens_per_second": 4816.2, "memory_gib": 0.97, "mfu": None, "step_seconds": 1.5}
    with metrics.open("w") as f:
        f.write(json.dumps({"step": 1, **row}) + "\n")
        f.write(json.dumps({"step": 1, "val_loss": 7.25, "val_perplexity": 1408.1}) + "\n")
        f.write(json.dumps({"step": 2, **row})[:20])  # a row being written
    p.poll()
    with metrics.open("a") as f:
        f.write(json.dumps({"step": 2, **row})[20:] + "\n")
    p.poll()
    assert said[0] == ("qwen3exp: step 1/10 (10%)  loss 7.5000  4,816 tok/s  0.97 GiB  elapsed 0:02  ETA 0:14", True)
    assert said[1] == ("qwen3exp: validation at step 1: loss 7.2500, perplexity 1,408.1", False)
    # 2 s between the two steps seen: 8 steps left, 16 s
    assert said[2] == (
        "qwen3exp: step 2/10 (20%)  loss 7.5000  val 7.2500  4,816 tok/s  0.97 GiB  elapsed 0:04  ETA 0:16",
        True,
    )
    assert progress.clock(3725) == "1:02:05" and progress.clock(None) == "?"


def test_progress_of_a_resumed_run_shows_only_its_new_steps(tmp_path):
    """Issue 22: a resumed run printed its earlier steps again ("step 1/40 ... elapsed 0:00 ETA 0:00")."""
    metrics = tmp_path / "metrics.jsonl"
    kept = [{"step": 1, "loss": 7.6}, {"step": 1, "val_loss": 7.5, "val_perplexity": 1808.0}, {"step": 2, "loss": 7.5}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in kept))  # what the checkpoint step-2 resume keeps
    said: list[str] = []
    p = progress.Progress(metrics, 40, lambda text, live: said.append(text), now=iter([0.0, 5.0]).__next__)
    p.poll()
    with metrics.open("a") as f:
        f.write(json.dumps({"step": 3, "loss": 7.4}) + "\n")
    p.poll()
    assert said == ["qwen3exp: step 3/40 (7%)  loss 7.4000  val 7.5000  elapsed 0:05  ETA ?"]


def test_watch_shows_nothing_of_the_ranks_once_they_are_stopped(tmp_path, caplog):
    stopping = [False]
    watch = progress.Watch(tmp_path / "metrics.jsonl", 10, verbose=False, node_rank=0, stopping=lambda: stopping[0])
    with caplog.at_level(logging.DEBUG, logger="qwen3exp"):
        watch.line("[default0]:RuntimeError: a real error\n")
        stopping[0] = True
        for line in [
            "W1202 03:59:37.601000 5504 api.py:753] Received 15 death signal, shutting down workers",
            "Traceback (most recent call last):",
            "SignalException: Process 5504 got signal: 15",
        ]:
            watch.line(line + "\n")
        watch.finish()
    shown = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert shown == ["[default0]:RuntimeError: a real error"]
    assert any("death signal" in r.getMessage() for r in caplog.records)  # in qwen3exp.log (DEBUG)


# What a run whose disk filled while rank 0 saved a checkpoint printed (tests/test_faults.py's
# full-disk run, shortened): the rank's traceback (multiprocessing's, the rank being a fork of the
# agent), torchrun's report of it, the agent's note and its own traceback.
FULL_DISK = [
    "Process ForkProcess-1:",
    "Traceback (most recent call last):",
    '  File "/p/multiprocessing/process.py", line 314, in _bootstrap',
    "torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0])",
    "Traceback (most recent call last): (RANK 0)",
    '  File "/p/torch/distributed/checkpoint/filesystem.py", line 524, in create_stream',
    "    with path.open(mode) as stream:",
    "OSError: [Errno 28] No space left on device",
    "E1206 20:19:30.226000 12492 /p/api.py:836] failed (exitcode: 1) local_rank: 0 (pid: 12572) of fn: forked",
    "E1206 20:19:30.226000 12492 /p/api.py:836] Traceback (most recent call last):",
    "qwen3exp.run.agent: could not write /r/logs/agent_node0.json: [Errno 28] No space left on device",
    "Traceback (most recent call last):",
    '  File "/w/qwen3exp/run/forked_agent.py", line 100, in _run_agent',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "forked FAILED",
]


def test_a_full_disk_shows_no_traceback_and_another_crash_shows_its_own(tmp_path, caplog):
    """Issue 39: a disk that filled during training showed the rank's traceback, torchrun's report
    and the agent's traceback before the launcher's clear message. They are left out of the console
    (kept in qwen3exp.log); a traceback of anything else is shown whole, once complete."""

    def watched(lines: list[str], *, verbose: bool = False) -> tuple[list[str], list[str], progress.Watch]:
        caplog.clear()
        watch = progress.Watch(tmp_path / "metrics.jsonl", 10, verbose=verbose, node_rank=0, stopping=lambda: False)
        with caplog.at_level(logging.DEBUG, logger="qwen3exp"):
            for line in lines:
                watch.line(line + "\n")
            watch.finish()
        ranks = [r for r in caplog.records if r.name == "qwen3exp.ranks"]
        return [r.getMessage() for r in ranks if r.levelno >= logging.INFO], [r.getMessage() for r in ranks], watch

    shown, logged, watch = watched(["[default0]:RuntimeError: seen before the disk filled", *FULL_DISK])
    assert shown == ["[default0]:RuntimeError: seen before the disk filled"]
    assert logged[1:] == FULL_DISK  # in qwen3exp.log
    assert watch.filter.hidden == {"lines printed after the disk filled": len(FULL_DISK)}
    crash = ["Traceback (most recent call last):", '  File "/x/y.py", line 3, in <module>', "RuntimeError: boom"]
    assert watched(crash)[0] == crash
    assert watched(FULL_DISK, verbose=True)[0] == FULL_DISK
    # Held only until complete: shown once the ranks have been quiet for QUIET_S.
    clock = [0.0]
    held = noise.HeldTracebacks(noise.RankFilter(verbose=False), now=lambda: clock[0])
    assert held.take("a line") == (["a line"], []) and held.take(crash[0]) == ([], [])
    assert held.take(crash[1]) == ([], []) and held.due() == ([], [])
    clock[0] += held.QUIET_S
    assert held.due() == (crash[:2], [])


def test_rerun_command_resumes_in_the_run_directory_or_starts_anew():
    from qwen3exp.launchers.outcome import rerun_command
    from qwen3exp.run.provenance import Origin

    run = Origin(command=["python", "-m", "qwen3exp", "checkpoint=dcp", "hydra.run.dir=old dir"])
    assert (
        rerun_command(run, Path("/r/a b"), same_dir=True)
        == "python -m qwen3exp checkpoint=dcp 'hydra.run.dir='\"'\"'/r/a b'\"'\"''"
    )
    assert rerun_command(run, Path("/r/x"), same_dir=False) == "python -m qwen3exp checkpoint=dcp"
    sweep = Origin(command=["python", "-m", "qwen3exp", "-m", "training.lr=1e-3,3e-3"], mode="MULTIRUN", sweep_dir="/s")
    assert (
        rerun_command(sweep, Path("/s/0"), same_dir=True)
        == "python -m qwen3exp -m training.lr=1e-3,3e-3 hydra.sweep.dir=/s"
    )


def _record(text, **extra):
    return (
        logging.LogRecord("qwen3exp.launch", logging.INFO, __file__, 1, text, None, None)
        if not extra
        else logging.makeLogRecord(
            {"name": "qwen3exp.launch", "levelno": logging.INFO, "levelname": "INFO", "msg": text, **extra}
        )
    )


class _Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("no_color", [None, "1"])
def test_terminal_live_line_and_colour(monkeypatch, no_color):
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    out = _Tty()
    h = console.ConsoleHandler(stream=out)
    h.emit(_record("qwen3exp: step 1/2", live=True))
    h.emit(_record("qwen3exp: step 2/2", live=True))
    h.emit(_record("qwen3exp: completed", tone="good"))
    text = out.getvalue()
    assert text.count("\r\x1b[K") == 2 and text.index("step 2/2") < text.index("\n") < text.index("completed")
    if no_color:
        assert "\x1b[3" not in text
    else:
        assert "\x1b[32mqwen3exp: completed" in text


def test_pipe_gets_plain_lines_only(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    h = console.ConsoleHandler(stream=out)
    h.emit(_record("qwen3exp: step 1/2", live=True))
    h.emit(_record("\x1b[31mred from a library\x1b[39m"))
    h.emit(_record("qwen3exp: failed", tone="good"))
    assert out.getvalue() == "qwen3exp: step 1/2\nred from a library\nqwen3exp: failed\n"
