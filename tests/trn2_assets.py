"""Stand-ins for the published Qwen3 folders the trn2 experiments name, so that those experiments
can be planned and converted here (no download, no network).

Each stand-in has the published `config.json` values, the tokenizer bundled with qwen3exp (vocab
2048, below the models' 151936), and, where weights are loaded, safetensors files whose headers
list every tensor at its published shape and dtype over a SPARSE file of the exact length: the
pre-launch checks read headers and file sizes only, so they see a complete checkpoint, while the
disk holds a few KiB. Never good for loading weights: the data is all zeros.
"""

from __future__ import annotations

import atexit
import json
import shutil
import struct
import tempfile
from pathlib import Path

from qwen3exp.assets import CORPUS_DIR, TOKENIZER_DIR

# https://huggingface.co/Qwen/Qwen3-4B-Instruct-2507/blob/main/config.json (the values that matter)
QWEN3_4B_INSTRUCT_2507 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "rope_theta": 5000000,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
    "rope_scaling": None,
    "use_sliding_window": False,
    "sliding_window": None,
}

# https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (the values that matter)
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 40960,
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}


def dense_tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a published dense Qwen3 checkpoint (lm_head only when untied)."""
    d, hd, f = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = {"model.embed_tokens.weight": (cfg["vocab_size"], d), "model.norm.weight": (d,)}
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = (cfg["vocab_size"], d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update(
            {
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (h * hd, d),
                p + "self_attn.k_proj.weight": (kv * hd, d),
                p + "self_attn.v_proj.weight": (kv * hd, d),
                p + "self_attn.o_proj.weight": (d, h * hd),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (f, d),
                p + "mlp.up_proj.weight": (f, d),
                p + "mlp.down_proj.weight": (d, f),
            }
        )
    return out


def write_sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "BF16") -> int:
    """A valid safetensors file (header + data region of the exact size) whose data is a hole."""
    itemsize = {"BF16": 2, "F16": 2, "F32": 4}[dtype]
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = itemsize
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data region starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + offset)
    return offset


def write_folder(folder: Path, cfg: dict, *, weights: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, folder / name)
    if weights:
        write_sparse_safetensors(folder / "model.safetensors", dense_tensor_shapes(cfg))
    return folder


_ROOT: Path | None = None


def standins() -> dict[str, Path]:
    """The stand-in folders (created once per test session, in a temporary folder)."""
    global _ROOT
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="qwen3exp-trn2-assets-"))
        atexit.register(shutil.rmtree, _ROOT, True)
        write_folder(_ROOT / "Qwen3-4B-Instruct-2507", QWEN3_4B_INSTRUCT_2507, weights=True)
        write_folder(_ROOT / "Qwen3-30B-A3B", QWEN3_30B_A3B, weights=False)
    return {"4b": _ROOT / "Qwen3-4B-Instruct-2507", "30b_a3b": _ROOT / "Qwen3-30B-A3B"}


MIX_COPIES = {"web": 17, "code": 8}
"""trn2_qwen3_4b_mix's two corpora here: the bundled corpus repeated (2.7M and 1.3M tokens of the
bundled tokenizer), enough for the experiment's 20 steps to read each under its max_epochs of 4."""


def mix_corpora() -> dict[str, Path]:
    """Stand-ins for the corpora trn2_qwen3_4b_mix names (created once per test session)."""
    root, text = standins()["4b"].parent, (CORPUS_DIR / "train.jsonl").read_text()
    out = {name: root / f"{name}.jsonl" for name in MIX_COPIES}
    for name, path in out.items():
        if not path.exists():
            path.write_text(text * MIX_COPIES[name])
    return out


def overrides_for(experiment: str) -> list[str]:
    """What a trn2 experiment needs on this machine: a dry run (no Trainium) and the stand-in for
    the published folder it names (and for trn2_qwen3_4b_mix, its corpora)."""
    folder = standins()["30b_a3b" if "30b_a3b" in experiment else "4b"]
    sources = [f"data.sources.{n}.path={p}" for n, p in mix_corpora().items()] if "_mix" in experiment else []
    return ["dry_run=true", f"model.hf_assets_path={folder}", *sources]
