"""The Neuron bridge: nkilib kernels called through `torch_neuronx.wrap_nki`, behind an import guard.

NOT RUN ON HARDWARE. The real packages (`torch-neuronx`, `nki`, nkilib) come from the Neuron pip
repository, which this project's machines cannot reach (the PyPI names are placeholders that raise on
import). This module is written against the documented API and its contract (layouts, launch grid,
constraints) is covered by `tests/test_kernels_neuron.py` with a fake `torch_neuronx` / `nkilib`.

The contract, from the nkilib sources and the torch-neuronx documentation:
- A kernel is launched as `wrap_nki(kernel)[lnc](...)`: the index is the launch grid, the number of
  logical cores (LNC) the kernel is sharded over. `wrap_nki(kernel[lnc])` silently compiles for
  LNC=1, so the grid is always applied to the wrapper here.
- Non-tensor arguments are compile-time constants (one compilation per block size, flag, ...).
- `rope_hf(q, k, q_out, k_out, rope_cache=, backward=)`: q/k/outputs `[B, H, S, D]`, packed cache
  `[(B,) S, 2D]` (cos | sin), `S % (128 * LNC) == 0`; `backward=True` applies the inverse rotation.
- `moe_cte(hidden[T+1, H], affinities[(T+1)*E, 1], gate_up[E, H, 2, I], down[E, I, H],
  token_position_to_id[N*B], block_to_expert[N, 1], block_size, spec)`; with activation
  checkpointing it also returns `gate_up_T[N, 2, I, B]` and `down[N, B, H]`, which
  `blockwise_mm_bwd` reads. Block sizes 128/256/512/1024, dropless only, H divisible by LNC.
"""

from __future__ import annotations

import os

ROPE_SEQ_TILE = 128
"""rope_hf processes the sequence in tiles of 128 rows per logical core."""
MOE_BLOCK_SIZES = (128, 256, 512, 1024)
DEFAULT_LNC = 2
"""trn2's default logical-core configuration (`NEURON_LOGICAL_NC_CONFIG`)."""
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
DEVICE_TYPE = "neuron"
"""The torch device type of a NeuronCore (TorchNeuron's PrivateUse1 name)."""


class NeuronKernelError(ValueError):
    """An input the nkilib kernel does not accept (raised before the kernel is called)."""


def available() -> bool:
    """True when torch_neuronx and nkilib both import (the real wheels, or a test's fakes)."""
    try:
        import nkilib  # noqa: F401  # lazy: the Neuron packages exist only on Trainium hosts
        import torch_neuronx  # noqa: F401  # lazy: the same
    except Exception:  # the PyPI placeholders raise at import, not only ImportError
        return False
    return True


def on_neuron(t) -> bool:
    """The Neuron implementation runs for tensors on a Neuron device (and only if the bridge imports)."""
    return t.device.type == DEVICE_TYPE and available()


def runs_on_neuron(facts) -> bool:
    """Whether the ranks of these platform facts compute on NeuronCores, where nkilib's constraints apply."""
    return facts.device_type == DEVICE_TYPE


def lnc_from_env(env: dict[str, str] | None = None) -> int:
    """The logical-core count kernels are launched with: NEURON_LOGICAL_NC_CONFIG, else trn2's 2."""
    raw = (env if env is not None else os.environ).get(LNC_ENV)
    if raw is None or raw == "":
        return DEFAULT_LNC
    try:
        lnc = int(raw)
    except ValueError:
        raise NeuronKernelError(f"{LNC_ENV}={raw!r} is not an integer (allowed: 1, 2)") from None
    if lnc not in (1, 2):
        raise NeuronKernelError(f"{LNC_ENV}={lnc} (allowed: 1, 2)")
    return lnc


def _launch(kernel, lnc: int):
    from torch_neuronx import wrap_nki  # lazy: only on Trainium hosts

    # The grid indexes the wrapper: wrap_nki(kernel)[lnc]. Never wrap_nki(kernel[lnc]) (LNC=1).
    return wrap_nki(kernel)[lnc]


# ------------------------------------------------------------------------------------ RoPE
def check_rope(seq_len: int, head_dim: int, lnc: int) -> None:
    if seq_len % (ROPE_SEQ_TILE * lnc):
        raise NeuronKernelError(
            f"nkilib rope_hf needs the sequence length to be a multiple of 128 x LNC = {ROPE_SEQ_TILE * lnc}, "
            f"got {seq_len}"
        )
    if head_dim % 2:
        raise NeuronKernelError(f"rope_hf rotates halves of the head dimension; {head_dim} is odd")


def rope_hf(q_bhsd, k_bhsd, cache, *, backward: bool, lnc: int):
    """q/k `[B, H, S, D]` (contiguous), cache `[S, 2D]` or `[B, S, 2D]` -> rotated (q, k), same layout."""
    import torch  # lazy: this module is imported by the torch-free pre-launch checks too
    from nkilib.core.embeddings.rope_hf import rope_hf as kernel  # lazy: only on Trainium hosts

    B, _, S, D = q_bhsd.shape
    check_rope(S, D, lnc)
    if cache.shape[-1] != 2 * D or cache.shape[-2] != S or cache.dim() not in (2, 3):
        raise NeuronKernelError(f"rope cache must be [S, 2D] or [B, S, 2D] = [{S}, {2 * D}], got {list(cache.shape)}")
    q_out = torch.empty_like(q_bhsd)
    k_out = torch.empty_like(k_bhsd)
    q_out, k_out = _launch(kernel, lnc)(q_bhsd, k_bhsd, q_out, k_out, rope_cache=cache, backward=backward)
    return q_out, k_out


# ------------------------------------------------------------------------------------- MoE
def check_moe(*, block_size: int, hidden: int, lnc: int) -> None:
    if block_size not in MOE_BLOCK_SIZES:
        raise NeuronKernelError(f"nkilib blockwise MoE kernels take block sizes {MOE_BLOCK_SIZES}, got {block_size}")
    if hidden % lnc:
        raise NeuronKernelError(f"blockwise_mm_bwd shards the hidden size over LNC={lnc}; {hidden} is not divisible")


def moe_cte(hidden, affinities, gate_up, down, token_position_to_id, block_to_expert, *, block_size: int, lnc: int):
    """Forward with activation checkpointing -> (output[T+1, H], gate_up_T[N, 2, I, B], down[N, B, H])."""
    from nkilib.core.moe.moe_cte.moe_cte import (  # lazy: only on Trainium hosts
        MoECTEImplementation,
        MoECTESpec,
        ShardOnIConfig,
        moe_cte as kernel,
    )

    check_moe(block_size=block_size, hidden=hidden.shape[-1], lnc=lnc)
    n_blocks = block_to_expert.shape[0]
    # Shard on the intermediate dimension, the implementation that checkpoints the activations the
    # backward kernel reads; affinities are applied after the down projection (on H).
    spec = MoECTESpec(
        implementation=MoECTEImplementation.shard_on_i,
        shard_on_I=ShardOnIConfig(checkpoint_activation=True, expert_affinity_multiply_on_I=False),
    )
    out, gate_up_t, down_act = _launch(kernel, lnc)(
        hidden.contiguous(),
        affinities.contiguous(),
        gate_up.contiguous(),
        down.contiguous(),
        token_position_to_id,
        block_to_expert.reshape(n_blocks, 1),
        block_size,
        spec,
    )
    return out, gate_up_t, down_act


def blockwise_mm_bwd(
    grad_out,
    hidden,
    affinities,
    gate_up,
    down,
    gate_up_t,
    down_act,
    token_position_to_id,
    block_to_expert,
    *,
    block_size: int,
    lnc: int,
):
    """-> (d_hidden, d_affinities, d_gate_up, d_down), shaped like the forward inputs."""
    import torch  # lazy: this module is imported by the torch-free pre-launch checks too
    from nkilib.experimental.moe.bwd.blockwise_mm_backward import blockwise_mm_bwd as kernel  # lazy: Trainium only
    from nkilib.experimental.moe.bwd.moe_bwd_parameters import AffinityOption, KernelTypeOption  # lazy: the same

    check_moe(block_size=block_size, hidden=hidden.shape[-1], lnc=lnc)
    n_blocks = block_to_expert.shape[0]
    grads = _launch(kernel, lnc)(
        hidden.contiguous(),
        affinities.contiguous(),
        gate_up.contiguous(),
        down.contiguous(),
        gate_up_t.contiguous(),
        down_act.contiguous(),
        token_position_to_id,
        block_to_expert.reshape(n_blocks, 1),
        grad_out.contiguous(),
        block_size,
        affinity_option=AffinityOption.AFFINITY_ON_H,
        kernel_type_option=KernelTypeOption.DROPLESS,
    )
    # Gradients come back contiguous; the operator promises the strides of its inputs.
    return tuple(
        g if g.stride() == t.stride() else torch.empty_like(t).copy_(g)
        for g, t in zip(grads[:4], (hidden, affinities, gate_up, down), strict=True)
    )
