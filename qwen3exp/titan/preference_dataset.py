"""data=preference in the ranks: a torchtitan dataloader yielding each pair's chosen and rejected
sequences side by side (rows 2i and 2i + 1 of a batch: training.local_batch_size is even).

Each side is rendered by the run's chat template with chat SFT's mask of the final assistant turn
(`qwen3exp.data.preference.pairs`, the code the pre-launch checks and the plan ran), fitted to
training.seq_len (a pair with a side that does not fit: data.max_len_policy, drop or truncate) and
laid out as data=chat lays out one conversation (`chat_dataset.sample`: inputs, positions 0..seq_len-1,
labels the next token where counted, else -100, padding untrained). The pairs are dealt out
round-robin over the data-parallel ranks, read in file order in the first epoch and reshuffled after
(as data=chat); the read position (the next pair) is saved with dcp checkpoints.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader

from qwen3exp.data.chat.render import load_tokenizer
from qwen3exp.data.preference.pairs import fit_pair, pair_of, render_pair
from qwen3exp.plan import reference_model
from qwen3exp.titan.chat_dataset import ALL, ChatDataLoader, part_of, sample, split_of


class PreferenceDataset(IterableDataset, Stateful):
    def __init__(self, config: PreferenceDataLoader.Config, *, seq_len: int, dp_rank: int, dp_world_size: int):
        self.config, self.seq_len = config, seq_len
        lines = part_of(config.path, config.part, config.fraction)
        self._lines = lines[dp_rank::dp_world_size]
        self._index = list(range(len(lines)))[dp_rank::dp_world_size]  # each pair's index in the part
        self._tok = load_tokenizer(config.tokenizer_path)
        pad = self._tok.pad_token_id if self._tok.pad_token_id is not None else self._tok.eos_token_id
        self._pad = int(pad or 0)
        self._pair_idx = 0
        self._epoch = 0

    def _order(self) -> list[int]:
        order = list(range(len(self._lines)))
        if self._epoch > 0:
            random.Random(42 + self._epoch).shuffle(order)
        return order

    def __iter__(self):
        c = self.config
        while True:
            order, yielded = self._order(), False
            for i in range(self._pair_idx, len(order)):
                sides = fit_pair(render_pair(self._tok, pair_of(self._lines[order[i]])), self.seq_len, c.max_len_policy)
                if sides is None:
                    continue
                self._pair_idx, yielded = i + 1, True  # a batch holds whole pairs: saved between two pairs
                for side in sides:
                    inputs, labels = sample([side], self.seq_len, self._pad)
                    if c.indexed:  # reference_logps=precomputed: the stored values are looked up by pair
                        inputs["pair"] = torch.tensor(self._index[order[i]])
                    yield inputs, labels
            if not c.infinite:
                return
            if not yielded and self._pair_idx == 0:
                raise ValueError(
                    f"data=preference: none of this rank's {len(order)} pair(s) of {c.path} fits "
                    f"training.seq_len={self.seq_len} (data.max_len_policy={c.max_len_policy})"
                )
            self._pair_idx, self._epoch = 0, self._epoch + 1

    def state_dict(self) -> dict[str, Any]:
        return {"pair_idx": self._pair_idx, "epoch": self._epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pair_idx, self._epoch = state_dict["pair_idx"], state_dict["epoch"]


class PreferenceDataLoader(ChatDataLoader):
    """torchtitan's dataloader over `PreferenceDataset` (built by the trainer)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):  # not ChatDataLoader's: no messages_field, loss_on, pack
        path: str = ""
        """data.path (or the bundled pairs)."""
        max_len_policy: str = "drop"
        tokenizer_path: str = ""
        """The run's tokenizer folder (hf_assets_path): its chat template renders both sides."""
        part: str = ALL
        """train, validation (the two sides of the held-out split, as data=chat) or all."""
        fraction: float | None = None
        infinite: bool = True
        indexed: bool = False
        """Each sample also carries its pair's index in the part (`pair`, popped before the model)."""

    dataset = PreferenceDataset  # ChatDataLoader's __init__ over this dataset


def loader_config(exp, tokenizer_path: str, *, validation: bool = False) -> PreferenceDataLoader.Config:
    """The dataloader of data=preference for training, or for the validator (the held-out pairs, or
    all of validation.path); indexed when the reference's log-probs are precomputed."""
    path, part, fraction = split_of(exp, validation)
    indexed = reference_model.precomputed(exp)
    return PreferenceDataLoader.Config(
        path=path,
        max_len_policy=exp.data.max_len_policy,
        tokenizer_path=tokenizer_path,
        part=part,
        fraction=fraction,
        indexed=indexed,
    )
