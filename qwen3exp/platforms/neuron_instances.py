"""Trainium instance facts, for planning without a device and for checking the device count.

Plain data (no torch). Sources: AWS's Trainium2 architecture pages as summarised in the project's
notes: a Trainium2 chip has 8 physical NeuronCore-v3 and 96 GiB of HBM; a trn2.48xlarge has 16
chips, i.e. 128 physical cores, which the runtime shows as 64 logical cores at LNC=2 (24 GiB each)
and 128 at LNC=1 (12 GiB each). TorchNeuron (torch-neuronx 2.13/2.14 "native") supports Trn2 and
Trn3 only; Trn3 numbers are not in the notes, so Trn3 users set platform.cores_per_node and
platform.hbm_per_core_gib on top of the closest entry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NeuronInstance:
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


_TRN2_CHIP = dict(physical_cores_per_chip=8, hbm_per_chip_gib=96.0, bf16_flops_per_physical_core=79e12,
                  device_name="trn2")

INSTANCES: dict[str, NeuronInstance] = {
    "trn2.3xlarge": NeuronInstance(chips=1, **_TRN2_CHIP),
    "trn2.48xlarge": NeuronInstance(chips=16, **_TRN2_CHIP),
    "trn2u.48xlarge": NeuronInstance(chips=16, **_TRN2_CHIP),
}
