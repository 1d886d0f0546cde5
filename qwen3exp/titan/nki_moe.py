"""torchtitan override `nki_moe`: `GroupedExperts` -> `BlockwiseExperts`, which calls the blockwise
`qwen3exp::moe_blockwise` operator (nkilib `moe_cte` / `blockwise_mm_bwd` on Neuron).

Activated by `kernels=nki_moe` (`kernels.moe.impl=nki`, `kernels.moe.block_size`); what the
launcher knows about it (its default nodes, its pre-launch checks) is in `qwen3exp.kernels.nki_moe`,
this is the torchtitan half. The module keeps `GroupedExperts`' parameters (`w1_EFD`, `w2_EDF`,
`w3_EFD`: same names, shapes, initialisation and checkpoints) and its precision contract
(projections in bfloat16, output in the input's dtype). Each forward receives the routed rows
grouped by expert (torchtitan's token dispatcher sorts them and applies the router scores in its
combine), builds the blockwise routing metadata (blocks of `block_size` slots per expert, padded,
unit masked affinities), and lays the weights out as the kernel wants them (`gate_up [E, D, 2, F]`,
`down [E, F, D]`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from torchtitan.config import derive, override
from torchtitan.models.common.moe import GroupedExperts

from qwen3exp.kernels.moe_blockwise import moe_blockwise, route_grouped
from qwen3exp.kernels.nki_moe import DEFAULT_FQNS


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class BlockwiseExperts(GroupedExperts):
    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        block_size: int = 128
        """Slots per block of the blockwise kernel."""

    def __init__(self, config: Config):
        super().__init__(config)
        self.block_size = config.block_size

    def forward(self, x_RD: torch.Tensor, num_tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = _local(self.w1_EFD), _local(self.w2_EDF), _local(self.w3_EFD)
        R, D = x_RD.shape
        compute = torch.bfloat16  # GroupedExperts' own compute dtype
        routing = route_grouped(num_tokens_per_expert_E, num_rows=R, block_size=self.block_size, dtype=compute)
        hidden = torch.cat([x_RD, x_RD.new_zeros(1, D)])
        # The kernel's layouts as views of contiguous copies (gate_up [E, D, 2, F] over memory
        # [E, 2, F, D], down [E, F, D] over [E, D, F]): no transposing copy on the CPU/GPU path (the
        # Neuron bridge makes them contiguous for the kernel).
        gate_up = torch.stack((w1.to(compute), w3.to(compute)), 1).permute(0, 3, 1, 2)
        down = w2.to(compute).transpose(-2, -1)
        out, _, _ = moe_blockwise(
            hidden,
            routing.affinities,
            gate_up,
            down,
            routing.token_position_to_id,
            routing.block_to_expert,
            self.block_size,
        )
        return out[:R]


@override(
    target=GroupedExperts.Config,
    fqns=DEFAULT_FQNS,
    exact=True,
    description="qwen3exp::moe_blockwise operator (nkilib moe_cte / blockwise_mm_bwd on Neuron)",
)
def nki_moe(cfg: GroupedExperts.Config, block_size: int = 128) -> BlockwiseExperts.Config:
    return derive(cfg, BlockwiseExperts.Config, block_size=block_size)
