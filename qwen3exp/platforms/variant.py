"""What a platform is to qwen3exp: the facts its ranks run with, and what every platform module offers.

`PlatformFacts` is the resolved platform (launcher side), written to `platform.json` and read back by
every rank. `PlatformModule` is the protocol each platform module (`cpu`, `cuda`, `neuron`) follows;
the registry in `qwen3exp.platforms` finds the module from the validated section's class, so no
other module tests a platform's name. `NAMES` lists the platforms the schema's union accepts, for
messages that say what is allowed.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel

from qwen3exp.config.sections.platform import Platform
from qwen3exp.errors import Problem


@dataclass(frozen=True)
class PlatformFacts:
    name: str
    """cpu | cuda | neuron: the platform actually used."""
    reason: str
    """Why this platform (for platform=auto: what was detected) and whether the device was checked."""
    device_type: str
    dist_backend: str
    ranks_per_node: int
    """Ranks per node when launcher.nproc_per_node is null."""
    memory_per_rank_bytes: int
    attention: str
    """Inner attention kernel: sdpa (F.scaled_dot_product_attention, with a dense document mask or
    is_causal: `qwen3exp.plan.attention_path`) or flex."""
    compile_backend: str
    peak_flops_per_rank: float | None
    """For MFU; None where no meaningful peak exists (CPU)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set for every rank."""
    force_sum_reductions: bool = False
    """FSDP comms must use plain SUM (gloo has no PREMUL_SUM)."""
    devices_per_node: int | None = None
    """Devices the ranks of this node bind to (GPUs, NeuronCores; CPU cores); None: unknown here
    (e.g. a job submitted to other machines). The plan checks ranks per node against it."""
    devices_exclusive: bool = True
    """True: at most one rank per device (an error beyond); False: ranks may share (CPU cores; a
    warning that it will be slow)."""
    device_name: str | None = None
    """The accelerator's name as the device reports it (or the planning table's, when not checked)."""
    device_checked: bool = True
    """False when the numbers come from a table because no device was probed (a dry run)."""
    lnc: int | None = None
    """Neuron only: the Logical NeuronCore config (physical cores per rank); None elsewhere."""
    run_dir_env: dict[str, str] = field(default_factory=dict)
    """Environment variables whose value is a folder inside the run directory (the launcher joins
    them with the run directory), e.g. the Neuron compile cache."""
    comm_init_timeout_s: int | None = None
    """torchtitan's timeout for collectives up to the end of step 1; None: torchtitan's default."""
    sustained_flops_per_rank: float | None = None
    """FLOP/s a training step sustains on one rank, as the platform module states it (its source is in
    that module): the compute rate of parallelism=auto's cost model (`qwen3exp.plan.layout_cost`)."""
    link_bytes_per_s: float | None = None
    """Bytes per second one rank sends in a collective among ranks of its node (one direction), as
    stated by the platform module; the cost model's bandwidth for groups inside a node."""
    network_bytes_per_s: float | None = None
    """Bytes per second one rank sends to ranks on other nodes (its share of the node's network);
    the cost model's bandwidth for groups that span nodes."""
    forked_ranks: bool = False
    """True: each node's agent imports torchtitan once and forks its ranks from itself (torchrun
    `--start-method fork`), instead of starting a new interpreter per rank that imports it again.
    Only where nothing device-specific is initialized by that import (CPU): a CUDA or Neuron device
    must be set up in the rank's own process."""


SUSTAINED_FRACTION_OF_PEAK = 0.4
"""The fraction of an accelerator's peak FLOP/s a training step sustains, for planning (the CUDA and
Neuron modules state their peak per rank). An assumption, not a measurement: published FSDP
trainings of dense LLMs on H100-class GPUs report roughly 30-50% MFU, and 0.4 is the middle. The
cost model only ranks layouts, so one fraction for every accelerator keeps compute against
communication in proportion without pretending to know each kernel's efficiency."""


def section_name(section: type[BaseModel]) -> str:
    """The name a platform section's `name` tag is fixed to (CpuPlatform: cpu)."""
    return section.model_fields["name"].default


NAMES: tuple[str, ...] = tuple(section_name(s) for s in typing.get_args(typing.get_args(Platform)[0]))
"""The platforms the schema accepts, in the union's order: auto, cpu, cuda, neuron."""
ALLOWED = ", ".join(NAMES)
"""`NAMES` as a message's "allowed" part."""

PeakFlops = Callable[[str], float]
"""The peak bf16 FLOP/s of a device by its name (torchtitan's table, passed in by the probe process)."""
DeviceProbe = Callable[[PeakFlops], dict]
"""A platform's device probe body: its answer as one JSON object."""


class PlatformModule(Protocol):
    """A platform module: one per `platform` section class, everything qwen3exp knows about it."""

    # Read-only (properties): a module's constants satisfy them with their own, narrower types.
    @property
    def SECTION(self) -> type[BaseModel]:
        """The schema section it serves (CpuPlatform)."""
        ...

    @property
    def NAME(self) -> str:
        """`section_name(SECTION)`: the name in `PlatformFacts.name` and `platform.json`."""
        ...

    @property
    def probe_device(self) -> DeviceProbe | None:
        """The device probe's body, run in `python -m qwen3exp.titan.device_probe NAME` (it imports
        torch); None: nothing to probe (the CPU)."""
        ...

    def facts(self, cfg, *, nproc_per_node: int | None, dry_run: bool, reason: str) -> PlatformFacts:
        """Resolve the validated section (a real launch checks the device; ConfigError on a mismatch)."""
        ...

    def experiment_problems(self, exp, facts: PlatformFacts) -> list[Problem]:
        """Cross-field rules that need this platform (e.g. an attention kernel it lacks)."""
        ...

    def launch_problems(
        self, exp, facts: PlatformFacts, *, ranks: int, plan_bytes_per_rank: int | None, total_params: int = 0
    ) -> list[Problem]:
        """What the `ranks` ranks need from this host besides their devices."""
        ...

    def device_names(self) -> list[str]:
        """The devices of this host, for provenance.json."""
        ...

    def prepare_worker(self, facts: PlatformFacts) -> None:
        """Run in each rank before the first torchtitan import (torchtitan binds its device at import)."""
        ...


class DetectedPlatform(PlatformModule, Protocol):
    """A platform that platform=auto looks for (its device may or may not be here)."""

    def detect(self, *, nproc_per_node: int | None, dry_run: bool) -> PlatformFacts | str:
        """The facts when this platform's device is here, else why not (one clause of auto's reason)."""
        ...
