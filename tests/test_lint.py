"""ruff and mypy over the code base, so that `pytest` (the command CI runs) enforces them.

The configuration is in pyproject.toml ([tool.ruff], [tool.mypy]); both tools come with the `test`
extra (`pip install -e ".[test]"`). Where one is not installed the test is skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(tool: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed in this environment (pip install -e '.[test]' installs it)")
    return subprocess.run(
        [sys.executable, "-m", tool, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_ruff():
    proc = _run(
        "ruff", "check", "--no-fix", "--output-format", "concise", "qwen3exp", "hydra_plugins", "tests", timeout=300
    )
    assert proc.returncode == 0, f"ruff check qwen3exp hydra_plugins tests:\n{proc.stdout}{proc.stderr}"


FORMATTED = ("qwen3exp", "hydra_plugins", "tests")
"""What `ruff format` keeps formatted (its settings: [tool.ruff] in pyproject.toml, line-length 120)."""
DIFF_LINES = 400
"""How much of the diff a failure shows (the list of files is always whole)."""


def test_ruff_format():
    proc = _run("ruff", "format", "--check", "--diff", *FORMATTED, timeout=300)
    if proc.returncode == 0:
        return
    diff = proc.stdout.splitlines()
    files = [
        a.removeprefix("--- ") for a, b in itertools.pairwise(diff) if a.startswith("--- ") and b.startswith("+++ ")
    ]
    shown = "\n".join(diff[:DIFF_LINES]) + (
        f"\n... ({len(diff) - DIFF_LINES} more lines)" if len(diff) > DIFF_LINES else ""
    )
    pytest.fail(
        f"ruff format --check {' '.join(FORMATTED)}: {proc.stderr.strip()} (run `ruff format {' '.join(FORMATTED)}`)\n"
        + "\n".join(f"  {f}" for f in files)
        + f"\n{shown}",
        pytrace=False,
    )


def test_mypy():
    # torch and transformers are skipped (pyproject.toml): a cold run takes about 10 s.
    proc = _run("mypy", "qwen3exp", "hydra_plugins/qwen3exp_launcher", timeout=900)
    assert proc.returncode == 0, f"mypy qwen3exp hydra_plugins:\n{proc.stdout}{proc.stderr}"
