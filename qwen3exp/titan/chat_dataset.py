"""data=chat in the ranks: a torchtitan dataloader of conversations, one or several per sequence, padded.

Each conversation is rendered by the run's tokenizer and chat template with the trained mask of
data.loss_on (`qwen3exp.data.chat.render`, the code the pre-launch checks and the plan ran), fitted
to training.seq_len (data.max_len_policy: drop or truncate; `chat_render.fit`), and yielded as
torchtitan's text datasets yield a sample: `{"input": ids, "positions": ...}` and labels. A
conversation of n + 1 tokens fills n positions: inputs are its tokens but the last, labels[i] the
token after input i where that token is trained, else torchtitan's IGNORE_INDEX (-100, which
`torchtitan.components.loss.cross_entropy_loss` ignores and the trainer leaves out of its count of
valid tokens, so the step loss is the mean over the trained tokens of all ranks). Padding (the
tokenizer's pad token, else its eos) fills the rest of the sequence, its labels ignored.

data.pack=false: one conversation per sequence, positions 0..seq_len-1 (the padding follows the
conversation: the causal mask keeps it out of the conversation's attention).
data.pack=true: whole conversations packed greedily in read order (`chat_render.packs`: one that
does not fit in what is left starts the next sequence), each with positions from 0, and the padding
tail with positions from 0 of its own. A document starts where its position is 0: the attention of
every backend builds its block-causal document mask from the positions (torchtitan's
`get_attention_masks`; `qwen3exp.titan.attention`, `qwen3exp.titan.hf_model`), so no token attends
across a conversation boundary. The last sequence of an epoch is padded (no conversation spans two
epochs).

Sharding: the conversations of the part (`held_out`: training takes the others, validation the held
out ones; the same split as data=local) are dealt out round-robin, conversation i to data-parallel
rank i mod dp_world_size. The first epoch reads them in file order, later ones reshuffled (seed 42 +
epoch, as torchtitan's datasets do). The read position (the first conversation not yet in a yielded
sequence; a packed sequence is never held half-filled between two yields) is saved with dcp
checkpoints, so a resumed run reads exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.loss import IGNORE_INDEX

from qwen3exp.data.chat.render import Rendered, fit, load_tokenizer, messages_of, packs, records, render
from qwen3exp.data.files import held_out

TRAIN, VALIDATION, ALL = "train", "validation", "all"


def part_of(path: str, part: str, fraction: float | None) -> list[str]:
    """The records (JSON lines) of `path` that `part` reads: all, or the training or held-out side."""
    lines = [line for _, _, line in records(path)]
    if part == ALL or fraction is None:
        return lines
    held = set(held_out(len(lines), fraction))
    return [line for i, line in enumerate(lines) if (i in held) == (part == VALIDATION)]


def sample(
    rs: list[Rendered], seq_len: int, pad_id: int, *, pack: bool = False
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Fitted conversations (one unless `pack`) as (inputs, labels) of seq_len positions."""
    inputs: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    for r in rs:
        inputs += r.ids[:-1]
        labels += [t if on else IGNORE_INDEX for t, on in zip(r.ids[1:], r.trained[1:], strict=True)]
        positions += range(len(r.ids) - 1)
    tail = seq_len - len(inputs)
    inputs += [pad_id] * tail
    labels += [IGNORE_INDEX] * tail
    # pack: the padding is a document of its own; else it continues the conversation's positions.
    positions = positions + list(range(tail)) if pack else list(range(seq_len))
    ids, pos = torch.tensor(inputs, dtype=torch.long), torch.tensor(positions, dtype=torch.long)
    return {"input": ids, "positions": pos}, torch.tensor(labels, dtype=torch.long)


class ChatDataset(IterableDataset, Stateful):
    def __init__(self, config: ChatDataLoader.Config, *, seq_len: int, dp_rank: int, dp_world_size: int) -> None:
        self.config, self.seq_len = config, seq_len
        self._lines = part_of(config.path, config.part, config.fraction)[dp_rank::dp_world_size]
        self._tok = load_tokenizer(config.tokenizer_path)
        pad = self._tok.pad_token_id if self._tok.pad_token_id is not None else self._tok.eos_token_id
        self._pad = int(pad or 0)
        self._sample_idx = 0
        self._epoch = 0

    def _order(self) -> list[int]:
        order = list(range(len(self._lines)))
        if self._epoch > 0:
            random.Random(42 + self._epoch).shuffle(order)
        return order

    def _fitted(self, order: list[int]) -> Iterator[tuple[int, Rendered]]:
        """(position in `order`, fitted conversation) of this epoch from the read position on, the
        ones data.max_len_policy drops left out."""
        c = self.config
        for i in range(self._sample_idx, len(order)):
            messages = messages_of(self._lines[order[i]], c.messages_field)
            r = fit(render(self._tok, messages, c.loss_on), self.seq_len, c.max_len_policy)
            if r is not None:
                yield i, r

    def __iter__(self):
        c = self.config
        while True:
            order, yielded = self._order(), False
            groups = (
                packs(self._fitted(order), lambda x: len(x[1].ids) - 1, self.seq_len)
                if c.pack
                else ([x] for x in self._fitted(order))
            )
            for group in groups:
                # Past the group's last conversation: a resumed run renders the next ones again.
                self._sample_idx, yielded = group[-1][0] + 1, True
                yield sample([r for _, r in group], self.seq_len, self._pad, pack=c.pack)
            if not c.infinite:
                return
            if not yielded and self._sample_idx == 0:
                raise ValueError(
                    f"data=chat: none of this rank's {len(order)} conversation(s) of {c.path} fits "
                    f"training.seq_len={self.seq_len} (data.max_len_policy={c.max_len_policy})"
                )
            self._sample_idx, self._epoch = 0, self._epoch + 1

    def state_dict(self) -> dict[str, Any]:
        return {"sample_idx": self._sample_idx, "epoch": self._epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._sample_idx, self._epoch = state_dict["sample_idx"], state_dict["epoch"]


class OwnDataLoader(ParallelAwareDataloader):
    """torchtitan's dataloader over one of qwen3exp's own datasets, built from the loader's config by
    `build_dataset`: conversations (below), pairs (`preference_dataset`), mixtures (`mixture_dataset`)."""

    dataset: type
    """The IterableDataset class this loader reads."""

    def __init__(
        self,
        config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer=None,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = 1,
        **kwargs,
    ):
        ds = self.build_dataset(
            config, tokenizer=tokenizer, seq_len=seq_len, dp_rank=dp_rank, dp_world_size=dp_world_size
        )
        super().__init__(
            ds,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            num_workers=config.num_workers,
            persistent_workers=config.persistent_workers,
            pin_memory=config.pin_memory,
            prefetch_factor=config.prefetch_factor,
            snapshot_every_n_steps=snapshot_every_n_steps,
            batch_size=local_batch_size,
        )

    def build_dataset(self, config, *, tokenizer, seq_len: int, dp_rank: int, dp_world_size: int):
        """The dataset of this rank (the tokenizer: torchtitan's, unused by datasets that render their own)."""
        return self.dataset(config, seq_len=seq_len, dp_rank=dp_rank, dp_world_size=dp_world_size)


class ChatDataLoader(OwnDataLoader):
    """torchtitan's dataloader over `ChatDataset` (built by the trainer and by the validator)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        path: str = ""
        """data.path (or validation.path)."""
        messages_field: str = "messages"
        loss_on: str = "assistant"
        max_len_policy: str = "drop"
        pack: bool = False
        """data.pack: several conversations per sequence, each its own document."""
        tokenizer_path: str = ""
        """The run's tokenizer folder (hf_assets_path): its chat template renders the conversations."""
        part: str = ALL
        """train, validation (the two sides of the held-out split) or all."""
        fraction: float | None = None
        """validation.fraction held out (None: no split)."""
        infinite: bool = True

    dataset: type = ChatDataset


def loader_config(exp, tokenizer_path: str, *, validation: bool) -> ChatDataLoader.Config:
    """The dataloader of data=chat for training, or for the validator (the held-out conversations,
    or all of validation.path)."""
    d = exp.data
    path, part, fraction = split_of(exp, validation)
    return ChatDataLoader.Config(
        path=str(path),
        messages_field=d.messages_field,
        loss_on=d.loss_on,
        max_len_policy=d.max_len_policy,
        pack=d.pack,
        tokenizer_path=tokenizer_path,
        part=part,
        fraction=fraction,
        infinite=True,
    )


def split_of(exp, validation: bool) -> tuple[str, str, float | None]:
    """(path, part, fraction) a loader reads: for the validator the held-out records (or all of
    validation.path), for training the rest (all of data.path without a split)."""
    d, v = exp.data, exp.validation
    if validation and v.path is not None:
        return str(v.path), ALL, None
    part = ALL if v.held_out is None else (VALIDATION if validation else TRAIN)
    return str(d.location), part, v.held_out


def use_chat_loaders(config, exp, tokenizer_path: str) -> None:
    """Put data=chat's dataloaders into a built Trainer.Config (training's, and the validator's when
    validation is on), in place of the text loaders `to_torchtitan` builds for every source."""
    config.dataloader = loader_config(exp, tokenizer_path, validation=False)
    if exp.validation.enable:
        config.validator.dataloader = loader_config(exp, tokenizer_path, validation=True)
