"""Answers to `eval.samples` at a validation, generated with the model being trained.

The prompts are rendered as the plan measured them (`qwen3exp.plan.sample_prompts`). Generation is
a plain loop over the model's own forward pass, whatever the backend (native or Transformers):
all prompts in one batch, each row padded to training.seq_len, one forward pass per new token over
the whole rows (no KV cache: at the sizes samples are for, a few passes cost less than a validation
batch; the fixed shape keeps a compiled model from recompiling and serves every attention backend
with the masks torchtitan builds for a training batch). A row's next token is read from the
logits at its last position (causal attention: the padding after it changes nothing).

Every rank runs the same forward passes: a model sharded by FSDP (or tensor or expert parallelism)
needs every rank in each pass. After each pass rank 0's picks are broadcast, so every rank feeds
the same tokens next even where their logits differed in the last bit; rank 0 writes the records.

Greedy at temperature 0; otherwise prompt i (from 0) draws from softmax(logits / temperature) with
a CPU generator of its own, seeded with eval.sample_seed + i at every validation (no top-k / top-p;
the training's own random state is left alone): an answer depends on the weights, the seed and the
prompt's place in the list only, and two prompts do not share their random draws. An answer ends
at a stop id (kept in `tokens`, left out of `text`), after eval.sample_tokens new tokens, or when
its row is full.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from qwen3exp.plan import sample_prompts

LastLogits = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(rows [n, seq_len] token ids, last [n] positions) -> the logits at those positions, [n, vocab]."""


class Sampler:
    """The rendered prompts and the decoding settings of a run; `answer` generates, `records` decodes."""

    def __init__(
        self, prompts: list[str], *, tokenizer_path: str, seq_len: int, max_new: int, temperature: float, seed: int
    ):
        self.tok = sample_prompts.load_tokenizer(tokenizer_path)
        self.prompts = list(prompts)
        self.ids = [sample_prompts.prompt_ids(self.tok, p) for p in prompts]
        self.stops = sample_prompts.stop_ids(self.tok, Path(tokenizer_path))
        self.seq_len, self.max_new, self.temperature, self.seed = seq_len, max_new, temperature, seed

    def answer(self, last_logits: LastLogits, device: str) -> list[list[int]]:
        """The new token ids of every prompt (every rank runs this together; see the module docstring)."""
        n, seq_len = len(self.ids), self.seq_len
        rows = torch.zeros(n, seq_len, dtype=torch.long)  # the padding: any id, never attended to
        for i, ids in enumerate(self.ids):
            rows[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        lengths = [len(ids) for ids in self.ids]
        generators = [torch.Generator().manual_seed(self.seed + i) for i in range(n)]
        answers: list[list[int]] = [[] for _ in self.ids]
        live = list(range(n))
        for _ in range(self.max_new):
            if not live:
                break
            last = torch.tensor([length - 1 for length in lengths], dtype=torch.long)
            logits = last_logits(rows.to(device), last.to(device)).float().cpu()
            picks = _shared(self._pick(logits, live, generators), device)
            for i in list(live):
                token = int(picks[i])
                answers[i].append(token)
                if token in self.stops or lengths[i] == seq_len:
                    live.remove(i)
                else:
                    rows[i, lengths[i]] = token
                    lengths[i] += 1
        return answers

    def _pick(self, logits: torch.Tensor, live: list[int], generators: list[torch.Generator]) -> torch.Tensor:
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / self.temperature, dim=-1)
        picks = torch.zeros(len(logits), dtype=torch.long)
        for i in live:
            picks[i] = torch.multinomial(probs[i], 1, generator=generators[i])[0]
        return picks

    def records(self, step: int, answers: list[list[int]]) -> list[dict]:
        """One samples.jsonl record per prompt: step, prompt, text (special tokens left out), tokens."""
        return [
            {"step": step, "prompt": prompt, "text": self.tok.decode(ids, skip_special_tokens=True), "tokens": ids}
            for prompt, ids in zip(self.prompts, answers, strict=True)
        ]


def _shared(picks: torch.Tensor, device: str) -> torch.Tensor:
    """Rank 0's picks on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return picks
    t = picks.to(device)
    dist.broadcast(t, src=0)
    return t.cpu()


def last_logits(validator, model, rows: torch.Tensor, last: torch.Tensor, vocab: int) -> torch.Tensor:
    """The model's logits at positions `last` of `rows`, over the whole vocabulary (`vocab` ids),
    computed as a validation batch is: the validator's own preprocessing (attention masks from
    per-row positions 0..seq_len-1) in its context. A model whose lm_head the chunked loss applies
    (`_skip_lm_head`) returns hidden states: lm_head is applied here, to the selected positions only."""
    positions = torch.arange(rows.shape[1], device=rows.device).repeat(rows.shape[0], 1)
    inputs, _, extra = validator.post_dataloading_process({"input": rows, "positions": positions}, rows, [model])
    pick = torch.arange(rows.shape[0], device=rows.device)
    with validator.validation_context():
        out = _full(model(inputs, **extra))[pick, last]
        if getattr(model, "_skip_lm_head", False):
            out = _full(model.lm_head(out[:, None, :]))[:, 0]
        if out.shape[-1] != vocab:
            out = _vocab_gathered(out, vocab)
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor: a DTensor (a tensor-parallel output, sharded over the vocabulary) gathered."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _vocab_gathered(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Tensor parallelism on torchtitan's spmd_types backend gives each rank a plain tensor of its
    share of the vocabulary: gathered over the tp group as torchtitan's own `compute_logprobs` does."""
    import spmd_types as spmd  # type: ignore[import-untyped]  # lazy: torchtitan's dependency, tensor parallelism only
    from torchtitan.distributed.spmd_types import current_spmd_mesh, spmd_mesh_size  # lazy: tp only

    mesh = current_spmd_mesh()
    if mesh is None or spmd_mesh_size("tp") == 1:
        raise RuntimeError(f"the model gave logits over {logits.shape[-1]} ids, not its vocabulary's {vocab}")
    return spmd.redistribute(logits, mesh.get_group("tp"), src=spmd.S(-1), dst=spmd.I)
