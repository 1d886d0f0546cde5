"""objective=orpo (as TRL documents it): per pair, the chosen answer's NLL (the mean over its
counted tokens) - beta * logsigmoid(log_odds), with log_odds = (m_c - m_r) - (log(1 - e^m_c) -
log(1 - e^m_r)) on the per-token mean log-probs m; rewards beta * m, logps_* the means m."""

from __future__ import annotations

from qwen3exp.config.sections.objective import OrpoObjective
from qwen3exp.objectives.dpo import _metrics

SECTION = OrpoObjective
DATA = "pairs"
REFERENCE = False


def loss(section, lp):
    import torch  # lazy: torch only in the ranks
    import torch.nn.functional as F  # lazy: torch only in the ranks

    mc, mr = lp.chosen / lp.n_chosen, lp.rejected / lp.n_rejected
    log_odds = (mc - mr) - (torch.log1p(-torch.exp(mc)) - torch.log1p(-torch.exp(mr)))
    per_pair = -mc - section.beta * F.logsigmoid(log_odds)
    return per_pair, _metrics(section.beta * mc, section.beta * mr, mc, mr)
