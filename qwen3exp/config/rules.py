"""The rules between keys of different sections (and the experiment's name), checked after every
section parsed on its own: `check_experiment` runs them, and `qwen3exp.plan.model_files` runs the
architecture rules again once config.json is read (flavor=auto, model=hf).

Each rule returns Problems naming the key to change; a None section (one that did not parse)
skips the rules that read it, so that one mistake does not hide another."""

from __future__ import annotations

import math
from typing import Any

from qwen3exp.config.flavors import FLAVORS, Arch
from qwen3exp.config.sections.data import Validation
from qwen3exp.config.sections.kernels import Kernels
from qwen3exp.config.sections.parallelism import Parallelism
from qwen3exp.config.sections.sweep import Sweep
from qwen3exp.config.sections.training import LOSS_CHUNKS, Training
from qwen3exp.errors import Problem, one_of

NAME_MAX = 120
"""The longest experiment name: one folder of the default run directory (a folder name has 255 bytes)."""


def rule_problems(
    name: str, model: Any, training: Training, parallelism: Parallelism, sweep: Sweep, validation: Validation
) -> list[Problem]:
    """Every rule of an experiment whose sections all parsed, in the order they are reported."""
    return (
        name_problems(name) + objective_problems(sweep, validation) + cross_field_problems(model, training, parallelism)
    )


def name_problems(name: str) -> list[Problem]:
    # The schema's pattern keeps / out; '.', '..' and very long names would still escape or break the
    # default run directory (outputs/.. is the repository root; a folder name has 255 bytes).
    if name not in (".", "..") and len(name) <= NAME_MAX:
        return []
    return [
        Problem(
            "name",
            name,
            "is not a safe single folder name" + (f" ({len(name)} characters)" if len(name) > NAME_MAX else ""),
            f"a single folder name: letters, digits and . _ = , + -, at most {NAME_MAX} characters, not . or ..",
        )
    ]


def objective_problems(sweep: Sweep, validation: Validation) -> list[Problem]:
    if sweep.objective == "val_loss" and not validation.enable:
        return [
            Problem(
                "sweep.objective",
                "val_loss",
                "needs a validation loss, and validation.enable is false",
                "last_loss or tokens_per_second, or validation.enable=true",
            )
        ]
    return []


def cross_field_problems(model: Any, training: Training | None, parallelism: Parallelism | None) -> list[Problem]:
    """Rules between sections that need no files and no platform, for a native flavor (flavor=auto
    and model=hf read config.json: `model_files.check` applies the same rules before launch). A None
    section (one that did not validate) skips the rules that need it, so an unknown flavor does not
    hide a bad tp and a bad learning rate does not hide a too long sequence."""
    problems = sequence_problems(training, parallelism)
    if model is None or model.backend != "native" or model.flavor == "auto":
        return problems
    return problems + section_arch_problems(
        model, training, parallelism, FLAVORS[model.flavor], f"flavor {model.flavor}"
    )


def sequence_problems(training: Training | None, parallelism: Parallelism | None) -> list[Problem]:
    """`training.seq_len` against the degrees that cut the sequence, as torchtitan 0.3.0 checks them
    inside a rank (after the workers started):
    - the chunked loss (`ChunkedLossWrapper`, num_chunks=8, which `to_torchtitan` keeps) splits the
      tokens a rank holds, seq_len / cp, into 8 equal chunks (a `torch._check` in the loss);
    - context parallelism's head-tail load balancer cuts the sequence into 2 x cp pieces
      (`Trainer.__init__`: seq_len divisible by 2 x cp);
    - sequence parallelism (torchtitan's default with tp > 1, kept by `to_torchtitan`) shards the
      sequence across the tp ranks; `Trainer.__init__` checks both at once: seq_len divisible by
      tp x (2 x cp when cp > 1).
    Together: seq_len must be a multiple of lcm(8 x cp, tp x 2cp) (tp x 2cp is tp x 1 when cp = 1).
    This function reports the loss and cp part (which needs no model); `section_arch_problems` the
    tensor-parallel part, once tp fits the model's heads (a tp that is wrong anyway is one mistake,
    not two)."""
    if training is None or parallelism is None:
        return []
    if training.seq_len % (LOSS_CHUNKS * parallelism.cp) == 0:
        return []
    return [_seq_len_problem(training.seq_len, parallelism.tp, parallelism.cp)]


def _seq_len_problem(seq: int, tp: int, cp: int) -> Problem:
    """The one problem about seq_len and the degrees, whichever part failed, with the value that
    satisfies every part (see `sequence_problems`)."""
    sharded = tp * (2 * cp if cp > 1 else 1)
    divisor = math.lcm(LOSS_CHUNKS * cp, sharded)
    held = f"the seq_len / cp = {seq} / {cp} tokens each rank holds" if cp > 1 else "the sequence"
    why = [f"torchtitan's chunked loss cuts {held} into {LOSS_CHUNKS} equal chunks"]
    if cp > 1:
        why.append(f"context parallelism (parallelism.cp={cp}) balances 2 x cp = {2 * cp} pieces of it")
    binding_tp = tp if divisor != LOSS_CHUNKS * cp else 1  # tp adds nothing when 8 x cp covers it
    if binding_tp > 1:
        why.append(
            f"sequence parallelism (on with parallelism.tp={tp}) shards it across {tp} ranks"
            + (f", and torchtitan needs tp x 2 x cp = {sharded} to divide it" if cp > 1 else "")
        )
    lower = seq // divisor * divisor
    nearest = f"training.seq_len={lower} or {lower + divisor}" if lower else f"training.seq_len={divisor}"
    return Problem(
        "training.seq_len",
        seq,
        f"is not a multiple of {divisor}: " + "; ".join(why),
        f"a multiple of {divisor}" + _lcm_of(LOSS_CHUNKS, cp, binding_tp, sharded),
        f"nearest valid values: {nearest}",
    )


def _lcm_of(chunks: int, cp: int, tp: int, sharded: int) -> str:
    """How the divisor of `sequence_problems` is made, for the allowed line."""
    first = f"{chunks} x cp = {chunks * cp}" if cp > 1 else str(chunks)
    if tp > 1:
        second = f"tp x 2 x cp = {sharded}" if cp > 1 else f"tp = {tp}"
        return f" (lcm of {first} and {second})"
    return f" ({first})" if cp > 1 else ""


def arch_problems(
    model: Any,
    training: Training | None,
    parallelism: Parallelism | None,
    kernels: Kernels | None,
    base: Arch,
    origin: str,
) -> list[Problem]:
    """Every setting the architecture rules out. `base` is the architecture before the experiment's
    reductions (a flavor's, or config.json's for flavor=auto and model=hf, checked before launch);
    `origin` names it in messages. A None section (one that did not validate on its own) skips the
    rules that read it."""
    problems = section_arch_problems(model, training, parallelism, base, origin)
    if kernels is not None and kernels.moe.impl == "nki" and base.moe is None:
        problems.append(
            Problem(
                "kernels.moe.impl",
                "nki",
                f"{origin} is dense: it has no experts for kernels=nki_moe",
                "torchtitan for dense models (nki needs an MoE model: tiny_moe, 30B-A3B, ...)",
            )
        )
    return problems


def section_arch_problems(
    model: Any, training: Training | None, parallelism: Parallelism | None, base: Arch, origin: str
) -> list[Problem]:
    n_layers, num_experts, top_k = (
        (model.n_layers, model.num_experts, model.top_k) if model.backend == "native" else (None, None, None)
    )
    arch = base.reduced(n_layers=n_layers, num_experts=num_experts, top_k=top_k)
    problems: list[Problem] = []
    if arch.n_heads % arch.n_kv_heads:
        # Grouped-query attention shares each kv head with n_heads / n_kv_heads query heads: torchtitan's
        # fused QKV raises in every rank, transformers fails on the first forward. Only a config.json
        # can say so (every flavor divides), so the key is the folder that holds it.
        key = "model.hf_model" if model.backend == "hf" and model.hf_model is not None else "model.hf_assets_path"
        value = model.hf_model if key == "model.hf_model" else model.hf_assets_path
        problems.append(
            Problem(
                key,
                value,
                f"num_attention_heads ({arch.n_heads}) is not a multiple of "
                f"num_key_value_heads ({arch.n_kv_heads}) in {origin}",
                "a config.json whose num_attention_heads is a multiple of num_key_value_heads",
                f"divisors of {arch.n_heads}: {one_of(_divisors(arch.n_heads))}",
            )
        )
    if parallelism is not None:
        problems += _degree_problems(model, training, parallelism, arch, origin)
    if training is not None and training.seq_len > arch.max_seq_len:
        problems.append(
            Problem(
                "training.seq_len",
                training.seq_len,
                f"exceeds the model's maximum sequence length ({arch.max_seq_len}, {origin})",
                f"1..{arch.max_seq_len}",
            )
        )
    if n_layers is not None and n_layers > base.n_layers:
        problems.append(
            Problem("model.n_layers", n_layers, f"{origin} has only {base.n_layers} layers", f"1..{base.n_layers}")
        )
    for key, v in (("num_experts", num_experts), ("top_k", top_k)):
        if v is not None and base.moe is None:
            problems.append(Problem(f"model.{key}", v, f"{origin} is dense (no experts)", "null for dense models"))
    if base.moe is not None and num_experts is not None and num_experts > base.moe.num_experts:
        problems.append(
            Problem(
                "model.num_experts",
                num_experts,
                f"{origin} has only {base.moe.num_experts} experts",
                f"1..{base.moe.num_experts}",
            )
        )
    if base.moe is not None and arch.moe is not None and arch.moe.top_k > arch.moe.num_experts:
        problems.append(
            Problem(
                "model.top_k",
                arch.moe.top_k,
                f"exceeds the number of experts ({arch.moe.num_experts})",
                f"1..{arch.moe.num_experts}",
            )
        )
    return problems


def _degree_problems(
    model: Any, training: Training | None, parallelism: Parallelism, arch: Arch, origin: str
) -> list[Problem]:
    """The parallel degrees against the (reduced) architecture: pipeline stages, sequence
    parallelism's share of seq_len, tp against the heads, ep against the experts."""
    problems = _pipeline_problems(model, parallelism, arch, origin)
    tp, cp = parallelism.tp, parallelism.cp
    if (
        training is not None
        and tp > 1
        and arch.n_heads % tp == 0
        and arch.n_kv_heads % tp == 0
        and not sequence_problems(training, parallelism)
        and training.seq_len % (tp * (2 * cp if cp > 1 else 1))
    ):
        problems.append(_seq_len_problem(training.seq_len, tp, cp))  # sequence parallelism's share
    for key, heads in (("n_heads", arch.n_heads), ("n_kv_heads", arch.n_kv_heads)):
        if heads % tp:
            problems.append(
                Problem(
                    "parallelism.tp",
                    tp,
                    f"does not divide the model's {key} ({heads}, {origin})",
                    f"{one_of(_divisors(heads))} (the divisors of {heads})",
                    _nearest_hint("parallelism.tp", tp, _divisors(heads)),
                )
            )
    if arch.moe is not None and parallelism.ep > 1 and arch.moe.num_experts % parallelism.ep:
        problems.append(
            Problem(
                "parallelism.ep",
                parallelism.ep,
                f"does not divide the number of experts ({arch.moe.num_experts}, {origin})",
                f"{one_of(_divisors(arch.moe.num_experts))} (the divisors of {arch.moe.num_experts})",
            )
        )
    if arch.moe is None and parallelism.ep > 1:
        problems.append(
            Problem("parallelism.ep", parallelism.ep, f"expert parallelism needs an MoE model; {origin} is dense", "1")
        )
    return problems


def _pipeline_problems(model: Any, parallelism: Parallelism, arch: Arch, origin: str) -> list[Problem]:
    """What torchtitan 0.3.0 refuses in a rank for parallelism.pp > 1 (`to_torchtitan` turns CUDA graphs
    off for pp > 1, which torchtitan otherwise refuses in `Trainer.Config`)."""
    pp = parallelism.pp
    if pp == 1:
        return []
    problems: list[Problem] = []
    if model.backend == "native" and arch.tied:
        # torchtitan's Decoder.Config.update_from_config: "Weight tying is not supported with Pipeline
        # Parallel" (the embedding is on the first stage, the output projection on the last). The
        # Transformers backend unties the two weights instead (as it does for FSDP), so model=hf runs.
        untied = [n for n, a in FLAVORS.items() if not a.tied and not n.startswith("debugmodel")]
        problems.append(
            Problem(
                "parallelism.pp",
                pp,
                f"{origin} ties its embedding and output weights, and "
                "torchtitan's Qwen3 cannot split tied weights across pipeline stages",
                "1 for a model with tied embeddings",
                f"pipeline an untied model ({one_of(untied)}) or use model=hf, which unties them",
            )
        )
    # torchtitan's stage split counts the embedding and the output as one layer each and needs at
    # least one of these units per stage (`_generate_llm_fqn_per_model_part`).
    units = arch.n_layers + 2
    if pp > units:
        problems.append(
            Problem(
                "parallelism.pp",
                pp,
                f"more pipeline stages than {origin}'s {arch.n_layers} "
                "layers + embedding + output can fill (one unit per stage at least)",
                f"1..{units}",
            )
        )
    return problems


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest_hint(key: str, value: int, options: list[int]) -> str | None:
    if not options:
        return None
    best = min(options, key=lambda o: (abs(o - value), o))
    return f"nearest valid value: {key}={best}"
