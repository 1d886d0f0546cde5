"""Each CPU adaptation of qwen3exp/platforms/cpu.py, tested against the behaviour it answers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import REPO


def _py(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_device_selection_must_happen_before_torchtitan_import():
    # Without qwen3exp: torchtitan binds "cuda" on a CPU-only host.
    r = _py("from torchtitan.tools import utils; print(utils.device_type)")
    assert r.stdout.strip() == "cuda", r.stderr
    r = _py("""
        from qwen3exp.platforms import prepare_worker
        from qwen3exp.platforms.cpu import facts
        from qwen3exp.config.schema import CpuPlatform
        prepare_worker(facts(CpuPlatform(), nproc_per_node=2, reason="test"))
        from torchtitan.tools import utils
        from torchtitan.components.metrics import DeviceMemoryMonitor
        m = DeviceMemoryMonitor("cpu")
        print(utils.device_type, m.get_peak_stats().max_reserved_gib > 0)
    """)
    assert r.stdout.strip() == "cpu True", r.stderr


def test_cpu_device_module_reports_real_peak_memory():
    from qwen3exp.platforms.cpu import CpuDeviceModule

    dm = CpuDeviceModule()
    dm.reset_peak_memory_stats()
    before = dm.memory_stats()["reserved_bytes.all.peak"]
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    block += 1
    after = dm.memory_stats()["reserved_bytes.all.peak"]
    assert after - before > 48 * 2**20
    assert dm.get_device_properties().total_memory > after


def test_document_sdpa_matches_per_document_attention():
    """Packed documents must not attend across boundaries (torchtitan's block_causal semantics)."""
    from torchtitan.models.common.attention import create_varlen_metadata_for_document

    from qwen3exp.titan.attention import DocumentSDPAttention

    torch.manual_seed(0)
    B, L, H, D = 2, 12, 4, 8
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2]])
    q, k, v = (torch.randn(B, L, H, D, dtype=torch.float64) for _ in range(3))
    attn = DocumentSDPAttention(DocumentSDPAttention.Config())
    out = attn(q, k, v, attention_masks=create_varlen_metadata_for_document(positions))
    ref = torch.empty_like(out)
    for b in range(B):
        starts = [i for i in range(L) if positions[b, i] == 0] + [L]
        for s, e in zip(starts[:-1], starts[1:], strict=True):
            seg = [t[b : b + 1, s:e].transpose(1, 2) for t in (q, k, v)]
            ref[b : b + 1, s:e] = torch.nn.functional.scaled_dot_product_attention(*seg, is_causal=True).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-12)


FSDP_GLOO = """
import os, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
for m in model: fully_shard(m)
fully_shard(model)
for m in model.modules():
    if hasattr(m, "set_gradient_divide_factor"):
        m.set_gradient_divide_factor(1.0)   # what torchtitan's disable_fsdp_gradient_division does
        if sys.argv[1] == "sum":
            m.set_force_sum_reduction_for_comms(True)   # qwen3exp's fix
model(torch.randn(4, 8)).sum().backward()
dist.destroy_process_group()
print("ok")
"""


@pytest.mark.parametrize("mode", ["default", "sum"])
def test_fsdp_over_gloo_needs_sum_reductions(mode, tmp_path):
    script = tmp_path / "fsdp_gloo.py"
    script.write_text(FSDP_GLOO)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", str(script), mode],
                       capture_output=True, text=True, timeout=300)
    if mode == "default":
        assert r.returncode != 0 and "PREMUL_SUM" in r.stdout + r.stderr
    else:
        assert r.returncode == 0, r.stderr[-2000:]


def test_with_sum_reductions_wraps_parallelize():
    from qwen3exp.config.flavors import FLAVORS
    from qwen3exp.titan.model import qwen3_model_spec

    spec = qwen3_model_spec(FLAVORS["tiny"], flavor="tiny", attention="sdpa", force_sum_reductions=True)
    assert spec.parallelize_fn.__name__ == "parallelize"
    spec = qwen3_model_spec(FLAVORS["tiny"], flavor="tiny", attention="sdpa", force_sum_reductions=False)
    assert spec.parallelize_fn.__name__ == "parallelize_qwen3"
