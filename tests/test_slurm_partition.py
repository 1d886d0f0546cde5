"""A launcher=slurm run planned on the host it is submitted from (a login node) is checked against
the partition's nodes, as SLURM's `sinfo` describes them, never against the submit host's own devices,
cores or memory (issue 39). In process, with a fake `sinfo` on PATH (the seam the SLURM tests use for
`sbatch`); the real one-node cluster runs in tests/test_slurm.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import compose
from qwen3exp.config.schema import validate_experiment
from qwen3exp.plan import slurm_partition
from qwen3exp.plan.build import make_plan
from qwen3exp.platforms import host
from qwen3exp.units import GIB, MIB

# One line per group of alike nodes: partition (the default ends with *), CPUs, memory (MB), gres.
SINFO = """\
debug*|6|24000|(null)
gpu|64+|512000|gpu:h100:8(S:0-1)
gpu|96|1024000|gpu:h100:8(S:0-1)
trn2|192|2000000|neuron:16
"""


@pytest.fixture
def sinfo(tmp_path, monkeypatch) -> Path:
    """A fake `sinfo` that answers SINFO (whatever the options), first on PATH; no SLURM job here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text(f"#!/bin/sh\ncat <<'EOF'\n{SINFO}EOF\n")
    (bin_dir / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return bin_dir


def _plan(tmp_path, *args: str):
    """The plan of a real (not dry) launch, as the submit host makes it before submitting."""
    return make_plan(validate_experiment(compose("launcher=slurm", *args)), tmp_path / "run")


def test_a_gpu_partition_is_planned_with_its_gpus_on_a_host_without_one(sinfo, tmp_path):
    """platform=cuda on this GPU-less host: no device check here (it was exit 2, `no CUDA GPU is
    usable here`); the partition's 8 GPUs per node plan the run, the job checks them when it starts."""
    plan = _plan(tmp_path, "platform=cuda", "launcher.partition=gpu")
    f = plan.platform
    assert (f.name, f.devices_per_node, f.ranks_per_node, f.device_checked) == ("cuda", 8, 8, False)
    assert "sinfo -p gpu: 64 CPUs, 500 GiB, 8 GPU(s)" in f.reason and "the job checks its devices" in f.reason
    # platform=auto takes the partition's devices, not this host's CPU.
    assert _plan(tmp_path, "launcher.partition=gpu").platform.name == "cuda"
    trn2 = _plan(tmp_path, "launcher.partition=trn2", "training.seq_len=256").platform
    assert (trn2.name, trn2.devices_per_node, trn2.device_checked) == ("neuron", 64, False)


def test_a_cpu_partition_gives_its_cores_and_memory_not_this_hosts(sinfo, tmp_path):
    plan = _plan(tmp_path, "platform=cpu", "launcher.nproc_per_node=2")  # the default partition, debug
    f = plan.platform
    assert f.devices_per_node == 6 and f.memory_per_rank_bytes == 24000 * MIB // 2
    assert f.env["OMP_NUM_THREADS"] == "3" and "sinfo (the default partition): 6 CPUs" in f.reason
    assert f.memory_per_rank_bytes != host.physical_memory() // 2
    # The job's own requests come first: what it asks for is what its node gives it.
    asked = _plan(
        tmp_path, "platform=cpu", "launcher.nproc_per_node=2", "launcher.cpus_per_node=4", "launcher.mem_gb=8"
    )
    assert asked.platform.devices_per_node == 4 and asked.platform.memory_per_rank_bytes == 4 * GIB


def test_inside_the_job_and_without_sinfo(sinfo, tmp_path, monkeypatch):
    """Inside the job the plan is this node's (a real check); where sinfo says nothing the plan names
    it and checks nothing of this host instead."""
    exp = validate_experiment(compose("launcher=slurm", "platform=cpu"))
    assert slurm_partition.submitted_from_here(exp, {}) and not slurm_partition.submitted_from_here(
        exp, {"SLURM_JOB_ID": "7"}
    )
    assert not slurm_partition.submitted_from_here(validate_experiment(compose("platform=cpu")), {})
    (sinfo / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: Unable to contact slurm controller' >&2\nexit 1\n")
    node = slurm_partition.query("gpu")
    assert (
        node.cpus is None and "sinfo -p gpu said nothing of its nodes (sinfo: error: Unable to contact" in node.source
    )
    f = _plan(tmp_path, "platform=cpu", "launcher.nproc_per_node=2").platform
    assert f.devices_per_node is None and "not checked before submitting" in f.reason
