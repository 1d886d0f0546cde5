"""The local jobs of a parallel sweep (`sweep.parallel_jobs`) are checked together against this host
(qwen3exp/plan/host_share.py): the dry run says how many run at once and what they need together;
fewer that fit run at once, or `sweep.strict_parallel_jobs=true` refuses the batch.

In-process plans with an injected host (its cores and available memory: the seams the per-run host
checks are tested through, tests/test_preflight_files.py), and two commands on this host's real
figures (a dry run, and a refusal before anything starts).
"""

from __future__ import annotations

import os
import re

import pytest

from conftest import compose, run_cli
from qwen3exp.config.schema import validate_experiment
from qwen3exp.plan import host_share
from qwen3exp.plan.build import make_plan
from qwen3exp.platforms import cpu
from qwen3exp.titan.job_config import override_claims
from qwen3exp.units import GIB

SWEEP_24 = ("-m", "training.seed=range(0,24)", "sweep.parallel_jobs=24")
"""Issue 39's sweep: 24 jobs of the default experiment (2 CPU ranks each), all asked at once."""


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _plans(monkeypatch, jobs: int, *overrides: str, cores: int, available_gib: float):
    """The plans of `jobs` sweep points (seeds 0..jobs-1) on a host of `cores` cores with
    `available_gib` of memory available."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(cpu, "available_memory", lambda: int(available_gib * GIB))
    args = ("platform=cpu", f"sweep.parallel_jobs={jobs}", "dry_run=true", *overrides)
    exps = [validate_experiment(compose(*args, f"training.seed={i}")) for i in range(jobs)]
    return [make_plan(exp, f"/tmp/unused/{i}", claims_of=override_claims) for i, exp in enumerate(exps)]


def test_three_parallel_0p6b_jobs_that_do_not_fit_together_run_fewer_at_once(monkeypatch):
    """Issue 39: 3 parallel jobs of a 0.6B-shaped model were not checked together against host
    memory. On a host with room for 2 of them (8 cores: the cores take all 3), 2 run at once and the
    plan says so with the numbers; with sweep.strict_parallel_jobs=true the batch is refused."""
    shape = ("model.flavor=0.6B", "launcher.nproc_per_node=1", "training.seq_len=256", "training.local_batch_size=1")
    one = _plans(monkeypatch, 1, *shape, cores=8, available_gib=1000)[0]
    _, need = host_share.job_need(one)
    assert need > 4 * GIB  # a 0.6B-shaped job: parameters, gradients and AdamW in float32, with its runtime
    available = (2.5 * need + cpu.LAUNCHER_BYTES) / GIB  # each fits alone (its own plan's check passes)
    plans = _plans(monkeypatch, 3, *shape, cores=8, available_gib=available)
    assert all(not any("REFUSED" in w for w in p.warnings) for p in plans)
    shared = host_share.share(plans, 3)
    assert (shared.asked, shared.at_once, shared.problem) == (3, 2, None)
    text = "\n".join(shared.lines)
    assert "each job: up to 2 CPU thread(s)" in text and "its cores take 4 job(s) at once" in text
    assert "its memory 2" in text
    assert "FEWER AT ONCE THAN ASKED: 2 instead of 3" in text
    together = (2 * need + cpu.LAUNCHER_BYTES) / GIB
    assert f"2 at a time: 4 thread(s) on 8 core(s), {together:.2f} GiB of host memory together" in text
    strict = _plans(monkeypatch, 3, *shape, "sweep.strict_parallel_jobs=true", cores=8, available_gib=available)
    refused = host_share.share(strict, 3)
    assert refused.at_once == 2 and refused.problem is not None
    p = refused.problem
    assert (p.key, p.value, p.allowed) == ("sweep.parallel_jobs", 3, "at most 2 job(s) at once on this host")
    assert "A REAL RUN IS REFUSED (sweep.strict_parallel_jobs=true): 3 asked, 2 fit" in refused.lines[-1]


def test_a_parallel_sweep_that_fits_is_unchanged(monkeypatch):
    """2 one-rank jobs on 2 cores with memory to spare: both run at once, each rank with one thread
    (cores / (ranks x jobs)), and nothing is said to be fewer."""
    plans = _plans(monkeypatch, 2, "launcher.nproc_per_node=1", cores=2, available_gib=64)
    assert all(p.platform.env["OMP_NUM_THREADS"] == "1" for p in plans)
    shared = host_share.share(plans, 2)
    assert (shared.asked, shared.at_once, shared.problem) == (2, 2, None)
    assert "2 at a time: 2 thread(s) on 2 core(s)" in shared.lines[-1]
    assert not any("FEWER" in line for line in shared.lines)
    # One job at a time asked: nothing to share, the threads are the run's own (cores / ranks).
    (alone,) = _plans(monkeypatch, 1, "launcher.nproc_per_node=1", cores=2, available_gib=64)
    assert alone.platform.env["OMP_NUM_THREADS"] == "2" and host_share.share([alone], 1).lines == []


def test_jobs_on_an_accelerator_run_one_at_a_time(monkeypatch):
    """Each job's ranks use the node's devices 0..n-1: two 1-rank CUDA jobs would share device 0."""
    plans = _plans(monkeypatch, 2, "platform=cuda", "launcher.nproc_per_node=1", cores=8, available_gib=64)
    shared = host_share.share(plans, 2)
    assert (shared.at_once, shared.problem) == (1, None) and "one job at a time on cuda" in shared.lines[1]
    assert "FEWER AT ONCE THAN ASKED: 1 instead of 2" in shared.lines[-1]


def test_the_24_job_dry_run_says_how_many_run_at_once_and_why(tmp_path):
    """Issue 39: on this host (2 cores, 24 GiB) the dry run planned all 24 jobs at once with no word
    about the host. It now says how many run at once, limited by what, with the host's figures as
    qwen3exp reads them (its cores, MemAvailable)."""
    cores = _cores()
    if cores >= 48:
        pytest.skip(f"{cores} cores take 24 jobs of 2 ranks at once: nothing is limited by the cores here")
    r = run_cli(*SWEEP_24, "dry_run=true", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "host:       sweep.parallel_jobs=24 for 24 job(s) to run here" in out
    threads = 2 * max(1, cores // 48)  # each job: 2 ranks x cores / (2 ranks x 24 jobs) threads
    assert f"each job: up to {threads} CPU thread(s)" in out
    m = re.search(r"this host: (\d+) core\(s\), [\d.]+ GiB available \(MemAvailable\); its cores take (\d+) job", out)
    assert m is not None and int(m[1]) == cores and int(m[2]) == max(1, cores // threads), out[:3000]
    memory = re.search(r"its memory (\d+)", out)
    assert memory is not None
    by_memory = int(memory[1])
    at_once = min(24, int(m[2]), by_memory)
    assert f"FEWER AT ONCE THAN ASKED: {at_once} instead of 24" in out
    assert f"            {at_once} at a time: {at_once * threads} thread(s) on {cores} core(s)" in out
    assert out.count("\nhost:       ") == 1 and "OMP_NUM_THREADS=1 " in out  # said once; each rank's threads shared


def test_strict_parallel_jobs_refuses_a_batch_the_host_cannot_take_before_anything_starts(tmp_path):
    """sweep.strict_parallel_jobs=true: exit 2 naming sweep.parallel_jobs, what fits and why, no
    traceback, no job folder."""
    if _cores() >= 48:
        pytest.skip("this host's cores take 24 jobs of 2 ranks at once")
    sweep = tmp_path / "sweep"
    r = run_cli(*SWEEP_24, "sweep.strict_parallel_jobs=true", "training.steps=1", f"hydra.sweep.dir={sweep}")
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert "sweep.parallel_jobs" in r.stderr and "24 jobs at once do not fit this host together" in r.stderr
    assert "at most" in r.stderr and "job(s) at once on this host" in r.stderr and "Traceback" not in r.stderr
    assert not any(sweep.glob("*training.seed=*")) if sweep.exists() else True
