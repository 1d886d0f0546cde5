"""Preference objectives on the Transformers backend (`model=hf`): the preference trainer with the
backend's own trainer and config field.

torchtitan 0.3.0's backend trains with `TransformersBackendConfig` (`HFTransformerTrainer.Config`
plus `hf_model`, the folder whose config.json the model is built from: `HFTransformerModel.Config.
update_from_config` reads it off the trainer's config) and `HFTransformerTrainer` (which adds only
what context parallelism needs, refused for pair objectives before launch). A pair objective's
trainer is `qwen3exp.titan.preference_trainer.PreferenceTrainer`, whose config has no `hf_model`;
this module's trainer is both, so the backend's model reads its folder and the reference pass,
the pair loss and metrics are the preference trainer's, unchanged: the backend's model returns
the logits as the native one does, its LoRA adapters (`qwen3exp.titan.hf_lora`) are named
`...lora_b...` as the native ones, and FSDP shards its weights (and the frozen copy) the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.experiments.transformers_modeling_backend.trainer import HFTransformerTrainer

from qwen3exp.titan.preference_trainer import PreferenceTrainer


class HFPreferenceTrainer(PreferenceTrainer, HFTransformerTrainer):
    @dataclass(kw_only=True, slots=True)
    class Config(PreferenceTrainer.Config):
        hf_model: str = ""
        """The model folder (or Hub id) the backend builds the model from, as TransformersBackendConfig's."""
