"""The tests' fast path for `python -m qwen3exp` (tests/cli_fork.py) gives what a new interpreter
gives: the same exit code, stdout and stderr for a dry run, a refusal, a slip, a command from a
user's folder and an argument that is not UTF-8; and a command whose interpreter must start
differently (PYTHONPATH here) runs as a real subprocess."""

from __future__ import annotations

import os
import re

import pytest

import cli_fork
from conftest import cli_env, run_cli

COMMANDS = {
    "dry_run": ("dry_run=true", "training.steps=3"),
    "refusal": ("training.lr=zz", "dry_run=true"),
    "slip": ("training.lr", "1e-3"),
    "ls": ("ls",),
    "not_utf8": ("name=\udcff\x1b[31mred", "dry_run=true"),
}


def _mask(text: str) -> str:
    """The plan's memory line reads this machine's available memory, which moves between commands."""
    return re.sub(r"of [\d.]+ GiB usable \(\d+% of [\d.]+ GiB\); headroom [\d.]+ GiB", "of (usable memory)", text)


@pytest.mark.parametrize("name", COMMANDS)
def test_a_forked_command_is_the_same_as_a_new_interpreter(name, tmp_path, monkeypatch):
    args = (*COMMANDS[name], f"hydra.run.dir={tmp_path / 'run'}")
    forked = run_cli(*args, cwd=tmp_path)
    monkeypatch.setenv("QWEN3EXP_TESTS_FORK", "0")
    fresh = run_cli(*args, cwd=tmp_path)
    seen = [(p.returncode, _mask(p.stdout), p.stderr) for p in (forked, fresh)]
    assert seen[0] == seen[1]
    assert fresh.returncode in (0, 2) and "Traceback" not in fresh.stderr
    assert not (tmp_path / "run").exists()


def test_a_forked_command_has_the_test_processs_umask(tmp_path):
    """A run directory written under umask 027 (a dry run that keeps nothing cannot show it: `cp`)."""
    assert run_cli("ls").returncode == 0  # the fork server is up, started under this process's umask
    old = os.umask(0o027)
    try:
        done = run_cli("cp", "tiny_native", "mine", cwd=tmp_path)
    finally:
        os.umask(old)
    assert done.returncode == 0, done.stderr
    (made,) = (tmp_path / "conf" / "experiment").glob("mine.yaml")
    assert oct(made.stat().st_mode & 0o777) == oct(0o640)


def test_a_command_whose_interpreter_starts_differently_is_a_real_subprocess(tmp_path):
    moved = cli_env({"PYTHONPATH": f"{tmp_path}:{cli_env()['PYTHONPATH']}"})
    assert cli_fork.run(["ls"], tmp_path, moved, 60, base=cli_env()) is None
    # The server imported huggingface_hub, which reads its cache folder as it is imported.
    assert cli_fork.run(["ls"], tmp_path, cli_env({"HF_HOME": str(tmp_path)}), 60, base=cli_env()) is None
    done = cli_fork.run(["ls"], tmp_path, cli_env(), 60, base=cli_env())
    assert done is not None and done.returncode == 0 and "tiny" in done.stdout
