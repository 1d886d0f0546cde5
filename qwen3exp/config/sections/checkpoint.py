"""The `checkpoint` section: where the weights come from, whether resumable checkpoints are kept,
whether a Hugging Face folder is exported. Each kind says what it does as class properties."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from qwen3exp.config.sections.base import NonNegInt, PosInt, Strict, tagged


class _CheckpointKind(Strict):
    """What a checkpoint kind does, as properties, so that code asks `exp.checkpoint.resumable`
    instead of comparing kind strings."""

    resumable: ClassVar[bool] = False
    """A rerun of the identical experiment into its run directory continues from the latest step."""
    loads_weights: ClassVar[bool] = False
    """Step 0 starts from published Hugging Face safetensors."""
    exports: ClassVar[bool] = False
    """The last step is saved as a Hugging Face folder and reloaded to verify it."""


class NoCheckpoint(_CheckpointKind):
    """No checkpoints: random init, nothing saved."""

    kind: Literal["none"] = "none"


class DcpCheckpoint(_CheckpointKind):
    """torchtitan distributed checkpoints (model, optimizer, lr schedule, data position) under
    `<run dir>/checkpoint/step-N`. A rerun into the same run directory with the identical
    experiment resumes from the latest step."""

    kind: Literal["dcp"] = "dcp"
    resumable: ClassVar[bool] = True
    interval: PosInt = 500
    """Save every `interval` steps (and always at the last step)."""
    keep_latest_k: NonNegInt = 2
    """Keep the newest k checkpoints; 0 keeps all (torchtitan refuses 1)."""

    @model_validator(mode="after")
    def _keep(self) -> DcpCheckpoint:
        if self.keep_latest_k == 1:
            raise ValueError(
                tagged(
                    "keep_latest_k",
                    1,
                    "torchtitan keeps at least 2 (the newest may still be writing)",
                    "0 (keep all) or an integer >= 2",
                )
            )
        return self


ExportDtype = Literal["float32", "bfloat16", "float16"]


class HFLoad(_CheckpointKind):
    """Start from published Hugging Face safetensors (model weights only) at step 0."""

    kind: Literal["hf_load"] = "hf_load"
    loads_weights: ClassVar[bool] = True
    path: str | None = None
    """Model reference with the safetensors (and model.safetensors.index.json when sharded): a local
    folder or a Hub id `org/name[@revision]` in the local Hugging Face cache. None: model.hf_assets_path."""
    revision: str | None = None
    """Revision of a Hub id in `path` that has no `@revision` of its own. None: the cache's `main`."""


class HFExport(_CheckpointKind):
    """Save the last step as a complete Hugging Face folder (weights, index, config.json, tokenizer
    files) under `<run dir>/checkpoint/step-N`, then reload it with AutoModelForCausalLM and fail
    the run unless only a tied lm_head.weight is missing."""

    kind: Literal["hf_export"] = "hf_export"
    exports: ClassVar[bool] = True
    dtype: ExportDtype = "bfloat16"
    """dtype of the exported weights."""
    max_shard_mb: PosInt = 5000
    """Exported safetensors are split into files of at most this many megabytes (10^6 bytes), with
    model.safetensors.index.json, unless the source checkpoint's own index decides the split."""


class HFRoundtrip(_CheckpointKind):
    """hf_load + hf_export + verification: load published safetensors at step 0, export the last
    step, verify the export reloads in AutoModelForCausalLM."""

    kind: Literal["hf_roundtrip"] = "hf_roundtrip"
    loads_weights: ClassVar[bool] = True
    exports: ClassVar[bool] = True
    path: str | None = None
    """Model reference with the safetensors to load: a local folder or a Hub id `org/name[@revision]`
    in the local Hugging Face cache. None: model.hf_assets_path."""
    revision: str | None = None
    """Revision of a Hub id in `path` that has no `@revision` of its own. None: the cache's `main`."""
    dtype: ExportDtype = "bfloat16"
    """dtype of the exported weights."""
    max_shard_mb: PosInt = 5000
    """Exported safetensors are split into files of at most this many megabytes (10^6 bytes), with
    model.safetensors.index.json, unless the source checkpoint's own index decides the split."""


Checkpoint = Annotated[NoCheckpoint | DcpCheckpoint | HFLoad | HFExport | HFRoundtrip, Field(discriminator="kind")]
