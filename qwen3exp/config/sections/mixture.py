"""`data=mix`: several sources, each one of the data kinds, blended by weight.

A mixture composes the kinds; it is not one. Each source is a kind's own section (`source: bundled`,
`local`, `hf`, `chat` or `preference`, with that kind's keys) plus what the mixture adds to it
(`Share`: its weight, how often it may repeat, its own validation file). No kind's code knows about
mixtures: the classes here are made from the kinds' classes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from qwen3exp.config.sections.base import Strict, tagged
from qwen3exp.config.sections.data import BundledData, ChatData, HFData, LocalData, PreferenceData

SOURCE_NAME = r"^[a-z][a-z0-9_]{0,31}$"
"""A source's name: it names metrics (`val_loss_<name>`) and summary keys, so a plain identifier."""


class Share(Strict):
    """What a mixture adds to one source."""

    weight: Annotated[float, Field(ge=0)] = 1.0
    """The source's share of the trained tokens, normalised over the sources (0: the source is off)."""
    max_epochs: Annotated[float, Field(gt=0)] | None = None
    """The most times the source's training records may be read within training.steps (null: no limit)."""
    over_max_epochs: Literal["refuse", "cap"] = "refuse"
    """A source the plan finds would be read more than max_epochs times: refuse the run (exit 2), or
    cap it (it stops after max_epochs; the other sources fill its place)."""
    validation_path: str | None = None
    """The source's own held-out file or folder (its kind's format); null: validation.fraction of its
    own records is held out, as a one-source run holds out."""


class MixedBundled(BundledData, Share):
    """The bundled corpus as one source of a mixture."""


class MixedLocal(LocalData, Share):
    """Local text files as one source of a mixture."""


class MixedHF(HFData, Share):
    """A Hugging Face dataset read as plain text, as one source of a mixture."""


class MixedChat(ChatData, Share):
    """Conversations as one source of a mixture."""


class MixedPreference(PreferenceData, Share):
    """Preference pairs as one source of a mixture."""


Source = Annotated[
    MixedBundled | MixedLocal | MixedHF | MixedChat | MixedPreference,
    Field(discriminator="source"),
]


class MixtureData(Strict):
    """Several sources read in one run, blended by weight (`qwen3exp.data.mixture`)."""

    source: Literal["mix"] = "mix"
    sources: dict[Annotated[str, Field(pattern=SOURCE_NAME)], Source]
    """Source name -> source: each a data kind's section with `weight` (and optionally `max_epochs`,
    `over_max_epochs`, `validation_path`)."""

    @model_validator(mode="after")
    def _some_weight(self) -> MixtureData:
        if not self.sources:
            raise ValueError(tagged("sources", {}, "a mixture needs at least one source", "a mapping name -> source"))
        if not any(s.weight > 0 for s in self.sources.values()):
            weights = {n: s.weight for n, s in self.sources.items()}
            raise ValueError(tagged("sources", weights, "every source's weight is 0", "at least one weight above 0"))
        return self

    @property
    def weights(self) -> dict[str, float]:
        """Each source's normalised weight (they sum to 1)."""
        total = sum(s.weight for s in self.sources.values())
        return {n: s.weight / total for n, s in self.sources.items()}

    @property
    def causal_attention(self) -> bool:
        """No source's sequences need a document mask (`qwen3exp.plan.attention_path`)."""
        return all(s.causal_attention for s in self.sources.values())


Data = Annotated[
    BundledData | LocalData | HFData | ChatData | PreferenceData | MixtureData, Field(discriminator="source")
]
"""The data section: one kind (`Kind`), or a mixture of sources."""
