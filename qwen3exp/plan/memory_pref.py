"""A preference run's memory per rank (objective=dpo, orpo, simpo on data=preference), by arithmetic:
what `qwen3exp.titan.preference_trainer` holds beyond an SFT step of the same batch.

- The reference, held for the whole run (`reference_bytes`), by `Pairs.reference`:
  - `copy` (full fine-tune, objective.reference null): a frozen copy of the trainable weights,
    sharded like them (training.dtype);
  - `adapters` (peft=lora, reference null): the base with the adapters zeroed: no second model
    (the adapters' B matrices are saved for the reference pass only: a few MiB, left out);
  - `separate` (objective.reference: a model folder): its own parameters (its config.json), frozen,
    sharded like the policy's (training.dtype), resharded after its forward (measured 1.015; 1.21
    while its units stayed gathered, docs/plan.md);
  - `precomputed` (objective.reference_logps=precomputed): nothing during training; the first pass
    that stores the reference's log-probs (at step 1, before any optimizer state: the policy's
    weights, a separate reference's if one is named, and the reference's forward) has its own peak
    (`Memory.precompute_peak`), which is the run's when it is higher;
  - `none` (orpo, simpo): no reference.
- The loss is not torchtitan's chunked one: the policy's full [batch, seq_len, vocab] logits and
  torch's float32 log-softmax of them (`compute_logprobs`: cross_entropy, reduction none) live at
  once, and the backward adds their gradients (`PAIR_LOGIT_COPIES` float32 [tokens, vocab] tensors):
  at Qwen3's 151,936-token vocabulary one such tensor is 0.29 GiB for 512 tokens, more than two
  0.6B layers' activations.
- Two sequences per pair are already in training.local_batch_size (the tokens of a micro-batch).

Where the peak sits, measured (VmRSS and VmHWM of each rank read before and after the reference's
forward, the loss, the policy's backward and the optimizer step; 0.6B-2L, 2 ranks, 2026-12-06):
a full fine-tune peaks in the policy's backward (5.84 GiB per rank with one pair of 256-token sides;
the reference's no-grad forward before it 1.3 GiB lower, the optimizer step lower still), at its
end where the head's gradient is reduced, not in the log-softmax's backward (`loss_peak`). With
LoRA (no head gradient) the reference's forward was the peak with one pair per rank (2.4 GiB over
the step's start: the all-gathered embedding-and-head unit, its logits and their log-softmax;
`reference_phase`) and the log-softmax's backward with two. Each phase is counted; the largest is
the step's peak. The fit: `FITTED_ON`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from qwen3exp.config.flavors import Arch
from qwen3exp.config.hf_config import HFConfigError, arch_from_hf_config, read_hf_config
from qwen3exp.config.sections.objective import DpoObjective
from qwen3exp.objectives import registry
from qwen3exp.plan import memory, memory_peak, model_ref

MODES = ("copy", "adapters", "separate", "precomputed", "none")

PAIR_LOGIT_COPIES = 3
"""Float32 [tokens, vocab / tp] tensors alive in the policy's backward through the log-softmax: its
output (saved for the backward), its gradient and the logits' gradient (the logits themselves are
dropped before the backward: torchtitan's `del pred`)."""
PAIR_HEAD_COPIES = 1.9
"""Float32 head-weight sizes (`memory_peak.head_bytes`) a rank holds beside those logits, beyond its
sharded state, the reference, its layers' activations and the gathered head
(`memory_peak.GATHERED_HEAD`): the unit's copies the head's matmul and gloo's all-gather leave."""
PAIR_HEAD_GRADIENT_COPIES = 5.3
"""Float32 head sizes at the backward's end where the head trains (a full fine-tune: the head's
gradient with the embedding's added to it, FSDP's reduce-scatter input and output, beside the
gathered head); the logits are gone by then. This end, not the log-softmax, is a full fine-tune's
peak: doubling the tokens (0.6B-2L, one pair to two per rank) raised the measured peak by 0.23 GiB,
less than one more [tokens, vocab] tensor (0.29 GiB)."""
REFERENCE_HEAD_COPIES = 3.1
"""Float32 head sizes the reference's no-grad forward holds at its end beyond the rank's parameters,
optimizer states, the reference and the gathered head (`memory_peak.GATHERED_HEAD`): gloo's
all-gather output the unit is copied out of, the copy-in of the shard, the matmul's copy of the
weight and what the allocator keeps of the step before (markers: 2.38 GiB over the step's start with
LoRA, 2.44 with the copy, on 0.6B-2L with one pair per rank)."""
FITTED_ON = ("0.6B-2L dpo dp2 b2 s256", "0.6B-2L dpo dp2 b4 s256", "0.6B-2L dpo lora dp2 b2 s256",
             "0.6B-2L dpo lora dp2 b4 s256")  # fmt: skip
"""tests/bench/bench_memory.py's rows the constants above were fitted on (measured 2026-12-06, VmHWM
of forked CPU ranks, with the markers for where each peak sits): LoRA's one-pair row peaks at the
reference's forward (`REFERENCE_HEAD_COPIES`), its two-pair row at the log-softmax's backward
(`PAIR_HEAD_COPIES`, `PAIR_LOGIT_COPIES`), the full fine-tune's rows at the backward's end
(`PAIR_HEAD_GRADIENT_COPIES`). The other dpo rows are out of sample."""
REFERENCE_LOGIT_COPIES = 2
"""Float32 [tokens, vocab / tp] tensors of the reference's forward: its logits and their log-softmax."""


@dataclass(frozen=True)
class Pairs:
    """A preference run as the memory estimate sees it."""

    reference: str
    """One of `MODES`."""
    reference_arch: Arch | None = None
    """`separate`: the reference's architecture (its config.json); else None (the policy's)."""


def logits_bytes(arch: Arch, tp: int, tokens: int) -> int:
    """One float32 [tokens, vocab / tp] tensor: the loss's logits or their log-softmax."""
    return tokens * math.ceil(arch.vocab_size / tp) * 4


def reference_bytes(pairs: Pairs, params_per_rank: int, trainable_per_rank: int, param_bytes: int) -> int:
    """What a rank holds for the reference during training (see the module doc); `params_per_rank`:
    the reference's own parameters per rank for `separate`, else the policy's."""
    match pairs.reference:
        case "copy":
            return trainable_per_rank * param_bytes
        case "separate":
            return params_per_rank * param_bytes
        case _:  # adapters, precomputed, none
            return 0


def _gathered(fsdp: int) -> float:
    return memory_peak.GATHERED_HEAD * (1 - 1 / fsdp)


def loss_peak(arch: Arch, tp: int, fsdp: int, head_trains: bool, tokens: int, held: int) -> int:
    """The policy's backward: `held` (state, reference, the layers' activations) plus the larger of
    the log-softmax's backward (`PAIR_HEAD_COPIES` heads, `PAIR_LOGIT_COPIES` logits) and, where the
    head trains, the backward's end (`PAIR_HEAD_GRADIENT_COPIES` heads)."""
    head = memory_peak.head_bytes(arch, tp)
    softmax = int((PAIR_HEAD_COPIES + _gathered(fsdp)) * head) + PAIR_LOGIT_COPIES * logits_bytes(arch, tp, tokens)
    end = int((PAIR_HEAD_GRADIENT_COPIES + _gathered(fsdp)) * head) if head_trains else 0
    return held + max(softmax, end)


def reference_phase(ref_arch: Arch, tp: int, fsdp: int, tokens: int, held: int) -> int:
    """The reference's no-grad forward: `held` (the rank's parameters, optimizer states and reference)
    plus its head's copies and its logits with their log-softmax."""
    copies = REFERENCE_HEAD_COPIES + _gathered(fsdp)
    head = int(copies * memory_peak.head_bytes(ref_arch, tp))
    return held + head + REFERENCE_LOGIT_COPIES * logits_bytes(ref_arch, tp, tokens)


def of(exp) -> Pairs | None:
    """The preference run an experiment asks for (None: not one: sft). A separate reference's
    architecture is read from its config.json; where that cannot be read (its own checks say why
    before launch), the policy's is taken."""
    module = registry.of(exp.objective)
    if module.DATA != "pairs":
        return None
    section = exp.objective
    if not module.REFERENCE or not isinstance(section, DpoObjective):
        return Pairs("none")
    if section.reference_logps == "precomputed":
        return Pairs("precomputed", _arch_of(section.reference))
    if section.reference is not None:
        return Pairs("separate", _arch_of(section.reference))
    return Pairs("adapters" if exp.peft.kind == "lora" else "copy")


def _arch_of(reference: str | None) -> Arch | None:
    if reference is None:
        return None
    folder = model_ref.resolve("objective.reference", reference)[0].folder
    try:
        return arch_from_hf_config(read_hf_config(folder)) if folder is not None else None
    except HFConfigError:
        return None


def with_pairs(
    mem: memory.Memory, arch: Arch, g: memory.Degrees, pairs: Pairs, retained_fraction: float
) -> memory.Memory:
    """`mem` (the SFT estimate of the same batch: `memory.estimate`) as a preference step holds it:
    the reference, the unchunked loss's logits in the activations, and the step's phases (the
    policy's backward through the loss, the reference's forward, the optimizer step, the
    precompute pass)."""
    tokens, tp = mem.tokens_per_microbatch, g.tp
    pb, cb = memory.DTYPE_BYTES[mem.param_dtype], memory.DTYPE_BYTES[mem.compute_dtype]
    trainable = mem.gradients // pb
    ref_arch = pairs.reference_arch or arch
    ref_params = memory.params_per_rank(ref_arch, g) * pb
    ref = reference_bytes(pairs, ref_params // pb, trainable, pb)
    held_logits = REFERENCE_LOGIT_COPIES * logits_bytes(arch, tp, tokens)  # the logits and their log-softmax
    acts = mem.activations - 2 * memory_peak.chunk_bytes(arch, tp, tokens) + held_logits
    total = mem.total - mem.activations + acts + ref
    state = mem.parameters + mem.gradients + mem.optimizer
    base = acts - held_logits + mem.attention_mask
    base += cb * memory.largest_unit(arch, g, blocks_only=True) if mem.fsdp_buffers else 0
    head_trains, fsdp = trainable * pb == mem.parameters, g.dp_shard * g.cp
    phases = [
        total,
        loss_peak(arch, tp, fsdp, head_trains, tokens, state + ref + base),
        state + ref + memory_peak.OPTIMIZER_TEMPORARIES * trainable * 4,
    ]
    if pairs.reference in ("copy", "adapters", "separate"):  # no gradients are held at the forward
        phases.append(reference_phase(ref_arch, tp, fsdp, tokens, state - mem.gradients + ref))
    # precomputed: the first pass, at step 1 before any optimizer state: the policy's weights, and a
    # separate reference's built for the pass (else the policy's own starting weights are the reference).
    held = mem.parameters + (ref_params if pairs.reference_arch is not None else 0)
    pre = reference_phase(ref_arch, tp, fsdp, tokens, held) if pairs.reference == "precomputed" else 0
    top = max(*phases, pre)
    retained = int(top * retained_fraction)
    return dataclasses.replace(
        mem,
        activations=acts,
        total=total,
        transients=top - total,
        retained=retained,
        peak=top + retained + mem.runtime,
        headroom=mem.usable - top,
        fits=top <= mem.usable,
        reference=ref,
        reference_mode=pairs.reference,
        precompute_peak=pre,
    )


def plan_lines(mem: memory.Memory, human: Callable[[int], str]) -> list[str]:
    """The dry run's memory line of a preference objective's reference (none for sft)."""
    what = {
        "copy": f"a frozen copy of the trainable weights, sharded like them ({mem.param_dtype})",
        "adapters": "none held: the base with the adapters switched off (peft=lora)",
        "separate": f"the reference model's weights, frozen, sharded like the policy's ({mem.param_dtype})",
        "precomputed": f"none held: a first pass stores its log-probs (its peak: {human(mem.precompute_peak)})",
        "none": "none (the objective has no reference)",
    }.get(mem.reference_mode)
    if what is None:
        return []
    return [
        f"  reference      {human(mem.reference):>12}   {what}",
        "                                the pair loss is not chunked: the activations hold the full logits and "
        "their float32 log-softmax",
    ]
