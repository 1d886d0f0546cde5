"""The local jobs of a batch that run at once (`sweep.parallel_jobs` above 1) share this host: how
many of them it takes together, and what they need together.

Each job is checked alone by its plan (`memory_fit`: its ranks, its torchrun agent and its launcher
against the memory available now; its threads against the cores). Together (`share`):
- CPU platform: a job needs its ranks' threads (ranks x threads per rank) and its host memory
  (`cpu.host_memory`: ranks, torchrun agent, the job's own launcher process). As many jobs run at
  once as the cores take without the jobs oversubscribing them together (their threads at most the
  cores; one job at least: a job's own oversubscription is its plan's warning) and as the memory
  available now (MemAvailable) takes beside this launcher, the largest jobs counted first. Without a
  threads_per_rank of their own, the ranks of a batch's jobs get cores / (ranks x sweep.parallel_jobs)
  threads each (`threads_for_jobs`), so that the asked number of jobs can run side by side.
- Accelerators (cuda, neuron): one job at a time. Each job's ranks use the node's devices 0..n-1
  (torchrun's local ranks; the devices are not split between jobs), and each rank's plan counts a
  whole device's memory.
- launcher=slurm: the jobs run on their own allocations, not on this host: nothing here.

Fewer at once than asked: the batch runs that many at a time and the plan says why, with the
numbers; `sweep.strict_parallel_jobs=true` refuses it instead (exit 2 before any job starts; a dry
run says that a real run is refused). A job that does not fit this host alone is refused by its own
plan (its memory_fit problems), before this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.launcher import LocalLauncher, SlurmLauncher
from qwen3exp.config.sections.platform import CpuPlatform
from qwen3exp.errors import Problem
from qwen3exp.plan import slurm_partition
from qwen3exp.plan.memory import DTYPE_BYTES
from qwen3exp.platforms import PlatformFacts, cpu, elsewhere, resolve
from qwen3exp.units import gib


def job_facts(exp: Experiment) -> PlatformFacts:
    """The platform of one job (`platforms.resolve`: a real launch checks the device, exit 2 when it
    is missing; a dry run plans from tables), its CPU threads shared with the jobs of its batch. A
    launcher=slurm job planned on its submit host: the partition's nodes, nothing of this host
    (`slurm_partition`; the job checks its devices when it starts)."""
    if slurm_partition.submitted_from_here(exp):
        assert isinstance(exp.launcher, SlurmLauncher)
        node = slurm_partition.job_node(exp.launcher)
        return elsewhere.facts(exp.platform, node, nproc_per_node=exp.launcher.nproc_per_node)
    return threads_for_jobs(resolve(exp.platform, nproc_per_node=exp.launcher.nproc_per_node, dry_run=exp.dry_run), exp)


def threads_for_jobs(facts: PlatformFacts, exp: Experiment) -> PlatformFacts:
    """The CPU facts of one job of a local batch of `sweep.parallel_jobs` jobs: without
    platform.threads_per_rank, each rank's threads are cores / (ranks x jobs at once), at least 1."""
    jobs = exp.sweep.parallel_jobs
    given = isinstance(exp.platform, CpuPlatform) and exp.platform.threads_per_rank is not None
    if jobs == 1 or facts.name != cpu.NAME or given or not isinstance(exp.launcher, LocalLauncher):
        return facts
    ranks = exp.launcher.nproc_per_node or facts.ranks_per_node
    threads = max(1, (facts.devices_per_node or 1) // (ranks * jobs))
    env = {**facts.env, "OMP_NUM_THREADS": str(threads), "QWEN3EXP_CPU_THREADS": str(threads)}
    return replace(facts, env=env, sustained_flops_per_rank=cpu.FLOPS_PER_THREAD * threads)


@dataclass(frozen=True)
class Share:
    """What the batch's jobs need of this host together, and how many run at once."""

    asked: int
    """sweep.parallel_jobs (at most the jobs to run)."""
    at_once: int
    lines: list[str]
    """What the plan prints (empty: one job at a time was asked, or the jobs run elsewhere)."""
    problem: Problem | None = None
    """sweep.strict_parallel_jobs=true and fewer fit than asked: the refusal."""


def job_need(plan) -> tuple[int, int]:
    """(CPU threads, bytes of host memory) of one CPU job."""
    exp, mem = plan.exp, plan.memory
    ranks = plan.mesh.nproc_per_node
    export = DTYPE_BYTES.get(exp.checkpoint.dtype or "", 0) if exp.checkpoint.exports else 0
    need = cpu.host_memory(
        ranks=ranks,
        plan_bytes_per_rank=mem.total + mem.transients,
        kernels_active=exp.kernels.active,
        export_dtype_bytes=export,
        total_params=plan.parameters.total,
    ).need
    return ranks * int(plan.platform.env.get("QWEN3EXP_CPU_THREADS", "1")), need


def share(plans: Sequence, requested: int) -> Share:
    """How many of the jobs of `plans` (those that are to run) run at once (see the module doc)."""
    asked = min(requested, len(plans))
    if asked <= 1 or not isinstance(plans[0].exp.launcher, LocalLauncher):
        return Share(asked, max(1, asked), [])
    head = f"host:       sweep.parallel_jobs={requested} for {len(plans)} job(s) to run here"
    if any(p.platform.name != cpu.NAME for p in plans):
        why = (
            f"one job at a time on {plans[0].platform.name}: each job's ranks use this node's devices 0..n-1 "
            "(they are not split between jobs) and each rank's plan counts a whole device's memory"
        )
        return _decided(plans, requested, asked, 1, [head, f"            {why}"])
    needs = sorted((job_need(p) for p in plans), key=lambda n: n[1], reverse=True)
    cores = plans[0].platform.devices_per_node or 1
    most_threads = max(t for t, _ in needs)
    by_cores = max(1, cores // most_threads)
    available = cpu.available_memory()
    by_memory, total = asked, cpu.LAUNCHER_BYTES
    if available is not None:
        by_memory = 0
        for _, need in needs[:asked]:
            if total + need > available:
                break
            total, by_memory = total + need, by_memory + 1
        by_memory = max(1, by_memory)  # a job that does not fit alone is its own plan's refusal
    at_once = min(asked, by_cores, by_memory)
    threads = sum(t for t, _ in needs[:at_once])
    together = cpu.LAUNCHER_BYTES + sum(n for _, n in needs[:at_once])
    memory_text = f"{gib(available)} available (MemAvailable)" if available is not None else "memory not known"
    lines = [
        head,
        f"            each job: up to {most_threads} CPU thread(s) (ranks x threads per rank) and "
        f"{gib(needs[0][1])} of host memory (its ranks, torchrun agent and launcher: the plan's host check)",
        f"            this host: {cores} core(s), {memory_text}; its cores take {by_cores} job(s) at once "
        f"(threads at most the cores), its memory {by_memory}"
        + (f" (with this launcher's {gib(cpu.LAUNCHER_BYTES)})" if available is not None else ""),
        f"            {at_once} at a time: {threads} thread(s) on {cores} core(s), {gib(together)} of host memory "
        "together",
    ]
    return _decided(plans, requested, asked, at_once, lines)


def _decided(plans: Sequence, requested: int, asked: int, at_once: int, lines: list[str]) -> Share:
    """The share, fewer than asked said loudly (or refused with sweep.strict_parallel_jobs)."""
    if at_once >= asked:
        return Share(asked, at_once, lines)
    strict = plans[0].exp.sweep.strict_parallel_jobs
    problem = Problem(
        "sweep.parallel_jobs",
        requested,
        f"{asked} jobs at once do not fit this host together: " + "; ".join(x.strip() for x in lines[1:]),
        f"at most {at_once} job(s) at once on this host",
        f"sweep.parallel_jobs={at_once}, or sweep.strict_parallel_jobs=false to run {at_once} at a time",
    )
    if strict:
        word = "A REAL RUN IS REFUSED (sweep.strict_parallel_jobs=true)" if plans[0].exp.dry_run else "REFUSED"
        return Share(asked, at_once, [*lines, f"            {word}: {asked} asked, {at_once} fit"], problem)
    note = (
        f"            FEWER AT ONCE THAN ASKED: {at_once} instead of {asked} (sweep.strict_parallel_jobs=true refuses)"
    )
    return Share(asked, at_once, [*lines, note])
