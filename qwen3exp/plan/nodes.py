"""Where the torchrun agents sit (`Placement`), and what each launcher knows of its runs from the
inside (`Nodes`): its placement and the plan's notes on it, and its time limit.

Every launcher has one `Nodes` module in this package (`local_nodes`, `slurm_nodes`), found by the
class of the validated launcher section (`qwen3exp.plan.placement.nodes_of`); what happens on the
submit host (submitting, cancelling, requeueing) is the launcher's own module in
`qwen3exp.launchers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from qwen3exp.config.schema import Experiment

# One node and no endpoint: like torchrun --standalone (a free port on localhost) but with a fixed
# run id, so that the per-rank log paths are predictable.
STANDALONE_ENDPOINT = "localhost:0"
STANDALONE_ID = "qwen3exp"


@dataclass(frozen=True)
class Placement:
    nnodes: int
    node_rank: int
    """This launcher's node. Node 0 resets the metrics and writes summary.json."""
    rdzv_endpoint: str
    """host:port of the c10d rendezvous (torchrun's rank-assignment store)."""
    rdzv_id: str
    how: str
    """Where node_rank and the endpoint came from (for the plan)."""
    agent_prefix: tuple[str, ...] = ()
    """Command that starts one torchrun agent per node (srun ...); empty: torchrun runs here."""
    per_node_hint: str | None = None
    """For launchers started by hand on every node: what to change on the other nodes."""

    @property
    def standalone(self) -> bool:
        return self.rdzv_endpoint == STANDALONE_ENDPOINT


class Nodes(Protocol):
    """One launcher's runs seen from the inside. `exp.launcher` is always this launcher's section."""

    def placement(self, exp: Experiment, env: Mapping[str, str]) -> Placement:
        """This node's place from the section and the scheduler's environment; ConfigError when
        they disagree."""
        ...

    def notes(self, exp: Experiment, where: Placement) -> list[str]:
        """For the plan: how the agents' commands are started."""
        ...

    def time_limit_deadline(self, exp: Experiment, env: Mapping[str, str]) -> float | None:
        """When (time.time()) the ranks of a checkpointing run are to save and stop; None: no time limit."""
        ...

    def time_limit_outcome(self, exp: Experiment, record: dict, env: Mapping[str, str]) -> tuple[str, int, str]:
        """(status, exit code, error) of an attempt whose ranks stopped at the pre-timeout signal
        (`record`: what rank 0 wrote, `qwen3exp.run.timelimit.saved`)."""
        ...
