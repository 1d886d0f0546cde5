"""The Plan: what a validated experiment resolved to, and its plan.json form (`Plan.as_json`).

`qwen3exp.plan.build.make_plan` makes it; `Prepared` holds the parts of one that `build.prepare`
resolves alone (no memory, host, data or checkpoint checks).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from qwen3exp.config.flavors import Arch
from qwen3exp.config.schema import Experiment
from qwen3exp.plan import memory
from qwen3exp.plan.auto_layout import Layout
from qwen3exp.plan.batches import Batches
from qwen3exp.plan.checkpoint_verdict import CheckpointVerdict
from qwen3exp.plan.layout_cost import StepCost
from qwen3exp.plan.mesh import Mesh
from qwen3exp.plan.model_files import ModelFiles
from qwen3exp.plan.nodes import Placement
from qwen3exp.platforms import PlatformFacts


@dataclass(frozen=True)
class Parameters:
    total: int
    active_per_token: int
    """Equals total for dense models; for MoE, the parameters one token passes through (top_k experts)."""
    per_rank: int
    """Held by the rank with the largest shard, after tp / ep / FSDP sharding (`qwen3exp.plan.memory`)."""
    is_moe: bool
    trainable: int | None = None
    """peft=lora: the adapters' parameters (`qwen3exp.plan.memory.lora_trainable`); None: all train."""


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
    data: dict = field(default_factory=dict)
    """The data's figures (`qwen3exp.data.figures.DataFigures.as_json`): documents, tokens, epochs, separator."""
    layout: Layout | None = None
    """What parallelism=auto / training.*=auto chose and why (`qwen3exp.plan.auto_layout`); None: nothing was auto."""
    step: StepCost | None = None
    """The cost model's step for this layout (`qwen3exp.plan.layout_cost.run_step`); summary.json compares."""

    def as_json(self) -> dict:
        """The plan as plan.json holds it (`qwen3exp.run.rundir.PLAN`; the experiment itself is in experiment.yaml)."""
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
            "data": self.data,
            "auto_layout": self.layout.as_json() if self.layout is not None else None,
            "step": asdict(self.step) if self.step is not None else None,
        }


@dataclass(frozen=True)
class Prepared:
    """What `build.prepare` resolves: the parts of a plan a launch depends on, without the memory, host,
    data and checkpoint checks (tests and notebooks use it to convert an experiment)."""

    exp: Experiment
    facts: PlatformFacts
    mesh: Mesh
    batches: Batches
    files: ModelFiles
    placement: Placement
    overrides: list[dict] = field(default_factory=list)
    """The torchtitan overrides the experiment activates, with the config nodes each one replaces."""
