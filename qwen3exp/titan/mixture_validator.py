"""Validation of a data mixture (data=mix): one held-out loss per source, and their token-weighted mean.

Each source of data.sources is validated on its own held-out records, read by its kind's own
validation loader, exactly as a run of that one source would read them: plain text (bundled, local,
hf) through the held-out split of `qwen3exp.titan.dataset` (the source's validation.fraction of its
documents, or all of its `validation_path`), conversations and preference pairs through the
validation side of `qwen3exp.titan.chat_dataset` and `qwen3exp.titan.preference_dataset`. This
module only composes them (`source_loaders`): it sees each source as the data section of a
one-source experiment (`source_view`), so no kind's code knows about mixtures.

At each validation (`MixtureValidator.validate`), validation.steps batches of every source go
through the model without gradients, as torchtitan's validator runs them (the same loss function,
the same context, -100 labels left out); for each source the loss sum and the count of its trained
tokens are summed over the data-parallel ranks. The row in metrics.jsonl (`qwen3exp.titan.metrics`):
`val_loss`, the summed loss of every source over their summed tokens (the token-weighted mean of the
sources' losses), and `val_loss_<source>`, each source's own mean; TensorBoard and W&B get them as
`validation_metrics/loss_<source>`. The samples of eval.samples follow, as for a single source.

A preference objective's mixture (every source holds pairs, `MixturePairValidator`) measures each
source as `PreferenceValidator` measures its one source (the objective's loss, the reference's
log-probs from the trainer): `val_loss_<source>` is the source's mean pair loss, `val_loss` the mean
over every source's pairs, `val_reward_accuracy` the accurate share of all of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import torch
import torch.distributed as dist
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.distributed import utils as dist_utils
from torchtitan.tools import utils
from torchtitan.tools.logging import logger

from qwen3exp.config.sections.data import ChatData, PreferenceData
from qwen3exp.titan import chat_dataset, dataset, preference_dataset
from qwen3exp.titan.metrics import SOURCE_LOSS_PREFIX, VAL_REWARD_ACCURACY
from qwen3exp.titan.preference_validator import PreferenceValidator
from qwen3exp.titan.validator import FinalStepValidator

SOURCE_DATASET = dataset.VALIDATION_NAME + "_{name}"
"""The name a text source's held-out documents are registered under in torchtitan's dataset table."""


class MixtureValidator(FinalStepValidator):
    @dataclass(kw_only=True, slots=True)
    class Config(FinalStepValidator.Config):
        sources: dict[str, BaseDataLoader.Config] = field(default_factory=dict)
        """Source name -> the dataloader of its held-out records (its kind's validation loader)."""

    def validate(self, model_parts, step: int) -> None:
        (model,) = model_parts  # pipeline stages: refused before launch (rules.mixture_validation_problems)
        names = list(self.config.sources)
        sums = torch.zeros(len(names), dtype=torch.float32, device=utils.device_type)
        tokens = torch.zeros(len(names), dtype=torch.int64, device=utils.device_type)
        model.eval()
        try:
            with torch.no_grad():
                for i, name in enumerate(names):
                    sums[i], tokens[i] = self.source_sums(model, model_parts, self.config.sources[name])
        finally:
            model.train()
        pd = self.parallel_dims
        if pd.dp_enabled:  # tokens counted before context-parallel sharding, as torchtitan counts them
            tokens = dist_utils.dist_sum_tensor(tokens, pd.get_mesh("batch"))
        if pd.dp_cp_enabled:
            sums = dist_utils.dist_sum_tensor(sums, pd.get_optional_mesh("loss"))
        losses, total = per_source(names, sums.tolist(), tokens.tolist())
        self.metrics_processor.log_validation(
            loss=total, step=step, extra_metrics={SOURCE_LOSS_PREFIX + n: v for n, v in losses.items()}
        )
        logger.info(f"validate step {step:2} per source: " + "  ".join(f"{n}: {v:7.4f}" for n, v in losses.items()))
        if self.sampler is not None:
            self.answer_samples(self.sampler, model_parts, step)

    def source_sums(self, model, model_parts, dl_config) -> tuple[torch.Tensor, torch.Tensor]:
        """(this rank's summed loss, its trained tokens) over validation.steps batches of one source."""
        loader = replace(dl_config, infinite=True).build(
            dp_world_size=self.dp_world_size,
            dp_rank=self.dp_rank,
            tokenizer=self.tokenizer,
            seq_len=self.seq_len,
            local_batch_size=self.local_batch_size,
        )
        device = utils.device_type
        loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        count = torch.zeros((), dtype=torch.int64, device=device)
        for _, (input_dict, labels) in zip(range(self.config.steps), loader, strict=False):
            self.metrics_processor.ntokens_since_last_log += labels.numel()
            input_dict = {k: v.to(device) for k, v in input_dict.items()}
            labels = labels.to(device)
            count += (labels != IGNORE_INDEX).sum()
            inputs, labels, extra = self.post_dataloading_process(input_dict, labels, model_parts)
            with self.validation_context():
                loss, _ = self.loss_fn(model(inputs, **extra), labels)
            loss_sum += loss.detach().to_local() if hasattr(loss, "to_local") else loss.detach()
        return loss_sum, count


class MixturePairValidator(PreferenceValidator):
    """A mixture of preference sources: each source's pairs through the objective's own loss
    (`PreferenceValidator.pair_totals`, the reference's log-probs from the trainer)."""

    @dataclass(kw_only=True, slots=True)
    class Config(PreferenceValidator.Config):
        sources: dict[str, BaseDataLoader.Config] = field(default_factory=dict)
        """Source name -> the dataloader of its held-out pairs (`qwen3exp.titan.preference_dataset`)."""

    def validate(self, model_parts, step: int) -> None:
        (model,) = model_parts  # pipeline parallelism is refused before launch
        names = list(self.config.sources)
        model.eval()
        try:
            totals = torch.stack(
                [self.pair_totals(model, model_parts, replace(c, infinite=True)) for c in self.config.sources.values()]
            )  # per source: summed pair loss, accurate pairs, pairs
        finally:
            model.train()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(totals)
        losses, total = per_source(names, totals[:, 0].tolist(), totals[:, 2].tolist())
        accuracy = float(totals[:, 1].sum()) / max(float(totals[:, 2].sum()), 1.0)
        extra = {VAL_REWARD_ACCURACY: accuracy, **{SOURCE_LOSS_PREFIX + n: v for n, v in losses.items()}}
        self.metrics_processor.log_validation(loss=total, step=step, extra_metrics=extra)
        logger.info(f"validate step {step:2} per source: " + "  ".join(f"{n}: {v:7.4f}" for n, v in losses.items()))
        if self.sampler is not None:
            self.answer_samples(self.sampler, model_parts, step)


def per_source(names: list[str], sums: list[float], tokens: list) -> tuple[dict[str, float], float]:
    """({source: its mean loss per trained token (per pair)}, the mean over all sources' tokens
    (pairs)); NaN where a source gave none (written as null)."""
    losses = {n: s / t if t else math.nan for n, s, t in zip(names, sums, tokens, strict=True)}
    total = sum(sums) / sum(tokens) if sum(tokens) else math.nan
    return losses, total


def source_view(exp, name: str):
    """The experiment as a run of source `name` alone: its data section is the source (a kind's
    class), its validation path the source's own `validation_path`."""
    src = exp.data.sources[name]
    validation = exp.validation.model_copy(update={"path": src.validation_path})
    return exp.model_copy(update={"data": src, "validation": validation})


def source_loaders(exp, tokenizer_path: str, data_path: Callable) -> dict[str, BaseDataLoader.Config]:
    """Source name -> the validation loader its kind builds for a run of that source alone (`data_path`:
    an experiment -> its data's files, `qwen3exp.titan.job_config.data_path`)."""
    from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataLoader  # lazy: torchtitan

    out: dict[str, BaseDataLoader.Config] = {}
    for name in exp.data.sources:
        view = source_view(exp, name)
        d, v = view.data, view.validation
        if isinstance(d, PreferenceData):
            out[name] = preference_dataset.loader_config(view, tokenizer_path, validation=True)
            continue
        if isinstance(d, ChatData):
            out[name] = chat_dataset.loader_config(view, tokenizer_path, validation=True)
            continue
        path = v.path if v.path is not None else str(data_path(view))
        text_field = d.text_field if d.source == "local" else "text"
        hf = dataset.hf(d) if v.path is None else None
        registered = dataset.register_validation(path, text_field, held_out_fraction=v.held_out, hf=hf)
        own = SOURCE_DATASET.format(name=name)
        DATASETS[own] = DATASETS[registered]  # one entry per source (the kind registers one name)
        out[name] = HuggingFaceTextDataLoader.Config(dataset=own, dataset_path=path, infinite=True)
    return out


def validator_of(exp, first, tokenizer_path: str, data_path: Callable) -> FinalStepValidator.Config:
    """The validator of a data=mix run with validation on: `first`, the validator config a run of the
    first source alone would have (its frequency, steps, last step, eval.samples), reading every
    source's held-out records instead of that one source's."""
    kept = {f.name: getattr(first, f.name) for f in fields(FinalStepValidator.Config) if f.init}
    loaders = source_loaders(exp, tokenizer_path, data_path)
    kept["dataloader"] = next(iter(loaders.values()))  # torchtitan's field; `validate` reads `sources`
    pairs = isinstance(first, PreferenceValidator.Config)  # a preference objective: every source holds pairs
    return (MixturePairValidator if pairs else MixtureValidator).Config(**kept, sources=loaders)
