"""`qwen3exp chat RUN`: talk to the model a run trained.

`--prompt TEXT` prints one answer; without it, a small interactive loop reads a line at a time from
stdin (the conversation is kept) until end of input or `/exit`. `--compare RUN_B` answers the same
prompt with both runs, one after the other under a header each. The conversation goes through the
tokenizer's chat template (`--thinking`: Qwen3's `enable_thinking`); greedy at `--temperature 0`
(the default), else sampled after `torch.manual_seed(seed)` (generation_config.json's top_k / top_p
kept). CUDA when there is one, else the CPU. Exit code 2 with one line: a path that is not a
qwen3exp run, no loadable weights, a tokenizer without a chat template, a bad number.

What is loaded (transformers' AutoModelForCausalLM and AutoTokenizer, safetensors only):
- the newest Hugging Face export `<run>/export/step-N` (highest N with config.json or an adapter);
  of a peft=lora export its `merged/` folder (checkpoint.merge_lora), else the base with `adapter/`
  applied through transformers' PEFT integration (peft must be installed): the export's own copy of
  the base, else the base model adapter_config.json names (`base_model_name_or_path` and
  `revision`: a local folder, or a Hub id in the local Hugging Face cache, never downloaded);
- else (model=native without peft) the newest DCP checkpoint `checkpoint/step-N` that qwen3exp
  signed, verified first (DCP reads with pickle: `qwen3exp.run.signing`), converted by `convert`
  (`qwen3exp.launchers.chat_dcp`: torchtitan's state dict adapter) into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3exp.errors import EXIT_CONFIG_ERROR, printable
from qwen3exp.plan import model_ref
from qwen3exp.run import records, rundir, signing

PROG = "qwen3exp chat"
EXIT = "/exit"
NO_TEXT = "(the model ended its turn without text)"  # printed for an empty answer, not a bare empty line
ADAPTER_CONFIG = "adapter_config.json"
Convert = Callable[[Path, dict, Path], None]
"""(DCP step folder, the run's resolved experiment, empty folder) -> a Hugging Face folder there."""


class Refused(Exception):
    """A run (or tokenizer) chat cannot use; the message says why and what to do (exit 2)."""


@dataclass
class Weights:
    folder: Path
    """The Hugging Face folder loaded with AutoModelForCausalLM (and AutoTokenizer)."""
    adapter: Path | None = None
    """A PEFT adapter folder applied on top (peft=lora without merged weights)."""
    experiment: dict | None = None
    """Set for a DCP checkpoint `folder` (no export): the run's resolved experiment."""


def export_steps(run: Path) -> list[int]:
    """The steps N of `<run>/export/step-N` folders that are complete (config.json, or a LoRA
    adapter on its own), oldest first."""
    return sorted(
        int(m.group(1))
        for p in (run / rundir.EXPORT).glob("step-*")
        if (m := re.fullmatch(r"step-(\d+)", p.name))
        and ((p / "config.json").is_file() or (p / rundir.ADAPTER / ADAPTER_CONFIG).is_file())
    )


def find_weights(run: Path) -> Weights:
    """What `chat` loads for `run`; raises Refused when the run left no loadable Hugging Face folder."""
    steps = export_steps(run)
    if not steps:
        return _dcp_weights(run)
    folder = run / rundir.EXPORT / f"step-{steps[-1]}"
    merged = folder / rundir.MERGED
    if (merged / "config.json").is_file():
        return Weights(merged)
    adapter = folder / rundir.ADAPTER
    if adapter.is_dir():
        return Weights(folder if (folder / "config.json").is_file() else named_base(adapter), adapter)
    return Weights(folder)


def named_base(adapter: Path) -> Path:
    """The folder of the base model an adapter-only export names (adapter_config.json's
    base_model_name_or_path and revision), resolved offline; Refused when it is not here."""
    try:
        config = json.loads((adapter / ADAPTER_CONFIG).read_text())
        name, revision = config["base_model_name_or_path"], config.get("revision")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise Refused(f"{adapter / ADAPTER_CONFIG}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(name, str) or not isinstance(revision, str | None):
        raise Refused(f"{adapter / ADAPTER_CONFIG}: base_model_name_or_path {name!r} is not a model reference")
    ref, problems = model_ref.resolve("base_model_name_or_path", name, revision=revision, revision_key="revision")
    if problems or ref.folder is None:
        why = "; ".join(filter(None, (problems[0].message, problems[0].hint))) if problems else "does not resolve"
        raise Refused(f"{adapter}: the adapter's base model {name!r} is not available here: {why}")
    return ref.folder


def _dcp_weights(run: Path) -> Weights:
    fix = "rerun with checkpoint.export=end (or checkpoint=hf_export)"
    step = rundir.latest_checkpoint_step(run)
    if step is None:
        left = "unsigned DCP checkpoints" if rundir.complete_checkpoint_steps(run) else "no weights"
        raise Refused(f"{run}: this run has no Hugging Face export and {left}; {fix}")
    try:
        experiment = rundir.load_experiment(run) or {}
    except records.Unreadable as e:
        raise Refused(str(e)) from None
    model, peft = experiment.get("model") or {}, experiment.get("peft") or {}
    backend, kind = model.get("backend"), peft.get("kind", "none")
    if backend != "native" or kind not in (None, "none"):
        raise Refused(
            f"{run}: this run has no Hugging Face export, and chat reads DCP checkpoints of model=native "
            f"without peft only (model.backend={backend}, peft.kind={kind}); {fix}"
        )
    folder = run / rundir.CHECKPOINT / f"step-{step}"
    if why := signing.problem(folder):
        raise Refused(f"{folder}: {why}; never loaded (DCP reads with pickle); {fix}")
    return Weights(folder, experiment=experiment)


def device() -> str:
    import torch  # lazy: seconds to import; only once a model is loaded

    return "cuda" if torch.cuda.is_available() else "cpu"


def load(weights: Weights, convert: Convert | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of `weights`, in eval mode on `device()` (float32 on the CPU, the export's
    dtype on CUDA); raises Refused for a tokenizer without a chat template or a LoRA export without
    peft installed. A DCP checkpoint goes through a temporary Hugging Face folder (`convert`)."""
    if weights.experiment is None:
        return _load_folder(weights)
    if convert is None:
        raise Refused(
            f"{weights.folder}: a DCP checkpoint, and this entry point cannot convert one (use qwen3exp chat)"
        )
    with tempfile.TemporaryDirectory(prefix="qwen3exp-chat-") as tmp:
        convert(weights.folder, weights.experiment, Path(tmp))
        return _load_folder(Weights(Path(tmp)))


def _load_folder(weights: Weights) -> tuple[Any, Any]:
    import torch  # lazy: seconds to import; only once a model is loaded
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: seconds to import; chat only
    from transformers.utils import logging as hf_logging  # lazy: the same

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(weights.folder)
    if not getattr(tok, "chat_template", None):
        raise Refused(
            f"{weights.folder}: the tokenizer has no chat template (tokenizer_config.json chat_template "
            "or chat_template.jinja); chat needs one to render a conversation"
        )
    where = device()
    dtype = "auto" if where == "cuda" else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(weights.folder, dtype=dtype, use_safetensors=True)
    except (OSError, ValueError) as e:
        raise Refused(f"{weights.folder}: not loadable with transformers ({type(e).__name__}: {e})") from None
    if weights.adapter is not None:
        model = _with_adapter(model, weights.adapter)
    return model.to(where).eval(), tok


def _with_adapter(model, adapter: Path):
    """The adapter applied through transformers' PEFT integration (peft installed). No `local_files_only`:
    transformers 5's `load_adapter` passes it to `LoadStateDictConfig`, a TypeError; a folder is not fetched."""
    from transformers.utils import is_peft_available  # lazy: seconds to import; chat only

    if not is_peft_available():
        raise Refused(
            f"{adapter}: a LoRA adapter without merged weights, and peft is not installed; "
            "pip install peft, or rerun with checkpoint.merge_lora=true"
        )
    model.load_adapter(str(adapter))
    return model


def prompt_ids(tok, messages: list[dict], *, thinking: bool) -> list[int]:
    """The token ids of `messages` rendered by the chat template, ready for the assistant's turn."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def generate(model, tok, ids: list[int], *, max_new_tokens: int, temperature: float, seed: int) -> list[int]:
    """The new token ids after `ids`: greedy at temperature 0, else sampled after
    `torch.manual_seed(seed)`."""
    import torch  # lazy: seconds to import; only once a model is loaded

    where = next(model.parameters()).device
    input_ids = torch.tensor([ids], device=where)
    sampling: dict = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": temperature}
    torch.manual_seed(seed)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            **sampling,
        )
    return out[0, len(ids) :].tolist()


def answer(model, tok, messages: list[dict], *, thinking: bool, **decoding) -> str:
    """The assistant's reply to `messages` (the new tokens decoded, special tokens skipped)."""
    new = generate(model, tok, prompt_ids(tok, messages, thinking=thinking), **decoding)
    return tok.decode(new, skip_special_tokens=True)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--prompt", help="one user message: print the answer and exit (else: an interactive loop)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per answer (> 0; default 128)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default); > 0: sampling")
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed before each sampled answer (default 0)")
    ap.add_argument("--thinking", action="store_true", help="enable_thinking=True in the chat template (Qwen3)")
    ap.add_argument("--compare", type=Path, metavar="RUN_B", help="answer the same --prompt with RUN_B too")
    return ap


def _check_numbers(args: argparse.Namespace) -> None:
    if args.max_new_tokens <= 0:
        raise Refused(f"--max-new-tokens {args.max_new_tokens}: must be a positive integer")
    if not args.temperature >= 0 or args.temperature == float("inf"):
        raise Refused(f"--temperature {args.temperature}: must be a finite number >= 0 (0: greedy)")
    if args.compare is not None and args.prompt is None:
        raise Refused("--compare needs --prompt (the loop talks to one run)")


def _check_run(run: Path) -> None:
    if not run.is_dir():
        raise Refused(f"{run}: not a directory (expected a qwen3exp run directory)")
    try:
        experiment = rundir.load_experiment(run)
    except records.Unreadable as e:
        raise Refused(str(e)) from None
    if experiment is None:
        raise Refused(f"{run}: not a qwen3exp run directory (no {rundir.EXPERIMENT})")


def main(argv: list[str] | None = None, convert: Convert | None = None) -> int:
    """`convert`: how a DCP checkpoint becomes a Hugging Face folder (None: DCP runs are refused)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse printed the usage and the mistake (an unknown option, ...)
        return e.code if isinstance(e.code, int) else EXIT_CONFIG_ERROR
    decoding = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    try:
        _check_numbers(args)
        runs = [args.run] if args.compare is None else [args.run, args.compare]
        for run in runs:
            _check_run(run)
        weights = [find_weights(run) for run in runs]
        models = [load(w, convert) for w in weights]
    except Refused as e:
        print(f"{PROG}: {printable(str(e))}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if args.prompt is None:
        model, tok = models[0]
        return _loop(model, tok, thinking=args.thinking, **decoding)
    messages = [{"role": "user", "content": args.prompt}]
    for run, w, (model, tok) in zip(runs, weights, models, strict=True):
        reply = answer(model, tok, messages, thinking=args.thinking, **decoding)
        if len(runs) > 1:
            print(f"=== {run} ({w.folder}) ===")
        print(reply if reply.strip() else NO_TEXT, flush=True)
    return 0


def _loop(model, tok, *, thinking: bool, **decoding) -> int:
    """Read user messages from stdin, one a line, until end of input or /exit; answer each with the
    conversation so far."""
    messages: list[dict] = []
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"{PROG}: type a message and Enter; {EXIT} or Ctrl-D ends", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", flush=True, file=sys.stderr)
        line = sys.stdin.readline()
        if not line or line.strip() == EXIT:
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        reply = answer(model, tok, messages, thinking=thinking, **decoding)
        messages.append({"role": "assistant", "content": reply})
        print(reply if reply.strip() else NO_TEXT, flush=True)
