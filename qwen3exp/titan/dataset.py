"""Local text datasets for torchtitan's HuggingFaceTextDataLoader (no network), and the held-out
validation split.

torchtitan's built-in datasets (c4, ...) download from the Hub. This registers local entries in
`torchtitan.hf_datasets.text_datasets.DATASETS` that read .jsonl/.json files (one {"text": ...} per
line) or .txt files (one document per blank-line separated paragraph) with `datasets`, offline.
Registration happens in every rank (the conversion runs there), so the names resolve everywhere.

The held-out split (`validation.fraction`, when validation has no path of its own): of the n
documents, the round(n x fraction) whose position ranks lowest under a fixed hash are held out
(`held_out`). The set depends only on n and the fraction, not on the rank, the seed or the
run, so every run of a dataset validates on the same documents and trains on the rest: the
training entry and the validation entry select complementary rows of the same loaded dataset.
"""

from __future__ import annotations

from functools import partial

# The file listing and the split are plain Python, shared with the pre-launch checks of the data
# (which must not import torchtitan), so both read the same files in the same order and the plan
# refuses a split that would leave a rank nothing to train on.
from qwen3exp.plan.data_files import data_files, held_out

DATASET_NAME = "qwen3exp_local"
VALIDATION_NAME = "qwen3exp_validation"
TRAIN, VALIDATION, ALL = "train", "validation", "all"


def _load(path: str, *, part: str, fraction: float | None):
    from datasets import load_dataset  # lazy: heavy (pyarrow, pandas); only when a rank loads the data

    files = data_files(path)
    if all(f.endswith(".txt") for f in files):
        ds = load_dataset("text", data_files=files, split="train", sample_by="paragraph")
    else:
        ds = load_dataset("json", data_files=files, split="train")
    if part == ALL or fraction is None:
        return ds
    held = set(held_out(len(ds), fraction))
    return ds.select([i for i in range(len(ds)) if (i in held) == (part == VALIDATION)])


def _entry(path: str, text_field: str, *, part: str, fraction: float | None):
    from torchtitan.hf_datasets import DatasetConfig  # lazy: torchtitan in the ranks only

    # The "text" loader of `datasets` always names its column "text".
    field = "text" if all(f.endswith(".txt") for f in data_files(path)) else text_field
    return DatasetConfig(
        path=str(path),
        loader=partial(_load, part=part, fraction=fraction),
        sample_processor=lambda sample: sample[field],
    )


def register(path: str, text_field: str = "text", *, held_out_fraction: float | None = None) -> str:
    """The training dataset: every document of `path`, less the held-out ones (if a fraction)."""
    from torchtitan.hf_datasets.text_datasets import DATASETS  # lazy: torchtitan in the ranks only

    part = TRAIN if held_out_fraction is not None else ALL
    DATASETS[DATASET_NAME] = _entry(path, text_field, part=part, fraction=held_out_fraction)
    return DATASET_NAME


def register_validation(path: str, text_field: str = "text", *, held_out_fraction: float | None = None) -> str:
    """The validation dataset: the held-out documents of `path` (a fraction), or all of `path` (a
    separate validation path)."""
    from torchtitan.hf_datasets.text_datasets import DATASETS  # lazy: torchtitan in the ranks only

    part = VALIDATION if held_out_fraction is not None else ALL
    DATASETS[VALIDATION_NAME] = _entry(path, text_field, part=part, fraction=held_out_fraction)
    return VALIDATION_NAME
