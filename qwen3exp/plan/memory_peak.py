"""A rank's peak within a training step beyond the plan's steady total, by arithmetic: the
transients that `qwen3exp.plan.memory`'s parameters, gradients, optimizer, FSDP buffers and
activations leave out, found by measuring ranks (tests/bench/bench_memory.py; VmRSS of each rank
sampled every 5 ms with markers at forward, backward and optimizer events).

Where the 0.6B-shaped ranks' memory went beyond the plan (2.11x on Qwen3-0.6B), cause by cause:
- The loss phase, the peak of every 0.6B-shaped row (both layouts, both sequence lengths).
  torchtitan's chunked loss (8 chunks) keeps the lm_head's weight unsharded for all chunks and runs
  each chunk's backward at once, every layer's activations still held: each chunk adds the head
  weight's full (per tp shard) float32 gradient to the one accumulated so far, and after the last
  chunk FSDP copies it into its reduce-scatter input and reduces it (2.5 head sizes above the
  chunk loop, measured). With Qwen3's 151,936-token vocabulary that weight is most of a small model
  (0.6B: 593 MiB in float32 against 120 MiB for two layers). Counted, with what the loop holds
  (the gathered weight, the tp-sharded embedding's dense gradient, gloo's and DTensor's buffers),
  as `HEAD_COPIES` head sizes; a chunk's backward with its logits (`LOSS_CHUNK_COPIES`) is the
  peak instead where the head is small (the tiny models).
- The model=hf backend un-ties tied embeddings for FSDP and re-ties them when it initialises the
  weights: its ranks hold one vocabulary matrix, as the native ones (`HEAD_COPIES`).
- Python, torch and torchtitan in a CPU rank's resident memory (~0.9 GiB): the platform's
  `measured_beside` (`qwen3exp.platforms.cpu.MEASURED_RUNTIME_BYTES`).
- The optimizer step. AdamW's foreach step makes one temporary the size of the trainable shard
  (the square root of the second moment), while the gradients and both moments are held; the
  activations and FSDP buffers are freed by then, so it is the peak only where they are small.
- Memory the allocator keeps: glibc's heap in a CPU rank (inside `HEAD_COPIES`' fit), the CUDA
  caching allocator's reserve (`qwen3exp.platforms.cuda.RESERVED_FRACTION`, not yet measured).
- Attention keeps no seq_len x seq_len matrix of scores: the CPU's SDPA with a boolean mask runs
  torch's flash kernel for the CPU (`_scaled_dot_product_flash_attention_for_cpu`), CUDA's flash /
  memory-efficient kernels likewise; the dense block-causal mask and the copies SDPA saves of it
  are the plan's own term where the run has one (`qwen3exp.plan.attention_path.mask_bytes`).
"""

from __future__ import annotations

import math

from qwen3exp.config.flavors import Arch
from qwen3exp.config.sections.training import LOSS_CHUNKS


def activation_elements_per_token(arch: Arch, mode: str) -> tuple[int, int]:
    """(per layer, head) elements kept per token for the backward pass (see the module doc)."""
    d, hd = arch.dim, arch.head_dim
    q, kv = arch.n_heads * hd, arch.n_kv_heads * hd
    attention = 2 * d + (q + 2 * kv) + 2 * (q + kv) + q
    if arch.moe is None:
        f_total = arch.hidden_dim
        ffn = 2 * d + 4 * f_total
        matmul_out = (q + 2 * kv) + d + 2 * f_total + d
    else:
        k, e, f = arch.moe.top_k, arch.moe.num_experts, arch.moe.hidden_dim
        ffn = 2 * d + e + 2 * k * d + 4 * k * f
        matmul_out = (q + 2 * kv) + d + e + 2 * k * f + k * d
    full_layer = attention + ffn
    match mode:
        case "none":
            per_layer, once = full_layer, 0
        case "full":
            per_layer, once = d, full_layer
        case "selective":
            per_layer, once = d + matmul_out // 2 + q, full_layer
        case _:
            raise ValueError(f"unknown activation checkpointing mode {mode!r}")
    return per_layer, once + 2 * d


HEAD_COPIES = {("native", True): 6.0, ("native", False): 4.5, ("hf", True): 4.5, ("hf", False): 4.5}
"""Float32 head-weight sizes (per tp shard, `head_bytes`) a rank holds at the loss phase's peak beyond
its sharded state, its layers' activations and the gathered head (`GATHERED_HEAD`), by model backend
and tied embeddings, fitted on tests/bench/bench_memory.py's in-sample rows (`fitted` there): the
accumulated chunk gradients of the head weight, the embedding's dense gradient added to it when
tied, FSDP's reduce-scatter input and output (a copy-in and a copy-out even on one rank), gloo's
and DTensor's buffers. Each fitted on one row, measured 2026-12-06 (VmHWM, forked CPU ranks): native
tied (one FSDP unit, gathered for the whole step) on 0.6B-2L dp2 s256 (5.893 GiB measured, 5.887
planned); native untied (the head its own unit, no embedding gradient in it) on 0.6B-2L untied dp2
s256 (6.18); model=hf tied on 0.6B-2L hf dp2 s256 (5.10). model=hf holds tied embeddings tied (the
transformers backend unties them for FSDP and re-ties them in `init_weights`: measured, its
lm_head.weight is its embedding's and its optimizer holds one vocabulary matrix), and 1.5 head
sizes less than the native loss at the same point, on one rank and on two (not traced further).
model=hf untied is taken as native untied (not measured). The rows that were not fitted on, and
their scores: docs/plan.md, tests/test_memory_score.py."""
GATHERED_HEAD = 1.0
"""The head's all-gathered weight beside the rank's shard (float32 head sizes): (1 - 1/fsdp) of it
is memory the sharded state does not already count; 0 on one rank, where FSDP's unsharded
parameter is the shard itself."""
LOSS_CHUNK_COPIES = 4
"""Float32 chunk-logit-sized tensors alive in one chunk's cross-entropy backward (the logits, the
log-softmax output, their gradients)."""
CHUNK_LOOP_BELOW = 1.5
"""How far (head sizes) a chunk's backward stays below the reduction's peak: 1.25-1.5 measured."""
OPTIMIZER_TEMPORARIES = 1
"""Trainable-shard-sized float32 temporaries of AdamW's foreach step."""


def head_bytes(arch: Arch, tp: int) -> int:
    """The lm_head weight of one tp shard (the embedding when tied) in float32 (its gradient's dtype
    as FSDP reduces it)."""
    return math.ceil(arch.vocab_size / tp) * arch.dim * 4


def chunk_bytes(arch: Arch, tp: int, tokens: int) -> int:
    """One chunk of the chunked loss's float32 logits (tokens / 8 x vocab / tp)."""
    return math.ceil(tokens / LOSS_CHUNKS) * math.ceil(arch.vocab_size / tp) * 4


def step_peak(
    arch: Arch,
    tp: int,
    head_trains: bool,
    tokens: int,
    base: int,
    state: int,
    trainable_elements: int,
    *,
    backend: str = "native",
    fsdp: int = 1,
) -> int:
    """The largest of the step's phases (bytes per rank) beside the plan's total. `base`: the
    activations of the layers (not the loss's chunks), the attention mask and the FSDP unit
    prefetched for the backward; `state`: parameters, gradients and moments; `head_trains`: the
    head has a gradient (not with peft=lora); `backend`: the model backend (`HEAD_COPIES`); `fsdp`:
    the degree FSDP shards the head over (dp_shard x cp)."""
    head = head_bytes(arch, tp)
    copies = HEAD_COPIES[backend, arch.tied] if head_trains else 1.0  # peft=lora: the gathered weight, no gradient
    copies += GATHERED_HEAD * (1 - 1 / fsdp) if head_trains else 0.0
    # The gradient's reduction after the last chunk, or a chunk's backward with its logits (below it
    # by `CHUNK_LOOP_BELOW` head sizes: that chunk's gradient is added, not yet reduced).
    logits = LOSS_CHUNK_COPIES * chunk_bytes(arch, tp, tokens)
    below = CHUNK_LOOP_BELOW if head_trains else 0.0
    loss = state + base + int(max(copies * head, (copies - below) * head + logits))
    optimizer = state + OPTIMIZER_TEMPORARIES * trainable_elements * 4
    return max(loss, optimizer)
