"""The plan: what a validated experiment resolves to before anything starts.

Mesh (what -1 resolved to), batches and tokens, parameter counts (total, active per token, per rank
after sharding), the per-rank memory estimate against the platform's memory (`qwen3exp.plan.memory`),
the kernel overrides that will apply, the checkpoint verdict, and the exact torchrun command(s).
Each part has its module (`mesh`, `batches`, `memory`, `memory_fit`, `checkpoint_verdict`,
`model_files`, `data_files`, `placement`, `tracking`); this one puts them together. `make_plan` also runs every
check that needs the platform or the file system, and reports all problems together. Pure
arithmetic on plain data: no torch, no torchtitan, no model is built (except where kernel overrides
are active: their matches are computed on torchtitan's config tree, built once, by `qwen3exp.titan`).

The Plan (`qwen3exp.plan.resolved`) is the one resolved object of a launch: besides what it shows,
it holds the experiment, the checked model files, the node placement, the override claims and this
node's torchrun command, and `qwen3exp.launchers.local.launch(plan, run_dir)` runs it without
resolving anything again.

`python -m qwen3exp dry_run=true` prints the plan (`qwen3exp.plan.render`); every real run writes it
to `plan.json` in its run directory (`Plan.as_json`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Set as AbstractSet
from pathlib import Path
from typing import Any

from qwen3exp.config.parallel_rules import context_parallel_problems
from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.data import ChatData
from qwen3exp.data import figures as data_figures, files as data_files
from qwen3exp.data.chat import packing as chat_packing
from qwen3exp.data.preference import files as preference_files
from qwen3exp.data.text import hf_files as hf_data_files
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.plan import (
    attention_path,
    auto_resolve,
    eval_tasks,
    memory,
    model_files,
    placement,
    reference_model,
    sample_prompts,
    tracking,
)
from qwen3exp.plan.auto_layout import Layout, attention
from qwen3exp.plan.batches import Batches, batch_problems, resolve_batches
from qwen3exp.plan.checkpoint_verdict import CheckpointVerdict, checkpoint_verdict
from qwen3exp.plan.host_share import job_facts
from qwen3exp.plan.layout_cost import Shape, run_step
from qwen3exp.plan.memory_fit import DoesNotFit, memory_fit
from qwen3exp.plan.mesh import Mesh, mesh_problems, resolve_mesh
from qwen3exp.plan.model_files import ModelFiles
from qwen3exp.plan.model_sources import ModelSections
from qwen3exp.plan.nodes import Placement
from qwen3exp.plan.resolved import Parameters, Plan, Prepared
from qwen3exp.platforms import PlatformFacts, experiment_problems, neuron_cache, resolve
from qwen3exp.run.redact import redact_argv

# The kernels group (qwen3exp/kernels/) and the checkpoint group fill these hooks. They must stay
# cheap (no torchtitan import unless kernel overrides are active): the dry run calls them for every
# sweep point.
ClaimsOf = Callable[[Experiment, Any], list[dict]]
"""Matches an experiment's kernel overrides against torchtitan's config tree: the torchtitan
adapter's `qwen3exp.titan.job_config.override_claims`, passed in by the caller (plan/ sits below the
adapter and imports no torchtitan code)."""


def kernel_claims(exp: Experiment, facts, claims_of: ClaimsOf | None) -> list[dict]:
    """Every torchtitan override this experiment will apply, with the model nodes it replaces
    (matches computed on the config tree, no model built; the default kernels override nothing and
    need no matcher). Raises ConfigError for kernels that do not fit (no match, two overrides on one
    node, nki_moe on a dense model, a seq_len the kernel cannot tile on Neuron, ...) and for what
    torchtitan's own checks refuse in the config they are matched on."""
    if not exp.kernels.active:
        return []
    if claims_of is None:
        raise TypeError(
            "an experiment with kernel overrides is planned with claims_of=qwen3exp.titan.job_config.override_claims"
        )
    return claims_of(exp, facts)


def section_problems(sections: dict[str, Any], replaced: AbstractSet[str] = frozenset()) -> list[Problem]:
    """The plan's checks on whatever sections are valid on their own (used when the experiment as a
    whole is invalid, so that a mistake in one section does not hide one in another). `replaced`:
    keys whose bad value was replaced by its default to validate the rest; no problem about them."""
    sections = dict(sections)
    if any(k.startswith(("parallelism.", "launcher.", "platform.")) for k in replaced):
        sections.pop("parallelism", None)  # a stand-in default would make the mesh check misleading
    if any(k in ("training.local_batch_size", "training.global_batch_size") for k in replaced):
        sections.pop("training", None)
    return [p for p in _section_problems(sections) if p.key not in replaced]


def _section_problems(sections: dict[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    # The model files need the model, its checkpoint and the mesh degrees; without one of them the
    # check is skipped (that section's own problem is reported). training and kernels are optional.
    if all(k in sections for k in ("model", "checkpoint", "parallelism")):
        try:
            model_files.check(
                ModelSections(
                    sections["model"],
                    sections["checkpoint"],
                    sections["parallelism"],
                    sections.get("training"),
                    sections.get("kernels"),
                )
            )
        except ConfigError as e:
            problems += e.problems
    if "data" in sections:
        if not isinstance(sections["data"], ChatData):  # data=chat's own checks follow (chat_files)
            problems += data_files.data_problems(sections["data"], sections.get("validation"))
        problems += hf_data_files.hf_problems(sections["data"], sections.get("training"), sections.get("validation"))
        s = sections  # records only:
        problems += preference_files.record_problems(s["data"], s.get("validation"), None, None, s.get("objective"))
    if all(k in sections for k in ("parallelism", "launcher", "platform")):
        try:
            # The experiment as a whole is invalid, so nothing starts: plan without probing devices.
            facts = resolve(sections["platform"], nproc_per_node=sections["launcher"].nproc_per_node, dry_run=True)
        except ConfigError as e:
            return problems + e.problems
        mesh, ps = mesh_problems(sections["parallelism"], sections["launcher"], facts)
        problems += ps
        if mesh is not None and "training" in sections:
            problems += batch_problems(sections["training"], mesh)[1]
    return problems


def make_plan(
    exp: Experiment,
    run_dir: str | Path,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    provenance=None,
    job_num: int | None = None,
    env: Mapping[str, str] | None = None,
    claims_of: ClaimsOf | None = None,
) -> Plan:
    """Resolve and check everything; raise ConfigError naming every problem. A plan that does not fit
    in memory is a problem, unless `exp.dry_run` (then it is a loud warning in `Plan.warnings`).
    `env`: the scheduler's environment for the node placement (default: this process's);
    `claims_of`: the kernel override matcher (see `ClaimsOf`), needed when kernels are active."""
    files, facts, mesh, batches, claims, where, exp, layout = _resolve_stages(exp, env, claims_of)
    arch = files.arch
    warnings = _sharing_warnings(facts, mesh)
    total, active = arch.param_counts()
    trainable = memory.trainable_of(arch, exp.peft)
    params = Parameters(total, active, memory.params_per_rank(arch, mesh.degrees), arch.is_moe, trainable)
    mem, fit = memory_fit(exp, arch, mesh, facts, total, warnings)
    problems = fit + _peft_problems(exp, arch.is_moe)
    problems += chat_packing.rank_problems(exp, mesh.dp_replicate * mesh.dp_shard, files.folder)
    verdict = checkpoint_verdict(exp, files, Path(run_dir))
    problems += _verdict_problems(exp, verdict)
    if problems:
        raise DoesNotFit(problems) if problems == fit else ConfigError(problems)
    nnodes, nproc, folder = mesh.nnodes, mesh.nproc_per_node, Path(run_dir)
    t = exp.training
    shape = Shape(mesh.degrees, t.activation_checkpoint, t.local_batch_size, batches.grad_accum_steps)
    forked = facts.forked_ranks
    commands = placement.torchrun_commands(
        exp, where, nnodes=nnodes, nproc_per_node=nproc, run_dir=folder, forked=forked
    )
    command = placement.torchrun_argv(exp, where, nnodes=nnodes, nproc_per_node=nproc, run_dir=folder, forked=forked)
    return Plan(
        name=exp.name,
        run_dir=str(run_dir),
        overrides=list(overrides),
        platform=neuron_cache.for_graph(facts, exp, arch, mesh, batches),  # Neuron: the graph's compile cache
        mesh=mesh,
        batches=batches,
        arch=arch,
        parameters=params,
        memory=mem,
        kernel_overrides=[(f"{c['key']} -> {c['target']}", len(c["nodes"])) for c in claims],
        checkpoint=verdict,
        commands=[redact_argv(c) for c in commands],
        exp=exp,
        files=files,
        placement=where,
        kernel_claims=claims,
        command=command,
        launch_notes=placement.notes(exp, where),
        provenance=auto_resolve.sources(provenance, exp, layout),
        warnings=warnings,
        layout=layout,
        step=run_step(exp, arch, shape, nproc_per_node=nproc, facts=facts),
        data=data_figures.figures(exp, files.folder, batches).as_json(),
    )


def _sharing_warnings(facts: PlatformFacts, mesh: Mesh) -> list[str]:
    """More ranks than devices on a node: it runs, slowly."""
    if facts.devices_per_node is not None and mesh.nproc_per_node > facts.devices_per_node:
        n, devices = mesh.nproc_per_node, facts.devices_per_node
        return [f"{n} ranks share {devices} {facts.name} device(s) on this node: expect it to be slow"]
    return []


def _verdict_problems(exp: Experiment, verdict: CheckpointVerdict) -> list[Problem]:
    """The checkpoint this run would load does not fit the experiment."""
    if verdict.compatible is not False:
        return []
    return [
        Problem(
            "checkpoint",
            exp.checkpoint.summary,
            verdict.detail,
            verdict.allowed or "a checkpoint of this architecture",
            verdict.hint,
        )
    ]


def _resolve_stages(
    exp: Experiment, env: Mapping[str, str] | None, claims_of: ClaimsOf | None
) -> tuple[ModelFiles, PlatformFacts, Mesh, Batches, list[dict], Placement, Experiment, Layout | None]:
    """The model files, platform, mesh, batches, kernel claims, node placement and the experiment with
    its `auto` keys chosen; raise ConfigError naming the problems of every stage that can be checked
    (DoesNotFit when the only one is that no layout of the `auto` keys fits)."""
    problems: list[Problem] = []
    try:
        files = model_files.check(exp)  # the architecture, tokenizer vocab, weights' headers
    except ConfigError as e:
        problems += e.problems
        files = None
    arch = files.arch if files is not None else None
    facts = job_facts(exp)  # a real launch checks the device (exit 2 when missing); a dry run plans from tables
    moe = arch is not None and arch.is_moe
    exp, layout, unfit = auto_resolve.attempt(exp, arch, facts, lambda e: _peft_problems(e, moe))
    if not isinstance(exp.data, ChatData):  # data=chat's own checks follow (chat_files)
        problems += data_files.data_problems(exp.data, exp.validation, ranks=None)  # the split: per rank, below
    problems += hf_data_files.hf_problems(exp.data, exp.training, exp.validation)
    folder, t = (files.folder if files else None), exp.training
    problems += preference_files.record_problems(exp.data, exp.validation, folder, t.seq_len, exp.objective, t, exp)
    problems += data_figures.eos_problems(exp.data, folder) + reference_model.problems(exp, folder, arch)
    problems += sample_prompts.problems(exp, folder)
    problems += eval_tasks.problems(exp)  # eval=lm_eval: lm-eval, the export, each task and its data
    problems += tracking.check(exp)
    problems += experiment_problems(exp, facts) + attention_path.problems(exp, attention(exp, facts))
    problems += context_parallel_problems(exp.model, exp.parallelism, attention(exp, facts))
    mesh, ps = mesh_problems(exp.parallelism, exp.launcher, facts)
    problems += ps
    batches = None
    if mesh is not None:
        batches, ps = batch_problems(exp.training, mesh)
        problems += ps
        problems += data_files.split_problems(exp.data, exp.validation, mesh.dp_replicate * mesh.dp_shard)
    claims: list[dict] = []
    if not problems and not unfit and arch is not None and mesh is not None and batches is not None:
        try:
            claims = kernel_claims(exp, facts, claims_of)
        except ConfigError as e:
            problems += e.problems
    try:
        where = placement.resolve(exp, os.environ if env is None else env)
    except ConfigError as e:
        problems += e.problems
        where = None
    if problems or unfit or files is None or mesh is None or batches is None or where is None:
        raise DoesNotFit(unfit) if unfit and not problems else ConfigError(problems + unfit)
    return files, facts, mesh, batches, claims, where, exp, layout


def prepare(exp: Experiment, env: Mapping[str, str] | None = None, claims_of: ClaimsOf | None = None) -> Prepared:
    """Check the model's files, resolve the platform, the mesh, the batches, the node placement and
    the kernel override claims; raise ConfigError on the first failing stage (cheap: no torchtitan
    unless kernel overrides are active). A launch runs `make_plan`'s Plan instead."""
    files = model_files.check(exp)
    facts = job_facts(exp)
    exp = auto_resolve.resolve(exp, files.arch, facts, lambda e: _peft_problems(e, files.arch.is_moe))[0]
    problems = experiment_problems(exp, facts) + tracking.check(exp)
    if problems:
        raise ConfigError(problems)
    mesh = resolve_mesh(exp, facts)
    batches = resolve_batches(exp, mesh)
    where = placement.resolve(exp, os.environ if env is None else env)
    return Prepared(exp, facts, mesh, batches, files, where, kernel_claims(exp, facts, claims_of))


def _peft_problems(exp: Experiment, is_moe: bool) -> list[Problem]:
    """peft=lora where it cannot apply: MLP targets of an MoE model (grouped experts), tensor
    parallelism on model=hf (its adapters are replicated); checkpoint.merge_lora without LoRA."""
    if exp.peft.kind != "lora":
        if exp.checkpoint.merge_lora:
            why = "merges LoRA adapters into the export, and peft=none trains none"
            return [Problem("checkpoint.merge_lora", True, why, "false, or peft=lora", None)]
        return []
    if exp.model.backend == "hf" and exp.parallelism.tp > 1:
        why = "LoRA on model=hf (qwen3exp's adapters on transformers' projections) has no tensor-parallel plan"
        hint = "shard with FSDP (parallelism.dp_shard), or use model=native"
        return [Problem("parallelism.tp", exp.parallelism.tp, why, "1 with peft=lora and model=hf", hint)]
    mlp = sorted({"gate_proj", "up_proj", "down_proj"} & set(exp.peft.targets))
    if mlp and is_moe:
        why = "an MoE model's experts are grouped tensors, not projections LoRA can target"
        return [Problem("peft.targets", exp.peft.targets, why, "q_proj, k_proj, v_proj, o_proj", None)]
    return []
