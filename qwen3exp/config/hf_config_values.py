"""The value each key of a Hugging Face config.json must hold, checked before it is used: the counts
are positive, bounded integers (`HF_LIMITS`), the floats finite, every other key read has its JSON
type (`check_types`), so a broken or hostile config.json is refused by key, not crashed on.
"""

from __future__ import annotations

import math


class HFConfigError(ValueError):
    """config.json is missing, unreadable, or not a Qwen3 architecture the chosen backend can build."""

    def __init__(self, message: str, *, allowed: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.allowed = allowed
        """What would be accepted instead (None: a Qwen3 architecture)."""
        self.hint = hint


# The keys read as something other than a count (`positive`, `finite`): the JSON type each must
# have where present and not null. A wrong type is refused by name: iterated, `"architectures": 5`
# crashed the check; read for its truth, `"tie_word_embeddings": "false"` would tie the weights.
_TYPED: dict[str, tuple[type, str]] = {
    "architectures": (list, "a list of architecture names"),
    "model_type": (str, "a string"),
    "hidden_act": (str, "a string"),
    "tie_word_embeddings": (bool, "true or false"),
    "attention_bias": (bool, "true or false"),
    "use_sliding_window": (bool, "true or false"),
    "norm_topk_prob": (bool, "true or false"),
    "decoder_sparse_step": (int, "a positive integer"),
    "mlp_only_layers": (list, "a list of layer indices"),
}


def check_types(cfg: dict) -> None:
    """HFConfigError naming the first key of `_TYPED` whose value has the wrong JSON type."""
    for key, (kind, allowed) in _TYPED.items():
        value = cfg.get(key)
        if value is None:
            continue
        match value:
            case bool() if kind is int:
                bad = True
            case int() if kind is int:
                bad = value <= 0
            case list() if key == "architectures":
                bad = not all(isinstance(a, str) for a in value)
            case _:
                bad = not isinstance(value, kind)
        if bad:
            raise HFConfigError(
                f"{key} is {_shown(value)} (a JSON {_json_type(value)}), not {allowed}",
                allowed=f"{key}: {allowed}" + (" (e.g. ['Qwen3ForCausalLM'])" if key == "architectures" else ""),
            )


def _json_type(value) -> str:
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


HF_LIMITS = {
    "num_hidden_layers": 1024,
    "num_experts": 4096,
    "num_local_experts": 4096,
    "num_experts_per_tok": 4096,
    "num_attention_heads": 4096,
    "num_key_value_heads": 4096,
    "head_dim": 65536,
}
"""Upper bounds of a Qwen3 config.json's counts, about 10x the largest published model's (94 layers,
128 experts, 64 heads): a config.json with 10^12 layers must be refused in a second, not planned
layer by layer (the checks list every tensor per layer and expert)."""
HF_SIZE_LIMIT = 1 << 24
"""Every other size (hidden_size, vocab_size, intermediate sizes): at most 16M."""


def positive(cfg: dict, key: str) -> int:
    """cfg[key] as an int > 0 (a zero head count would divide by zero below, in torchtitan or in
    transformers) and within `HF_LIMITS`."""
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise HFConfigError(f"config.json {key} is {_shown(value)}, not a positive integer")
    limit = HF_LIMITS.get(key, HF_SIZE_LIMIT)
    if value > limit:
        raise HFConfigError(f"config.json {key} is {value}, beyond any Qwen3 (at most {limit})")
    return value


def finite(cfg: dict, key: str, default: float, *, positive: bool = True) -> float:
    """cfg[key] (or `default` when it is absent or null) as a finite float (> 0 where `positive`):
    a NaN rope_theta or an infinite norm epsilon trains NaN losses in every rank."""
    value = cfg.get(key)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or (positive and value <= 0)
    ):
        raise HFConfigError(f"config.json {key} is {_shown(value)}, not a finite number" + (" > 0" if positive else ""))
    return float(value)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."
