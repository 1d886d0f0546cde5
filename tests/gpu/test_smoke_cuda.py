"""The CUDA smoke check (tests/gpu/smoke_cuda.sh) as a test: skipped on machines without a GPU,
which is every machine this project has been developed and tested on so far."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SCRIPT = Path(__file__).resolve().parent / "smoke_cuda.sh"


def test_tiny_experiments_train_on_cuda_with_flex_attention(tmp_path):
    r = subprocess.run(
        ["bash", str(SCRIPT), sys.executable],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**__import__("os").environ, "SMOKE_OUT": str(tmp_path)},
    )
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    assert "tiny_native: status=completed" in r.stdout
    assert "attention=flex" in r.stdout and "backend=nccl" in r.stdout
