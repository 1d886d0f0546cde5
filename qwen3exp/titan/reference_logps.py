"""DPO's reference log-probs in the ranks when they do not come from a live copy of the policy:
a separate reference model (objective.reference), or stored ones (objective.reference_logps=precomputed).

precomputed: at the first step that needs them (step 1, before any update, so the policy still holds
its starting weights) a first pass reads every training pair, and every held-out pair when the run
validates, through the reference once: the separate model (built for the pass, then dropped), the
base with the adapters off (peft=lora) or the starting weights themselves (a full fine-tune). The
batches are the training loader's own (`qwen3exp.titan.preference_dataset`, one epoch, in file
order, the same masks), so each side's summed log-prob is the number the live path computes
(`preference_loss.row_logps`). Each rank computes its own pairs; the sums of all ranks (each pair
filled by one rank) are written by rank 0 to `<run dir>/reference_logps/<part>.pt`, a [pairs, 2]
tensor (chosen, rejected) indexed by the pair's position in the part (NaN: a pair max_len_policy
drops). Training reads them back by the `pair` index the loader attaches to each sample, so no
reference is held while training. A resumed run (a dcp checkpoint past step 0) reads the stored
file: log-probs are never recomputed from trained weights (a missing file, or one without a row per
pair of the part as it is now, is an error then, unless the reference is a separate model, which
is loaded again; before step 1 such a file is computed anew).
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torchtitan.models.common.attention import FlexAttention, VarlenAttention
from torchtitan.models.common.decoder import Decoder
from torchtitan.tools.logging import logger

from qwen3exp.run import rundir
from qwen3exp.titan import reference_load
from qwen3exp.titan.chat_dataset import TRAIN, VALIDATION, part_of
from qwen3exp.titan.preference_loss import row_logps

Forward = Callable[[torch.Tensor, torch.Tensor, dict], torch.Tensor]
"""(inputs, labels, extra model kwargs) -> the reference's summed log-prob of each row."""


def path(run_dir: str | Path, part: str) -> Path:
    return Path(run_dir) / rundir.REFERENCE_LOGPS / f"{part}.pt"


def forward(trainer, model: torch.nn.Module, inputs, labels, extra) -> torch.Tensor:
    """`model`'s summed log-prob of each row's counted labels, without gradients."""
    with torch.no_grad(), trainer.train_context():
        pred = model(inputs, **own_kwargs(model, extra))
        out = row_logps(pred, labels)[0].detach()
        del pred
    for sub in model.modules():  # FSDP keeps the root and last block gathered after a forward: not a frozen model's
        if isinstance(sub, FSDPModule):
            sub.reshard()
    return out


def own_kwargs(model: torch.nn.Module, extra: dict) -> dict:
    """The forward kwargs of `model` (the native reference, or the policy itself) from the policy's:
    torchtitan's trainer builds attention masks for native models with flex or varlen attention only
    (`Trainer.post_dataloading_process`), so beside a model=hf policy (whose backend builds its own
    inside its forward) the native reference gets none: they are built here from the positions as
    the trainer builds them for a native policy. Otherwise (masks given, SDPA, no positions, a
    model=hf model) `extra` unchanged."""
    positions = extra.get("positions")
    config = getattr(model, "config", None)
    if "attention_masks" in extra or positions is None or not isinstance(config, Decoder.Config):
        return extra
    if not isinstance(
        getattr(config.first_attention, "inner_attention", None), (FlexAttention.Config, VarlenAttention.Config)
    ):
        return extra
    return {**extra, "attention_masks": model.get_attention_masks(positions=positions)}


def of_rows(trainer, inputs, labels, extra, pairs: torch.Tensor | None, part: str) -> torch.Tensor:
    """The reference's summed log-probs of the rows (2i chosen, 2i + 1 rejected of pair `pairs[i]`):
    stored (precomputed) or from the separate reference model (live)."""
    if not trainer.config.precomputed:
        assert trainer.reference_model is not None, "built with the trainer"
        return forward(trainer, trainer.reference_model, inputs, labels, extra)
    if trainer.stored_logps is None:
        trainer.stored_logps = ensure(trainer)
    assert pairs is not None, "reference_logps=precomputed: the loader attaches each sample's pair index"
    table = trainer.stored_logps[part]
    # Both rows of a pair carry its index. A pair the pass dropped (NaN) is one training drops too
    # (the same fit_pair); no check here, which would wait for the device every micro-batch.
    return table[pairs.reshape(-1)[0::2].long()].reshape(-1)


def ensure(trainer) -> dict[str, torch.Tensor]:
    """The stored reference log-probs of each part (train, and validation when the run validates),
    computed by the first pass unless this run stored them already."""
    parts = {TRAIN: (trainer.config.dataloader, trainer.config.training.seq_len)}
    validator = getattr(trainer, "validator", None)  # torchtitan sets it only when validation is on
    if trainer.config.validator.enable and validator is not None:
        parts[VALIDATION] = (validator.dl_config, validator.seq_len)
    run_dir = trainer.config.dump_folder
    where = Path(run_dir) / rundir.REFERENCE_LOGPS
    if (stored := _read(run_dir, parts, trainer.device)) is not None:
        logger.info(f"Reference log-probs read from {where} (stored by this run before step 1)")
        return stored
    if trainer.step > 1 and not trainer.config.reference:  # the step being trained: 1 on a fresh run
        raise RuntimeError(
            f"resumed at step {trainer.step} without the stored reference log-probs of every pair "
            f"({where}): they are never recomputed from trained weights"
        )
    logger.info(f"Precomputing the reference log-probs of the {' and '.join(parts)} pairs (one forward per side)")
    fwd = _first_pass_forward(trainer)
    out = {p: _pass(trainer, fwd, cfg, seq_len) for p, (cfg, seq_len) in parts.items()}
    del fwd  # a separate reference model goes with it
    gc.collect()
    if not dist.is_initialized() or dist.get_rank() == 0:
        for p, logps in out.items():
            _write(path(run_dir, p), logps)
    if dist.is_initialized():
        dist.barrier()
    pairs = sum(int(t.isfinite().all(dim=1).sum()) for t in out.values())
    logger.info(
        f"Reference log-probs precomputed for {pairs} pairs into {where}; no reference model is held while training"
    )
    return out


def _read(run_dir: str, parts: dict, device) -> dict[str, torch.Tensor] | None:
    """The stored tables, when every part has its file with one row per pair of the part as it is now."""
    out = {}
    for p, (cfg, _) in parts.items():
        if not path(run_dir, p).is_file():
            return None
        table = torch.load(path(run_dir, p), weights_only=True)["logps"]
        if table.shape[0] != len(part_of(cfg.path, cfg.part, cfg.fraction)):
            return None
        out[p] = table.to(device)
    return out


def _first_pass_forward(trainer) -> Forward:
    """The reference of the first pass: the separate model, the base with the adapters off, or the
    starting weights (the first step runs before any update)."""
    if trainer.config.reference:
        model = reference_load.build(trainer, trainer.config.reference)  # dropped with this closure
        return lambda i, lab, e: forward(trainer, model, i, lab, e)
    if trainer.config.lora:
        return trainer.adapters_off_logps
    return lambda i, lab, e: forward(trainer, trainer.model_parts[0], i, lab, e)


def _batch_of(trainer) -> tuple[int, int]:
    """(data-parallel rank, degree), as the trainer deals out the batches."""
    if trainer.parallel_dims.dp_enabled:
        mesh = trainer.parallel_dims.get_mesh("batch")
        return mesh.get_local_rank(), mesh.size()
    return 0, 1


def _pass(trainer, fwd: Forward, loader_config, seq_len: int) -> torch.Tensor:
    """[pairs, 2] summed log-probs of the part's pairs (NaN where a pair is dropped), over every rank."""
    cfg = dataclasses.replace(loader_config, infinite=False, indexed=True)
    n = len(part_of(cfg.path, cfg.part, cfg.fraction))
    rank, ranks = _batch_of(trainer)
    batch = trainer.config.training.local_batch_size
    loader = cfg.build(dp_world_size=ranks, dp_rank=rank, seq_len=seq_len, local_batch_size=batch)
    sums = torch.zeros(n, 2, device=trainer.device)
    seen = torch.zeros(n, device=trainer.device)
    tokens_seen = trainer.ntokens_seen  # post_dataloading_process counts tokens: not this pass's
    batches, idle = iter(loader), _padding(seq_len)
    while True:
        got = next(batches, None)
        more = torch.tensor(float(got is not None), device=trainer.device)
        if dist.is_initialized() and ranks > 1:  # every rank runs as many forwards (FSDP gathers in each)
            dist.all_reduce(more, op=dist.ReduceOp.MAX)
        if not more:
            break
        input_dict, labels = got if got is not None else idle  # a rank without a batch left: padding
        input_dict = {key: v.to(trainer.device) for key, v in input_dict.items()}
        pairs = input_dict.pop("pair")[0::2].long()
        inputs, labels, extra = trainer.post_dataloading_process(input_dict, labels.to(trainer.device))
        logps = fwd(inputs, labels, extra).float()
        if got is not None:
            sums[pairs] = torch.stack([logps[0::2], logps[1::2]], dim=1)
            seen[pairs] = 1.0
    trainer.ntokens_seen = tokens_seen
    if dist.is_initialized() and ranks > 1:
        dist.all_reduce(sums)
        dist.all_reduce(seen)
    sums[seen == 0] = float("nan")
    return sums


def _padding(seq_len: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A batch of one pair of padding (a rank with no pair still joins the FSDP gathers)."""
    ids = torch.zeros(2, seq_len, dtype=torch.long)
    pos = torch.arange(seq_len).repeat(2, 1)
    return {"input": ids, "positions": pos, "pair": torch.zeros(2, dtype=torch.long)}, torch.full_like(ids, -100)


def _write(target: Path, logps: torch.Tensor) -> None:
    """Atomically: a run killed mid-write leaves no half file for its resume to read."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    torch.save({"logps": logps.cpu()}, tmp)
    os.replace(tmp, target)
