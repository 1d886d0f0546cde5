"""objective=dpo (sigmoid DPO, as TRL documents it): per pair
-logsigmoid(beta * ((logp_c - ref_c) - (logp_r - ref_r))) on the completions' summed log-probs; the
rewards are beta * (logp - ref), logps_* the policy's summed log-probs."""

from __future__ import annotations

from qwen3exp.config.sections.objective import DpoObjective

SECTION = DpoObjective
DATA = "pairs"
REFERENCE = True


def loss(section, lp):
    import torch.nn.functional as F  # lazy: torch only in the ranks

    rc = section.beta * (lp.chosen - lp.ref_chosen)
    rr = section.beta * (lp.rejected - lp.ref_rejected)
    per_pair = -F.logsigmoid(rc - rr)
    return per_pair, _metrics(rc, rr, lp.chosen, lp.rejected)


def _metrics(rc, rr, logps_c, logps_r) -> dict:
    return {
        "rewards_chosen": rc,
        "rewards_rejected": rr,
        "reward_margin": rc - rr,
        "reward_accuracy": (rc > rr).float(),
        "logps_chosen": logps_c,
        "logps_rejected": logps_r,
    }
