"""Pre-launch checks that read files: the model's config.json, tokenizer and safetensors.

The schema never touches the filesystem; `launch.prepare` calls `check()` before any worker
starts. Every model reference (`model.hf_assets_path`, `model.hf_model`, `checkpoint.path`) is a
local folder or a Hub id resolved offline from the local Hugging Face cache
(`qwen3exp.plan.model_ref`). Three sources are then named, each from one reference
(`qwen3exp.plan.model_sources`):
- config: the architecture (flavor=auto and model=hf read config.json);
- tokenizer: `model.hf_assets_path`; for model=hf without it, `model.hf_model`'s own folder (the
  model's tokenizer, never the bundled one); the bundled vocab-2048 tokenizer only when no model
  folder is named at all;
- weights: `checkpoint.path`, else the tokenizer's folder (hf_load, hf_roundtrip).
`check()` resolves the architecture, checks an explicit flavor against config.json key by key
(Qwen3-4B-Instruct-2507's rope_theta 5e6 against the 4B flavor's 1e6 is an error, not something to
train through) (`qwen3exp.plan.model_arch`), the tokenizer's vocabulary against the model's (a
tokenizer other than the model's own, or ids without an embedding, is an error:
`qwen3exp.plan.tokenizer_files`), and, when weights are loaded, every safetensors file's header
(readable, not truncated), every tensor the model needs (present, right shape, a floating-point
dtype, no NaN or Inf in its values: `nonfinite_tensors`, within a byte budget:
`qwen3exp.plan.weight_files`, `qwen3exp.plan.weight_values`). A folder whose config.json asks for
remote code (`auto_map`) is refused: qwen3exp never runs code shipped in a model folder. Each mistake
is one `Problem` naming the key; all of them are reported together. Cheap: JSON, safetensors headers
and a bounded numpy scan of the raw bytes (no torch, no transformers, no torchtitan; huggingface_hub
only for a Hub id). The ranks read the folders and the architecture through the functions here after
`check` passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.flavors import FLAVORS, Arch
from qwen3exp.config.hf_config import arch_from_hf_config, read_hf_config
from qwen3exp.config.rules import arch_problems
from qwen3exp.config.schema import Experiment
from qwen3exp.errors import ConfigError, Problem, nearby_path
from qwen3exp.plan.model_arch import CONFIG_JSON, arch_and_source, hf_moe_problems, remote_code_problems
from qwen3exp.plan.model_ref import ModelRef
from qwen3exp.plan.model_sources import BUNDLED, Sections, folder_of, refs
from qwen3exp.plan.tokenizer_files import tokenizer_problems
from qwen3exp.plan.weight_files import weights_problems


@dataclass(frozen=True)
class ModelFiles:
    arch: Arch
    """The architecture that is trained (the experiment's reductions applied)."""
    source: str
    """Where the architecture came from: 'flavor tiny' or 'config.json of /path'."""
    folder: Path
    """The tokenizer's folder (model.hf_assets_path, model=hf's hf_model, or the bundled folder):
    also torchtitan's hf_assets_path and what the export copies its tokenizer files from."""
    weights: Path | None
    """Folder whose safetensors are loaded at step 0 (checkpoint hf_load / hf_roundtrip)."""
    config_folder: Path | None = None
    """The folder whose config.json describes the model (None: an explicit flavor, no config.json)."""
    tokenizer_vocab: int | None = None
    """1 + the largest token id the tokenizer produces."""
    refs: tuple[ModelRef, ...] = ()
    """Every model reference the experiment names, resolved (Hub ids: snapshot and commit)."""
    config_ref: ModelRef | None = None
    """The reference config.json comes from (None: bundled, or an explicit flavor)."""
    tokenizer_ref: ModelRef | None = None
    """The reference the tokenizer comes from (None: bundled)."""
    weights_ref: ModelRef | None = None
    """The reference the weights come from (None: random initialisation)."""

    def sources(self) -> dict:
        """Where config, tokenizer and weights each come from (plan.json, provenance.json)."""

        def entry(folder: Path | None, ref: ModelRef | None, what: str) -> dict | None:
            if folder is None:
                return None
            out: dict = {"folder": str(folder), "what": what}
            if ref is not None:
                out.update({k: v for k, v in ref.as_json().items() if k != "folder"})
            return out

        return {
            "config": entry(self.config_folder, self.config_ref, CONFIG_JSON) or {"folder": None, "what": self.source},
            "tokenizer": entry(
                self.folder,
                self.tokenizer_ref,
                f"{self.tokenizer_vocab} tokens" + ("" if self.tokenizer_ref else f", {BUNDLED}"),
            ),
            "weights": entry(self.weights, self.weights_ref, "safetensors loaded at step 0")
            or {"folder": None, "what": "random initialisation"},
        }


def assets_folder(exp: Experiment) -> Path:
    """The tokenizer's folder (torchtitan's hf_assets_path): see `Refs.tokenizer`."""
    return folder_of(refs(exp).tokenizer(exp))


def weights_folder(exp: Experiment) -> Path | None:
    """The folder loaded at step 0, or None when training starts from random weights."""
    if not exp.checkpoint.loads_weights:
        return None
    return folder_of(refs(exp).weights(exp))


def hf_model_folder(exp: Experiment) -> tuple[str, Path | None]:
    """model=hf: (what AutoConfig is given: the resolved folder, the folder holding its config.json
    or None when the reference does not resolve)."""
    r = refs(exp)
    ref = r.config(exp)
    if ref is None:
        return str(TOKENIZER_DIR), TOKENIZER_DIR
    return (str(ref.folder) if ref.folder is not None else ref.value), ref.folder


def resolve_arch(exp: Experiment) -> Arch:
    """The trained architecture, without the checks (ranks rebuild it after `check` passed)."""
    m = exp.model
    known = m.arch()  # a native flavor other than auto: no file to read
    if known is not None:
        return known
    folder = folder_of(refs(exp).config(exp))
    arch = arch_from_hf_config(read_hf_config(folder), backend=m.backend)
    if m.backend == "native":
        arch = arch.reduced(n_layers=m.n_layers, num_experts=m.num_experts, top_k=m.top_k)
    return arch


def check(exp: Sections) -> ModelFiles:
    """Resolve and check the model's files; raise ConfigError naming every problem."""
    r = refs(exp)
    problems: list[Problem] = list(r.problems)
    tok_ref, cfg_ref = r.tokenizer(exp), r.config(exp)
    if (tok_ref is not None and tok_ref.folder is None) or (cfg_ref is not None and cfg_ref.folder is None):
        raise ConfigError(problems)  # nothing to read without the model's folder
    folder = folder_of(tok_ref)
    if not folder.is_dir():
        key, value = (tok_ref.key, tok_ref.value) if tok_ref else ("model.hf_assets_path", str(folder))
        raise ConfigError(
            problems
            + [
                Problem(
                    key,
                    value,
                    "is a file, not a folder",
                    "a local folder with tokenizer files (and config.json, safetensors)",
                    nearby_path(folder),
                )
            ]
        )
    problems += remote_code_problems(exp, r)
    arch, source = arch_and_source(exp, r, problems)
    if arch is None:
        raise ConfigError(problems)
    if exp.model.backend == "native" and exp.model.flavor != "auto":
        base = FLAVORS[exp.model.flavor]
    else:
        base = arch
        problems += arch_problems(exp.model, exp.training, exp.parallelism, exp.kernels, base, source)
    m = exp.model
    if m.backend == "native":
        arch = base.reduced(n_layers=m.n_layers, num_experts=m.num_experts, top_k=m.top_k)
    problems += hf_moe_problems(exp, arch)
    w_ref = r.weights(exp)
    weights = None
    if exp.checkpoint.loads_weights and (w_ref is None or w_ref.folder is not None):
        weights = folder_of(w_ref)
    vocab, tok_problems = tokenizer_problems(exp, r, folder, arch, weights)
    problems += tok_problems
    if weights is not None:
        wkey = w_ref.key if w_ref is not None else "model.hf_assets_path"
        problems += weights_problems(wkey, weights, arch, exact=(arch == base), ref=w_ref)
    if problems:
        raise ConfigError(problems)
    cfg_folder = None if (m.backend == "native" and m.flavor != "auto") else folder_of(cfg_ref)
    return ModelFiles(
        arch=arch,
        source=source,
        folder=folder,
        weights=weights,
        config_folder=cfg_folder,
        tokenizer_vocab=vocab,
        refs=tuple(r.all()),
        config_ref=cfg_ref if cfg_folder else None,
        tokenizer_ref=tok_ref,
        weights_ref=w_ref,
    )
