"""ruff and mypy over the code base, so that `pytest` (the command CI runs) enforces them.

The configuration is in pyproject.toml ([tool.ruff], [tool.mypy]); both tools come with the `test`
extra (`pip install -e ".[test]"`). Where one is not installed the test is skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(tool: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed in this environment (pip install -e '.[test]' installs it)")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_ruff():
    proc = _run("ruff", "check", "--no-fix", "--output-format", "concise", "qwen3exp", "hydra_plugins", "tests",
                timeout=300)
    assert proc.returncode == 0, f"ruff check qwen3exp hydra_plugins tests:\n{proc.stdout}{proc.stderr}"


def test_mypy():
    # torch and transformers are skipped (pyproject.toml): a cold run takes about 10 s.
    proc = _run("mypy", "qwen3exp", "hydra_plugins/qwen3exp_launcher", timeout=900)
    assert proc.returncode == 0, f"mypy qwen3exp hydra_plugins:\n{proc.stdout}{proc.stderr}"
