"""Which attention a run's ranks take, decided once from the configuration before launch.

- causal: `F.scaled_dot_product_attention(is_causal=True)` with no mask tensor, so torch takes its
  causal kernel (flash on the CPU and CUDA) and torchtitan builds no per-document metadata (no
  per-step host sync). Taken where no document boundary needs a mask:
  - data=chat with data.pack=false: one conversation per sequence, its padding after it (the
    padding is untrained, and causal attention keeps it out of the conversation's tokens), so the
    causal mask is the document mask;
  - a plain-text run with data.cross_document_attention=true: the documents packed into a sequence
    attend to each other (the Trainium walkthrough's SDPA).
- block_causal: a dense `[batch, 1, seq, seq]` document-causal mask (`qwen3exp.titan.attention`,
  `qwen3exp.titan.hf_model`): packed text (the default) and data.pack=true. The losses of these
  runs are unchanged.
- flex (CUDA): torchtitan's document BlockMask, block-sparse (no dense mask), whatever the data.
  With data.cross_document_attention=true, model.attention=auto takes SDPA on CUDA too (its causal
  kernel is flash attention), and model.attention=flex is refused.

Why the decision is not made per batch ("does this batch hold a boundary?"): reading the positions
on the host is a device sync every step, and switching between two graphs recompiles on Neuron;
packed text and packed conversations have a boundary in nearly every sequence anyway, and the runs
without one (one conversation per sequence) are known from the configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.data import ChatData, PackedText
from qwen3exp.config.sections.mixture import MixtureData
from qwen3exp.errors import Problem
from qwen3exp.platforms import PlatformFacts

Mask = Literal["causal", "block_causal"]


@dataclass(frozen=True)
class AttentionPath:
    kernel: str
    """sdpa or flex (model.attention, auto resolved by the platform)."""
    mask: Mask
    why: str

    @property
    def causal(self) -> bool:
        """The SDPA path without a mask tensor (`is_causal=True`)."""
        return self.kernel == "sdpa" and self.mask == "causal"

    @property
    def dense_mask(self) -> bool:
        """A dense [batch, 1, seq, seq] mask exists (SDPA with document masking)."""
        return self.kernel == "sdpa" and self.mask == "block_causal"

    def describe(self, local_batch_size: int, seq_len: int) -> str:
        if self.kernel == "flex":
            return f"flex, torchtitan's document BlockMask (block-sparse, no dense mask; {self.why})"
        if self.causal:
            return f"sdpa, causal (is_causal=True, no mask tensor; {self.why})"
        return f"sdpa, block-causal dense mask [{local_batch_size}, 1, {seq_len}, {seq_len}] ({self.why})"


def kernel_of(exp: Experiment, facts: PlatformFacts) -> str:
    """The attention kernel the run uses: model.attention, `auto` resolved by the platform, except
    that cross-document attention takes SDPA everywhere (its causal kernel needs no mask)."""
    if exp.model.attention != "auto":
        return exp.model.attention
    return "sdpa" if exp.data.causal_attention and cross_document(exp.data) else facts.attention


def cross_document(data) -> list[str]:
    """The keys that ask for cross-document attention (data=mix: a text source's)."""
    if isinstance(data, MixtureData):
        texts = {n: s for n, s in data.sources.items() if isinstance(s, PackedText) and s.weight > 0}
        return [f"data.sources.{n}.cross_document_attention" for n, s in texts.items() if s.cross_document_attention]
    return ["data.cross_document_attention"] if isinstance(data, PackedText) and data.cross_document_attention else []


def resolve(exp: Experiment, facts: PlatformFacts) -> AttentionPath:
    """The run's attention path on this platform."""
    return attention_path(exp, kernel_of(exp, facts))


def attention_path(exp: Experiment, kernel: str) -> AttentionPath:
    """The path of a run whose attention kernel (auto resolved) is `kernel`."""
    chat = isinstance(exp.data, ChatData)
    if isinstance(exp.data, MixtureData):  # a mixture: causal when no source needs a document mask
        why = "data=mix: " + (
            "no source needs a document mask" if exp.data.causal_attention else "a source packs documents"
        )
        return AttentionPath(kernel, "causal" if exp.data.causal_attention else "block_causal", why)
    if exp.data.causal_attention:
        why = "one conversation per sequence: no document boundary" if chat else "data.cross_document_attention=true"
        return AttentionPath(kernel, "causal", why)
    why = "data.pack=true: conversations packed per sequence" if chat else "packed documents, each sees only itself"
    return AttentionPath(kernel, "block_causal", why)


def problems(exp: Experiment, kernel: str) -> list[Problem]:
    """Cross-document attention is the SDPA causal path; FlexAttention here builds torchtitan's
    document BlockMask (it has no causal-only variant for the native model)."""
    if kernel == "flex" and (keys := cross_document(exp.data)):
        return [
            Problem(
                keys[0],
                True,
                "cross-document attention is the SDPA causal path, and this run's attention is flex "
                "(torchtitan's document BlockMask)",
                "false with model.attention=flex",
                "model.attention=sdpa",
            )
        ]
    return []


def mask_bytes(
    dense_mask: bool, local_batch_size: int, seq_len: int, compute_bytes: int, n_layers: int, activation_checkpoint: str
) -> int:
    """The plan's memory term for the dense block-causal mask of the SDPA path (0 where the run has
    none: is_causal, flex): the boolean mask ([batch, 1, seq, seq], a byte an element, built once per
    step and held for it: `qwen3exp.titan.attention.DocumentMaskQwen3Model`) and the copy in
    the compute dtype (`compute_bytes` an element) that `F.scaled_dot_product_attention` converts it
    to and saves for the backward in every layer whose activations are held (activation_checkpoint=
    none: every layer; full, selective: the one block recomputed). No attention scores are
    materialised: SDPA with a mask runs torch's flash kernel for the CPU
    (`_scaled_dot_product_flash_attention_for_cpu`, GQA included), CUDA's likewise. Measured:
    tests/bench/bench_attention.py."""
    if not dense_mask:
        return 0
    layers_held = n_layers if activation_checkpoint == "none" else 1
    return local_batch_size * seq_len * seq_len * (1 + layers_held * compute_bytes)
