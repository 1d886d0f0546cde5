"""The plan's memory prediction against what the ranks measure (issue 25): three rows of
tests/bench/bench_memory.py's matrix, trained for real (2 steps, 2 CPU ranks each), must score within
0.85-1.15. The rows vary the layout (FSDP dp_shard=2, tensor parallel tp=2) and the model backend
(native, hf); the benchmark runs the whole matrix (0.6B-shaped models with the real vocabulary, MoE,
activation checkpointing, seq_len 2048).

Why the ratio is stable run to run: a tiny rank's measure is mostly the process's runtime (Python,
torch, torchtitan: `qwen3exp.platforms.cpu.MEASURED_RUNTIME_BYTES`), which repeats within a few
MiB on one machine (the tiny rows measured 0.95-1.05 GiB, ratios 1.00-1.03). Between machines it
can differ (the CI machine measured ~0.3 GiB more per rank once): then this test says by how much.
"""

from __future__ import annotations

import pytest

from bench import bench_memory


@pytest.mark.slow
@pytest.mark.parametrize("name", bench_memory.QUICK)
def test_predicted_memory_is_within_15_percent_of_the_measured(name, tmp_path):
    row = dict(bench_memory.ROWS)[name]
    overrides = bench_memory.overrides_of(row, {}, steps=2, platform="cpu", ranks=2)
    s = bench_memory.train(overrides, tmp_path / "run")
    assert s["status"] == "completed", s
    ratio = s["memory_measured_gib"] / s["memory_predicted_gib"]
    assert s["memory_ratio"] == pytest.approx(ratio)
    assert bench_memory.LOW <= ratio <= bench_memory.HIGH, (
        f"{name}: predicted {s['memory_predicted_gib']:.3f} GiB, measured {s['memory_measured_gib']:.3f} GiB"
    )
