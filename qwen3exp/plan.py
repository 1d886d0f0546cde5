"""The plan: what a validated experiment resolves to on a platform (mesh, world size, batches),
and the cross-field rules that need the platform to check."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from qwen3exp.errors import ConfigError, Problem
from qwen3exp.platforms import PlatformFacts
from qwen3exp.schema import Experiment


@dataclass(frozen=True)
class Mesh:
    nnodes: int
    nproc_per_node: int
    world_size: int
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    cp: int
    ep: int
    dp_shard_from: str
    """How dp_shard was obtained (given, or what -1 resolved to)."""


@dataclass(frozen=True)
class Batches:
    local_batch_size: int
    global_batch_size: int
    grad_accum_steps: int
    tokens_per_step: int
    tokens_per_rank_per_step: int


def resolve_mesh(exp: Experiment, facts: PlatformFacts) -> Mesh:
    la, p = exp.launcher, exp.parallelism
    nproc = la.nproc_per_node or facts.ranks_per_node
    world = la.nnodes * nproc
    others = p.dp_replicate * p.tp * p.pp * p.cp
    origin = "launcher.nproc_per_node" if la.nproc_per_node else f"platform {facts.name} default"
    if p.dp_shard == -1:
        if world % others:
            raise ConfigError([Problem(
                "parallelism", {"dp_replicate": p.dp_replicate, "tp": p.tp, "pp": p.pp, "cp": p.cp},
                f"the product of the degrees ({others}) does not divide the world size {world} "
                f"(nnodes {la.nnodes} x nproc_per_node {nproc}, {origin})",
                f"degrees whose product divides {world}")])
        dp_shard, how = world // others, f"-1 -> {world // others} (world {world} / other degrees {others})"
    else:
        dp_shard, how = p.dp_shard, "given"
        if others * dp_shard != world:
            raise ConfigError([Problem(
                "parallelism.dp_shard", p.dp_shard,
                f"dp_replicate x dp_shard x tp x pp x cp = {others * dp_shard} but the world size is {world} "
                f"(nnodes {la.nnodes} x nproc_per_node {nproc}, {origin})",
                f"-1, or {world // others if world % others == 0 else 'a value making the product equal the world size'}")])
    if p.ep > 1 and (dp_shard * p.cp * p.tp) % p.ep:
        raise ConfigError([Problem("parallelism.ep", p.ep, "must divide dp_shard x cp x tp",
                                   f"a divisor of {dp_shard * p.cp * p.tp}")])
    return Mesh(la.nnodes, nproc, world, p.dp_replicate, dp_shard, p.tp, p.pp, p.cp, p.ep, how)


def resolve_batches(exp: Experiment, mesh: Mesh) -> Batches:
    t = exp.training
    dp = mesh.dp_replicate * mesh.dp_shard
    per_step = t.local_batch_size * dp
    gbs = per_step if t.global_batch_size == -1 else t.global_batch_size
    if gbs % per_step:
        raise ConfigError([Problem(
            "training.global_batch_size", t.global_batch_size,
            f"must be a multiple of local_batch_size x data-parallel degree = {t.local_batch_size} x {dp}",
            f"-1 or a multiple of {per_step}")])
    accum = gbs // per_step
    return Batches(t.local_batch_size, gbs, accum, gbs * t.seq_len,
                   t.local_batch_size * accum * t.seq_len // mesh.cp)


def mesh_dict(mesh: Mesh) -> dict:
    return asdict(mesh)
