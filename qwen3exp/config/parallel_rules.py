"""The rules of the parallel degrees (`parallelism.tp`, `cp`, `pp`, `ep`) against the sequence
length and the model's architecture, as torchtitan 0.3.0 checks them inside a rank (after the
workers started). `qwen3exp.config.rules` runs them with the other rules between sections."""

from __future__ import annotations

import math
from typing import Any

from qwen3exp.config.flavors import FLAVORS, Arch
from qwen3exp.config.sections.parallelism import Parallelism
from qwen3exp.config.sections.training import LOSS_CHUNKS, Training
from qwen3exp.errors import Problem, one_of


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
    This function reports the loss and cp part (which needs no model); `degree_problems` the
    tensor-parallel part, once tp fits the model's heads (a tp that is wrong anyway is one mistake,
    not two)."""
    if training is None or parallelism is None:
        return []
    if training.seq_len % (LOSS_CHUNKS * parallelism.cp) == 0:
        return []
    return [seq_len_problem(training.seq_len, parallelism.tp, parallelism.cp)]


def seq_len_problem(seq: int, tp: int, cp: int) -> Problem:
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


def degree_problems(
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
        problems.append(seq_len_problem(training.seq_len, tp, cp))  # sequence parallelism's share
    for key, heads in (("n_heads", arch.n_heads), ("n_kv_heads", arch.n_kv_heads)):
        if heads % tp:
            problems.append(
                Problem(
                    "parallelism.tp",
                    tp,
                    f"does not divide the model's {key} ({heads}, {origin})",
                    f"{one_of(divisors(heads))} (the divisors of {heads})",
                    _nearest_hint("parallelism.tp", tp, divisors(heads)),
                )
            )
    if arch.moe is not None and parallelism.ep > 1 and arch.moe.num_experts % parallelism.ep:
        problems.append(
            Problem(
                "parallelism.ep",
                parallelism.ep,
                f"does not divide the number of experts ({arch.moe.num_experts}, {origin})",
                f"{one_of(divisors(arch.moe.num_experts))} (the divisors of {arch.moe.num_experts})",
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


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nearest_hint(key: str, value: int, options: list[int]) -> str | None:
    if not options:
        return None
    best = min(options, key=lambda o: (abs(o - value), o))
    return f"nearest valid value: {key}={best}"


def context_parallel_problems(model: Any, parallelism: Parallelism, attention: str) -> list[Problem]:
    """parallelism.cp > 1 where torchtitan 0.3.0 refuses it inside a rank (`attention`: the attention
    the run uses, model.attention with auto resolved by the platform):
    - its context parallelism wraps only FlexAttention and its own SDPA module
      (`distributed/context_parallel/api.py`: `apply_cp_to_forward` raises NotImplementedError for
      any other module), and qwen3exp's document-masked SDPA (attention sdpa: the CPU, Neuron) is
      neither;
    - the Transformers backend refuses the default "headtail" load balancer under context
      parallelism (`HFTransformerTrainer._validate_cp_load_balancer`), which qwen3exp keeps."""
    cp = parallelism.cp
    if cp == 1:
        return []
    if model.backend == "hf":
        why = "torchtitan's Transformers backend (model=hf) refuses context parallelism with its default load balancer"
        return [Problem("parallelism.cp", cp, why, "1 with model=hf", "use model=native with FlexAttention")]
    if attention != "flex":
        why = (
            f"context parallelism needs FlexAttention, and this run's attention is {attention} (qwen3exp's "
            "document-masked SDPA), which torchtitan's context parallelism cannot wrap"
        )
        hint = "model.attention=flex where the platform has it (cuda); else training.activation_checkpoint"
        return [Problem("parallelism.cp", cp, why, "1 unless the attention is flex", hint)]
    return []
