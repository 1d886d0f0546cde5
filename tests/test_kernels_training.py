"""Real CPU trainings through `python -m qwen3exp`: with and without the kernel overrides the first
three losses agree (1e-5), and summary.json records one replaced node per layer, confirmed by the
`[Override]` lines torchtitan logged at run time.

Two sweeps (`-m`, 2 points each, 1 rank, 3 steps) started side by side: tiny dense with
kernels=default,nki_rope and tiny MoE with kernels=default,nki_moe (16-slot blocks, so experts span
several blocks and blocks are padded). The README's user kernel is checked in-process
(tests/test_kernels_overrides.py), where logits and gradients are compared exactly.
"""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import read_metrics, read_summary
from runprocs import Background

pytestmark = pytest.mark.slow

COMMON = [
    "launcher.nproc_per_node=1",
    "training.steps=3",
    "training.warmup_steps=1",
    "training.seq_len=64",
    "training.local_batch_size=2",
    "metrics.tensorboard=false",
    "platform=cpu",
    "kernels.moe.block_size=16",
]
SWEEPS = {
    "dense": ["model.flavor=tiny", "kernels=default,nki_rope"],
    "moe": ["model.flavor=tiny_moe", "kernels=default,nki_moe"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("kernels")
    procs = {
        name: Background(
            "-m", f"name={name}", f"hydra.sweep.dir={root / name}", *COMMON, *ovr, folder=root / "logs" / name
        )
        for name, ovr in SWEEPS.items()
    }
    for name, p in procs.items():
        r = p.result(timeout=900)
        assert r.returncode == 0, f"{name}:\n{(r.stdout + r.stderr)[-4000:]}"
    # one job folder per point (named by its overrides): tell them apart by the resolved experiment
    out = {}
    for name in SWEEPS:
        for summary in (root / name).rglob("summary.json"):
            exp = yaml.safe_load((summary.parent / "experiment.yaml").read_text())
            out[name if exp["kernels"]["name"] == "default" else f"{name}_kernels"] = summary.parent
    assert sorted(out) == ["dense", "dense_kernels", "moe", "moe_kernels"], out
    return out


@pytest.mark.parametrize("base", ["dense", "moe"])
def test_same_first_losses_with_and_without_the_overrides(runs, base):
    plain = [r["loss"] for r in read_metrics(runs[base])][:3]
    kernels = [r["loss"] for r in read_metrics(runs[f"{base}_kernels"])][:3]
    assert len(plain) == len(kernels) == 3
    assert max(abs(a - b) for a, b in zip(plain, kernels, strict=True)) <= 1e-5, (plain, kernels)
    assert read_summary(runs[base])["overrides"] == []


def test_summary_counts_one_override_per_layer(runs):
    (rope,) = read_summary(runs["dense_kernels"])["overrides"]
    assert rope["key"] == "kernels.rope" and rope["nodes"] == rope["applied"] == 2  # tiny has 2 layers
    assert rope["node_fqns"] == [f"model_spec.model.layers.{i}.attention.rope" for i in range(2)]
    (moe,) = read_summary(runs["moe_kernels"])["overrides"]
    assert moe["key"] == "kernels.moe" and moe["nodes"] == moe["applied"] == 2
    applied = json.loads((runs["moe_kernels"] / "overrides_applied.json").read_text())
    expected = [("qwen3exp.titan.nki_moe.nki_moe", "BlockwiseExperts.Config")] * 2
    assert [(a["name"], a["new"]) for a in applied] == expected
