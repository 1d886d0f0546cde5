"""The `objective` section: what the loss optimises. `sft` (next-token cross-entropy on the data's
trained tokens, the default) or a preference objective on pairs of a chosen and a rejected answer
(`dpo`, `orpo`, `simpo`, with data=preference). Each variant's loss is one module of
`qwen3exp.objectives`, found by the section's class."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from qwen3exp.config.sections.base import Strict

Beta = Annotated[float, Field(gt=0)]


class SftObjective(Strict):
    """Supervised: the mean next-token cross-entropy over the trained tokens (today's training)."""

    kind: Literal["sft"] = "sft"


class DpoObjective(Strict):
    """Direct Preference Optimization (sigmoid): -logsigmoid(beta * ((logp_c - ref_c) - (logp_r -
    ref_r))) per pair, on the completions' summed log-probs under the policy and the reference."""

    kind: Literal["dpo"] = "dpo"
    beta: Beta = 0.1
    """DPO's beta: how far the policy may move from the reference (the rewards are beta * (logp - ref))."""
    reference: str | None = None
    """The reference model. null: the policy's own starting weights (with peft=lora: the base with
    the adapters switched off, so no second model is held; a full fine-tune keeps a frozen copy of
    the trainable weights, sharded like them). Else a model folder or a Hub id in the local Hugging
    Face cache (as checkpoint.path): a Qwen3 model of its own architecture, loaded frozen and sharded
    like the policy (a torchtitan model on either backend), with the policy's tokenizer and vocabulary."""
    reference_logps: Literal["live", "precomputed"] = "live"
    """live: the reference's log-probs of each batch are computed in the step that trains on it (the
    reference is held during training). precomputed: before step 1 a first pass over the training
    (and held-out) pairs computes them once and stores them in the run directory
    (`reference_logps/`), and training reads them back by pair index, so no reference is held while
    training (for full fine-tunes that would not fit otherwise; a resumed run reuses the stored
    values). The plan says which is used and what it costs."""


class OrpoObjective(Strict):
    """ORPO: the chosen answer's NLL (mean over its tokens) - beta * logsigmoid(log_odds), the
    log-odds of the per-token mean log-probs. No reference model."""

    kind: Literal["orpo"] = "orpo"
    beta: Beta = 0.1
    """ORPO's lambda: the weight of the odds-ratio term next to the chosen answer's NLL."""


class SimpoObjective(Strict):
    """SimPO: -logsigmoid(beta * (mean_logp_c - mean_logp_r) - gamma), on the per-token mean
    log-probs of the completions. No reference model."""

    kind: Literal["simpo"] = "simpo"
    beta: Beta = 2.0
    """SimPO's beta: the scale of the length-normalised reward."""
    gamma: Annotated[float, Field(ge=0)] = 0.5
    """SimPO's target reward margin."""


Objective = Annotated[SftObjective | DpoObjective | OrpoObjective | SimpoObjective, Field(discriminator="kind")]
