"""A preference run's memory per rank (objective=dpo, orpo, simpo on data=preference), by arithmetic:
what `qwen3exp.titan.preference_trainer` holds beyond an SFT step of the same batch.

- The reference, held for the whole run (`reference_bytes`), by `Pairs.reference`:
  - `copy` (full fine-tune, objective.reference null): a frozen copy of the trainable weights,
    sharded like them (training.dtype);
  - `adapters` (peft=lora, reference null): the base with the adapters zeroed: no second model
    (the adapters' B matrices are saved for the reference pass only: a few MiB, left out);
  - `separate` (objective.reference: a model folder): its own parameters (its config.json), frozen,
    sharded like the policy's (training.dtype);
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
forward, the loss, the policy's backward and the optimizer step; 0.6B-2L, 2 ranks, one pair of
256-token sides per rank, 2026-12-06): the policy's backward through the loss (full fine-tune 5.84
GiB per rank; the reference's no-grad forward before it peaked 1.3 GiB lower, the optimizer step
lower still). The reference's forward adds 2.4 GiB over the step's start on that shape (the
all-gathered embedding-and-head unit, its logits and their log-softmax), the same with LoRA and with
the copy; it is counted as its own phase (`reference_phase`) and is the peak only where the
policy's activations are small next to it.
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

PAIR_LOGIT_COPIES = 4
"""Float32 [tokens, vocab / tp] tensors alive in the policy's backward through the loss: the logits,
their log-softmax (saved for the backward), its gradient and the logits' gradient."""
PAIR_HEAD_COPIES = {True: 3.25, False: 1.5}
"""Float32 head-weight sizes (`memory_peak.head_bytes`) a rank holds at the policy backward's peak
beyond its sharded state, the reference, its layers' activations and the gathered head
(`memory_peak.GATHERED_HEAD`), by whether the head trains (full fine-tune: the head's gradient with
the embedding's added to it, FSDP's reduce-scatter buffers, the matmul's copy of the weight; peft=lora:
no gradient). True fitted on tests/bench/bench_memory.py's `0.6B-2L dpo dp2 b2 s256` (its peak);
False on the backward of `0.6B-2L dpo lora dp2 b2 s256` as its markers measured it (3.47 GiB per
rank at step 1, below that row's peak, the reference's forward), 2026-12-06. The other dpo rows of
the bench are out of sample."""
REFERENCE_HEAD_COPIES = 3.1
"""Float32 head sizes the reference's no-grad forward holds at its end beyond the rank's parameters,
optimizer states, the reference and the gathered head (`memory_peak.GATHERED_HEAD`): gloo's
all-gather output the unit is copied out of, the copy-in of the shard, the matmul's copy of the
weight and what the allocator keeps of the step before. Fitted on the peak of `0.6B-2L dpo lora dp2
b2 s256` (the reference's forward, by its markers: 2.38 GiB over the step's start); the full
fine-tune's reference forward measured 2.44 GiB over its step's start, predicted within 0.1 GiB."""
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
    """The policy's backward through the unchunked loss: `held` (state, reference, the layers'
    activations) plus `PAIR_HEAD_COPIES` head sizes and `PAIR_LOGIT_COPIES` logits."""
    copies = PAIR_HEAD_COPIES[head_trains] + _gathered(fsdp)
    return held + int(copies * memory_peak.head_bytes(arch, tp)) + PAIR_LOGIT_COPIES * logits_bytes(arch, tp, tokens)


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
