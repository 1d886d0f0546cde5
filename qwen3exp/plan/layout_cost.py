"""The cost model `parallelism=auto` ranks layouts by (`qwen3exp.plan.auto_layout`): the predicted
seconds of one training step, from the FLOPs a rank computes and the bytes its collectives send,
against the rates its platform states (`PlatformFacts.sustained_flops_per_rank`, `link_bytes_per_s`,
`network_bytes_per_s`; each platform module gives their source).

Compute, per rank and step:
  flops per token = 6 N + 12 L n_heads head_dim seq_len     (torchtitan's own count for MFU:
      N = the parameters a token passes through in matrix products: the active ones, less an untied
      embedding; the attention term counts scores and values, causal masking not subtracted)
  recompute       = the blocks' forward again: + 1/3 of their 6N with activation_checkpoint=full,
                    + 1/6 with selective (torchtitan's op-level SAC recomputes about half the matmuls)
  per rank        = flops per token x the tokens of its data-parallel replica per step / (tp x cp x pp)
  pipeline        = x (1 + (pp - 1) / local_batch_size) for pp > 1 (1F1B, one sequence per
                    micro-batch: torchtitan's defaults)
  reference       = a preference objective's reference forward (DPO with a live reference: the
                    copy, the base with the adapters off, or a separate model): + 1/3 of that
                    model's 6N + attention per token; none per step with precomputed log-probs
                    (`StepCost.reference_s`; the two sequences of a pair are in local_batch_size)
Communication, bytes one rank sends per micro-batch (ring collectives: (g - 1) / g of the buffer per
all-gather or reduce-scatter, twice that per all-reduce, which is (g - 1) times a rank's shard;
S = the parameters rank 0 holds under the whole mesh (`memory.params_per_rank`: experts sharded by
ep and then by the ep-borrowed FSDP group), T = tokens of its micro-batch after cp):
  FSDP over dp_shard x cp  all-gather of (dp_shard x cp - 1) S in forward and again in backward
                           (compute dtype), reduce-scatter of the trainable gradients (float32)
  HSDP over dp_replicate   all-reduce of the sharded gradients (float32)
  TP (sequence parallel)   per layer 4 activation collectives of T x dim forward, 4 backward, 4 more
                           with full recompute
  CP                       per layer each rank's keys and values pass the cp - 1 others: forward,
                           twice in backward, again with full recompute
  EP                       per MoE layer the dispatch and combine all-to-all of T x top_k tokens,
                           forward and backward, again with full recompute
  PP                       the activations and their gradients across a stage boundary
A group whose ranks share a node sends at link_bytes_per_s, else at network_bytes_per_s; torchtitan
orders the mesh pp, dp_replicate, dp_shard, cp, tp, so a group spans its own degree times the inner ones.
Overlap: torchtitan prefetches the next block's FSDP all-gather, so FSDP and HSDP traffic hides
behind compute (the step takes the larger of the two); TP, CP, EP and PP collectives wait for their
data and add to the step.
Left out (the model ranks layouts; it promises no time): kernel efficiency by shape, the latency of
each collective, the optimizer step, data loading, compilation.

Every plan predicts its own layout's step (`run_step`, plan.json `step`), and every run keeps score:
summary.json puts the median measured step next to it (`qwen3exp.run.scorecard.step_score`). The
ratio says how far the rates above are from this host's; it warns nothing (the model ranks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qwen3exp.config.flavors import Arch
from qwen3exp.config.schema import Experiment
from qwen3exp.plan import memory, memory_pref
from qwen3exp.platforms import PlatformFacts

RECOMPUTE = {"none": 0.0, "selective": 1 / 6, "full": 1 / 3}
"""Extra compute of the blocks per activation_checkpoint mode, as a fraction of their 6N (see above)."""
GRAD_BYTES = 4
"""FSDP reduces gradients in float32 (torchtitan's default reduce dtype)."""


@dataclass(frozen=True)
class Shape:
    """One candidate layout: the mesh, the checkpointing mode and the micro-batches of a step."""

    degrees: memory.Degrees
    activation_checkpoint: str
    local_batch_size: int
    grad_accum: int


@dataclass(frozen=True)
class StepCost:
    compute_s: float
    """Forward, backward and recompute of one step on one rank, with the pipeline bubble."""
    hidden_s: float
    """FSDP and HSDP collectives, which run behind compute."""
    exposed_s: float
    """TP, CP, EP and PP collectives, on the critical path."""
    step_s: float
    tokens_per_s: float
    """Tokens of the whole step (every data-parallel replica) per predicted second."""
    reference_s: float = 0.0
    """Of `compute_s`: a preference objective's reference forward (`reference_flops`)."""


def run_step(exp: Experiment, arch: Arch, shape: Shape, *, nproc_per_node: int, facts: PlatformFacts) -> StepCost:
    """`step_cost` of `shape` with the rest from the experiment: seq_len, the compute dtype, the
    fraction of the parameters that train (LoRA: the adapters)."""
    trainable = memory.trainable_of(arch, exp.peft)
    total = max(1, arch.param_counts()[0])
    pairs = memory_pref.of(exp)
    return step_cost(
        arch,
        shape,
        seq_len=exp.training.seq_len,
        compute_bytes=memory.DTYPE_BYTES[exp.training.mixed_precision_param],
        trainable_fraction=1.0 if trainable is None else trainable / total,
        nproc_per_node=nproc_per_node,
        facts=facts,
        reference_flops=reference_flops(pairs, arch, exp.training.seq_len) if pairs is not None else 0.0,
    )


def reference_flops(pairs: memory_pref.Pairs, arch: Arch, seq_len: int) -> float:
    """FLOPs per token of a preference step's reference forward: a third of the reference model's
    training FLOPs (the policy's architecture unless a separate one); 0 with no reference, or with
    precomputed log-probs (paid once, by the first pass)."""
    if pairs.reference not in ("copy", "adapters", "separate"):
        return 0.0
    return flops_per_token(pairs.reference_arch or arch, seq_len, "none") / 3


def flops_per_token(arch: Arch, seq_len: int, activation_checkpoint: str) -> float:
    """Training FLOPs per token with the recompute of `activation_checkpoint` (see the module doc)."""
    _, active = arch.param_counts()
    matmul = active - (0 if arch.tied else arch.vocab_size * arch.dim)
    head = arch.vocab_size * arch.dim
    blocks = matmul - head
    attention = 12 * arch.n_layers * arch.n_heads * arch.head_dim * seq_len
    return 6 * matmul + attention + RECOMPUTE[activation_checkpoint] * (6 * blocks + attention)


def _ring(group: int, nbytes: float, *, all_reduce: bool = False) -> float:
    """Bytes one rank sends in a ring collective over `group` ranks on a buffer of `nbytes`."""
    if group <= 1:
        return 0.0
    return (2 if all_reduce else 1) * (group - 1) / group * nbytes


def step_cost(
    arch: Arch,
    shape: Shape,
    *,
    seq_len: int,
    compute_bytes: int,
    trainable_fraction: float,
    nproc_per_node: int,
    facts: PlatformFacts,
    reference_flops: float = 0.0,
) -> StepCost:
    """The predicted step of `shape` (see the module doc); `reference_flops`: per token, a
    preference objective's reference forward (`reference_flops`)."""
    g, m, a = shape.degrees, shape.local_batch_size, shape.grad_accum
    full = shape.activation_checkpoint == "full"
    per_token = flops_per_token(arch, seq_len, shape.activation_checkpoint) + reference_flops
    flops = per_token * m * a * seq_len / (g.tp * g.cp * g.pp)
    bubble = 1 + (g.pp - 1) / m if g.pp > 1 else 1.0
    compute_s = flops * bubble / (facts.sustained_flops_per_rank or 1e12)
    reference_s = compute_s * reference_flops / per_token

    def rate(span: int) -> float:
        inside = span <= nproc_per_node
        return (facts.link_bytes_per_s if inside else facts.network_bytes_per_s) or 1e9

    shard = memory.params_per_rank(arch, g)
    fsdp_group, fsdp_span = g.dp_shard * g.cp, g.dp_shard * g.cp * g.tp
    fsdp = (fsdp_group - 1) * (2 * shard * compute_bytes + shard * trainable_fraction * GRAD_BYTES)
    hsdp = _ring(g.dp_replicate, shard * trainable_fraction * GRAD_BYTES, all_reduce=True)
    hidden_s = a * (fsdp / rate(fsdp_span) + hsdp / rate(fsdp_span * g.dp_replicate))

    tokens = m * seq_len / g.cp
    layers = math.ceil(arch.n_layers / g.pp)
    tp = layers * (8 + 4 * full) * _ring(g.tp, tokens * arch.dim * compute_bytes)
    kv = 2 * arch.n_kv_heads * arch.head_dim
    cp = layers * (3 + full) * (g.cp - 1) * tokens * kv * compute_bytes / (g.tp if g.tp > 1 else 1)
    ep = 0.0
    if arch.moe is not None:
        routed = tokens * arch.moe.top_k * arch.dim * compute_bytes
        ep = layers * (4 + 2 * full) * _ring(g.ep, routed)
    pp = 2 * tokens * arch.dim * compute_bytes if g.pp > 1 else 0.0
    world = g.dp_replicate * fsdp_span * g.pp
    exposed_s = a * (tp / rate(g.tp) + cp / rate(g.cp * g.tp) + ep / rate(fsdp_span) + pp / rate(world))
    step_s = max(compute_s, hidden_s) + exposed_s
    dp = g.dp_replicate * g.dp_shard
    return StepCost(compute_s, hidden_s, exposed_s, step_s, m * a * dp * seq_len / step_s, reference_s)
