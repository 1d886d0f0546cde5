"""The rules between keys of different sections (and the experiment's name), checked after every
section parsed on its own: `check_experiment` runs them, and `qwen3exp.plan.model_files` runs the
architecture rules again once config.json is read (flavor=auto, model=hf). The rules of the parallel
degrees (against seq_len and the architecture) are in `qwen3exp.config.parallel_rules`.

Each rule returns Problems naming the key to change; a None section (one that did not parse)
skips the rules that read it, so that one mistake does not hide another."""

from __future__ import annotations

from typing import Any

from qwen3exp.config.flavors import FLAVORS, Arch
from qwen3exp.config.parallel_rules import degree_problems, divisors, sequence_problems
from qwen3exp.config.sections.data import Validation
from qwen3exp.config.sections.kernels import Kernels
from qwen3exp.config.sections.parallelism import Parallelism
from qwen3exp.config.sections.sweep import Sweep
from qwen3exp.config.sections.training import Training
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
    """The rules of `arch_problems` that read the model, training and parallelism sections."""
    n_layers, num_experts, top_k = (
        (model.n_layers, model.num_experts, model.top_k) if model.backend == "native" else (None, None, None)
    )
    arch = base.reduced(n_layers=n_layers, num_experts=num_experts, top_k=top_k)
    problems: list[Problem] = []
    if arch.n_heads % arch.n_kv_heads:
        problems.append(_grouped_query_problem(model, arch, origin))
    if parallelism is not None:
        problems += degree_problems(model, training, parallelism, arch, origin)
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
    return problems + _expert_problems(num_experts, top_k, base, arch, origin)


def _grouped_query_problem(model: Any, arch: Arch, origin: str) -> Problem:
    """Grouped-query attention shares each kv head with n_heads / n_kv_heads query heads: torchtitan's
    fused QKV raises in every rank, transformers fails on the first forward. Only a config.json can
    say so (every flavor divides), so the key is the folder that holds it."""
    key = "model.hf_model" if model.backend == "hf" and model.hf_model is not None else "model.hf_assets_path"
    value = model.hf_model if key == "model.hf_model" else model.hf_assets_path
    return Problem(
        key,
        value,
        f"num_attention_heads ({arch.n_heads}) is not a multiple of "
        f"num_key_value_heads ({arch.n_kv_heads}) in {origin}",
        "a config.json whose num_attention_heads is a multiple of num_key_value_heads",
        f"divisors of {arch.n_heads}: {one_of(divisors(arch.n_heads))}",
    )


def _expert_problems(num_experts: int | None, top_k: int | None, base: Arch, arch: Arch, origin: str) -> list[Problem]:
    """model.num_experts and model.top_k against the experts of `base` (`arch`: after the reductions)."""
    problems: list[Problem] = []
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
