"""Regenerate the bundled corpus and tokenizer (run once by a developer; outputs are committed).

Why generated, not downloaded: the project must train with no network. The corpus is the
docstrings of CPython's standard library (PSF licence, redistributable with notice), which gives
real English-and-code text; the tokenizer is a byte-level BPE (vocab 2048) trained on it with the
`tokenizers` library, so it loads in torchtitan and in transformers alike.

    python -m qwen3exp.assets.make_assets
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus" / "train.jsonl"
TOKENIZER_DIR = HERE / "tokenizer"
VOCAB_SIZE = 2048
MAX_DOCS = 4000
# qwen3exp's `tiny` flavor (qwen3exp/flavors.py) as a Hugging Face Qwen3 config.json.
TINY_QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "use_sliding_window": False,
    "eos_token_id": 0,
    "dtype": "float32",
}


def _docstrings() -> list[str]:
    docs: list[str] = []
    seen: set[str] = set()
    names = sorted(m.name for m in pkgutil.iter_modules() if m.name in sys.stdlib_module_names)
    for name in names:
        if name.startswith("_") or name in {"antigravity", "this", "idlelib", "tkinter", "turtle"}:
            continue
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        for obj in [mod, *(v for _, v in inspect.getmembers(mod) if inspect.isclass(v) or inspect.isfunction(v))]:
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 200 and doc not in seen:
                seen.add(doc)
                docs.append(doc)
    random.Random(0).shuffle(docs)
    return docs[:MAX_DOCS]


def main() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # lazy: only to rebuild it

    docs = _docstrings()
    CORPUS.parent.mkdir(parents=True, exist_ok=True)
    with CORPUS.open("w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer=trainer)
    TOKENIZER_DIR.mkdir(parents=True, exist_ok=True)
    tok.save(str(TOKENIZER_DIR / "tokenizer.json"))
    # BOS/EOS come only from tokenizer_config.json in torchtitan's HuggingFaceTokenizer; without it
    # documents would be packed with no separator.
    (TOKENIZER_DIR / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "add_bos_token": False,
                "add_eos_token": True,
                "model_max_length": 4096,
            },
            indent=2,
        )
        + "\n"
    )
    # With config.json the folder is also a (weightless) Hugging Face model folder: the `tiny` flavor
    # in Qwen3Config terms, so model=hf and flavor=auto work out of the box.
    (TOKENIZER_DIR / "config.json").write_text(json.dumps(TINY_QWEN3_CONFIG, indent=2) + "\n")
    print(f"{len(docs)} documents, {CORPUS.stat().st_size / 1e6:.2f} MB; vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
