"""data=mix in the Trainer.Config: the config of the run's first source, with the mixture's dataloader.

A mixture is not a kind: `mixed` builds the Trainer.Config that a run of the mixture's first source
(with a weight) alone would train with (`first_source`: its trainer, loss, validator), then puts the
mixture's dataloader (`qwen3exp.titan.mixture_dataset`) in place of that source's, each source read
by its kind's own loader config (`_spec`: torchtitan's text loader over the entry
`qwen3exp.titan.dataset.register` makes for it under its own name, `chat_dataset.loader_config`,
`preference_dataset.loader_config`), and the tokenizer config of the mixture's first plain-text
source (the separator its documents end with; `dataset.tokenizer_config`). So a mixture of one source
trains exactly as that source alone. The validator is the mixture's (`qwen3exp.titan.mixture_validator`:
one held-out loss per source). Plain Python at import: torchtitan is imported lazily.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from qwen3exp.config.sections.data import ChatData, PreferenceData
from qwen3exp.config.sections.mixture import MixedChat, MixedPreference
from qwen3exp.plan import model_files


def first_source(exp):
    """`exp` reading only its first source with a weight (a kind's own section)."""
    name = next(n for n, s in exp.data.sources.items() if s.weight > 0)
    return exp.model_copy(update={"data": exp.data.sources[name]})


def _text_source(exp):
    """`exp` reading its first plain-text source (its separator ends the text documents), else the first source."""
    texts = {n: s for n, s in exp.data.sources.items() if not isinstance(s, (ChatData, PreferenceData))}
    # One tokenizer, one separator: sources that resolve to different ones are refused before launch
    # (`qwen3exp.data.mixture_checks`).
    return exp.model_copy(update={"data": next(iter(texts.values()))}) if texts else first_source(exp)


def _spec(exp, name: str, source, tokenizer_path: str, data_path):
    """The source's `SourceSpec`: its normalised weight, its cap, its kind's own loader config."""
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader  # lazy: torchtitan in the ranks

    from qwen3exp.titan import chat_dataset, dataset, preference_dataset  # lazy: import torchtitan
    from qwen3exp.titan.mixture_dataset import SourceSpec  # lazy: imports torchtitan

    # A source with its own validation file trains on all of its records; else on the rest of the
    # held-out split, as a one-source run does.
    fraction = None if source.validation_path is not None else exp.validation.held_out
    part = chat_dataset.ALL if fraction is None else chat_dataset.TRAIN
    one = exp.model_copy(update={"data": source})
    loader: Any
    if isinstance(source, MixedPreference):
        loader = dataclasses.replace(
            preference_dataset.loader_config(one, tokenizer_path), part=part, fraction=fraction
        )
    elif isinstance(source, MixedChat):
        cfg = chat_dataset.loader_config(one, tokenizer_path, validation=False)
        loader = dataclasses.replace(cfg, part=part, fraction=fraction)
    else:
        path = str(data_path(one))
        text_field = source.text_field if source.source == "local" else "text"
        entry = dataset.register(
            path, text_field, held_out_fraction=fraction, hf=dataset.hf(source), name=f"{dataset.DATASET_NAME}_{name}"
        )
        loader = HuggingFaceTextDataLoader.Config(dataset=entry, dataset_path=path, infinite=True)
    cap = source.max_epochs if source.over_max_epochs == "cap" else None
    return SourceSpec(name=name, weight=exp.data.weights[name], max_epochs=cap, loader=loader)


def mixed(exp, facts, run_dir: Path, to_torchtitan, data_path):
    """The Trainer.Config of data=mix (`to_torchtitan`, `data_path`: `qwen3exp.titan.job_config`'s,
    for one source)."""
    from qwen3exp.titan import dataset  # lazy: beside its torchtitan users
    from qwen3exp.titan.mixture_dataset import MixtureDataLoader  # lazy: imports torchtitan
    from qwen3exp.titan.mixture_validator import validator_of  # lazy: imports torchtitan

    config = to_torchtitan(first_source(exp), facts, run_dir)
    tokenizer_path = str(model_files.assets_folder(exp))
    config.tokenizer = dataset.tokenizer_config(_text_source(exp), tokenizer_path)
    config.dataloader = MixtureDataLoader.Config(
        sources=[_spec(exp, n, s, tokenizer_path, data_path) for n, s in exp.data.sources.items()],
        record_dir=str(run_dir),
        record_every=exp.training.local_batch_size,
    )
    if exp.validation.enable:  # one held-out loss per source and their mean (qwen3exp.titan.mixture_validator)
        config.validator = validator_of(exp, config.validator, tokenizer_path, data_path)
    return config
