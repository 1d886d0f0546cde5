"""Where a model's config.json, tokenizer and weights come from: the experiment's model references.

Every model reference (`model.hf_assets_path`, `model.hf_model`, `checkpoint.path`) is a local
folder or a Hub id resolved offline from the local Hugging Face cache (`qwen3exp.plan.model_ref`).
`Refs` names, from those references, the one each source is read from:
- config: the architecture (flavor=auto and model=hf read config.json);
- tokenizer: `model.hf_assets_path`; for model=hf without it, `model.hf_model`'s own folder (the
  model's tokenizer, never the bundled one); the bundled vocab-2048 tokenizer only when no model
  folder is named at all;
- weights: `checkpoint.path`, else the tokenizer's folder (hf_load, hf_roundtrip).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.checkpoint import Checkpoint
from qwen3exp.config.sections.kernels import Kernels
from qwen3exp.config.sections.model import HFModel, NativeModel
from qwen3exp.config.sections.parallelism import Parallelism
from qwen3exp.config.sections.training import Training
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.plan import model_ref
from qwen3exp.plan.model_ref import ModelRef

BUNDLED = "the tokenizer bundled with qwen3exp"


@dataclass(frozen=True)
class ModelSections:
    """What the model-file checks read of an experiment: `model_files.check` takes this (or the Experiment,
    which has them all). When the experiment as a whole is invalid the command line still runs these
    checks on the sections that validated on their own, so that a mistake elsewhere does not hide a
    wrong model folder: `training` and `kernels` may then be None, and the rules that read them are
    skipped (a bad seq_len or kernel choice is reported by its own section's validation)."""

    model: NativeModel | HFModel
    checkpoint: Checkpoint
    parallelism: Parallelism
    training: Training | None = None
    kernels: Kernels | None = None


Sections = Experiment | ModelSections
"""What every model-file check reads: an Experiment, or the model sections of an invalid one."""


@dataclass(frozen=True)
class Refs:
    """The experiment's model references, resolved (None: the key is not set)."""

    assets: ModelRef | None
    hf_model: ModelRef | None
    checkpoint: ModelRef | None
    problems: tuple[Problem, ...] = ()

    def all(self) -> list[ModelRef]:
        return [r for r in (self.assets, self.hf_model, self.checkpoint) if r is not None]

    def tokenizer(self, exp: Sections) -> ModelRef | None:
        """Where the tokenizer comes from: hf_assets_path, else (model=hf) hf_model, else None (bundled)."""
        if self.assets is not None:
            return self.assets
        return self.hf_model if exp.model.backend == "hf" else None

    def config(self, exp: Sections) -> ModelRef | None:
        """Where config.json comes from (model=hf: hf_model, else hf_assets_path); None: bundled."""
        if exp.model.backend == "hf" and self.hf_model is not None:
            return self.hf_model
        return self.assets

    def weights(self, exp: Sections) -> ModelRef | None:
        """Where the step-0 safetensors come from (checkpoint.path, else the tokenizer's reference)."""
        if not exp.checkpoint.loads_weights:
            return None
        return self.checkpoint if self.checkpoint is not None else self.tokenizer(exp)


def refs(exp: Sections) -> Refs:
    """Resolve every model reference of the experiment (offline); problems name the key."""
    m, c = exp.model, exp.checkpoint
    problems: list[Problem] = []
    out: dict[str, ModelRef | None] = {"assets": None, "hf_model": None, "checkpoint": None}
    given = [("assets", "model.hf_assets_path", m.hf_assets_path, m.revision, "model.revision")]
    if m.backend == "hf":
        given.append(("hf_model", "model.hf_model", m.hf_model, m.revision, "model.revision"))
    if c.loads_weights:
        given.append(("checkpoint", "checkpoint.path", c.path, c.revision, "checkpoint.revision"))
    for slot, key, value, revision, revision_key in given:
        if value is None:
            continue
        ref, ps = model_ref.resolve(key, value, revision=revision, revision_key=revision_key)
        out[slot] = ref
        problems += ps
    named = [v for _, _, v, _, _ in given if v is not None]
    if m.revision is not None and not any(
        model_ref.split(v) and not Path(v).expanduser().exists() for v in named[: 2 if m.backend == "hf" else 1]
    ):
        if not any(p.key == "model.revision" for p in problems):
            problems.append(
                Problem(
                    "model.revision",
                    m.revision,
                    "applies to a Hub id in model.hf_assets_path"
                    + (" or model.hf_model" if m.backend == "hf" else "")
                    + ", and none is given",
                    "null, or a Hub id in the model reference",
                )
            )
    return Refs(out["assets"], out["hf_model"], out["checkpoint"], tuple(problems))


def folder_of(ref: ModelRef | None) -> Path:
    """The resolved folder of a reference; the bundled folder for None. Raises ConfigError when it
    does not resolve (`check` has refused that before launch, with the same problem)."""
    if ref is None:
        return TOKENIZER_DIR
    if ref.folder is None:
        _, problems = model_ref.resolve(ref.key, ref.value, revision=ref.revision)
        raise ConfigError(problems or [Problem(ref.key, ref.value, "does not resolve")])
    return ref.folder


def fetch_hint(ref: ModelRef | None, *patterns: str) -> str | None:
    cmd = ref.fetch_command(*patterns) if ref is not None else None
    return f"fetch it into the Hugging Face cache: {cmd}" if cmd else None
