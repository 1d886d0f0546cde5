"""Whether a plan fits: the per-rank memory estimate against the platform's memory, and this
host's memory and cores for the ranks it starts. A plan that does not fit is a problem naming the
key to change (the model, or the local batch size) with what to try; a dry run shows it as a loud
warning instead."""

from __future__ import annotations

from dataclasses import dataclass

from qwen3exp.config.flavors import Arch
from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.model import NativeModel
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.plan import attention_path, memory, memory_pref
from qwen3exp.plan.mesh import Mesh
from qwen3exp.platforms import PlatformFacts, cpu, cuda, host_problems, neuron

MEASURED_BESIDE = {m.NAME: m.measured_beside for m in (cpu, cuda, neuron)}
"""Each platform's `measured_beside(exp)`: what its measure of a rank's peak holds beside the model
(a table here until `variant.PlatformModule` names the function)."""


@dataclass
class DoesNotFit(ConfigError):
    """A refusal whose every problem is that the plan does not fit (the memory per rank, this host's
    memory or cores, or no layout of parallelism=auto): an adaptive sweep skips such a point and goes
    on (`qwen3exp.launchers.batch`), where any other refusal stops the launch."""

    objective: tuple[str, str] | None = None
    """(metric, direction) the refused job would have returned (`Experiment.sweep_target`), when known."""


def memory_fit(
    exp: Experiment, arch: Arch, mesh: Mesh, facts: PlatformFacts, total_params: int, warnings: list[str]
) -> tuple[memory.Memory, list[Problem]]:
    """The per-rank memory estimate, and the problems of a plan that does not fit in it or on this
    host's memory and cores (a dry run adds them to `warnings` instead, as loudly)."""
    t = exp.training
    runtime, retained = MEASURED_BESIDE[facts.name](exp)
    # model=hf holds tied embeddings tied: torchtitan's transformers backend un-ties them for FSDP
    # and its init_weights ties them again (measured: lm_head.weight is embed_tokens.weight).
    mem = memory.estimate(
        arch,
        mesh.degrees,
        local_batch_size=t.local_batch_size,
        seq_len=t.seq_len,
        param_dtype=t.dtype,
        compute_dtype=t.mixed_precision_param,
        activation_checkpoint=t.activation_checkpoint,
        budget=facts.memory_per_rank_bytes,
        trainable=memory.trainable_of(arch, exp.peft),
        runtime=runtime,
        retained_fraction=retained,
        dense_mask=attention_path.resolve(exp, facts).dense_mask,
        backend=exp.model.backend,
    )
    pairs = memory_pref.of(exp)  # a preference objective: its reference and its unchunked loss
    mem = memory_pref.with_pairs(mem, arch, mesh.degrees, pairs, retained) if pairs is not None else mem
    problems: list[Problem] = []
    if not mem.fits:
        problem = memory_problem(exp, mem)
        if exp.dry_run:
            warnings.append("DOES NOT FIT: " + problem.message + "; " + (problem.hint or ""))
        else:
            problems.append(problem)
    # This host's memory and cores for the ranks it starts (CPU): a dry run says so as loudly.
    for problem in host_problems(
        exp,
        facts,
        ranks=mesh.nproc_per_node,
        plan_bytes_per_rank=mem.total + mem.transients if mem.fits else None,
        total_params=total_params,
    ):
        if exp.dry_run:
            warnings.append(
                f"A REAL RUN IS REFUSED: {problem.key} = {problem.value!r}: {problem.message}; "
                f"allowed: {problem.allowed}"
            )
        else:
            problems.append(problem)
    return mem, problems


def memory_problem(exp: Experiment, mem: memory.Memory) -> Problem:
    g = memory.gib
    need = (mem.total + mem.transients) / memory.USABLE_FRACTION
    hints = []
    if exp.training.activation_checkpoint != "full":
        hints.append("training.activation_checkpoint=full")
    if exp.training.local_batch_size > 1:
        hints.append(
            f"training.local_batch_size={max(1, exp.training.local_batch_size // 2)} "
            "(with training.global_batch_size to keep the batch)"
        )
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
                key, value = (
                    ("model.hf_model", m.hf_model) if m.hf_model else ("model.hf_assets_path", m.hf_assets_path)
                )
    else:  # activations tip it over
        key, value = "training.local_batch_size", exp.training.local_batch_size
    return Problem(
        key,
        value,
        f"the plan needs about {g(mem.total + mem.transients)} per rank (parameters {g(mem.parameters)}, "
        f"gradients {g(mem.gradients)}, optimizer {g(mem.optimizer)}, FSDP buffers {g(mem.fsdp_buffers)}, "
        f"activations {g(mem.activations)}, a step's transients {g(mem.transients)}) but "
        f"{int(memory.USABLE_FRACTION * 100)}% of the {g(mem.budget)} per rank is "
        f"{g(mem.usable)}",
        f"a plan needing at most {g(mem.usable)} per rank (a budget of at least {g(need)} per rank)",
        "try: " + ", ".join(hints),
    )
