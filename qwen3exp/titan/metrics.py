"""Structured metrics: torchtitan's MetricsProcessor with one more logger that appends one JSON
object per logged step to the run directory's metrics.jsonl (no scraping of colored log lines).

Every line is strict JSON: a non-finite number (NaN, +-inf: a diverged loss, an overflowing grad
norm) is written as null and its key is listed in the row's `nonfinite` (present only then), e.g.
`{"step": 7, "loss": 2.3, "grad_norm": null, ..., "nonfinite": ["grad_norm"]}`. Python's
`json.dumps` would otherwise write `NaN` / `Infinity`, which no strict JSON reader accepts.

A validation (torchtitan's validator, `qwen3exp.titan.validator`) adds a row of its own after the
training row of its step: `{"step": 10, "val_loss": 3.1, "val_perplexity": 22.2}` (no `loss` key;
`qwen3exp.run.rundir.read_metrics` and `read_validation` tell the two kinds apart)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor, _get_metrics_rank


def finite_row(row: dict) -> dict:
    """`row` with every non-finite number replaced by None and those keys listed in `nonfinite`."""
    bad = [k for k, v in row.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)]
    if not bad:
        return row
    return {**{k: None if k in bad else v for k, v in row.items()}, "nonfinite": bad}


def _perplexity(loss: float) -> float:
    """exp(loss); inf when it overflows or the loss is not finite (written as null)."""
    try:
        return math.exp(loss)
    except (OverflowError, ValueError):
        return math.inf


class JsonlLogger(BaseLogger):
    def __init__(self, path: str, *, peak_flops_known: bool):
        self._f = open(path, "a", buffering=1)
        self._peak_flops_known = peak_flops_known

    def log(self, metrics: dict, step: int) -> None:
        if "validation_metrics/loss" in metrics:
            loss = metrics["validation_metrics/loss"]
            self._write({"step": step, "val_loss": loss, "val_perplexity": _perplexity(loss)})
            return
        if "loss_metrics/global_avg_loss" not in metrics:
            return
        mfu = metrics.get("mfu(%)") if self._peak_flops_known else None
        row = {
            "step": step,
            "loss": metrics["loss_metrics/global_avg_loss"],
            "grad_norm": metrics.get("grad_norm"),
            "tokens_per_second": metrics.get("throughput(tps)"),
            "memory_gib": metrics.get("memory/max_reserved(GiB)"),
            "mfu": mfu,
            "lr": next((v for k, v in metrics.items() if k.startswith("lr")), None),
            "step_seconds": metrics.get("time_metrics/end_to_end(s)"),
        }
        self._write(row)

    def _write(self, row: dict) -> None:
        self._f.write(json.dumps(finite_row(row), allow_nan=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


class JsonlMetricsProcessor(MetricsProcessor):
    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        jsonl_path: str = ""
        """Where the metrics rank appends one JSON object per logged step."""
        peak_flops_known: bool = True
        """False where torchtitan's MFU uses a fallback peak (CPU): mfu is then recorded as null."""

    def _build_metric_logger(self, *, config, parallel_dims, pp_schedule, **kwargs) -> BaseLogger:
        import torch.distributed as dist

        inner = MetricsProcessor._build_metric_logger(
            self, config=config, parallel_dims=parallel_dims, pp_schedule=pp_schedule, **kwargs)
        rank = dist.get_rank() if dist.is_initialized() else 0
        if not config.jsonl_path or rank != _get_metrics_rank(parallel_dims=parallel_dims, pp_schedule=pp_schedule):
            return inner
        container = inner if isinstance(inner, LoggerContainer) else LoggerContainer()
        container.add_logger(JsonlLogger(config.jsonl_path, peak_flops_known=config.peak_flops_known))
        return container
