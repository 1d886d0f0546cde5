"""The device mesh of a plan: the world size and every parallel degree, with what -1 resolved to.

`mesh_problems` names the degree that does not fit the world size (launcher.nnodes x ranks per
node), or the ranks per node that the platform has no devices for.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen3exp.config.schema import Experiment
from qwen3exp.errors import ConfigError, Problem, one_of
from qwen3exp.plan import memory
from qwen3exp.platforms import PlatformFacts


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
    nproc_from: str = "launcher.nproc_per_node"
    """Where the ranks per node came from (launcher.nproc_per_node, or the platform's default)."""

    @property
    def degrees(self) -> memory.Degrees:
        return memory.Degrees(self.dp_replicate, self.dp_shard, self.tp, self.pp, self.cp, self.ep)


def mesh_problems(parallelism, launcher, facts: PlatformFacts) -> tuple[Mesh | None, list[Problem]]:
    """Resolve the device mesh; problems name the degree that does not fit the world size."""
    la, p = launcher, parallelism
    nproc = la.nproc_per_node or facts.ranks_per_node
    nproc_key = "launcher.nproc_per_node" if la.nproc_per_node else f"platform {facts.name} default ranks_per_node"
    world = la.nnodes * nproc
    origin = f"world size {world} = launcher.nnodes {la.nnodes} x {nproc} ranks per node ({nproc_key})"
    problems = _divisor_problems(p, world, origin)
    if problems:
        return None, problems
    others = p.dp_replicate * p.tp * p.pp * p.cp
    if p.dp_shard == -1:
        dp_shard, how = world // others, f"-1 -> {world // others} (world {world} / other degrees {others})"
    else:
        dp_shard, how = p.dp_shard, "given"
        if others * dp_shard != world:
            ok = world // others
            return None, [
                Problem(
                    "parallelism.dp_shard",
                    p.dp_shard,
                    f"dp_replicate x dp_shard x tp x pp x cp = {others * dp_shard}, but the {origin}",
                    f"-1 or {ok}",
                    f"nearest valid value: parallelism.dp_shard={ok}",
                )
            ]
    problems = _ep_problems(p, dp_shard) + _device_problems(la, facts, nproc)
    if problems:
        return None, problems
    return Mesh(la.nnodes, nproc, world, p.dp_replicate, dp_shard, p.tp, p.pp, p.cp, p.ep, how, nproc_key), []


def _divisor_problems(p, world: int, origin: str) -> list[Problem]:
    """The degrees (other than dp_shard and ep) that do not divide the world size, or whose product does not."""
    problems: list[Problem] = []
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    for key in ("dp_replicate", "tp", "pp", "cp"):
        v = getattr(p, key)
        if world % v:
            problems.append(
                Problem(
                    f"parallelism.{key}",
                    v,
                    f"does not divide the {origin}",
                    f"{one_of(divisors)} (the divisors of {world})",
                    f"or run {v} ranks per node: launcher.nproc_per_node={v}",
                )
            )
    others = p.dp_replicate * p.tp * p.pp * p.cp
    if not problems and world % others:
        problems.append(
            Problem(
                "parallelism",
                {"dp_replicate": p.dp_replicate, "tp": p.tp, "pp": p.pp, "cp": p.cp},
                f"dp_replicate x tp x pp x cp = {others} does not divide the {origin}",
                f"degrees whose product divides {world}",
            )
        )
    return problems


def _ep_problems(p, dp_shard: int) -> list[Problem]:
    """Expert parallelism must divide the ranks that shard the experts' data (dp_shard x cp x tp)."""
    if p.ep > 1 and (dp_shard * p.cp * p.tp) % p.ep:
        n = dp_shard * p.cp * p.tp
        return [
            Problem(
                "parallelism.ep",
                p.ep,
                f"must divide dp_shard x cp x tp = {n}",
                f"{one_of(d for d in range(1, n + 1) if n % d == 0)} (the divisors of {n})",
            )
        ]
    return []


def _device_problems(la, facts: PlatformFacts, nproc: int) -> list[Problem]:
    """More ranks per node than the node has devices, on a platform whose devices a rank holds alone."""
    if facts.devices_per_node is None or nproc <= facts.devices_per_node or not facts.devices_exclusive:
        return []
    msg = f"{nproc} ranks per node, but the {facts.name} platform sees {facts.devices_per_node} device(s) on this node"
    key = "launcher.nproc_per_node" if la.nproc_per_node else "platform.ranks_per_node"
    return [
        Problem(
            key,
            nproc,
            msg,
            f"1..{facts.devices_per_node}",
            f"nearest valid value: launcher.nproc_per_node={facts.devices_per_node}",
        )
    ]


def resolve_mesh(exp: Experiment, facts: PlatformFacts) -> Mesh:
    mesh, problems = mesh_problems(exp.parallelism, exp.launcher, facts)
    if problems or mesh is None:
        raise ConfigError(problems)
    return mesh
