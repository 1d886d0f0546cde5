"""Local text datasets for torchtitan's HuggingFaceTextDataLoader (no network).

torchtitan's built-in datasets (c4, ...) download from the Hub. This registers a local entry in
`torchtitan.hf_datasets.text_datasets.DATASETS` that reads .jsonl/.json files (one {"text": ...} per
line) or .txt files (one document per blank-line separated paragraph) with `datasets`, offline.
Registration happens in every rank (the conversion runs there), so the name resolves everywhere.
"""

from __future__ import annotations

from functools import partial

# The file listing is plain Python, shared with the pre-launch checks of the data (which must not
# import torchtitan), so both read the same files in the same order.
from qwen3exp.plan.data_files import data_files

DATASET_NAME = "qwen3exp_local"


def _load(path: str, *, text_field: str):
    from datasets import load_dataset

    files = data_files(path)
    if all(f.endswith(".txt") for f in files):
        return load_dataset("text", data_files=files, split="train", sample_by="paragraph")
    return load_dataset("json", data_files=files, split="train")


def register(path: str, text_field: str = "text") -> str:
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    # The "text" loader of `datasets` always names its column "text".
    field = "text" if all(f.endswith(".txt") for f in data_files(path)) else text_field
    DATASETS[DATASET_NAME] = DatasetConfig(
        path=str(path),
        loader=partial(_load, text_field=field),
        sample_processor=lambda sample: sample[field],
    )
    return DATASET_NAME
