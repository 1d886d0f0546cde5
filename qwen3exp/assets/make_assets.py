"""Regenerate the bundled corpus and tokenizer (run once by a developer; outputs are committed).

Why generated, not downloaded: the project must train with no network. The corpus is the
docstrings of CPython's standard library (PSF licence, redistributable with notice), which gives
real English-and-code text; the tokenizer is a byte-level BPE (vocab 2048) trained on it with the
`tokenizers` library, so it loads in torchtitan and in transformers alike. Its tokenizer_config.json
carries a chat template in Qwen3's format (`CHAT_TEMPLATE`), and chat/train.jsonl holds synthetic
conversations for data=chat (`chat_records`, deterministic, no tokenizer needed).

    python -m qwen3exp.assets.make_assets          # everything (retrains the tokenizer)
    python -m qwen3exp.assets.make_assets chat     # only the chat template, the conversations and the pairs
    python -m qwen3exp.assets.make_assets preference  # only the preference pairs (from the conversations)
    python -m qwen3exp.assets.make_assets lm_eval  # only the questions of the bundled lm-eval task

The bundled lm-evaluation-harness task `qwen3exp_tiny` (lm_eval/: its YAML, loader and questions)
asks for the true end of sentences of the corpus (`lm_eval_records`): the tiny experiments train on
that corpus, so its score moves with what they learn; a smoke test of the whole path, not a benchmark.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import random
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus" / "train.jsonl"
CHAT = HERE / "chat" / "train.jsonl"
PREFERENCE = HERE / "preference" / "train.jsonl"
LM_EVAL_QUESTIONS = HERE / "lm_eval" / "qwen3exp_tiny.jsonl"
LM_EVAL_COUNT = 20
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


# Qwen3's chat template (tokenizer_config.json of the Qwen3 models), cut to its structure: a system
# prompt first, `<|im_start|>{role}\n...<|im_end|>\n` turns, and the empty thinking block
# `<think>\n\n</think>\n\n` on an assistant turn after the last user query that is the last message
# (Qwen3 renders older assistant turns without it). Tools and reasoning_content are left out.
CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}"
    "{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- if loop.index0 > ns.last_query_index and loop.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content.lstrip('\\n') }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": None,
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
    "add_bos_token": False,
    "add_eos_token": True,
    "model_max_length": 4096,
    "chat_template": CHAT_TEMPLATE,
}
CHAT_CONVERSATIONS = 320
_NAMES = ["Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Ivy", "Jon", "Kai", "Lea", "Max"]
_COLOURS = ["red", "blue", "green", "black", "white", "yellow", "purple", "orange"]
_ANIMALS = ["cat", "dog", "fox", "owl", "bee", "cow", "hen", "pig"]


def chat_records(n: int = CHAT_CONVERSATIONS) -> list[dict]:
    """Synthetic conversations a tiny model learns in a few dozen steps: arithmetic, echoing and
    lookups with fixed answer phrasings, 1 to 3 turns, half with a system prompt, a sixth as
    prompt/completion pairs. Deterministic (seeded)."""
    rng = random.Random(24)
    out: list[dict] = []
    for i in range(n):
        turns = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            a, b = rng.randrange(10), rng.randrange(10)
            name, colour, animal = rng.choice(_NAMES), rng.choice(_COLOURS), rng.choice(_ANIMALS)
            turns.append(
                rng.choice(
                    [
                        (f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."),
                        (f"Repeat after me: {colour} {animal}", f"{colour} {animal}"),
                        (f"My name is {name}. Say hello.", f"Hello, {name}! Nice to meet you."),
                        (f"What colour is the {colour} {animal}?", f"The {animal} is {colour}."),
                    ]
                )
            )
        if i % 6 == 5:
            out.append({"prompt": turns[0][0], "completion": turns[0][1]})
            continue
        system = [{"role": "system", "content": "You are a brief, helpful assistant."}] if i % 2 == 0 else []
        messages = [m for q, r in turns for m in ({"role": "user", "content": q}, {"role": "assistant", "content": r})]
        out.append({"messages": system + messages})
    return out


def write_chat_assets() -> None:
    """The chat template in tokenizer_config.json and the conversations (no tokenizer retraining:
    the token ids of the corpus stay as they are)."""
    (TOKENIZER_DIR / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    CHAT.parent.mkdir(parents=True, exist_ok=True)
    CHAT.write_text("".join(json.dumps(r) + "\n" for r in chat_records()))


def lm_eval_records(n: int = LM_EVAL_COUNT) -> list[dict]:
    """The questions of `qwen3exp_tiny`: the first sentence (10 to 24 words, ASCII) of n corpus
    documents, cut in half; the first half is the context, the choices are its true second half and
    the second halves of 3 other questions' sentences, in a seeded order. Deterministic."""
    sentences = []
    for line in CORPUS.read_text().splitlines():
        first = json.loads(line)["text"].split("\n\n")[0].replace("\n", " ")
        sentence = re.split(r"(?<=[.!?])\s", first)[0]
        if 10 <= len(sentence.split()) <= 24 and sentence.endswith(".") and sentence.isascii():
            sentences.append(sentence.split())
    rng = random.Random(26)
    picked = rng.sample(sentences, n)
    halves = [(" ".join(w[: len(w) // 2]), " ".join(w[len(w) // 2 :])) for w in picked]
    out = []
    for i, (context, end) in enumerate(halves):
        choices = [end, *(halves[(i + k) % n][1] for k in (1, 2, 3))]
        rng.shuffle(choices)
        out.append({"id": i, "context": context, "choices": choices, "label": choices.index(end)})
    return out


def write_lm_eval_assets() -> None:
    LM_EVAL_QUESTIONS.write_text("".join(json.dumps(r) + "\n" for r in lm_eval_records()))


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


def preference_records(conversations: list[list[dict]]) -> list[dict]:
    """Pairs for data=preference, built honestly from the bundled conversations: the prompt is a
    conversation up to its last answer, chosen its real last answer, rejected the last answer of the
    next conversation whose answer differs (a fluent answer to another question)."""
    answers = [c[-1]["content"] for c in conversations]
    out = []
    for i, conv in enumerate(conversations):
        j = next(
            k % len(conversations)
            for k in range(i + 1, i + len(conversations))
            if answers[k % len(conversations)] != answers[i]
        )
        out.append({"prompt": conv[:-1], "chosen": answers[i], "rejected": answers[j]})
    return out


def write_preference_assets() -> None:
    records = [json.loads(line) for line in CHAT.read_text().splitlines() if line.strip()]
    conversations = [
        r["messages"]
        if "messages" in r
        else [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["completion"]}]
        for r in records
    ]
    PREFERENCE.parent.mkdir(parents=True, exist_ok=True)
    with PREFERENCE.open("w") as f:
        for r in preference_records(conversations):
            f.write(json.dumps(r) + "\n")


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
    write_chat_assets()
    write_preference_assets()
    write_lm_eval_assets()
    # With config.json the folder is also a (weightless) Hugging Face model folder: the `tiny` flavor
    # in Qwen3Config terms, so model=hf and flavor=auto work out of the box.
    (TOKENIZER_DIR / "config.json").write_text(json.dumps(TINY_QWEN3_CONFIG, indent=2) + "\n")
    print(f"{len(docs)} documents, {CORPUS.stat().st_size / 1e6:.2f} MB; vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    if sys.argv[1:] == ["chat"]:
        write_chat_assets()
        write_preference_assets()
    elif sys.argv[1:] == ["preference"]:
        write_preference_assets()
    elif sys.argv[1:] == ["lm_eval"]:
        write_lm_eval_assets()
    else:
        main()
