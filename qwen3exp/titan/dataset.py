"""Local text datasets for torchtitan's HuggingFaceTextDataLoader (no network), and the held-out
validation split.

torchtitan's built-in datasets (c4, ...) download from the Hub. This registers local entries in
`torchtitan.hf_datasets.text_datasets.DATASETS` that read .jsonl/.json files (one {"text": ...} per
line) or .txt files (one document per blank-line separated paragraph) with `datasets`, offline.
data=hf reads the files `qwen3exp.data.text.hf_source` resolves (a dataset in the local Hugging
Face cache, or local parquet/json/arrow/csv files) through their `datasets` builder, streamed when
data.streaming (a stream's held-out rows: `qwen3exp.data.text.hf_files.is_held_out`, row by row).
Registration happens in every rank (the conversion runs there), so the names resolve everywhere.

The held-out split (`validation.fraction`, when validation has no path of its own): of the n
documents, the round(n x fraction) whose position ranks lowest under a fixed hash are held out
(`held_out`). The set depends only on n and the fraction, not on the rank, the seed or the
run, so every run of a dataset validates on the same documents and trains on the rest: the
training entry and the validation entry select complementary rows of the same loaded dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, partial

from qwen3exp.config.sections.data import HFData

# The file listing and the split are plain Python, shared with the pre-launch checks of the data
# (which must not import torchtitan), so both read the same files in the same order and the plan
# refuses a split that would leave a rank nothing to train on.
from qwen3exp.data.figures import separator, tokenizer_eos
from qwen3exp.data.files import data_files, held_out
from qwen3exp.data.text.hf_files import is_held_out
from qwen3exp.data.text.hf_source import resolve

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
    return _part(ds, part=part, fraction=fraction)


def _part(ds, *, part: str, fraction: float | None):
    """The training or the validation rows of a loaded dataset (all of them without a fraction). A
    stream's length is unknown: its rows are held out one by one (`hf_data_files.is_held_out`)."""
    if part == ALL or fraction is None:
        return ds
    keep_held = part == VALIDATION
    if not hasattr(ds, "__len__"):  # a datasets.IterableDataset (data.streaming)
        return ds.filter(lambda _, i: is_held_out(i, fraction) == keep_held, with_indices=True)
    held = set(held_out(len(ds), fraction))
    return ds.select([i for i in range(len(ds)) if (i in held) == keep_held])


def _load_hf(_path: str, *, data, part: str, fraction: float | None):
    """data=hf: the resolved files (the plan checked them) through their `datasets` builder, offline."""
    from datasets import load_dataset  # lazy: heavy (pyarrow, pandas); only when a rank loads the data

    src, problems = resolve(data)
    if src is None:
        raise ValueError("; ".join(p.render() for p in problems))
    ds = load_dataset(src.builder, data_files=list(src.files), split="train", streaming=data.streaming)
    return _part(ds, part=part, fraction=fraction)


def _entry(path: str, text_field: str, *, part: str, fraction: float | None):
    from torchtitan.hf_datasets import DatasetConfig  # lazy: torchtitan in the ranks only

    # The "text" loader of `datasets` always names its column "text".
    field = "text" if all(f.endswith(".txt") for f in data_files(path)) else text_field
    return DatasetConfig(
        path=str(path),
        loader=partial(_load, part=part, fraction=fraction),
        sample_processor=lambda sample: sample[field],
    )


def register(
    path: str, text_field: str = "text", *, held_out_fraction: float | None = None, hf=None, name: str = DATASET_NAME
) -> str:
    """The training dataset: every document of `path`, less the held-out ones (if a fraction);
    `hf`: a data=hf section, read instead of `path`. `name`: the entry's name (a mixture registers
    one per source)."""
    from torchtitan.hf_datasets.text_datasets import DATASETS  # lazy: torchtitan in the ranks only

    if hf is not None:
        return register_hf(hf, held_out_fraction=held_out_fraction, name=name)
    part = TRAIN if held_out_fraction is not None else ALL
    DATASETS[name] = _entry(path, text_field, part=part, fraction=held_out_fraction)
    return name


def hf(data) -> HFData | None:
    """The data section when it is data=hf (read by `register_hf`), else None."""
    return data if isinstance(data, HFData) else None


def _hf_entry(data, *, part: str, fraction: float | None):
    from torchtitan.hf_datasets import DatasetConfig  # lazy: torchtitan in the ranks only

    field = data.text_field
    return DatasetConfig(
        path=str(data.name or data.files),
        loader=partial(_load_hf, data=data, part=part, fraction=fraction),
        sample_processor=lambda sample: sample[field],
    )


def register_hf(
    data, *, held_out_fraction: float | None = None, validation: bool = False, name: str | None = None
) -> str:
    """data=hf (an HFData section): the training rows (less the held-out ones, if a fraction), or
    with `validation` the held-out rows; `name`: the entry's name (None: the one-source names)."""
    from torchtitan.hf_datasets.text_datasets import DATASETS  # lazy: torchtitan in the ranks only

    part = (VALIDATION if validation else TRAIN) if held_out_fraction is not None else ALL
    name = name or (VALIDATION_NAME if validation else DATASET_NAME)
    DATASETS[name] = _hf_entry(data, part=part, fraction=held_out_fraction)
    return name


def register_validation(path: str, text_field: str = "text", *, held_out_fraction: float | None = None, hf=None) -> str:
    """The validation dataset: the held-out documents of `path` (a fraction), or all of `path` (a
    separate validation path); `hf`: a data=hf section whose held-out rows are read instead."""
    from torchtitan.hf_datasets.text_datasets import DATASETS  # lazy: torchtitan in the ranks only

    if hf is not None:
        return register_hf(hf, held_out_fraction=held_out_fraction, validation=True)
    part = VALIDATION if held_out_fraction is not None else ALL
    DATASETS[VALIDATION_NAME] = _entry(path, text_field, part=part, fraction=held_out_fraction)
    return VALIDATION_NAME


@cache
def _separated_tokenizer():
    """torchtitan's HuggingFaceTokenizer whose eos_id (the id its text dataset appends to every
    document, `encode(text, add_eos=True)`) is the token data.eos chose (`qwen3exp.data.figures.separator`)."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer  # lazy: torchtitan in the ranks only

    class SeparatedTokenizer(HuggingFaceTokenizer):
        @dataclass(kw_only=True, slots=True)
        class Config(HuggingFaceTokenizer.Config):
            eos: str = ""
            """The document separator (the plan resolved and checked it)."""

        def __init__(self, config: Config, *, tokenizer_path: str):
            super().__init__(config, tokenizer_path=tokenizer_path)
            eos_id = self.tokenizer.token_to_id(config.eos)
            if eos_id is None:
                raise ValueError(f"data.eos {config.eos!r} is not a token of the tokenizer in {tokenizer_path}")
            self.eos_token, self.eos_id = config.eos, eos_id
            self.hf_adds_eos = eos_id in self.tokenizer.encode("").ids

    return SeparatedTokenizer


def tokenizer_config(exp, tokenizer_path: str):
    """The trainer's tokenizer config: plain-text data's documents end with the separator the plan
    chose (data.eos; null: the end-of-text token); torchtitan's own when that is the tokenizer's eos_token
    already (the bundled tokenizer's `<|endoftext|>`), and for data=chat (its loader renders on its own)."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer  # lazy: torchtitan in the ranks only

    sep = separator(exp.data, tokenizer_path)
    if sep is None or sep[0] == tokenizer_eos(tokenizer_path):
        return HuggingFaceTokenizer.Config()
    return _separated_tokenizer().Config(eos=sep[0])
