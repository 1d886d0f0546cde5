"""The batches of a plan: local x data-parallel x gradient accumulation = global, and the tokens of a step."""

from __future__ import annotations

from dataclasses import dataclass

from qwen3exp.config.schema import Experiment
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.plan.mesh import Mesh


@dataclass(frozen=True)
class Batches:
    local_batch_size: int
    global_batch_size: int
    grad_accum_steps: int
    tokens_per_step: int
    tokens_per_rank_per_step: int


def batch_problems(training, mesh: Mesh) -> tuple[Batches | None, list[Problem]]:
    t = training
    dp = mesh.dp_replicate * mesh.dp_shard
    per_step = t.local_batch_size * dp
    gbs = per_step if t.global_batch_size == -1 else t.global_batch_size
    if gbs % per_step:
        lower = max(per_step, gbs // per_step * per_step)
        return None, [
            Problem(
                "training.global_batch_size",
                t.global_batch_size,
                f"must be a multiple of local_batch_size x data-parallel degree = {t.local_batch_size} x {dp} "
                f"= {per_step}",
                f"-1 or a multiple of {per_step}",
                f"nearest valid values: training.global_batch_size={lower} or {lower + per_step}",
            )
        ]
    accum = gbs // per_step
    return Batches(
        t.local_batch_size, gbs, accum, gbs * t.seq_len, t.local_batch_size * accum * t.seq_len // mesh.cp
    ), []


def resolve_batches(exp: Experiment, mesh: Mesh) -> Batches:
    batches, problems = batch_problems(exp.training, mesh)
    if problems or batches is None:
        raise ConfigError(problems)
    return batches
