"""The plan: what a validated experiment resolves to before anything starts.

Mesh (what -1 resolved to), batches and tokens, parameter counts (total, active per token, per rank
after sharding), the per-rank memory estimate against the platform's memory (`qwen3exp.plan.memory`),
the kernel overrides that will apply, the checkpoint verdict, and the exact torchrun command(s).
`make_plan` also runs every check that needs the platform or the file system, and reports all
problems together. Pure arithmetic on plain data: no torch, no torchtitan, no model is built
(except where kernel overrides are active: their matches are computed on torchtitan's config tree,
built once, by `qwen3exp.titan`).

The Plan is the one resolved object of a launch: besides what it shows, it holds the experiment, the
checked model files, the node placement, the override claims and this node's torchrun command, and
`qwen3exp.launchers.local.launch(plan, run_dir)` runs it without resolving anything again.

`python -m qwen3exp dry_run=true` prints the plan (`qwen3exp.plan.render`); every real run writes it
to `plan.json` in its run directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Set as AbstractSet
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwen3exp.config.flavors import Arch
from qwen3exp.config.schema import Experiment, NativeModel
from qwen3exp.errors import ConfigError, Problem, one_of
from qwen3exp.plan import memory
from qwen3exp.platforms import PlatformFacts

if TYPE_CHECKING:
    from qwen3exp.plan.model_files import ModelFiles
    from qwen3exp.plan.placement import Placement


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


@dataclass(frozen=True)
class Batches:
    local_batch_size: int
    global_batch_size: int
    grad_accum_steps: int
    tokens_per_step: int
    tokens_per_rank_per_step: int


@dataclass(frozen=True)
class Parameters:
    total: int
    active_per_token: int
    """Equals total for dense models; for MoE, the parameters one token passes through (top_k experts)."""
    per_rank: int
    """Held by the rank with the largest shard, after tp / ep / FSDP sharding (`qwen3exp.plan.memory`)."""
    is_moe: bool


@dataclass(frozen=True)
class CheckpointVerdict:
    compatible: bool | None
    """True / False, or None when there is nothing to load."""
    detail: str
    allowed: str | None = None
    """What would be accepted, when compatible is False (default: a checkpoint of this architecture)."""
    hint: str | None = None


@dataclass
class Plan:
    name: str
    run_dir: str
    overrides: list[str]
    platform: PlatformFacts
    mesh: Mesh
    batches: Batches
    arch: Arch
    parameters: Parameters
    memory: memory.Memory
    kernel_overrides: list[tuple[str, int]]
    checkpoint: CheckpointVerdict
    commands: list[list[str]]
    """Every node's torchrun command, secrets redacted (what is shown and written)."""
    exp: Experiment
    """The experiment this plan resolves (not in plan.json: experiment.yaml holds it)."""
    files: ModelFiles
    """The checked model files: architecture, tokenizer folder, the weights loaded at step 0."""
    placement: Placement
    """Where the torchrun agents run; this launcher's node."""
    kernel_claims: list[dict]
    """Every torchtitan override that applies, with the config nodes it replaces (for summary.json)."""
    command: list[str]
    """This node's torchrun command as it is run (not redacted; `commands` holds the shown form)."""
    launch_notes: list[str] = field(default_factory=list)
    """How the commands start: the sbatch options (launcher=slurm), the per-node launchers."""
    provenance: list[tuple[str, Any, Any]] = field(default_factory=list)
    """(key, value, source) for every key of the experiment (empty when not computed)."""
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        import shlex

        return {
            "name": self.name,
            "run_dir": self.run_dir,
            "overrides": self.overrides,
            "platform": asdict(self.platform),
            "mesh": asdict(self.mesh),
            "batches": asdict(self.batches),
            "architecture": asdict(self.arch),
            "model_files": self.files.sources(),
            "parameters": asdict(self.parameters),
            "memory": {**self.memory.as_dict(), "usable_fraction": memory.USABLE_FRACTION},
            "kernel_overrides": [{"name": n, "nodes": c} for n, c in self.kernel_overrides],
            "checkpoint": asdict(self.checkpoint),
            "commands": [shlex.join(c) for c in self.commands],
            "launch_notes": self.launch_notes,
            "provenance": {k: {"value": v, "source": str(s)} for k, v, s in self.provenance},
            "warnings": self.warnings,
        }


# -------------------------------------------------------------------------------- mesh
def mesh_problems(parallelism, launcher, facts: PlatformFacts) -> tuple[Mesh | None, list[Problem]]:
    """Resolve the device mesh; problems name the degree that does not fit the world size."""
    la, p = launcher, parallelism
    nproc = la.nproc_per_node or facts.ranks_per_node
    nproc_key = "launcher.nproc_per_node" if la.nproc_per_node else f"platform {facts.name} default ranks_per_node"
    world = la.nnodes * nproc
    origin = f"world size {world} = launcher.nnodes {la.nnodes} x {nproc} ranks per node ({nproc_key})"
    problems: list[Problem] = []
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    for key in ("dp_replicate", "tp", "pp", "cp"):
        v = getattr(p, key)
        if world % v:
            problems.append(Problem(f"parallelism.{key}", v, f"does not divide the {origin}",
                                    f"{one_of(divisors)} (the divisors of {world})",
                                    f"or run {v} ranks per node: launcher.nproc_per_node={v}"))
    others = p.dp_replicate * p.tp * p.pp * p.cp
    if not problems and world % others:
        problems.append(Problem("parallelism", {"dp_replicate": p.dp_replicate, "tp": p.tp, "pp": p.pp, "cp": p.cp},
                                f"dp_replicate x tp x pp x cp = {others} does not divide the {origin}",
                                f"degrees whose product divides {world}"))
    if problems:
        return None, problems
    if p.dp_shard == -1:
        dp_shard, how = world // others, f"-1 -> {world // others} (world {world} / other degrees {others})"
    else:
        dp_shard, how = p.dp_shard, "given"
        if others * dp_shard != world:
            ok = world // others
            return None, [Problem(
                "parallelism.dp_shard", p.dp_shard,
                f"dp_replicate x dp_shard x tp x pp x cp = {others * dp_shard}, but the {origin}",
                f"-1 or {ok}", f"nearest valid value: parallelism.dp_shard={ok}")]
    if p.ep > 1 and (dp_shard * p.cp * p.tp) % p.ep:
        n = dp_shard * p.cp * p.tp
        problems.append(Problem("parallelism.ep", p.ep, f"must divide dp_shard x cp x tp = {n}",
                                f"{one_of(d for d in range(1, n + 1) if n % d == 0)} (the divisors of {n})"))
    if facts.devices_per_node is not None and nproc > facts.devices_per_node:
        msg = (f"{nproc} ranks per node, but the {facts.name} platform sees {facts.devices_per_node} "
               f"device(s) on this node")
        if facts.devices_exclusive:
            key = "launcher.nproc_per_node" if la.nproc_per_node else "platform.ranks_per_node"
            problems.append(Problem(key, nproc, msg, f"1..{facts.devices_per_node}",
                                    f"nearest valid value: launcher.nproc_per_node={facts.devices_per_node}"))
    if problems:
        return None, problems
    return Mesh(la.nnodes, nproc, world, p.dp_replicate, dp_shard, p.tp, p.pp, p.cp, p.ep, how, nproc_key), []


def resolve_mesh(exp: Experiment, facts: PlatformFacts) -> Mesh:
    mesh, problems = mesh_problems(exp.parallelism, exp.launcher, facts)
    if problems or mesh is None:
        raise ConfigError(problems)
    return mesh


def batch_problems(training, mesh: Mesh) -> tuple[Batches | None, list[Problem]]:
    t = training
    dp = mesh.dp_replicate * mesh.dp_shard
    per_step = t.local_batch_size * dp
    gbs = per_step if t.global_batch_size == -1 else t.global_batch_size
    if gbs % per_step:
        lower = max(per_step, gbs // per_step * per_step)
        return None, [Problem(
            "training.global_batch_size", t.global_batch_size,
            f"must be a multiple of local_batch_size x data-parallel degree = {t.local_batch_size} x {dp} "
            f"= {per_step}",
            f"-1 or a multiple of {per_step}",
            f"nearest valid values: training.global_batch_size={lower} or {lower + per_step}")]
    accum = gbs // per_step
    return Batches(t.local_batch_size, gbs, accum, gbs * t.seq_len,
                   t.local_batch_size * accum * t.seq_len // mesh.cp), []


def resolve_batches(exp: Experiment, mesh: Mesh) -> Batches:
    batches, problems = batch_problems(exp.training, mesh)
    if problems or batches is None:
        raise ConfigError(problems)
    return batches


def mesh_dict(mesh: Mesh) -> dict:
    return asdict(mesh)


# ------------------------------------------------------------ hooks: kernels, checkpoints
# The kernels group (qwen3exp/kernels/) and the checkpoint group fill these three functions. They
# must stay cheap (no torchtitan import unless kernel overrides are active): the dry run calls them
# for every sweep point.
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
        raise TypeError("an experiment with kernel overrides is planned with "
                        "claims_of=qwen3exp.titan.job_config.override_claims")
    return claims_of(exp, facts)


def checkpoint_verdict(exp: Experiment, files, run_dir: Path) -> CheckpointVerdict:
    """What is loaded and saved, and whether what is loaded fits the model (compatible=False is an
    error). `files`: the checked `model_files.ModelFiles` (weights headers and shapes already match)."""
    c = exp.checkpoint
    match c.kind:
        case "none":
            return CheckpointVerdict(None, "checkpoint=none: nothing is loaded (random initialisation), "
                                           "nothing is saved")
        case "dcp":
            return _dcp_verdict(c, run_dir)
        case "hf_load" | "hf_roundtrip":
            export = f"; exports the last step ({c.dtype}) and reloads it" if c.kind == "hf_roundtrip" else ""
            return CheckpointVerdict(True, f"checkpoint={c.kind}: loads {files.weights} at step 0: every tensor "
                                           f"the model needs is present with its shape{export}")
        case "hf_export":
            return CheckpointVerdict(None, f"checkpoint=hf_export: nothing is loaded; exports the last step "
                                           f"({c.dtype}) as a Hugging Face folder and reloads it")
    return CheckpointVerdict(None, f"checkpoint={c.kind}: not checked")


def _dcp_verdict(c, run_dir: Path) -> CheckpointVerdict:
    """checkpoint=dcp: start fresh, or resume from the newest checkpoint its ranks signed, after
    checking every file of it (`qwen3exp.run.signing`: DCP reads checkpoints with pickle). A newer
    checkpoint without a signature is skipped (a stop between its save and its signature) and said
    so; a signature that does not check, or checkpoints none of which is signed, refuse the launch."""
    from qwen3exp.run import rundir, signing

    saves = f"saves checkpoint/step-N every {c.interval} steps and at the last step, keeps {c.keep_latest_k or 'all'}"
    step = rundir.latest_checkpoint_step(run_dir)
    skipped = [s for s in rundir.complete_checkpoint_steps(run_dir) if step is None or s > step]
    folder = run_dir / rundir.CHECKPOINT
    if step is not None and (problem := signing.problem(folder / f"step-{step}")) is not None:
        return _unsigned(run_dir, step, problem)
    if step is None and skipped:
        return _unsigned(run_dir, skipped[-1], f"step-{skipped[-1]} carries no qwen3exp signature")
    if step is None:
        return CheckpointVerdict(None, f"checkpoint=dcp: starts fresh; {saves}")
    note = (f" (step-{', step-'.join(map(str, skipped))} carries no signature: a stop came between its save and "
            "its signature, or qwen3exp did not write it; never loaded)" if skipped else "")
    return CheckpointVerdict(True, f"checkpoint=dcp: resumes from {folder}/step-{step}{note} (identical "
                                   f"experiment); {saves}")


def _unsigned(run_dir: Path, step: int, problem: str) -> CheckpointVerdict:
    from qwen3exp.run import rundir

    where = run_dir / rundir.CHECKPOINT / f"step-{step}"
    return CheckpointVerdict(False, f"checkpoint=dcp would resume from {where}, but {problem}: qwen3exp resumes "
                                    "only checkpoints it wrote under this user's key (loading one runs pickled code)",
                             "a checkpoint this user's qwen3exp wrote (see qwen3exp/run/signing.py)",
                             f"if you trust it: delete {where} to resume from an earlier step, or start anew in a "
                             "new directory")


# ------------------------------------------------------------------------------ checks
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
    from qwen3exp.plan import data_files, model_files

    problems: list[Problem] = []
    # The model files need the model, its checkpoint and the mesh degrees; without one of them the
    # check is skipped (that section's own problem is reported). training and kernels are optional.
    if all(k in sections for k in ("model", "checkpoint", "parallelism")):
        try:
            model_files.check(model_files.ModelSections(
                sections["model"], sections["checkpoint"], sections["parallelism"],
                sections.get("training"), sections.get("kernels")))
        except ConfigError as e:
            problems += e.problems
    if "data" in sections:
        problems += data_files.data_problems(sections["data"], sections.get("validation"))
    if all(k in sections for k in ("parallelism", "launcher", "platform")):
        from qwen3exp.platforms import resolve

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


def make_plan(exp: Experiment, run_dir: str | Path, *, overrides: list[str] | tuple[str, ...] = (),
              provenance=None, job_num: int | None = None, env: Mapping[str, str] | None = None,
              claims_of: ClaimsOf | None = None) -> Plan:
    """Resolve and check everything; raise ConfigError naming every problem. A plan that does not fit
    in memory is a problem, unless `exp.dry_run` (then it is a loud warning in `Plan.warnings`).
    `env`: the scheduler's environment for the node placement (default: this process's);
    `claims_of`: the kernel override matcher (see `ClaimsOf`), needed when kernels are active."""
    from qwen3exp.plan import data_files, model_files, placement, tracking
    from qwen3exp.platforms import experiment_problems, host_problems, resolve
    from qwen3exp.run.provenance import redact_argv

    problems: list[Problem] = []
    try:
        files = model_files.check(exp)  # the architecture, tokenizer vocab, weights' headers
    except ConfigError as e:
        problems += e.problems
        files = None
    arch = files.arch if files is not None else None
    problems += data_files.data_problems(exp.data, exp.validation)
    problems += tracking.check(exp)
    # A real launch checks the device here (exit 2 when it is missing); a dry run plans from tables.
    facts = resolve(exp.platform, nproc_per_node=exp.launcher.nproc_per_node, dry_run=exp.dry_run)
    problems += experiment_problems(exp, facts)
    mesh, ps = mesh_problems(exp.parallelism, exp.launcher, facts)
    problems += ps
    batches = None
    if mesh is not None:
        batches, ps = batch_problems(exp.training, mesh)
        problems += ps
    claims: list[dict] = []
    if not problems and arch is not None and mesh is not None and batches is not None:
        try:
            claims = kernel_claims(exp, facts, claims_of)
        except ConfigError as e:
            problems += e.problems
    try:
        where = placement.resolve(exp, os.environ if env is None else env)
    except ConfigError as e:
        problems += e.problems
        where = None
    if problems or arch is None or mesh is None or batches is None or where is None:
        raise ConfigError(problems)

    warnings: list[str] = []
    if facts.devices_per_node is not None and mesh.nproc_per_node > facts.devices_per_node:
        warnings.append(f"{mesh.nproc_per_node} ranks share {facts.devices_per_node} {facts.name} device(s) "
                        f"on this node: expect it to be slow")
    total, active = arch.param_counts()
    params = Parameters(total, active, memory.params_per_rank(arch, mesh.degrees), arch.is_moe)
    t = exp.training
    mem = memory.estimate(arch, mesh.degrees, local_batch_size=t.local_batch_size, seq_len=t.seq_len,
                          param_dtype=t.dtype, compute_dtype=t.mixed_precision_param,
                          activation_checkpoint=t.activation_checkpoint, budget=facts.memory_per_rank_bytes)
    if not mem.fits:
        problem = _memory_problem(exp, mem)
        if exp.dry_run:
            warnings.append("DOES NOT FIT: " + problem.message + "; " + (problem.hint or ""))
        else:
            problems.append(problem)
    # This host's memory and cores for the ranks it starts (CPU): a dry run says so as loudly.
    for problem in host_problems(exp, facts, ranks=mesh.nproc_per_node,
                                 plan_bytes_per_rank=mem.total if mem.fits else None, total_params=total):
        if exp.dry_run:
            warnings.append(f"A REAL RUN IS REFUSED: {problem.key} = {problem.value!r}: {problem.message}; "
                            f"allowed: {problem.allowed}")
        else:
            problems.append(problem)
    verdict = checkpoint_verdict(exp, files, Path(run_dir))
    if verdict.compatible is False:
        problems.append(Problem("checkpoint", exp.checkpoint.kind, verdict.detail,
                                verdict.allowed or "a checkpoint of this architecture", verdict.hint))
    if problems:
        raise ConfigError(problems)
    assert files is not None  # arch is files.arch
    commands = placement.torchrun_commands(exp, where, nnodes=mesh.nnodes, nproc_per_node=mesh.nproc_per_node,
                                           run_dir=Path(run_dir))
    command = placement.torchrun_argv(exp, where, nnodes=mesh.nnodes, nproc_per_node=mesh.nproc_per_node,
                                      run_dir=Path(run_dir))
    return Plan(
        name=exp.name, run_dir=str(run_dir), overrides=list(overrides), platform=facts, mesh=mesh,
        batches=batches, arch=arch, parameters=params, memory=mem,
        kernel_overrides=[(f"{c['key']} -> {c['target']}", len(c["nodes"])) for c in claims], checkpoint=verdict,
        commands=[redact_argv(c) for c in commands], exp=exp, files=files, placement=where,
        kernel_claims=claims, command=command,
        launch_notes=placement.notes(exp, where),
        provenance=provenance.table(exp.model_dump(mode="json")) if provenance is not None else [],
        warnings=warnings)


# ---------------------------------------------------------------- the resolved parts alone
@dataclass(frozen=True)
class Prepared:
    """What `prepare` resolves: the parts of a plan a launch depends on, without the memory, host,
    data and checkpoint checks (tests and notebooks use it to convert an experiment)."""
    exp: Experiment
    facts: PlatformFacts
    mesh: Mesh
    batches: Batches
    files: ModelFiles
    placement: Placement
    overrides: list[dict] = field(default_factory=list)
    """The torchtitan overrides the experiment activates, with the config nodes each one replaces."""


def prepare(exp: Experiment, env: Mapping[str, str] | None = None, claims_of: ClaimsOf | None = None) -> Prepared:
    """Check the model's files, resolve the platform, the mesh, the batches, the node placement and
    the kernel override claims; raise ConfigError on the first failing stage (cheap: no torchtitan
    unless kernel overrides are active). A launch runs `make_plan`'s Plan instead."""
    from qwen3exp.plan import model_files, placement, tracking
    from qwen3exp.platforms import experiment_problems, resolve

    files = model_files.check(exp)
    facts = resolve(exp.platform, nproc_per_node=exp.launcher.nproc_per_node, dry_run=exp.dry_run)
    problems = experiment_problems(exp, facts) + tracking.check(exp)
    if problems:
        raise ConfigError(problems)
    mesh = resolve_mesh(exp, facts)
    batches = resolve_batches(exp, mesh)
    where = placement.resolve(exp, os.environ if env is None else env)
    return Prepared(exp, facts, mesh, batches, files, where, kernel_claims(exp, facts, claims_of))


def _memory_problem(exp: Experiment, mem: memory.Memory) -> Problem:
    g = memory.gib
    need = mem.total / memory.USABLE_FRACTION
    hints = []
    if exp.training.activation_checkpoint != "full":
        hints.append("training.activation_checkpoint=full")
    if exp.training.local_batch_size > 1:
        hints.append(f"training.local_batch_size={max(1, exp.training.local_batch_size // 2)} "
                     "(with training.global_batch_size to keep the batch)")
    if exp.training.dtype == "float32":
        hints.append("training.dtype=bfloat16")
    hints.append("more ranks (launcher.nnodes / launcher.nproc_per_node) so FSDP shards further")
    state = mem.parameters + mem.gradients + mem.optimizer
    key: str
    value: object
    if state > mem.usable:  # the model itself does not fit this mesh: smaller model or more ranks
        match exp.model:
            case NativeModel() as m:
                key, value = "model.flavor", m.flavor
            case m:  # model=hf: the architecture is the folder's config.json
                key, value = ("model.hf_model", m.hf_model) if m.hf_model else ("model.hf_assets_path",
                                                                                m.hf_assets_path)
    else:  # activations tip it over
        key, value = "training.local_batch_size", exp.training.local_batch_size
    return Problem(
        key, value,
        f"the plan needs about {g(mem.total)} per rank (parameters {g(mem.parameters)}, gradients "
        f"{g(mem.gradients)}, optimizer {g(mem.optimizer)}, FSDP buffers {g(mem.fsdp_buffers)}, activations "
        f"{g(mem.activations)}) but {int(memory.USABLE_FRACTION * 100)}% of the {g(mem.budget)} per rank is "
        f"{g(mem.usable)}",
        f"a plan needing at most {g(mem.usable)} per rank (a budget of at least {g(need)} per rank)",
        "try: " + ", ".join(hints))
