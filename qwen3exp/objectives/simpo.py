"""objective=simpo (as TRL documents it): per pair -logsigmoid(beta * (m_c - m_r) - gamma) on the
per-token mean log-probs m; rewards beta * m, logps_* the means m. No reference."""

from __future__ import annotations

from qwen3exp.config.sections.objective import SimpoObjective
from qwen3exp.objectives.dpo import _metrics

SECTION = SimpoObjective
DATA = "pairs"
REFERENCE = False


def loss(section, lp):
    import torch.nn.functional as F  # lazy: torch only in the ranks

    mc, mr = lp.chosen / lp.n_chosen, lp.rejected / lp.n_rejected
    per_pair = -F.logsigmoid(section.beta * (mc - mr) - section.gamma)
    return per_pair, _metrics(section.beta * mc, section.beta * mr, mc, mr)
