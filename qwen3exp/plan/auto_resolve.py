"""The plan's step for the keys written `auto`: `resolve` gives the experiment with the chosen layout
(`qwen3exp.plan.auto_layout`) and what the plan shows of the choice, or refuses (exit 2, nothing
started) when no layout fits, naming the smallest change that would fit. That change is found by
searching again with it, trying in this order, cheapest first: full activation checkpointing (slower,
nothing else changes), a smaller micro-batch (the same global batch through accumulation when
training.global_batch_size is set), both, then more nodes (launcher.nnodes: more ranks to shard
over, at the same memory per rank), then more nodes with both. Only keys not written `auto` are
changed: an `auto` key was searched already.

The global batch is kept (`kept_global_batch`): a layout the plan chooses changes how the work is
spread, never the optimisation. training.global_batch_size set: every layout reaches it through
gradient accumulation (or is not a candidate). -1 with any degree written `auto`: the global batch is
the one the default layout gives (every auto degree at its stand-in, `parallelism.STAND_IN`: FSDP over
every rank) with the experiment's local batch (local_batch_size=auto: the one the plan chooses for that
default layout; 1 where that layout fits none, said in the plan); the chosen layout keeps it by
accumulation, and the plan says so."""

from __future__ import annotations

from typing import Any

from qwen3exp.config.flavors import Arch
from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.auto_values import AUTO
from qwen3exp.config.sections.base import MAX_NODES
from qwen3exp.config.sections.parallelism import DEGREES, Parallelism
from qwen3exp.config.sections.training import Training
from qwen3exp.errors import Problem
from qwen3exp.plan import memory
from qwen3exp.plan.auto_layout import Layout, Rules, Search, auto_keys, choose, resolved, search
from qwen3exp.plan.memory_fit import DoesNotFit
from qwen3exp.plan.mesh import mesh_problems
from qwen3exp.platforms import PlatformFacts
from qwen3exp.units import human_bytes

MAX_NODE_FACTOR = 64
"""More nodes tried: up to 64 times launcher.nnodes (a larger change is not a suggestion)."""


def _training(t: Training, **changes) -> Training:
    """The section with `changes`, its other `auto` fields still `auto`."""
    return Training.model_validate({**t.model_dump(), **{k: AUTO for k in t.auto}, **changes})


def _training_changes(t: Training) -> list[tuple[str, Training]]:
    """Full checkpointing, then each smaller micro-batch, then both (those not left to `auto`)."""
    ac = "activation_checkpoint" not in t.auto and t.activation_checkpoint != "full"
    batch = "local_batch_size" not in t.auto and t.local_batch_size > 1
    out = [("training.activation_checkpoint=full", _training(t, activation_checkpoint="full"))] if ac else []
    b = t.local_batch_size // 2 if batch else 0
    while b >= 1:
        out.append((f"training.local_batch_size={b}", _training(t, local_batch_size=b)))
        b //= 2
    if ac and batch:
        both = _training(t, local_batch_size=1, activation_checkpoint="full")
        out.append(("training.local_batch_size=1 training.activation_checkpoint=full", both))
    return out


def _changes(exp: Experiment) -> list[tuple[str, Experiment]]:
    """Each change to try, as its overrides and the experiment it makes (see the module doc): the
    training changes, then more nodes alone, then more nodes with the largest training change."""
    trainings = _training_changes(exp.training)
    changed = [(o, exp.model_copy(update={"training": tr})) for o, tr in trainings]
    factors = [f for f in (2**i for i in range(1, 7)) if f <= MAX_NODE_FACTOR and exp.launcher.nnodes * f <= MAX_NODES]
    for last in ([], trainings[-1:]):
        for f in factors:
            nodes = f"launcher.nnodes={exp.launcher.nnodes * f}"
            update: dict = {"launcher": exp.launcher.model_copy(update={"nnodes": exp.launcher.nnodes * f})}
            for o, tr in last:
                nodes, update["training"] = f"{nodes} {o}", tr
            changed.append((nodes, exp.model_copy(update=update)))
    return changed


def smallest_change(exp: Experiment, arch: Arch, facts: PlatformFacts, rules: Rules) -> str | None:
    """The first change of `_changes` under which a layout fits, with that layout; None: none does."""
    for override, changed in _changes(exp):
        found = search(changed, arch, facts, rules)
        if found.fitting:
            winner = choose(found)[0]
            return f"{override} (then {winner.describe()} fits: {human_bytes(winner.memory)} per rank)"
    return None


def nothing_fits(exp: Experiment, arch: Arch, facts: PlatformFacts, rules: Rules, found: Search) -> DoesNotFit:
    """The refusal of an experiment none of whose layouts fits (`found`: the search that found none)."""
    g = human_bytes
    keys = auto_keys(exp)
    key = "parallelism" if exp.parallelism.auto else keys[0]
    budget = facts.memory_per_rank_bytes
    usable = int(budget * memory.USABLE_FRACTION)
    if not found.meshes:
        r = found.refused[0] if found.refused else None
        first = f"{r.key} = {r.value!r}: {r.message}" if r else "(no reason recorded)"
        why = f"no mesh passes torchtitan's rules with the degrees given: {first}"
        return DoesNotFit([Problem(key, AUTO, why, "degrees that leave at least one legal mesh")])
    need = f"; the smallest needs {g(found.smallest)} per rank" if found.smallest is not None else ""
    why = (
        f"no layout fits: {len(found.meshes)} mesh(es) torchtitan accepts, {found.considered} layout(s) with "
        f"checkpointing modes and batch sizes estimated, none within {g(usable)} per rank "
        f"({int(memory.USABLE_FRACTION * 100)}% of {g(budget)}){need}"
    )
    change = smallest_change(exp, arch, facts, rules)
    hint = f"smallest change that fits: {change}" if change else "a smaller model (none of the changes tried fits)"
    allowed = f"an experiment with a layout that needs at most {g(usable)} per rank"
    return DoesNotFit([Problem(key, AUTO, why, allowed, hint)])


def resolve(exp: Experiment, arch: Arch, facts: PlatformFacts, rules: Rules) -> tuple[Experiment, Layout | None]:
    """`exp` with a value for every key written `auto`, and the choice (None: nothing was `auto`).
    Raises DoesNotFit when no layout fits."""
    keys = auto_keys(exp)
    if not keys:
        return exp, None
    exp, kept = kept_global_batch(exp, arch, facts, rules)
    found = search(exp, arch, facts, rules)
    if not found.fitting:
        raise nothing_fits(exp, arch, facts, rules, found)
    winner, top, why = choose(found)
    chosen_exp, chosen = resolved(exp, winner)
    layout = Layout(keys, chosen, top, len(found.meshes), found.considered, len(found.fitting), why, kept)
    return chosen_exp, layout


def kept_global_batch(exp: Experiment, arch: Arch, facts: PlatformFacts, rules: Rules) -> tuple[Experiment, str | None]:
    """`exp` with the global batch every candidate layout must keep (see the module doc), and the
    plan's line about it (None: training.global_batch_size was set, or no degree is `auto`, so no
    layout choice can change it)."""
    p, t = exp.parallelism, exp.training
    if not p.auto or t.global_batch_size != -1:
        return exp, None
    default = Parallelism.model_validate({k: getattr(p, k) for k in DEGREES})  # auto degrees hold STAND_IN
    mesh, _ = mesh_problems(default, exp.launcher, facts)
    if mesh is None:  # the world size itself is refused: the search says why
        return exp, None
    dp = mesh.dp_replicate * mesh.dp_shard
    described = " x ".join(f"{k} {getattr(mesh, k)}" for k in DEGREES if getattr(mesh, k) > 1) or "1 rank"
    local, how = t.local_batch_size, f"training.local_batch_size {t.local_batch_size}"
    if "local_batch_size" in t.auto:
        found = search(exp.model_copy(update={"parallelism": default}), arch, facts, rules)
        local = choose(found)[0].shape.local_batch_size if found.fitting else 1
        how = (
            f"local batch {local}, what training.local_batch_size=auto chooses for it"
            if found.fitting
            else "local batch 1: THAT LAYOUT FITS NO BATCH, so the smallest"
        )
    kept = dp * local
    note = (
        f"global batch {kept} sequences, kept (training.global_batch_size=-1): the default layout ({described}: "
        f"{dp} data-parallel ranks) with {how}; the chosen layout reaches it by gradient accumulation; "
        "set training.global_batch_size to choose another"
    )
    return exp.model_copy(update={"training": _training(t, global_batch_size=kept)}), note


def attempt(
    exp: Experiment, arch: Arch | None, facts: PlatformFacts, rules: Rules
) -> tuple[Experiment, Layout | None, list[Problem]]:
    """`resolve`, its refusal returned with the experiment as given, so that the plan's other checks
    still run (`arch` None: the model's files have problems; nothing is chosen)."""
    if arch is None:
        return exp, None, []
    try:
        return (*resolve(exp, arch, facts, rules), [])
    except DoesNotFit as e:
        return exp, None, e.problems


def sources(provenance, exp: Experiment, layout: Layout | None) -> list[tuple[str, Any, Any]]:
    """The provenance table of `exp` (key, value, source; [] without a provenance), the keys the plan
    chose saying so and where their `auto` came from."""
    if provenance is None:
        return []
    chosen = layout.chosen if layout is not None else {}
    kept = {"training.global_batch_size"} if layout is not None and layout.global_batch else set()
    table = provenance.table(exp.model_dump(mode="json"))
    return [(k, v, _source(k, src, chosen, kept)) for k, v, src in table]


def _source(key: str, source: str, chosen: dict, kept: set[str]) -> str:
    if key in chosen:
        return f"chosen by the plan: auto in {source}"
    return f"kept by the plan: -1 in {source}" if key in kept else source
