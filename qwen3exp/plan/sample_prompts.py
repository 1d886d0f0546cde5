"""The prompts of `eval.samples` as the ranks feed them to the model, and what they cost.

Shared by the plan (its checks and its cost line: `qwen3exp.plan.render`) and the ranks
(`qwen3exp.titan.samples`), so that the prompt the plan measured is the prompt that is answered:
- a tokenizer with a chat template renders each prompt as one user turn ready for the assistant's
  answer (`add_generation_prompt`; Qwen3's `enable_thinking=False`: the same rendering as
  `qwen3exp chat` without `--thinking`); a tokenizer without one encodes the prompt as plain text;
- an answer stops at the model's end-of-sequence ids (generation_config.json's `eos_token_id`,
  else config.json's, as transformers' `generate` stops) or the tokenizer's eos token.

The checks (exit 2 before any worker): the rules between sections (`qwen3exp.config.rules.
sample_problems`: validation off, pipeline or context parallelism), and a prompt whose rendering
does not fit training.seq_len (each new token is predicted from one forward pass over a
seq_len-long row; an answer ends where the row is full).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from qwen3exp.config.rules import sample_problems
from qwen3exp.errors import Problem

SAMPLES_KEY = "eval.samples"


@functools.lru_cache(maxsize=8)
def load_tokenizer(folder: str):
    """The transformers tokenizer of `folder` (the run's hf_assets_path), chat template or not."""
    from transformers import AutoTokenizer  # lazy: seconds to import; only when eval.samples lists prompts

    return AutoTokenizer.from_pretrained(folder)


def prompt_ids(tok, prompt: str) -> list[int]:
    """The token ids the model continues for `prompt` (see the module docstring)."""
    if getattr(tok, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    else:
        text = prompt
    return list(tok(text, add_special_tokens=False)["input_ids"])


def stop_ids(tok, folder: str | Path) -> set[int]:
    """The ids that end an answer: the eos ids of generation_config.json (else config.json) in
    `folder`, and the tokenizer's eos token."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = Path(folder) / name
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            ids |= {int(i) for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int)}
            break
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    return ids


def problems(exp, folder: Path | None) -> list[Problem]:
    """Everything that rules out the experiment's samples; `folder`: the tokenizer's (None: the
    model files did not check, whose problem is reported; the lengths are not measured)."""
    e = exp.eval
    if not e.samples:
        return []
    found = sample_problems(e, exp.validation, exp.parallelism)
    if folder is None:
        return found
    seq_len = exp.training.seq_len
    tok = load_tokenizer(str(folder))
    for i, prompt in enumerate(e.samples):
        n = len(prompt_ids(tok, prompt))
        if n > seq_len:
            how = "with the tokenizer's chat template" if getattr(tok, "chat_template", None) else "as plain text"
            found.append(
                Problem(
                    SAMPLES_KEY,
                    prompt,
                    f"prompt {i + 1} of {len(e.samples)} is {n} tokens once rendered {how}, longer than "
                    f"training.seq_len ({seq_len})",
                    f"a prompt of at most {seq_len} tokens once rendered",
                    "shorten the prompt, or raise training.seq_len",
                )
            )
    return found


def validations(exp) -> int:
    """How many validations a run of training.steps makes: at step 1, every validation.freq steps
    and at the last step (`qwen3exp.titan.validator`); 0 with validation off."""
    v, steps = exp.validation, exp.training.steps
    if not v.enable:
        return 0
    multiples = range(v.freq, steps + 1, v.freq)  # counted, never listed: steps may be 1e9
    return len(multiples) + (1 not in multiples) + (steps not in multiples and steps != 1)


def cost_line(exp) -> str | None:
    """The plan's line on what the samples cost at most; None without samples."""
    e = exp.eval
    if not e.samples:
        return None
    n, count = len(e.samples), validations(exp)
    how = (
        "greedy"
        if e.sample_temperature == 0
        else f"sampled at temperature {e.sample_temperature:g}, seed {e.sample_seed}"
    )
    per = n * e.sample_tokens
    return (
        f"{n} prompt(s) x at most {e.sample_tokens} new tokens = {per:,} per validation, x {count} validation(s) "
        f"= at most {per * count:,} new tokens ({how}); per validation at most {e.sample_tokens} forward "
        f"passes over {n} x {exp.training.seq_len} tokens (no KV cache), on every rank"
    )
