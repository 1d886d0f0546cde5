"""The base model a LoRA run's adapter is shared against: the model reference the user named.

A peft=lora export writes the adapter on its own (`export/step-N/adapter`, PEFT's folder, a few MB)
when the frozen base is a Hugging Face model the experiment names (checkpoint.load=hf: the
reference its weights come from, `checkpoint.path`, else `model.hf_assets_path` / `model.hf_model`):
adapter_config.json's `base_model_name_or_path` is then that reference, as `PeftModel.from_pretrained`
and the Hub expect it: the Hub id (with its `revision` when one was asked for), or, for a local
folder, the folder's absolute path (or the Hub id of a Hugging Face cache snapshot folder). A base
that exists only in the run (random initialisation, checkpoint.load=dcp) is exported next to the
adapter (`export/step-N`), which then names that folder. The merged weights are written only when
asked (checkpoint.merge_lora).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.config.schema import Experiment
from qwen3exp.plan.model_ref import ModelRef
from qwen3exp.plan.model_sources import refs

# huggingface_hub's cache layout: <cache>/models--<org>--<name>/snapshots/<commit>
_SNAPSHOT = re.compile(r"models--(?P<id>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})$")


@dataclass(frozen=True)
class Base:
    name_or_path: str
    """adapter_config.json's base_model_name_or_path: a Hub id or an absolute folder."""
    revision: str | None = None
    """adapter_config.json's revision (a Hub id's branch, tag or commit; None: main)."""


def named_base(exp: Experiment) -> Base | None:
    """The base a peft=lora export's adapter names; None without LoRA, or when the base weights are
    not a Hugging Face model the experiment names (the export then holds the base too)."""
    if exp.peft.kind != "lora" or not exp.checkpoint.loads_weights:
        return None
    ref = refs(exp).weights(exp)
    return None if ref is None else base_of(ref)


def base_of(ref: ModelRef) -> Base:
    if ref.repo_id is not None:
        return Base(ref.repo_id, ref.revision)
    folder = ref.folder if ref.folder is not None else Path(ref.value).expanduser().resolve()
    if m := _SNAPSHOT.search(folder.as_posix()):
        return Base(m["id"].replace("--", "/", 1), m["commit"])
    return Base(str(folder))


def exports_base(exp: Experiment) -> bool:
    """Whether an export writes the base model's weights (`export/step-N`): always without LoRA;
    with LoRA only when the base is not a named Hugging Face model."""
    return named_base(exp) is None
