"""objective.reference: DPO's separate reference model, checked before launch, and how the plan says
where the reference's log-probs come from.

A reference is resolved exactly as `checkpoint.path` is (`qwen3exp.plan.model_ref`: a local folder,
or a Hub id in the local Hugging Face cache, never downloaded). Its folder must hold a Qwen3
config.json the native model can hold (no remote code), every tensor of that architecture in its
safetensors (`qwen3exp.plan.weight_files`), and the policy's tokenizer: the same vocabulary (every
token with the same id, `tokenizer.json` / `vocab.json`) and the same embedding size, since DPO
compares the two models' log-probs of the same token ids. The reference's architecture is its own
(another size of Qwen3 is fine). Each mistake is a Problem naming `objective.reference`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from qwen3exp.config.flavors import Arch
from qwen3exp.config.sections.objective import DpoObjective
from qwen3exp.errors import Problem
from qwen3exp.plan import model_ref
from qwen3exp.plan.layout_cost import Shape, run_step
from qwen3exp.plan.model_arch import arch_of, read_config
from qwen3exp.plan.model_ref import ModelRef
from qwen3exp.plan.model_sources import fetch_hint
from qwen3exp.plan.tokenizer_files import TOKENIZER_PATTERNS
from qwen3exp.plan.weight_files import weights_problems

KEY = "objective.reference"


def named(exp) -> str | None:
    """The separate reference of a DPO run (None: the policy's starting weights, or no DPO)."""
    return exp.objective.reference if isinstance(exp.objective, DpoObjective) else None


def precomputed(exp) -> bool:
    """DPO with objective.reference_logps=precomputed."""
    return isinstance(exp.objective, DpoObjective) and exp.objective.reference_logps == "precomputed"


def resolve(exp) -> tuple[ModelRef | None, list[Problem]]:
    """The reference resolved (a folder, or a Hub id's cached snapshot), or None when none is named."""
    value = named(exp)
    if value is None:
        return None, []
    return model_ref.resolve(KEY, value)


def folder(exp) -> Path | None:
    """The reference's resolved folder (the ranks read it after `problems` passed)."""
    ref, _ = resolve(exp)
    return ref.folder if ref is not None else None


def vocabulary(folder: Path) -> dict[str, int] | None:
    """Token -> id of the tokenizer files in `folder` (its model's vocabulary and added tokens)."""
    tok = folder / "tokenizer.json"
    if tok.is_file():
        data = json.loads(tok.read_text())
        vocab = data.get("model", {}).get("vocab") or {}
        out = dict(vocab) if isinstance(vocab, dict) else {piece: i for i, (piece, _) in enumerate(vocab)}
        out.update({t["content"]: t["id"] for t in data.get("added_tokens") or []})
        return out
    if (folder / "vocab.json").is_file():
        return dict(json.loads((folder / "vocab.json").read_text()))
    return None


def problems(exp, policy_tokenizer: Path | None, policy_arch: Arch | None) -> list[Problem]:
    """Every problem of objective.reference (none when it is null)."""
    ref, found = resolve(exp)
    if ref is None or found or ref.folder is None:
        return found
    value, where = ref.value, ref.folder
    out: list[Problem] = []
    cfg = read_config(KEY, value, where, out, ref)
    arch = arch_of(KEY, value, cfg, out, "native") if cfg is not None else None
    if cfg is not None and cfg.get("auto_map"):
        why = "config.json has auto_map (remote code); qwen3exp never runs code shipped in a model folder"
        out.append(Problem(KEY, value, why, "a Qwen3 model folder whose config.json has no auto_map"))
    if arch is None:
        return out
    out += _vocabulary_problems(ref, arch, policy_tokenizer, policy_arch)
    out += weights_problems(KEY, where, arch, exact=True, ref=ref)
    return out


def _vocabulary_problems(
    ref: ModelRef, arch: Arch, policy_tokenizer: Path | None, policy_arch: Arch | None
) -> list[Problem]:
    allowed = "a model with the policy's tokenizer (the same tokens, the same ids) and vocab_size"
    if policy_arch is not None and arch.vocab_size != policy_arch.vocab_size:
        why = f"has vocab_size {arch.vocab_size}, the policy {policy_arch.vocab_size}: its log-probs are over other ids"
        return [Problem(KEY, ref.value, why, allowed)]
    try:
        theirs = vocabulary(ref.folder) if ref.folder is not None else None
        ours = vocabulary(policy_tokenizer) if policy_tokenizer is not None else None
    except (OSError, json.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError) as e:
        return [Problem(KEY, ref.value, f"tokenizer files are unreadable ({e})", allowed)]
    if theirs is None:
        why = "holds no tokenizer (tokenizer.json, vocab.json): its vocabulary cannot be compared with the policy's"
        return [Problem(KEY, ref.value, why, allowed, fetch_hint(ref, *TOKENIZER_PATTERNS))]
    if ours is None or theirs == ours:
        return []
    differ = sorted((t for t in set(theirs) | set(ours) if theirs.get(t) != ours.get(t)), key=str)
    first = differ[0]
    why = (
        f"its tokenizer differs from the policy's ({len(theirs)} against {len(ours)} tokens; {len(differ)} "
        f"token(s) with another id or missing, e.g. {first!r}: id {theirs.get(first)} here, {ours.get(first)} in "
        "the policy's): DPO compares log-probs of the same ids"
    )
    return [Problem(KEY, ref.value, why, allowed)]


def mode(exp) -> str:
    """Where DPO's reference log-probs come from, in one line of the plan."""
    o = exp.objective
    if named(exp) is not None:
        ref = f"reference = the separate model {named(exp)} (frozen, sharded like the policy)"
    elif exp.peft.kind == "lora":
        ref = "reference = the base with the adapters switched off (no second model)"
    else:
        ref = "reference = a frozen copy of the starting weights, sharded like them (one more copy of the weights)"
    if o.reference_logps == "live":
        return ref + ", its log-probs computed live in each step"
    if named(exp) is None and exp.peft.kind != "lora":
        ref = "reference = the starting weights"
    return ref + ", its log-probs precomputed before step 1 (no reference held while training)"


def precompute_line(plan) -> list[str]:
    """reference_logps=precomputed: the first pass's estimated time (one forward per side of every
    pair, training and held-out, on the reference's architecture) from the plan's step cost
    (`qwen3exp.plan.layout_cost`: a step is forward + backward = 3 forwards, no recompute here;
    the FSDP all-gathers of a forward behind it); none otherwise."""
    exp = plan.exp
    if not precomputed(exp):
        return []
    pairs = plan.data.get("documents")
    if not pairs:
        return ["precompute: one forward of the reference per pair side before step 1 (pairs not counted: no estimate)"]
    arch = plan.arch
    if (where := folder(exp)) is not None:
        found: list[Problem] = []
        cfg = read_config(KEY, str(where), where, found)
        arch = (arch_of(KEY, str(where), cfg, found, "native") if cfg is not None else None) or arch
    m, b = plan.mesh, plan.batches
    dp = m.dp_replicate * m.dp_shard
    batches = math.ceil(2 * pairs / (b.local_batch_size * dp))
    shape = Shape(m.degrees, "none", b.local_batch_size, batches)
    cost = run_step(exp, arch, shape, nproc_per_node=m.nproc_per_node, facts=plan.platform)
    seconds = max(cost.compute_s, cost.hidden_s * 2 / 3) / 3 + cost.exposed_s / 2
    return [
        f"precompute: {pairs:,} pairs x 2 sides, {batches} forward batch(es) per rank before step 1: "
        f"~{seconds:.3g}s predicted (layout_cost.py; stored in the run directory, reused on resume)"
    ]
