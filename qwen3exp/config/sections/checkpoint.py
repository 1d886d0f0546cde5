"""The `checkpoint` section: three independent choices, any combination in one run.

- `load`: where step 0's weights come from (random, published Hugging Face safetensors, or a dcp
  step another run saved);
- `save`: whether resumable dcp checkpoints are kept (a rerun of the identical experiment into its
  run directory continues from the latest, not from `load` again);
- `export`: whether Hugging Face folders are written (at the end, or also every `export_interval`).

The config group's options (`checkpoint=dcp`, `hf_load`, `hf_export`, `hf_roundtrip`, `hf_finetune`,
`none`) are presets of these keys. Code asks `exp.checkpoint.resumable` etc. instead of comparing names.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from qwen3exp.config.sections.base import NonNegInt, PosInt, Strict, tagged

ExportDtype = Literal["float32", "bfloat16", "float16"]
PRESETS = ("none", "dcp", "hf_load", "hf_export", "hf_roundtrip", "hf_finetune")
"""The config group's options (conf/checkpoint/<name>.yaml)."""
_LEGACY_KIND: dict[str, dict[str, Any]] = {
    "none": {},
    "dcp": {"save": True},
    "hf_load": {"load": "hf"},
    "hf_export": {"export": "end"},
    "hf_roundtrip": {"load": "hf", "export": "end"},
}
"""What `kind` meant before the keys were independent: experiment files recorded by earlier versions
(a run directory's experiment.yaml) still read the same."""


class Checkpoint(Strict):
    """Where the weights come from, whether resumable checkpoints are kept, whether Hugging Face
    folders are exported: any combination."""

    load: Literal["none", "hf", "dcp"] = "none"
    """none: random initialisation; hf: published Hugging Face safetensors (model weights only) at
    step 0; dcp: the model weights of a dcp step another qwen3exp run saved (checkpoint.path)."""
    path: str | None = None
    """load=hf: a local folder or a Hub id `org/name[@revision]` in the local Hugging Face cache
    (null: model.hf_assets_path). load=dcp: that run's `checkpoint/step-N` folder (required)."""
    revision: str | None = None
    """load=hf: the revision of a Hub id in `path` that has no `@revision` of its own. null: `main`."""
    save: bool = False
    """Keep resumable dcp checkpoints (model, optimizer, lr schedule, data position) under
    `<run dir>/checkpoint/step-N`; a rerun of the identical experiment into the same run directory
    resumes from the latest one (not from `load` again)."""
    interval: PosInt = 500
    """save=true: save every `interval` steps and at the last step."""
    keep_latest_k: NonNegInt = 2
    """save=true: keep the newest k checkpoints; 0 keeps all (torchtitan refuses 1)."""
    export: Literal["none", "end", "interval"] = "none"
    """Write a complete Hugging Face folder (weights, index, config.json, tokenizer files) under
    `<run dir>/export/step-N` at the last step (end), or also every `export_interval` steps
    (interval); the last one is reloaded with AutoModelForCausalLM and the run fails unless only a
    tied lm_head.weight is missing."""
    export_interval: PosInt | None = None
    """export=interval: export every this many steps. null: checkpoint.interval."""
    dtype: ExportDtype = "bfloat16"
    """dtype of the exported weights."""
    max_shard_mb: PosInt = 5000
    """Exported safetensors are split into files of at most this many megabytes (10^6 bytes), with
    model.safetensors.index.json, unless the source checkpoint's own index decides the split."""
    merge_lora: bool = False
    """peft=lora with an export: also write the merged weights (W + alpha / rank * B A) as a full
    Hugging Face folder (`<export>/merged`) that `from_pretrained` loads without PEFT. Without it a
    LoRA export of a named Hugging Face base holds the adapter only (`<export>/adapter`, naming that
    base), no copy of the model."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_kind(cls, data: Any) -> Any:
        """A `kind` from an earlier version's experiment file: the same keys it meant."""
        if isinstance(data, dict) and "kind" in data:
            data = dict(data)
            kind = data.pop("kind")
            if kind not in _LEGACY_KIND:
                raise ValueError(
                    tagged(
                        "kind",
                        kind,
                        "checkpoint.kind is no longer a key: load, save and export are chosen independently",
                        f"checkpoint=<{'|'.join(PRESETS)}>, or checkpoint.load / .save / .export",
                    )
                )
            data = {**_LEGACY_KIND[kind], **data}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Checkpoint:
        if self.keep_latest_k == 1:
            raise ValueError(
                tagged(
                    "keep_latest_k",
                    1,
                    "torchtitan keeps at least 2 (the newest may still be writing)",
                    "0 (keep all) or an integer >= 2",
                )
            )
        if self.load == "dcp" and not self.path:
            raise ValueError(
                tagged(
                    "path",
                    self.path,
                    "checkpoint.load=dcp needs the dcp step folder to load",
                    "<run dir>/checkpoint/step-N",
                )
            )
        if self.load == "none" and (self.path is not None or self.revision is not None):
            key = "path" if self.path is not None else "revision"
            raise ValueError(
                tagged(
                    key,
                    getattr(self, key),
                    "says where to load weights from, and checkpoint.load=none loads nothing",
                    "null, or checkpoint.load=hf|dcp",
                )
            )
        if self.load == "dcp" and self.revision is not None:
            raise ValueError(tagged("revision", self.revision, "is a Hub revision; load=dcp reads a folder", "null"))
        if self.export_interval is not None and self.export != "interval":
            raise ValueError(
                tagged(
                    "export_interval", self.export_interval, f"is used by export=interval; export={self.export}", "null"
                )
            )
        if self.merge_lora and self.export == "none":
            raise ValueError(
                tagged(
                    "merge_lora",
                    True,
                    "merges the adapters into an export, and checkpoint.export=none",
                    "false, or checkpoint.export=end|interval",
                )
            )
        return self

    @property
    def resumable(self) -> bool:
        """A rerun of the identical experiment into its run directory continues from the latest step."""
        return self.save

    @property
    def loads_weights(self) -> bool:
        """Step 0 starts from published Hugging Face safetensors."""
        return self.load == "hf"

    @property
    def exports(self) -> bool:
        return self.export != "none"

    @property
    def every_export(self) -> int | None:
        """Steps between exports (None: only the last step)."""
        return (self.export_interval or self.interval) if self.export == "interval" else None

    @property
    def summary(self) -> str:
        """The choices in a few words, e.g. `load=hf save=dcp export=end`."""
        return f"load={self.load} save={'dcp' if self.save else 'none'} export={self.export}"
