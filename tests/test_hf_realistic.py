"""A realistic-size Hugging Face round trip: a random Qwen3-0.6B-shaped checkpoint (Qwen/Qwen3-0.6B's
published dimensions and 151,936 vocabulary, tied embeddings, 596M parameters) written by
transformers' `save_pretrained` in several shards with model.safetensors.index.json, loaded with
hf_roundtrip (hf_load at step 0) on 2 CPU ranks, trained 2 steps, exported sharded and reloaded
with `AutoModelForCausalLM` offline. The ranks' measured peak memory (summary.json
`memory_measured_gib`, the largest of every rank) and the plan's figure for it (plan.json
`memory.peak`) are printed with their ratio, which must be within 0.85-1.15 (issue 39; the
28-layer model is out of the sample tests/bench/bench_memory.py fitted the estimate on). It is
not yet: on 2026-12-06 the ranks measured 8.07 GiB for 6.75 planned (1.19x). Not traced; this run
differs from the bench rows (0.98-1.08) in loading a checkpoint before step 1 and storing its
parameters in bfloat16 while computing in float32 (the bench's one-rank 28-layer bfloat16 row,
no checkpoint, measured 1.08x).

Sized for CI (2 cores): seq_len 32, local batch 1, 2 steps; parameters and AdamW states stored in
bfloat16 (half the memory of float32) with float32 compute (bfloat16 matmuls are ~20x slower on
CPUs without AVX512-BF16).

Opt-in (3.5 minutes and 16 GiB on a 2-core machine): skipped unless QWEN3EXP_REALISTIC=1, e.g.
`QWEN3EXP_REALISTIC=1 python -m pytest -q tests/test_hf_realistic.py`. Every suite runs the same
round trip at tiny size: tests/test_hf_checkpoints.py (dense, both backends) and
tests/test_hf_moe.py (MoE, loaded from a sharded checkpoint with its index, exported sharded).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import read_summary, run_cli
from hf_fixtures import peak_rss_ratio, write_0p6b_checkpoint

OPT_IN = "QWEN3EXP_REALISTIC"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get(OPT_IN) != "1",
        reason=f"opt-in (3.5 min, 16 GiB): run with {OPT_IN}=1 python -m pytest -q tests/test_hf_realistic.py",
    ),
]

PARAMS_0P6B = 596_049_920
RUN = (
    "model.flavor=auto",
    "checkpoint=hf_roundtrip",
    "checkpoint.max_shard_mb=400",
    "training.steps=2",
    "training.warmup_steps=1",
    "training.seq_len=32",
    "training.local_batch_size=1",
    "training.dtype=bfloat16",
    "training.mixed_precision_param=float32",
    "launcher.nproc_per_node=2",
    "validation.enable=false",
    "metrics.tensorboard=false",
)

RELOAD = """
import json, sys, torch
from transformers import AutoModelForCausalLM
model, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, output_loading_info=True)
ids = torch.arange(1, 33)[None]
print(json.dumps({"missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
                  "mismatched": [list(map(str, m)) for m in info["mismatched_keys"]],
                  "loss": model(input_ids=ids, labels=ids).loss.item(), "tied": model.config.tie_word_embeddings,
                  "params": sum(p.numel() for p in model.parameters())}))
"""


def _shards(folder: Path) -> tuple[list[str], set[str]]:
    """(the *.safetensors files, the files model.safetensors.index.json names)."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return sorted(p.name for p in folder.glob("*.safetensors")), set(index["weight_map"].values())


NEEDS_GIB = 20
"""The two ranks peak at about 16 GiB together (measured: 7.8 and 8.3 GiB), plus the launcher."""


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1 << 20)
    return 0.0


@pytest.fixture(scope="session")
def qwen3_0p6b(tmp_path_factory) -> Path:
    """Written once per test session (seed 0, bfloat16, 3 shards of at most 400 MB). Skipped, with
    the reason, on a machine that has not the memory free for the two ranks (an OOM-killed rank
    would be a failure that says nothing about qwen3exp)."""
    if (free := _available_gib()) < NEEDS_GIB:
        pytest.skip(f"needs {NEEDS_GIB} GiB of free memory for two 0.6B ranks; {free:.1f} GiB available")
    return write_0p6b_checkpoint(tmp_path_factory.mktemp("qwen3-0.6b") / "ckpt", seed=0)


def test_0p6b_sharded_checkpoint_round_trip(qwen3_0p6b, tmp_path, capsys):
    files, indexed = _shards(qwen3_0p6b)
    assert len(files) > 1 and set(files) == indexed

    run_dir = tmp_path / "run"
    r = run_cli(*RUN, f"model.hf_assets_path={qwen3_0p6b}", f"hydra.run.dir={run_dir}", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["weights_loaded"] is True
    assert s["weights_source"] == str(qwen3_0p6b)
    assert math.isfinite(s["step1_loss"])

    export = s["export"]
    assert export["ok"], export
    assert export["unexpected_keys"] == [] and export["mismatched_keys"] == []
    assert export["missing_keys"] in ([], ["lm_head.weight"])
    folder = Path(export["path"])
    files, indexed = _shards(folder)
    assert len(files) > 1 and set(files) == indexed, (files, indexed)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).is_file(), name
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"], cfg["tie_word_embeddings"]) == (
        151936,
        1024,
        28,
        True,
    )

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    reload = subprocess.run(
        [sys.executable, "-c", RELOAD, str(folder)], env=env, capture_output=True, text=True, timeout=600
    )
    assert reload.returncode == 0, reload.stderr[-3000:]
    info = json.loads(reload.stdout.strip().splitlines()[-1])
    assert info["unexpected"] == [] and info["mismatched"] == [] and info["missing"] in ([], ["lm_head.weight"])
    assert info["tied"] is True and info["params"] == PARAMS_0P6B
    assert math.isfinite(info["loss"])

    mem = peak_rss_ratio(run_dir)
    with capsys.disabled():
        print(
            f"\nQwen3-0.6B-shaped hf_roundtrip, 2 CPU ranks: measured peak (summary.json memory_measured_gib) "
            f"{mem['measured'] / 2**30:.2f} GiB, plan estimate {mem['estimated'] / 2**30:.2f} GiB per rank, "
            f"ratio {mem['ratio']:.2f}"
        )
    assert mem["measured"] and mem["estimated"], mem
    assert mem["ratio"] == pytest.approx(s["memory_ratio"])
    assert 0.85 <= mem["ratio"] <= 1.15, mem
