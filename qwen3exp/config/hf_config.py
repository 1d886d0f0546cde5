"""A Hugging Face Qwen3 config.json, read into an `Arch` and written from one.

`arch_from_hf_config` refuses what the chosen backend cannot build (another architecture, RoPE
scaling the backend does not implement, attention bias, sliding windows, mixed dense/MoE layouts),
and every count it reads is checked to be a positive, bounded number (`HF_LIMITS`), so a broken or
hostile config.json is refused in a second. Plain JSON: no transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

from qwen3exp.config.flavors import Arch, MoEArch
from qwen3exp.config.hf_config_values import HFConfigError, check_types, finite, positive

# Architectures the Hugging Face config.json reader accepts.
HF_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


# RoPE types transformers 5 implements (`transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`, plus
# "default"); model=hf builds them, the native Qwen3 only "default" (plain RoPE, `CosSinRoPE`).
# Copied so that planning imports no transformers; tests/test_preflight_files.py compares the two.
HF_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")


def read_hf_config(folder: str | Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise HFConfigError(f"{path} does not exist")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFConfigError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(cfg, dict):
        raise HFConfigError(f"{path} holds a JSON {type(cfg).__name__}, not an object")
    return cfg


def rope_scalings(cfg: dict) -> list[tuple[str, str]]:
    """(config.json key, rope type) for every RoPE entry that is not plain RoPE. Both keys count:
    transformers 5 reads the legacy `rope_scaling` over `rope_parameters` when both are present."""
    out = []
    for key in ("rope_scaling", "rope_parameters"):
        rope = cfg.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            out.append((key, repr(rope)))
            continue
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            out.append((key, str(rope_type)))
    return out


def arch_from_hf_config(cfg: dict, *, backend: str = "native") -> Arch:
    """The architecture of a published Qwen3 / Qwen3-MoE config.json, for `backend`.

    backend="native": the native architecture that holds the checkpoint exactly; raises HFConfigError
    for anything the native Qwen3 cannot represent (other architectures, RoPE scaling, attention
    bias, sliding windows, mixed dense/MoE layouts, unnormalised top-k routing), so such a checkpoint
    is refused instead of trained subtly wrong. backend="hf" (transformers builds the model): RoPE
    scaling is accepted when transformers implements its type (`HF_ROPE_TYPES`)."""
    check_types(cfg)
    archs = cfg.get("architectures") or []
    if not any(a in HF_ARCHITECTURES for a in archs) and cfg.get("model_type") not in ("qwen3", "qwen3_moe"):
        raise HFConfigError(
            f"architecture {archs or cfg.get('model_type')!r} is not Qwen3; allowed: {', '.join(HF_ARCHITECTURES)}"
        )
    _check_rope(cfg, backend)
    unsupported = []
    if cfg.get("attention_bias"):
        unsupported.append("attention_bias=true")
    if cfg.get("use_sliding_window"):
        unsupported.append("use_sliding_window=true")
    if cfg.get("hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act={cfg.get('hidden_act')!r} (native Qwen3 uses silu)")
    try:
        return _arch(cfg, unsupported)
    except HFConfigError:
        raise
    except KeyError as e:
        raise HFConfigError(f"config.json lacks {e.args[0]!r}") from e
    except (TypeError, ValueError) as e:  # a number written as text, a list where a number belongs
        raise HFConfigError(f"config.json holds a value that is not a number ({e})") from e


def _check_rope(cfg: dict, backend: str) -> None:
    """RoPE scaling the backend cannot build: HFConfigError naming the key."""
    ropes = rope_scalings(cfg)
    if backend == "native" and ropes:
        # The native model would train plain RoPE where Hugging Face uses the scaled one: silently a
        # different model at long range. Refused, naming the key, with the backend that can do it.
        said = "; ".join(f"{k} asks for RoPE scaling {t!r}" for k, t in ropes)
        can = all(t in HF_ROPE_TYPES for _, t in ropes)
        raise HFConfigError(
            f"{said}, which the native Qwen3 cannot represent (it trains plain RoPE, so the model would "
            "silently differ from the checkpoint)",
            allowed="for model=native: no rope_scaling, or rope_type 'default'",
            hint=(
                "model=hf builds it (transformers implements " + ", ".join(repr(t) for _, t in ropes) + ")"
                if can
                else f"neither backend implements it; transformers implements {', '.join(HF_ROPE_TYPES)}"
            ),
        )
    if backend == "hf":
        bad = [(k, t) for k, t in ropes if t not in HF_ROPE_TYPES]
        if bad:
            raise HFConfigError(
                "; ".join(f"{k} asks for RoPE scaling {t!r}" for k, t in bad)
                + ", which transformers does not implement",
                allowed=f"rope_type {', '.join(HF_ROPE_TYPES)}",
            )


def _arch(cfg: dict, unsupported: list[str]) -> Arch:
    """The numbers of config.json as an Arch (`unsupported`: what is already known to be refused).
    Raises KeyError, TypeError or ValueError for a missing or malformed number."""
    dim = positive(cfg, "hidden_size")
    n_heads = positive(cfg, "num_attention_heads")
    rope = cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        rope = {}
    # Missing keys take transformers' Qwen3Config defaults, as AutoConfig would.
    theta = finite(cfg, "rope_theta", finite(rope, "rope_theta", 10000.0))
    moe = _moe(cfg, unsupported)
    if unsupported:
        raise HFConfigError("not representable by the native Qwen3: " + "; ".join(unsupported))
    return Arch(
        n_layers=positive(cfg, "num_hidden_layers"),
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=positive(cfg, "num_key_value_heads") if cfg.get("num_key_value_heads") is not None else n_heads,
        head_dim=positive(cfg, "head_dim") if cfg.get("head_dim") is not None else dim // n_heads,
        hidden_dim=(
            positive(cfg, "intermediate_size")
            if cfg.get("intermediate_size") is not None
            else (moe.hidden_dim if moe else 0)
        ),
        vocab_size=positive(cfg, "vocab_size"),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        rope_theta=theta,
        max_seq_len=(
            positive(cfg, "max_position_embeddings") if cfg.get("max_position_embeddings") is not None else 32768
        ),
        norm_eps=finite(cfg, "rms_norm_eps", 1e-6),
        moe=moe,
    )


def _moe(cfg: dict, unsupported: list[str]) -> MoEArch | None:
    """The experts of a Qwen3-MoE config.json (None: dense); layouts the native MoE cannot build are
    added to `unsupported`."""
    # transformers 5 writes num_local_experts; published 4.x configs say num_experts.
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if not experts:
        return None
    moe = MoEArch(
        num_experts=positive(cfg, "num_experts" if cfg.get("num_experts") else "num_local_experts"),
        top_k=positive(cfg, "num_experts_per_tok"),
        hidden_dim=positive(cfg, "moe_intermediate_size"),
    )
    if int(cfg.get("decoder_sparse_step", 1)) != 1 or cfg.get("mlp_only_layers"):
        unsupported.append("mixed dense/MoE layer layouts (decoder_sparse_step, mlp_only_layers)")
    if not cfg.get("norm_topk_prob", True):
        unsupported.append("norm_topk_prob=false (native Qwen3 MoE normalises the top-k weights)")
    return moe


# Arch field -> the config.json key that holds it (for messages that name the user's keys).
HF_KEYS = {
    "n_layers": "num_hidden_layers",
    "dim": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "hidden_dim": "intermediate_size",
    "vocab_size": "vocab_size",
    "tied": "tie_word_embeddings",
    "rope_theta": "rope_theta",
    "norm_eps": "rms_norm_eps",
    "moe": "num_experts",
    "moe.num_experts": "num_experts",
    "moe.top_k": "num_experts_per_tok",
    "moe.hidden_dim": "moe_intermediate_size",
}


def hf_config_from_arch(arch: Arch, base: dict | None = None) -> dict:
    """A Qwen3 config.json describing `arch`: `base` (the source checkpoint's config.json, whose
    other keys such as token ids are kept) with every architecture key set from `arch`."""
    cfg = dict(base or {})
    moe = arch.moe is not None
    cfg.update(
        architectures=["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"],
        model_type="qwen3_moe" if moe else "qwen3",
        vocab_size=arch.vocab_size,
        hidden_size=arch.dim,
        num_hidden_layers=arch.n_layers,
        num_attention_heads=arch.n_heads,
        num_key_value_heads=arch.n_kv_heads,
        head_dim=arch.head_dim,
        intermediate_size=arch.hidden_dim,
        max_position_embeddings=arch.max_seq_len,
        rms_norm_eps=arch.norm_eps,
        tie_word_embeddings=arch.tied,
        hidden_act="silu",
        attention_bias=False,
        use_sliding_window=False,
    )
    if isinstance(cfg.get("rope_parameters"), dict):
        cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_theta": arch.rope_theta}
    else:
        cfg["rope_theta"] = arch.rope_theta
    if "layer_types" in cfg:  # transformers checks its length against num_hidden_layers
        cfg["layer_types"] = ["full_attention"] * arch.n_layers
    if arch.moe is not None:
        cfg.pop("num_local_experts", None)
        cfg.update(
            num_experts=arch.moe.num_experts,
            num_experts_per_tok=arch.moe.top_k,
            moe_intermediate_size=arch.moe.hidden_dim,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    return cfg
