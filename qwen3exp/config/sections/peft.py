"""The `peft` section: train the whole model (`none`) or LoRA adapters on a frozen base (`lora`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from qwen3exp.config.sections.base import PosInt, Strict, tagged

LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class NoPeft(Strict):
    """Every weight is trained."""

    kind: Literal["none"] = "none"


class Lora(Strict):
    """LoRA: the base weights are frozen; each targeted projection W (out x in) gets trainable
    A (rank x in) and B (out x rank), B starting at zero, and computes W x + alpha / rank * B A x."""

    kind: Literal["lora"] = "lora"
    rank: PosInt = 8
    """The adapters' rank r."""
    alpha: Annotated[float, Field(gt=0)] = 16.0
    """Scaling: the adapter's output is multiplied by alpha / rank."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on the adapters' input (PEFT's lora_dropout)."""
    targets: Annotated[list[LoraTarget], Field(min_length=1)] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """The projections that get adapters, named as PEFT names them: any subset of the seven (PEFT's
    own default for Qwen3 is [q_proj, v_proj]); each named projection gets its own adapter, and the
    exported adapter holds exactly these."""

    @model_validator(mode="after")
    def _each_once(self) -> Lora:
        twice = sorted({t for t in self.targets if self.targets.count(t) > 1})
        if twice:
            why = f"names {', '.join(twice)} more than once (a projection has one adapter)"
            raise ValueError(tagged("targets", self.targets, why, "each projection at most once"))
        return self


Peft = Annotated[NoPeft | Lora, Field(discriminator="kind")]
