"""The `data` section (bundled corpus or local files) and the `validation` section (the held-out loss)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from qwen3exp.config.sections.base import PosInt, Strict


class BundledData(Strict):
    source: Literal["bundled"] = "bundled"
    """The small corpus shipped with qwen3exp (CPython standard-library docstrings)."""


class LocalData(Strict):
    source: Literal["local"] = "local"
    path: str
    """A .jsonl file (one {"text": ...} per line), a .txt file (one document per blank-line
    separated paragraph), or a folder of such files."""
    text_field: str = "text"


Data = Annotated[BundledData | LocalData, Field(discriminator="source")]


class Validation(Strict):
    """A held-out loss, measured by torchtitan's validator on documents no training step reads."""

    enable: bool = True
    freq: PosInt = 10
    """Validate at step 1, every `freq` steps and at the last step."""
    steps: PosInt = 2
    """Batches per validation (local_batch_size x seq_len tokens per data-parallel rank each)."""
    fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    """Without `path`: the share of the training documents held out, the same ones every run
    (ranked by a fixed hash of their position); training never reads them."""
    path: str | None = None
    """A separate validation file or folder (the formats of data.path); training then reads all of
    its own documents."""

    @property
    def held_out(self) -> float | None:
        """The fraction of the training data held out (None: a separate path, or no validation)."""
        return self.fraction if self.enable and self.path is None else None
