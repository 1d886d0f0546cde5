"""The `platform` section (auto, cpu, cuda, neuron), and beside it the hardware table the Neuron
platform plans with (`INSTANCES`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from qwen3exp.config.sections.base import PerNode, Strict, tagged
from qwen3exp.errors import did_you_mean, one_of


class AutoPlatform(Strict):
    name: Literal["auto"] = "auto"
    """cuda if a GPU is visible, else neuron if torch_neuronx is installed, else cpu (each with the
    schema defaults of that platform; pick platform=cuda|neuron|cpu to set its keys)."""


class CpuPlatform(Strict):
    name: Literal["cpu"] = "cpu"
    ranks_per_node: PerNode = 2
    """Ranks when launcher.nproc_per_node is null."""
    threads_per_rank: PerNode | None = None
    """torch intra-op threads per rank; None: cores / ranks (at least 1), and in a local batch of
    sweep.parallel_jobs jobs cores / (ranks x sweep.parallel_jobs), so the jobs share the cores."""
    memory_per_rank_gib: Annotated[float, Field(gt=0)] | None = None
    """Memory budget per rank for planning; None: physical memory / ranks."""


class CudaPlatform(Strict):
    name: Literal["cuda"] = "cuda"
    gpus_per_node: PerNode | None = None
    """Ranks per node; None: the number of visible GPUs."""
    memory_per_gpu_gib: Annotated[float, Field(gt=0)] | None = None
    """Memory budget per rank for planning; None: the GPU's total memory."""
    assumed_gpus_per_node: PerNode = 8
    """Planning on a machine without a GPU (a dry run elsewhere): GPUs per node when gpus_per_node is null."""
    assumed_memory_gib: Annotated[float, Field(gt=0)] = 80.0
    """Planning on a machine without a GPU: memory per GPU when memory_per_gpu_gib is null."""


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Hydra reads `+platform.runtime_env.NEURON_RT_NUM_CORES=4` as an int; environment values are text.
EnvValue = Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, int) and not isinstance(v, bool) else v)]


@dataclass(frozen=True)
class NeuronInstance:
    """Trainium instance facts, for planning without a device and for checking the device count
    (`qwen3exp.platforms.neuron`), and the instance types `platform.instance_type` accepts.

    Sources: AWS's Trainium2 architecture pages as summarised in the project's notes: a Trainium2
    chip has 8 physical NeuronCore-v3 and 96 GiB of HBM; a trn2.48xlarge has 16 chips, i.e. 128
    physical cores, which the runtime shows as 64 logical cores at LNC=2 (24 GiB each) and 128 at
    LNC=1 (12 GiB each). TorchNeuron (torch-neuronx 2.13/2.14 "native") supports Trn2 and Trn3
    only; Trn3 numbers are not in the notes, so Trn3 users set platform.cores_per_node and
    platform.hbm_per_core_gib on top of the closest entry."""

    chips: int
    physical_cores_per_chip: int
    hbm_per_chip_gib: float
    bf16_flops_per_physical_core: float
    """TensorEngine peak (torchtitan's table: 79 TFLOP/s per NeuronCore-v3)."""
    device_name: str
    """What torch.neuron.get_device_properties().name reports for the chip."""

    def logical_cores(self, lnc: int) -> int:
        return self.chips * self.physical_cores_per_chip // lnc

    def hbm_per_logical_core_gib(self, lnc: int) -> float:
        return self.hbm_per_chip_gib * lnc / self.physical_cores_per_chip


_TRN2 = NeuronInstance(
    chips=1, physical_cores_per_chip=8, hbm_per_chip_gib=96.0, bf16_flops_per_physical_core=79e12, device_name="trn2"
)

INSTANCES: dict[str, NeuronInstance] = {
    "trn2.3xlarge": _TRN2,
    "trn2.48xlarge": replace(_TRN2, chips=16),
    "trn2u.48xlarge": replace(_TRN2, chips=16),
}


class NeuronPlatform(Strict):
    name: Literal["neuron"] = "neuron"
    lnc: Literal[1, 2] = 2
    """Logical NeuronCore config (NEURON_LOGICAL_NC_CONFIG): physical NeuronCores per rank."""
    instance_type: str = "trn2.48xlarge"
    """Instance for the table values (chips, cores, HBM): used to plan without a device (dry run)
    and to check the device count against lnc."""
    cores_per_node: PerNode | None = None
    """Logical NeuronCores (= ranks) per node; None: the instance table (checked against the device
    count before a real launch)."""
    hbm_per_core_gib: Annotated[float, Field(gt=0)] | None = None
    """HBM per logical core for planning; None: the device's total_memory, else the instance table."""
    compile_cache_dir: Annotated[str, Field(min_length=1)] | None = None
    """Neuron compile cache (TORCH_NEURONX_NEFF_CACHE_DIR). None: shared by every run and sweep job,
    one folder per graph: $QWEN3EXP_NEURON_CACHE, else your shell's TORCH_NEURONX_NEFF_CACHE_DIR, else
    ~/.cache/qwen3exp/neuron-compile, then a subfolder named by the hash of what changes the graph
    (key.json there says what). A path: that folder, as is, for every graph. `run`: neuron_cache/ in
    the run directory (nothing shared: every run compiles; ./run for a folder named run)."""
    runtime_env: dict[str, EnvValue] = {}
    """More environment variables for every rank (NEURON_RT_*, NEURON_LAUNCH_BLOCKING, ...)."""

    @model_validator(mode="after")
    def _neuron(self) -> NeuronPlatform:
        problems = []
        if self.instance_type not in INSTANCES:
            problems.append(
                tagged(
                    "instance_type",
                    self.instance_type,
                    "unknown Neuron instance type",
                    one_of(INSTANCES),
                    did_you_mean(self.instance_type, list(INSTANCES))
                    or "pick the closest one and set platform.cores_per_node and platform.hbm_per_core_gib",
                )
            )
        owned = {
            "NEURON_LOGICAL_NC_CONFIG": "platform.lnc",
            "TORCH_NEURONX_NEFF_CACHE_DIR": "platform.compile_cache_dir",
            "QWEN3EXP_NEURON_CACHE_KEY": "platform.compile_cache_dir",
        }
        for key in self.runtime_env:
            if not _ENV_NAME.match(key):
                problems.append(
                    tagged(
                        f"platform.runtime_env.{key}",
                        self.runtime_env[key],
                        "not an environment variable name",
                        "letters, digits and _ (not starting with a digit)",
                    )
                )
            elif key in owned:
                problems.append(
                    tagged(
                        f"platform.runtime_env.{key}",
                        self.runtime_env[key],
                        f"is set by {owned[key]}",
                        hint=f"set {owned[key]} instead",
                    )
                )
        if problems:
            raise ValueError("\n".join(problems))
        return self


Platform = Annotated[AutoPlatform | CpuPlatform | CudaPlatform | NeuronPlatform, Field(discriminator="name")]
