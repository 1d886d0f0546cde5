"""The tokenizer a run reads: its vocabulary, and whether it is the model's own.

Plain JSON (tokenizer.json, vocab.json, tokenizer_config.json): no tokenizers, no transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

from qwen3exp.config.flavors import Arch
from qwen3exp.errors import Problem
from qwen3exp.plan.model_ref import ModelRef
from qwen3exp.plan.model_sources import BUNDLED, Refs, Sections, fetch_hint

TOKENIZER_PATTERNS = ("tokenizer*", "vocab.json", "merges.txt", "special_tokens_map.json", "chat_template.jinja")
"""The files of a tokenizer (for the `hf download --include` hint)."""


def tokenizer_vocab_size(folder: Path) -> int | None:
    """1 + the largest token id the tokenizer files in `folder` can produce (None: no tokenizer)."""
    ids: list[int] = []
    tok = folder / "tokenizer.json"
    if tok.is_file():
        data = json.loads(tok.read_text())
        vocab = data.get("model", {}).get("vocab") or {}
        if isinstance(vocab, dict):
            ids += vocab.values()
        else:  # Unigram: a list of [piece, score]
            ids.append(len(vocab) - 1)
        ids += [t["id"] for t in data.get("added_tokens") or []]
    elif (folder / "vocab.json").is_file():
        ids += json.loads((folder / "vocab.json").read_text()).values()
    else:
        return None
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        decoder = json.loads(cfg.read_text()).get("added_tokens_decoder") or {}
        if not isinstance(decoder, dict):  # transformers reads it as {id: token}
            raise TypeError(f"{cfg.name}'s added_tokens_decoder is a JSON {type(decoder).__name__}, not an object")
        ids += [int(i) for i in decoder]
    return max(ids) + 1 if ids else 0


def tokenizer_problems(
    exp: Sections, r: Refs, folder: Path, arch: Arch, weights: Path | None
) -> tuple[int | None, list[Problem]]:
    """(the tokenizer's vocabulary, problems): the tokenizer exists, its ids fit the model's
    embedding, and it is the model's own: a tokenizer from another folder than the model's config or
    weights must have the same vocabulary as the tokenizer that ships with them, and the bundled
    tokenizer is never used silently for loaded weights of another vocabulary."""
    ref = r.tokenizer(exp)
    key, value = (ref.key, ref.value) if ref is not None else ("model.hf_assets_path", str(folder))
    try:
        n = tokenizer_vocab_size(folder)
    except (OSError, json.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError) as e:
        return None, [Problem(key, value, f"tokenizer files are unreadable ({e})")]
    if n is None:
        return None, [
            Problem(
                key,
                value,
                "holds no tokenizer" + (f" ({folder})" if ref and ref.is_hub else ""),
                "a folder with tokenizer.json, or vocab.json + merges.txt",
                fetch_hint(ref, *TOKENIZER_PATTERNS),
            )
        ]
    if n > arch.vocab_size:
        return n, [
            Problem(
                key,
                value,
                f"the tokenizer produces token ids up to {n - 1} but the model's "
                f"vocab_size is {arch.vocab_size}: ids >= {arch.vocab_size} have no embedding",
                f"a tokenizer with at most {arch.vocab_size} tokens, or a model with vocab_size >= {n}",
            )
        ]
    problems = _owner_problems(exp, r, folder, ref, n)
    if ref is None and weights is not None and not problems and n != arch.vocab_size:
        problems.append(
            Problem(
                key,
                None,
                f"no tokenizer is named: {BUNDLED} has {n} tokens, but the loaded weights of "
                f"{weights} have a vocabulary of {arch.vocab_size}",
                "the model's own tokenizer",
                "set model.hf_assets_path to the model's folder or Hub id",
            )
        )
    return n, problems


def _owner_problems(exp: Sections, r: Refs, folder: Path, ref: ModelRef | None, n: int) -> list[Problem]:
    """The tokenizer (of `folder`, `n` tokens) is not the model's own: the one next to its config.json
    or its weights, when they are in another folder, has another vocabulary."""
    key, value = (ref.key, ref.value) if ref is not None else ("model.hf_assets_path", str(folder))
    problems: list[Problem] = []
    # The model's own tokenizer: the one next to its config.json and next to its weights.
    owners = [
        (o.key, o.value, o.folder)
        for o in (r.config(exp), r.weights(exp))
        if o is not None and o.folder is not None and o.folder != folder
    ]
    for okey, ovalue, ofolder in dict.fromkeys(owners):
        try:
            own = tokenizer_vocab_size(ofolder)
        except (OSError, json.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError):
            continue
        if own is not None and own != n:
            where = "the bundled tokenizer" if ref is None else f"the tokenizer of {key} = {value!r}"
            problems.append(
                Problem(
                    key,
                    value if ref is not None else None,
                    f"{where} has {n} tokens, but the model of {okey} = {ovalue!r} ships its own tokenizer with "
                    f"{own} tokens: training would read text with another model's token ids",
                    f"the model's own tokenizer ({okey}'s folder, or a copy of it)",
                    f"leave {key} unset to use the tokenizer of {okey}"
                    if ref is None or exp.model.backend == "hf"
                    else f"set {key} to the folder (or Hub id) of {okey}",
                )
            )
    return problems
