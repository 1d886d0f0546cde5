"""Parameters per rank and the per-rank memory estimate, by arithmetic (no torch, no model).

Parameters per rank follow torchtitan 0.3.0's sharding of Qwen3, tensor by tensor, for the rank
that holds the largest shard (rank 0; `torch.chunk` gives the first ranks the larger pieces):
- tensor parallel (tp): column-wise linears (wqkv, w1, w3, lm_head) and the embedding split dim 0,
  row-wise linears (wo, w2) dim 1; norms and the router gate are replicated. Routed experts are
  split on their hidden dim by tp when ep = 1, and are not tensor-parallel when ep > 1;
- expert parallel (ep): routed experts split dim 0 (the expert index) by ep;
- FSDP: every tensor split dim 0 by dp_shard x cp; routed experts use dp_shard x cp x tp / ep when
  ep > 1, and split dim 1 instead of dim 0 when that degree (x ep) exceeds the number of experts;
- dp_replicate replicates; tied embeddings count once;
- pipeline (pp): the first stage's share, ceil(n_layers / pp) layers plus the embedding (and the
  head when pp = 1). An approximation: torchtitan weighs the embedding and head like layers when
  it splits stages.
`tests/test_plan.py` checks the count against the local shards of the model torchtitan builds and
shards on the meta device (a fake process group).

Memory per rank (bytes), for AdamW:
  parameters  = params_per_rank x bytes(training.dtype)
  gradients   = trainable_per_rank x bytes(training.dtype)    (trainable: all, or peft=lora's adapters,
  optimizer   = 2 x trainable_per_rank x bytes(training.dtype)   rank x (in + out) per target and layer)
  fsdp buffers = 2 x U x bytes(mixed_precision_param) + U x 4          (U: the largest FSDP unit's
                 unsharded parameters / tp: a block, the embedding, or [norm, lm_head]; one
                 all-gathered, one prefetched, one float32 gradient being reduce-scattered; 0 when
                 nothing is sharded)
  activations = T x [ L x per_layer + head ] x bytes(compute) / tp  +  head logits
with T = local_batch_size x seq_len / cp tokens per micro-batch (gradient accumulation runs one
micro-batch at a time), L = n_layers, compute = mixed_precision_param, and per token and layer the
tensors kept for the backward pass (elements; d = dim, q = n_heads x head_dim, kv = n_kv_heads x
head_dim, f = FFN hidden, k = top_k, F = expert hidden, E = experts):
  attention  = 2d (norm in, out) + (q + 2kv) (wqkv) + 2(q + kv) (q/k norm, RoPE) + q (attention out)
  dense FFN  = 2d + 4f (w1, w3, silu, product)
  MoE FFN    = 2d + E (router) + 2kd (routed copy in and out) + 4kF
  activation_checkpoint=none:      per_layer = attention + FFN
  activation_checkpoint=full:      per_layer = d (the block input), plus one block recomputed (+ attention + FFN once)
  activation_checkpoint=selective: per_layer = d + half of the linear outputs + q (torchtitan's
                                   op-level SAC saves every other matmul and the attention output),
                                   plus one block recomputed
  head = 2d (final norm), and the loss logits: 2 x T/8 x vocab / tp in float32 (torchtitan's
         chunked loss, 8 chunks; logits and their gradient)
With pp > 1 a stage holds ceil(L / pp) layers but keeps up to pp micro-batches in flight (1F1B),
about L layers' worth, so L is used unchanged. Attention keeps no seq_len^2 matrix (`memory_peak`).
  attention mask = the dense block-causal mask where the run has one (SDPA with document masking;
                   0 on the causal path and on flex), its own line (`attention_path.mask_bytes`)

The step's peak adds what a step holds only for a moment (`transients`: the chunked loss's head
gradients and logits, AdamW's temporaries; the reasons, measured, are in `qwen3exp.plan.memory_peak`);
the platform adds what its measure counts beside the model (`retained`, `runtime`: e.g. a CPU rank's
Python and torch, `qwen3exp.platforms.cpu.MEASURED_RUNTIME_BYTES`), so that `peak` is the figure each
run's measured peak is compared with (`qwen3exp.run.scorecard`).

A plan fits when total + transients is at most `USABLE_FRACTION` of the platform's memory per rank (the
rest: the runtime, fragmentation, communication buffers); on the CPU, `platforms.cpu.host_problems`
also checks each rank's cost beyond it. A preference objective's memory: `qwen3exp.plan.memory_pref`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

from qwen3exp.config.flavors import Arch
from qwen3exp.config.sections.peft import Lora, Peft
from qwen3exp.plan import attention_path, memory_peak
from qwen3exp.units import gib as gib  # re-exported: plan/build.py prints through `memory.gib`

USABLE_FRACTION = 0.9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ParamTensor:
    name: str
    shape: tuple[int, ...]
    tp_dim: int | None
    """Dimension split by tensor parallelism (None: replicated)."""
    layer: int | None
    """Layer index (None: embedding, final norm, head)."""
    expert: bool = False


def param_tensors(arch: Arch) -> list[ParamTensor]:
    """Every parameter tensor torchtitan's Qwen3 has, with its torchtitan name (tied: no lm_head
    entry of its own, the embedding is the lm_head)."""
    d, hd = arch.dim, arch.head_dim
    q, kv = arch.n_heads * hd, arch.n_kv_heads * hd
    out = [ParamTensor("tok_embeddings.weight", (arch.vocab_size, d), 0, None)]
    for i in range(arch.n_layers):
        p = f"layers.{i}."
        out += [
            ParamTensor(p + "attention.qkv_linear.wqkv.weight", (q + 2 * kv, d), 0, i),
            ParamTensor(p + "attention.wo.weight", (d, q), 1, i),
            ParamTensor(p + "attention.q_norm.weight", (hd,), None, i),
            ParamTensor(p + "attention.k_norm.weight", (hd,), None, i),
            ParamTensor(p + "attention_norm.weight", (d,), None, i),
            ParamTensor(p + "ffn_norm.weight", (d,), None, i),
        ]
        if arch.moe is None:
            f = arch.hidden_dim
            out += [
                ParamTensor(p + "feed_forward.w1.weight", (f, d), 0, i),
                ParamTensor(p + "feed_forward.w2.weight", (d, f), 1, i),
                ParamTensor(p + "feed_forward.w3.weight", (f, d), 0, i),
            ]
        else:
            e, f = arch.moe.num_experts, arch.moe.hidden_dim
            x = p + "moe.routed_experts.inner_experts."
            out += [
                ParamTensor(x + "w1_EFD", (e, f, d), 1, i, True),
                ParamTensor(x + "w2_EDF", (e, d, f), 2, i, True),
                ParamTensor(x + "w3_EFD", (e, f, d), 1, i, True),
                ParamTensor(p + "moe.router.gate.weight", (e, d), None, i),
            ]
    out.append(ParamTensor("norm.weight", (d,), None, None))
    if not arch.tied:
        out.append(ParamTensor("lm_head.weight", (arch.vocab_size, d), 0, None))
    return out


@dataclass(frozen=True)
class Degrees:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1


def local_shape(t: ParamTensor, g: Degrees) -> tuple[int, ...]:
    """The shape of rank 0's shard of one tensor under torchtitan's sharding."""
    shape = list(t.shape)

    def split(dim: int, degree: int) -> None:
        shape[dim] = math.ceil(shape[dim] / degree)

    fsdp = g.dp_shard * g.cp
    if t.expert:
        if g.ep > 1:
            split(0, g.ep)
            efsdp = fsdp * g.tp // g.ep
            split(1 if efsdp * g.ep > t.shape[0] else 0, efsdp)
        else:
            if t.tp_dim is not None:
                split(t.tp_dim, g.tp)
            split(1 if fsdp > t.shape[0] else 0, fsdp)
        return tuple(shape)
    if t.tp_dim is not None:
        split(t.tp_dim, g.tp)
    split(0, fsdp)
    return tuple(shape)


def lora_trainable(arch: Arch, targets: list[str], rank: int) -> int:
    """LoRA's trainable parameters: rank x (in + out) for each targeted projection (out x in) of each layer."""
    q, kv, d, f = arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim, arch.dim, arch.hidden_dim
    shapes = {"q_proj": q + d, "k_proj": kv + d, "v_proj": kv + d, "o_proj": d + q}
    shapes |= {"gate_proj": d + f, "up_proj": d + f, "down_proj": f + d}
    return arch.n_layers * rank * sum(shapes[t] for t in targets)


def trainable_of(arch: Arch, peft: Peft) -> int | None:
    """The parameters that train: None (all of them), or peft=lora's adapters."""
    return lora_trainable(arch, list(peft.targets), peft.rank) if isinstance(peft, Lora) else None


@functools.lru_cache(maxsize=4096)  # parallelism=auto asks for every layout x batch x checkpointing mode
def params_per_rank(arch: Arch, g: Degrees) -> int:
    """Parameters held by rank 0 (the largest shard), pipeline stage 0."""
    layers_here = math.ceil(arch.n_layers / g.pp)
    total = 0
    for t in param_tensors(arch):
        if t.layer is not None and t.layer >= layers_here:
            continue
        if g.pp > 1 and t.name in ("norm.weight", "lm_head.weight"):
            continue  # on the last stage
        total += math.prod(local_shape(t, g))
    return total


@functools.lru_cache(maxsize=4096)  # as params_per_rank
def largest_unit(arch: Arch, g: Degrees, blocks_only: bool = False) -> int:
    """Unsharded parameters (per tp / ep shard) of the largest FSDP unit, as torchtitan wraps them:
    one per block, the embedding, and [final norm, lm_head] (one unit with the embedding when tied)."""
    units: dict[object, int] = {}
    for t in param_tensors(arch):
        n = math.prod(t.shape)
        if t.expert and g.ep > 1:
            n //= g.ep
        elif t.tp_dim is not None:
            n //= g.tp
        if t.layer is not None:
            unit: object = t.layer
        elif t.name == "tok_embeddings.weight":
            unit = "embedding and head" if arch.tied else "embedding"
        else:
            unit = "embedding and head" if arch.tied else "head"
        units[unit] = units.get(unit, 0) + n
    return max(n for unit, n in units.items() if isinstance(unit, int) or not blocks_only)


@dataclass(frozen=True)
class Memory:
    parameters: int
    gradients: int
    optimizer: int
    fsdp_buffers: int
    activations: int
    total: int
    transients: int
    """What a step holds at its highest point beyond `total` (`qwen3exp.plan.memory_peak`)."""
    retained: int
    """Freed memory the platform's allocator keeps and its measure counts."""
    runtime: int
    """What the platform's measure counts beside the model (a CPU rank's Python and torch)."""
    peak: int
    """total + transients + retained + runtime: the peak per rank as the platform measures it (scored)."""
    budget: int
    """The platform's memory per rank."""
    usable: int
    """USABLE_FRACTION of the budget."""
    headroom: int
    """usable - (total + transients) (negative: does not fit)."""
    fits: bool
    param_dtype: str
    compute_dtype: str
    activation_checkpoint: str
    tokens_per_microbatch: int
    attention_mask: int = 0
    """The dense attention mask and the copies SDPA saves of it (in `total`; `attention_path.mask_bytes`)."""
    reference: int = 0  # a preference objective's reference held per rank (in `total`; `memory_pref`)
    reference_mode: str = ""  # which reference (`memory_pref.MODES`); "" without a preference objective
    precompute_peak: int = 0  # reference_logps=precomputed: the first pass's peak (in `peak` if higher)

    def as_dict(self) -> dict:
        return asdict(self)


def estimate(
    arch: Arch,
    g: Degrees,
    *,
    local_batch_size: int,
    seq_len: int,
    param_dtype: str,
    compute_dtype: str,
    activation_checkpoint: str,
    budget: int,
    trainable: int | None = None,
    runtime: int = 0,
    retained_fraction: float = 0.0,
    dense_mask: bool = False,
    backend: str = "native",
) -> Memory:
    """`trainable`: the parameters that train (peft=lora: the adapters'; None: all), sharded like the rest;
    `runtime`, `retained_fraction`: the platform's measure beside the model (`Memory.runtime`) and
    the part of the model's peak its allocator keeps (`Memory.retained`); 0 for the model alone;
    `dense_mask`: SDPA takes a dense mask (`attention_path.mask_bytes`); `backend`: native or hf."""
    p = params_per_rank(arch, g)
    t = p if trainable is None else math.ceil(trainable / (g.dp_shard * g.cp * g.tp * g.pp))
    pb, cb = DTYPE_BYTES[param_dtype], DTYPE_BYTES[compute_dtype]
    params, grads, optim = p * pb, t * pb, 2 * t * pb
    sharded = g.dp_shard * g.cp > 1 or (g.ep > 1)
    buffers = (2 * cb + 4) * largest_unit(arch, g) if sharded else 0  # 2 gathered + a float32 gradient
    tokens = local_batch_size * seq_len // g.cp
    per_layer, once = memory_peak.activation_elements_per_token(arch, activation_checkpoint)
    logits = 2 * memory_peak.chunk_bytes(arch, g.tp, tokens)  # the loss's chunks: logits and their gradient
    acts = tokens * (arch.n_layers * per_layer + once) * cb // g.tp + logits
    mask = attention_path.mask_bytes(dense_mask, local_batch_size, seq_len, cb, arch.n_layers, activation_checkpoint)
    total = params + grads + optim + buffers + acts + mask
    base = acts - logits + mask  # the layers' activations
    base += cb * largest_unit(arch, g, blocks_only=True) if sharded else 0  # the last block, for the backward
    state, fsdp = params + grads + optim, g.dp_shard * g.cp
    step = memory_peak.step_peak(arch, g.tp, trainable is None, tokens, base, state, t, backend=backend, fsdp=fsdp)
    top = max(total, step)
    retained = int(top * retained_fraction)
    usable = int(budget * USABLE_FRACTION)
    return Memory(
        parameters=params,
        gradients=grads,
        optimizer=optim,
        fsdp_buffers=buffers,
        activations=acts,
        total=total,
        transients=top - total,
        retained=retained,
        runtime=runtime,
        peak=top + retained + runtime,
        budget=budget,
        usable=usable,
        headroom=usable - top,
        fits=top <= usable,
        param_dtype=param_dtype,
        compute_dtype=compute_dtype,
        activation_checkpoint=activation_checkpoint,
        tokens_per_microbatch=tokens,
        attention_mask=mask,
    )
