"""The `model` section: torchtitan's own Qwen3 (`native`) or Hugging Face Transformers (`hf`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from qwen3exp.config.flavors import FLAVORS, Arch
from qwen3exp.config.sections.base import PosInt, Strict, tagged
from qwen3exp.errors import did_you_mean, one_of


class NativeModel(Strict):
    """torchtitan's own Qwen3 implementation."""

    backend: Literal["native"] = "native"
    flavor: str = "tiny"
    """A torchtitan Qwen3 flavor (0.6B, 1.7B, 4B, 8B, 14B, 32B, 30B-A3B, 235B-A22B, debugmodel, ...),
    a qwen3exp flavor (tiny, tiny_moe), or `auto` to read the architecture from
    `hf_assets_path/config.json`. With an explicit flavor and a folder holding config.json, the two
    must describe the same architecture (checked before launch, every differing key named)."""
    hf_assets_path: str | None = None
    """Model reference (tokenizer files, and config.json / safetensors for checkpoints): a local
    folder, or a Hugging Face Hub id `org/name[@revision]` resolved offline from the local Hugging
    Face cache. None: the folder bundled with qwen3exp (tokenizer, vocab 2048, and the config.json
    of the `tiny` flavor)."""
    revision: str | None = None
    """Revision (branch, tag or commit) of a Hub id in hf_assets_path that has no `@revision` of its
    own. None: the cache's `main`."""
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    """Attention kernel. auto: the platform's choice (flex on CUDA, sdpa on CPU and Neuron)."""
    n_layers: PosInt | None = None
    """Keep only the first n layers of the flavor (the walkthrough's reduced MoE)."""
    num_experts: PosInt | None = None
    """MoE flavors only: use this many routed experts."""
    top_k: PosInt | None = None
    """MoE flavors only: route each token to this many experts."""

    @model_validator(mode="after")
    def _flavor_known(self) -> NativeModel:
        if self.flavor != "auto" and self.flavor not in FLAVORS:
            raise ValueError(
                tagged(
                    "flavor",
                    self.flavor,
                    "unknown flavor",
                    one_of(["auto", *FLAVORS]),
                    did_you_mean(self.flavor, list(FLAVORS)),
                )
            )
        return self

    def arch(self) -> Arch | None:
        """The architecture when it is known without reading files (None for flavor=auto)."""
        if self.flavor == "auto":
            return None
        arch = FLAVORS[self.flavor]
        return arch.reduced(n_layers=self.n_layers, num_experts=self.num_experts, top_k=self.top_k)


class HFModel(Strict):
    """Hugging Face Transformers v5 as torchtitan's modeling backend: `AutoModelForCausalLM` built
    from a local folder's config.json (offline)."""

    backend: Literal["hf"] = "hf"
    hf_assets_path: str | None = None
    """Model reference with tokenizer files, config.json and (for hf_load) safetensors: a local
    folder, or a Hugging Face Hub id `org/name[@revision]` resolved offline from the local Hugging
    Face cache. None: hf_model when it is set (the model's own tokenizer), else the folder bundled
    with qwen3exp (a `tiny`-sized Qwen3 config.json and the vocab-2048 tokenizer)."""
    hf_model: str | None = None
    """Model reference AutoConfig reads the architecture from: a local folder or a Hub id
    `org/name[@revision]` in the local Hugging Face cache (nothing is downloaded). None: hf_assets_path."""
    revision: str | None = None
    """Revision (branch, tag or commit) of the Hub ids in hf_model / hf_assets_path that have no
    `@revision` of their own. None: the cache's `main`."""
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    """Attention kernel. auto: the platform's choice (flex on CUDA, sdpa on CPU and Neuron)."""

    def arch(self) -> Arch | None:
        """Read from config.json before launch (None here: the schema touches no files)."""
        return None


Model = Annotated[NativeModel | HFModel, Field(discriminator="backend")]
