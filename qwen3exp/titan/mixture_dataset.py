"""data=mix in the ranks: one dataloader that blends the sources' own datasets by trained tokens.

Each source is read by its kind's rank-side dataset, unchanged: plain text (bundled, local, hf) by
torchtitan's `HuggingFaceTextDataset` over the entry `qwen3exp.titan.dataset` registers for it (one
name per source), conversations by `chat_dataset.ChatDataset`, pairs by
`preference_dataset.PreferenceDataset`. Each shards by data-parallel rank as it does alone, so the
ranks read disjoint data. The next sample comes from the source `qwen3exp.data.mixture.Blend`
picks (the largest deficit of trained tokens against the weight); a pair is drawn whole (both its
sides, rows 2i and 2i + 1). The dataset counts, per source, the trained tokens (labels not
IGNORE_INDEX) of what it yields and writes them for the launcher (`qwen3exp.titan.data_tokens`:
summary.json's `data_tokens`). A source capped by max_epochs (over_max_epochs=cap) is drawn no more
once its records were read that many times; when every source is capped the data ends (torchtitan
stops at the last whole step).

The state saved with dcp checkpoints is every source's own state, the blend's and the counters, so
a resumed run sees exactly the samples an uninterrupted one would. A mixture of one source yields
exactly the samples that source's kind yields alone (the same child with the same arguments).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

from qwen3exp.data.mixture import Blend
from qwen3exp.titan import data_tokens
from qwen3exp.titan.chat_dataset import ChatDataLoader, ChatDataset, OwnDataLoader
from qwen3exp.titan.preference_dataset import PreferenceDataLoader, PreferenceDataset


@dataclass(kw_only=True, slots=True)
class SourceSpec:
    """One source of the mixture as the ranks read it."""

    name: str
    weight: float
    """Normalised (the weights of the sources sum to 1)."""
    max_epochs: float | None = None
    """Capped once its records were read this many times (None: never; a refused one the plan refused)."""
    loader: Any = None
    """The kind's own dataloader config: torchtitan's text loader's, ChatDataLoader's or PreferenceDataLoader's."""


def epochs_read(child) -> float | None:
    """How many times a source's dataset has read its records in this rank (None: a stream, unknown)."""
    if isinstance(child, PreferenceDataset):
        return child._epoch + child._pair_idx / max(len(child._lines), 1)
    if isinstance(child, ChatDataset):
        return child._epoch + child._sample_idx / max(len(child._lines), 1)
    if isinstance(child._data, Dataset):  # torchtitan's text dataset over a map-style dataset
        return child._epoch + child._sample_idx / max(len(child._data), 1)
    return None


class MixtureDataset(IterableDataset, Stateful):
    def __init__(self, config: MixtureDataLoader.Config, *, tokenizer, seq_len: int, dp_rank: int, dp_world_size: int):
        self.config, self.dp_rank = config, dp_rank
        self.sources = list(config.sources)
        self.children = [self._child(s.loader, tokenizer, seq_len, dp_rank, dp_world_size) for s in self.sources]
        # A pair's two sides are drawn together (a batch holds whole pairs).
        self.units = [2 if isinstance(s.loader, PreferenceDataLoader.Config) else 1 for s in self.sources]
        self.blend = Blend(weights=[s.weight for s in self.sources])
        self._iters: list[Any] = [None] * len(self.sources)
        self._unrecorded = 0
        self._record_file = data_tokens.Record(config.record_dir, dp_rank) if config.record_dir else None

    @staticmethod
    def _child(loader, tokenizer, seq_len: int, dp_rank: int, dp_world_size: int):
        """The source's own dataset, built as its kind's dataloader builds it."""
        if isinstance(loader, (ChatDataLoader.Config, PreferenceDataLoader.Config)):
            cls = (
                PreferenceDataLoader.dataset
                if isinstance(loader, PreferenceDataLoader.Config)
                else ChatDataLoader.dataset
            )
            return cls(loader, seq_len=seq_len, dp_rank=dp_rank, dp_world_size=dp_world_size)
        return HuggingFaceTextDataset(
            dataset_name=loader.dataset,
            dataset_path=loader.dataset_path,
            tokenizer=tokenizer,
            seq_len=seq_len,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            infinite=loader.infinite,
        )

    def _draw(self, i: int) -> list:
        if self._iters[i] is None:
            self._iters[i] = iter(self.children[i])
        return [next(self._iters[i]) for _ in range(self.units[i])]

    def __iter__(self):
        while (i := self.blend.next()) is not None:
            unit = self._draw(i)
            self.blend.add(i, sum(int((labels != IGNORE_INDEX).sum()) for _, labels in unit))
            cap = self.sources[i].max_epochs
            if cap is not None and (read := epochs_read(self.children[i])) is not None and read >= cap:
                self.blend.cap(i)
            for sample in unit:
                self._record()
                yield sample

    def _record(self) -> None:
        """The counts for the launcher, once per local batch (as its last sample is yielded: the
        counts already hold it)."""
        self._unrecorded += 1
        if self._unrecorded >= self.config.record_every and self._record_file is not None:
            self._unrecorded = 0
            self._record_file.write(self.tokens())

    def tokens(self) -> dict[str, int]:
        """The trained tokens each source gave in this rank so far."""
        return {s.name: t for s, t in zip(self.sources, self.blend.tokens, strict=True)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "blend": self.blend.state_dict(),
            "sources": {s.name: c.state_dict() for s, c in zip(self.sources, self.children, strict=True)},
            "unrecorded": self._unrecorded,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.blend.load_state_dict(state_dict["blend"])
        for s, c in zip(self.sources, self.children, strict=True):
            c.load_state_dict(state_dict["sources"][s.name])
        self._unrecorded = state_dict["unrecorded"]
        self._iters = [None] * len(self.sources)  # the children continue from their loaded state


class MixtureDataLoader(OwnDataLoader):
    """torchtitan's dataloader over `MixtureDataset` (built by the trainer)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        sources: list[SourceSpec] = field(default_factory=list)
        """In the order of data.sources."""
        record_dir: str = ""
        """The run directory: the counts go to its logs/data_tokens/ ("": not written)."""
        record_every: int = 1
        """Samples between two writes of the counts (training.local_batch_size)."""

    def build_dataset(self, config, *, tokenizer, seq_len: int, dp_rank: int, dp_world_size: int):
        return MixtureDataset(
            config, tokenizer=tokenizer, seq_len=seq_len, dp_rank=dp_rank, dp_world_size=dp_world_size
        )
