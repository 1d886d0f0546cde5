"""`parallelism=auto`, `training.local_batch_size=auto`, `training.activation_checkpoint=auto`: the
layout the plan chooses for the keys written `auto` (`qwen3exp.config.sections.auto_values`), once
per job, before anything starts; a key given a value stays as given.

1. Meshes: every assignment of the `auto` degrees (tp, pp, cp: divisors of the world size; ep: of the
   experts; dp_replicate: of launcher.nnodes, since replicas pay off only across nodes; dp_shard: the
   ranks left over) that passes the rules a mesh written by hand passes, by the same functions:
   `mesh.mesh_problems` (the world size), `parallel_rules.degree_problems` and `sequence_problems`
   (heads and kv heads by tp, experts by ep, layers by pp, seq_len by cp and tp),
   `model_arch.hf_moe_problems`, the kernels' own refusals, and the caller's (LoRA's, `build`).
2. Crossed with the checkpointing modes (none, selective, full) and micro-batch sizes (with
   training.global_batch_size set: the divisors of global / dp; else 1, 2, 4, ... `MAX_BATCH`); what
   does not fit the platform's memory per rank by the plan's own estimate (`memory_fit`) is dropped.
3. Ranked by `layout_cost` (predicted tokens per second). Among the layouts within `TIE` of the
   fastest the one needing the least memory wins: the estimate has an error, the headroom absorbs it.
4. The winner's values replace `auto` in the experiment, which is what is recorded and launched.
Nothing fits: `DoesNotFit`, with the smallest change that would fit (`auto_resolve`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from qwen3exp.config.flavors import Arch
from qwen3exp.config.parallel_rules import context_parallel_problems, degree_problems, divisors, sequence_problems
from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.parallelism import DEGREES, Parallelism
from qwen3exp.config.sections.training import AC_MODES, Training
from qwen3exp.errors import Problem
from qwen3exp.kernels.registry import problems as kernel_problems
from qwen3exp.plan import attention_path as paths
from qwen3exp.plan.batches import batch_problems
from qwen3exp.plan.layout_cost import Shape, StepCost, run_step
from qwen3exp.plan.memory_fit import memory_fit
from qwen3exp.plan.mesh import Mesh, mesh_problems
from qwen3exp.plan.model_arch import hf_moe_problems
from qwen3exp.platforms import PlatformFacts
from qwen3exp.units import human_bytes

TIE = 0.01
"""Layouts predicted within 1% of the fastest are as fast: the cost model is not finer than that."""
MAX_BATCH = 64
"""The largest micro-batch auto tries when training.global_batch_size is -1 (then each rank's batch
sets the global one; beyond this the step is long and the global batch large for no gain in speed)."""
SHOWN = 5
Rules = Callable[[Experiment], list[Problem]]
"""More rules a layout must pass, from the caller (`build`: LoRA's)."""


def auto_keys(exp: Experiment) -> tuple[str, ...]:
    """The dotted keys written `auto`, in the schema's order."""
    p, t = exp.parallelism.auto, exp.training.auto
    return tuple(f"parallelism.{k}" for k in DEGREES if k in p) + tuple(
        f"training.{k}" for k in ("local_batch_size", "activation_checkpoint") if k in t
    )


@dataclass(frozen=True)
class Candidate:
    shape: Shape
    mesh: Mesh
    memory: int
    """The bytes per rank the estimate compares with the usable memory (`memory_fit`)."""
    cost: StepCost

    def describe(self) -> str:
        g, s = self.shape.degrees, self.shape
        degrees = " x ".join(f"{k} {getattr(g, k)}" for k in DEGREES if getattr(g, k) > 1) or "1 rank"
        accum = f" x {s.grad_accum} accumulated" if s.grad_accum > 1 else ""
        return f"{degrees}, AC {s.activation_checkpoint}, batch {s.local_batch_size}{accum}"


@dataclass(frozen=True)
class Search:
    """What one search looked at."""

    meshes: list[tuple[Parallelism, Mesh]]
    """The meshes the rules accept."""
    fitting: list[Candidate]
    considered: int
    """Layouts x modes x batches whose memory was estimated."""
    smallest: int | None
    """The least memory any of them needs (bytes per rank); None when none was estimated."""
    refused: list[Problem] = field(default_factory=list)
    """Why the stand-in mesh (every auto degree 1) is refused, when no mesh passes."""


@dataclass(frozen=True)
class Layout:
    """The choice, as the plan shows and records it."""

    keys: tuple[str, ...]
    chosen: dict[str, Any]
    top: list[Candidate]
    """The winner first, then the fastest others (at most `SHOWN` in all)."""
    meshes: int
    considered: int
    fitting: int
    why: str
    global_batch: str | None = None
    """How the global batch was kept, when training.global_batch_size was -1 (`auto_resolve`)."""

    def as_json(self) -> dict:
        return {
            "keys": list(self.keys),
            "chosen": self.chosen,
            "global_batch": self.global_batch,
            "meshes": self.meshes,
            "considered": self.considered,
            "fitting": self.fitting,
            "why": self.why,
            "top": [
                {"layout": c.describe(), "memory_bytes": c.memory, **asdict(c.cost), **asdict(c.shape.degrees)}
                for c in self.top
            ],
        }


def _options(key: str, exp: Experiment, arch: Arch, world: int) -> list[int]:
    """The values a degree may take: its own when given, else what the world and the model allow."""
    if key not in exp.parallelism.auto:
        return [getattr(exp.parallelism, key)]
    match key:
        case "dp_replicate":
            return divisors(exp.launcher.nnodes)
        case "ep":
            return [d for d in divisors(arch.moe.num_experts) if d <= world] if arch.moe else [1]
        case _:
            return divisors(world)


def legal_meshes(exp: Experiment, arch: Arch, facts: PlatformFacts, rules: Rules) -> tuple[list, list[Problem]]:
    """Every mesh the rules accept (see the module doc), with why the all-ones stand-in is refused."""
    p = exp.parallelism
    standin_mesh, base = mesh_problems(p, exp.launcher, facts)
    base += [q for group in _layout_rules(exp, arch, facts, rules) for q in group]
    nproc = exp.launcher.nproc_per_node or facts.ranks_per_node
    world = standin_mesh.world_size if standin_mesh else exp.launcher.nnodes * nproc
    seen = {(q.key, q.message) for q in base if standin_mesh is not None}
    out = []
    keys = ("dp_replicate", "tp", "pp", "cp", "ep")
    for values in itertools.product(*(_options(k, exp, arch, world) for k in keys)):
        degrees = dict(zip(keys, values, strict=True))
        if world % (degrees["dp_replicate"] * degrees["tp"] * degrees["pp"] * degrees["cp"]):
            continue
        degrees["dp_shard"] = -1 if "dp_shard" in p.auto else p.dp_shard
        candidate = Parallelism.model_validate(degrees)
        mesh, problems = mesh_problems(candidate, exp.launcher, facts)
        if mesh is None or problems:
            continue
        c_exp = exp.model_copy(update={"parallelism": candidate})
        groups = _layout_rules(c_exp, arch, facts, rules)
        if any((q.key, q.message) not in seen for group in groups for q in group):
            continue
        out.append((candidate, mesh))
    return out, base


def attention(exp: Experiment, facts: PlatformFacts) -> str:
    """The attention the run uses: model.attention, `auto` resolved by the platform."""
    return paths.kernel_of(exp, facts)


def attention_path(exp: Experiment, facts: PlatformFacts) -> paths.AttentionPath:
    """The attention kernel the run uses and whether SDPA takes a mask (`qwen3exp.plan.attention_path`)."""
    return paths.resolve(exp, facts)


def _layout_rules(exp: Experiment, arch: Arch, facts: PlatformFacts, rules: Rules) -> Iterator[list[Problem]]:
    """The rules a layout must pass, one group at a time, cheapest first (a caller stops at a refusal)."""
    t, p = exp.training, exp.parallelism
    yield sequence_problems(t, p)
    yield degree_problems(exp.model, t, p, arch, "the model")
    yield context_parallel_problems(exp.model, p, attention(exp, facts))
    yield hf_moe_problems(exp, arch)
    yield rules(exp)
    yield kernel_problems(exp, facts)


def _batches(training: Training, mesh: Mesh) -> list[int]:
    if "local_batch_size" not in training.auto:
        return [training.local_batch_size]
    if training.global_batch_size == -1:
        return [2**i for i in range(MAX_BATCH.bit_length()) if 2**i <= MAX_BATCH]  # 1, 2, 4, ...
    dp = mesh.dp_replicate * mesh.dp_shard
    return divisors(training.global_batch_size // dp) if training.global_batch_size % dp == 0 else []


def search(exp: Experiment, arch: Arch, facts: PlatformFacts, rules: Rules) -> Search:
    """Every layout that fits, with its predicted step (see the module doc)."""
    t = exp.training
    meshes, refused = legal_meshes(exp, arch, facts, rules)
    modes = AC_MODES if "activation_checkpoint" in t.auto else (t.activation_checkpoint,)
    total_params = arch.param_counts()[0]
    fitting: list[Candidate] = []
    considered, smallest = 0, None
    for (par, mesh), mode in itertools.product(meshes, modes):
        for batch in _batches(t, mesh):  # ascending: memory grows with the batch
            training = t.model_copy(update={"local_batch_size": batch, "activation_checkpoint": mode})
            batches, problems = batch_problems(training, mesh)
            if batches is None or problems:
                continue
            # memory_fit's own estimate (the platform's measure beside the model included); a dry
            # run's copy, so that this host's free memory now does not change the choice.
            trial = exp.model_copy(update={"parallelism": par, "training": training, "dry_run": True})
            mem = memory_fit(trial, arch, mesh, facts, total_params, [])[0]
            need = mem.usable - mem.headroom  # what `fits` compares with the usable memory
            considered += 1
            smallest = need if smallest is None else min(smallest, need)
            if not mem.fits:
                break
            shape = Shape(mesh.degrees, mode, batch, batches.grad_accum_steps)
            cost = run_step(trial, arch, shape, nproc_per_node=mesh.nproc_per_node, facts=facts)
            fitting.append(Candidate(shape, mesh, need, cost))
    return Search(meshes, fitting, considered, smallest, [] if meshes else refused)


def _simpler(c: Candidate) -> tuple:
    """Fewer parallel dimensions first, then smaller degrees (a deterministic order among equals)."""
    g = c.shape.degrees
    values = tuple(getattr(g, k) for k in ("tp", "cp", "pp", "ep", "dp_replicate"))
    return (sum(v > 1 for v in values), values)


def choose(found: Search) -> tuple[Candidate, list[Candidate], str]:
    """The winner, the ones shown, and why it won (`found.fitting` is not empty)."""
    ranked = sorted(found.fitting, key=lambda c: (-c.cost.tokens_per_s, c.memory, _simpler(c)))
    fastest = ranked[0]
    close = [c for c in ranked if c.cost.tokens_per_s >= fastest.cost.tokens_per_s * (1 - TIE)]
    winner = min(close, key=lambda c: (c.memory, _simpler(c)))
    return winner, _shown(winner, ranked), _why(winner, ranked, len(close))


def _shown(winner: Candidate, ranked: list[Candidate]) -> list[Candidate]:
    """The winner, then the fastest layout of each other mesh and checkpointing mode (the other
    batch sizes of one layout say little), at most `SHOWN` in all."""
    groups = {(winner.shape.degrees, winner.shape.activation_checkpoint)}
    top = [winner]
    for c in ranked:
        group = (c.shape.degrees, c.shape.activation_checkpoint)
        if group not in groups and len(top) < SHOWN:
            groups.add(group)
            top.append(c)
    return top


def _why(w: Candidate, ranked: list[Candidate], close: int) -> str:
    if len(ranked) == 1:
        return "the only layout that fits"
    if close > 1:
        return (
            f"{close} layouts are predicted within {TIE:.0%} of the fastest ({ranked[0].cost.tokens_per_s:,.0f} "
            f"tokens/s); this one needs the least memory ({human_bytes(w.memory)} per rank): the most headroom"
        )
    r = next(c for c in ranked if c is not w)
    a, b = w.cost, r.cost
    parts = {
        "compute with recompute and pipeline bubble": (a.compute_s, b.compute_s),
        "communication on the critical path (tp, cp, ep, pp)": (a.exposed_s, b.exposed_s),
        "FSDP traffic beyond what compute hides": (
            max(0.0, a.hidden_s - a.compute_s),
            max(0.0, b.hidden_s - b.compute_s),
        ),
    }
    name, (x, y) = max(parts.items(), key=lambda kv: kv[1][1] - kv[1][0])
    return (
        f"{a.tokens_per_s / b.tokens_per_s - 1:.0%} more tokens/s than the runner-up ({r.describe()}): "
        f"{name} {x:.3g} s vs {y:.3g} s per step"
    )


def resolved(exp: Experiment, winner: Candidate) -> tuple[Experiment, dict[str, Any]]:
    """The experiment with the winner's values in place of `auto`, and those values by key."""
    p, t = exp.parallelism, exp.training
    degrees = {k: getattr(p, k) for k in DEGREES}
    chosen: dict[str, Any] = {}
    for k in (k for k in DEGREES if k in p.auto):
        degrees[k] = chosen[f"parallelism.{k}"] = getattr(winner.mesh, k)
    values = t.model_dump()
    for k, v in (
        ("local_batch_size", winner.shape.local_batch_size),
        ("activation_checkpoint", winner.shape.activation_checkpoint),
    ):
        if k in t.auto:
            values[k] = chosen[f"training.{k}"] = v
    update = {"parallelism": Parallelism.model_validate(degrees), "training": Training.model_validate(values)}
    return exp.model_copy(update=update), chosen
