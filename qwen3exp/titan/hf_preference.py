"""Preference objectives on the Transformers backend (`model=hf`): the preference trainer with the
backend's config field.

torchtitan 0.3.0's backend trains with `TransformersBackendConfig`: `Trainer.Config` plus `hf_model`,
the folder whose config.json the model is built from (`HFTransformerModel.Config.update_from_config`
reads it off the trainer's config), and `HFTransformerTrainer`, which adds only what context
parallelism needs (refused for pair objectives before launch, so not inherited here: importing it
would import transformers into every native rank that trains pairs). A pair objective's trainer is
`qwen3exp.titan.preference_trainer.PreferenceTrainer`, whose config has no `hf_model`; this
module's adds it, and everything else is the preference trainer's, unchanged: the backend's model
returns the logits as the native one does, its LoRA adapters (`qwen3exp.titan.hf_lora`) are named
`...lora_b...` as the native ones (zeroed for the reference pass), and FSDP shards its weights
(and so the frozen copy of a full fine-tune) the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwen3exp.config.sections.model import HFModel
from qwen3exp.titan.preference_trainer import PreferenceTrainer


class HFPreferenceTrainer(PreferenceTrainer):
    @dataclass(kw_only=True, slots=True)
    class Config(PreferenceTrainer.Config):
        hf_model: str = ""
        """The model folder (or Hub id) the backend builds the model from, as TransformersBackendConfig's."""


def trainer_of(exp) -> type[PreferenceTrainer.Config] | None:
    """The trainer of a pair objective on the experiment's backend: model=hf's this module's, else
    None (`preference_trainer.own_loaders`' own)."""
    return HFPreferenceTrainer.Config if isinstance(exp.model, HFModel) else None
