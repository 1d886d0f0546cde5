"""Each CPU adaptation of qwen3exp/platforms/cpu.py, tested against the behaviour it answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from conftest import REPO
from runprocs import TINY, start_cli


def _py(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
@pytest.mark.slow  # quick tier: fresh interpreters import torchtitan
def test_device_selection_must_happen_before_torchtitan_import():
    # Without qwen3exp: torchtitan binds "cuda" on a CPU-only host.
    r = _py("from torchtitan.tools import utils; print(utils.device_type)")
    assert r.stdout.strip() == "cuda", r.stderr
    r = _py("""
        from qwen3exp.platforms import prepare_worker
        from qwen3exp.platforms.cpu import facts
        from qwen3exp.config.sections.platform import CpuPlatform
        prepare_worker(facts(CpuPlatform(), nproc_per_node=2, reason="test"))
        from torchtitan.tools import utils
        from torchtitan.components.metrics import DeviceMemoryMonitor
        m = DeviceMemoryMonitor("cpu")
        print(utils.device_type, m.get_peak_stats().max_reserved_gib > 0)
    """)
    assert r.stdout.strip() == "cpu True", r.stderr


def test_cpu_device_module_reports_real_peak_memory():
    from qwen3exp.platforms.cpu_device import CpuDeviceModule

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


@pytest.mark.slow  # it trains (torchrun or steps in a fresh process): the full tier
@pytest.mark.parametrize("mode", ["default", "sum"])
def test_fsdp_over_gloo_needs_sum_reductions(mode, tmp_path):
    script = tmp_path / "fsdp_gloo.py"
    script.write_text(FSDP_GLOO)

    def once():
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "localhost:0",
                str(script),
                mode,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )

    r = once()
    for _ in range(2):
        if not (mode == "sum" and r.returncode != 0 and ("SIGABRT" in r.stderr or "exitcode: -6" in r.stderr)):
            break
        # A rank of this bare torch script (no qwen3exp code) sometimes aborts (SIGABRT, in gloo) on
        # 2 loaded cores after other tests; the claim under test is about the reduction op, which a
        # PREMUL_SUM failure shows as a Python error, not an abort: an abort is run again.
        r = once()
    if mode == "default":
        assert r.returncode != 0 and "PREMUL_SUM" in r.stdout + r.stderr
    else:
        assert r.returncode == 0, r.stderr[-2000:]


def test_with_sum_reductions_wraps_parallelize():
    from qwen3exp.config.flavors import FLAVORS
    from qwen3exp.plan.attention_path import AttentionPath
    from qwen3exp.titan.model import qwen3_model_spec

    sdpa = AttentionPath("sdpa", "block_causal", "packed documents")
    spec = qwen3_model_spec(FLAVORS["tiny"], flavor="tiny", attention=sdpa, force_sum_reductions=True)
    assert spec.parallelize_fn.__name__ == "parallelize"
    spec = qwen3_model_spec(FLAVORS["tiny"], flavor="tiny", attention=sdpa, force_sum_reductions=False)
    assert spec.parallelize_fn.__name__ == "parallelize_qwen3"


# ------------------------------------------------------------------------------- host memory
def _host_figure(monkeypatch, available: int, **kw) -> list:
    from qwen3exp.config.sections.platform import CpuPlatform
    from qwen3exp.platforms import cpu

    monkeypatch.setattr(cpu, "available_memory", lambda: available)
    facts = cpu.facts(CpuPlatform(), nproc_per_node=2, reason="test")
    return cpu.host_problems(facts, ranks=2, ranks_key="launcher.nproc_per_node", threads_given=False, **kw)


def test_host_memory_refusal_names_every_part(monkeypatch):
    from qwen3exp.platforms import cpu
    from qwen3exp.units import GIB, MIB, gib

    (p,) = _host_figure(monkeypatch, 2 * GIB, plan_bytes_per_rank=100 * MIB)
    assert p.key == "launcher.nproc_per_node" and p.value == 2
    for part in (
        f"2 rank(s) x {gib(cpu.RANK_RUNTIME_BYTES + 115 * MIB)}",
        "per-process runtime",
        f"{gib(100 * MIB)} plan",
        f"{gib(15 * MIB)} transients",
        f"{gib(cpu.AGENT_BYTES)} torchrun agent",
        f"{gib(cpu.LAUNCHER_BYTES)} this launcher",
        "2.00 GiB available (MemAvailable",
    ):
        assert part in p.message, (part, p.message)
    assert "verify the HF export" not in p.message
    # An HF export is verified in this launcher after the ranks have exited: the larger phase counts.
    (p,) = _host_figure(monkeypatch, 2 * GIB, plan_bytes_per_rank=MIB, export_dtype_bytes=2, total_params=600_000_000)
    need = cpu.LAUNCHER_TORCH_BYTES + 6 * 600_000_000
    assert f"need about {gib(need)}" in p.message and f"then {gib(need)} in this launcher to verify" in p.message
    assert p.allowed == "fewer ranks, on a host with more free memory"  # fewer ranks would not help
    # Kernel overrides: the launcher imports torchtitan to match them and holds it while the ranks run.
    (p,) = _host_figure(monkeypatch, GIB, plan_bytes_per_rank=MIB, kernels_active=True)
    assert f"{gib(cpu.LAUNCHER_TORCH_BYTES)} this launcher" in p.message
    assert _host_figure(monkeypatch, 64 * GIB, plan_bytes_per_rank=100 * MIB) == []


def test_host_memory_covers_the_measured_0p6b_run():
    """The measurements of cpu.RANK_RUNTIME_BYTES' table, Qwen3-0.6B on 2 ranks (bfloat16 storage,
    float32 compute, seq_len 32 x 1): ranks 7987 and 8499 MiB, the agent 647 MiB, the launcher
    48 MiB while they ran (the issue: the old figure, runtime + plan per rank + 0.9 GiB per node,
    said 10.2 GiB for a run that held 16.8 GiB)."""
    from qwen3exp.config.flavors import FLAVORS
    from qwen3exp.plan import memory
    from qwen3exp.platforms import cpu
    from qwen3exp.units import MIB

    plan = memory.estimate(
        FLAVORS["0.6B"],
        memory.Degrees(dp_shard=2),
        local_batch_size=1,
        seq_len=32,
        param_dtype="bfloat16",
        compute_dtype="float32",
        activation_checkpoint="none",
        budget=2**40,
    )
    plan = plan.total + plan.transients  # the step's peak, as memory_fit passes it
    measured = (7987 + 8499 + 647 + 48) * MIB
    figure = cpu.host_memory(
        ranks=2, plan_bytes_per_rank=plan, export_dtype_bytes=2, total_params=FLAVORS["0.6B"].param_counts()[0]
    ).need
    assert measured <= figure <= 1.25 * measured, (figure / MIB, measured / MIB)


def _descendants(root: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


@pytest.mark.slow
def test_host_memory_figure_matches_a_real_tiny_run(tmp_path):
    """The check's figure for the tiny run on 2 ranks against the most resident memory its processes
    (launcher, torchrun agent, ranks) held at one time, sampled every 50 ms: at least 90% of it
    (the old figure said 88% here and 71% on CI's machine) and at most 150% (machines differ: the
    constants cover the larger of the two measurements)."""
    from qwen3exp.platforms import cpu

    run = tmp_path / "run"
    proc = start_cli(
        *TINY,
        "training.steps=3",
        "launcher.nproc_per_node=2",
        f"hydra.run.dir={run}",
        log=tmp_path / "run.log",
        fresh=True,
    )  # a new interpreter: the launcher as a user starts it (a fork of the tests' server holds torch)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, sum(_rss(pid) for pid in _descendants(proc.pid)))
        time.sleep(0.05)
    assert proc.returncode == 0, (tmp_path / "run.log").read_text()[-3000:]
    mem = json.loads((run / "plan.json").read_text())["memory"]
    plan = mem["total"] + mem["transients"]
    figure = cpu.host_memory(ranks=2, plan_bytes_per_rank=plan).need
    assert 0.9 * peak <= figure <= 1.5 * peak, (figure / 2**20, peak / 2**20)
