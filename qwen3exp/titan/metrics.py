"""Structured metrics: torchtitan's MetricsProcessor with one more logger that appends one JSON
object per logged step to the run directory's metrics.jsonl (no scraping of colored log lines),
and with TensorBoard and W&B loggers that know the experiment (`qwen3exp.titan.trackers`).

Every line is strict JSON: a non-finite number (NaN, +-inf: a diverged loss, an overflowing grad
norm) is written as null and its key is listed in the row's `nonfinite` (present only then), e.g.
`{"step": 7, "loss": 2.3, "grad_norm": null, ..., "nonfinite": ["grad_norm"]}`. Python's
`json.dumps` would otherwise write `NaN` / `Infinity`, which no strict JSON reader accepts.

A validation (torchtitan's validator, `qwen3exp.titan.validator`) adds a row of its own after the
training row of its step: `{"step": 10, "val_loss": 3.1, "val_perplexity": 22.2}` (no `loss` key;
`qwen3exp.run.metrics_file.read_metrics` and `read_validation` tell the two kinds apart); a data
mixture's row has `val_loss_<source>` for each source as well (`qwen3exp.titan.mixture_validator`).

The answers to eval.samples (`qwen3exp.titan.validator`) go to `log_samples`: on the metrics rank
into samples.jsonl (`SamplesFile`: one record per prompt, `{"step", "prompt", "text", "tokens"}`)
and to the trackers (TensorBoard text, a W&B table).

Every rank, not only the metrics rank, keeps its own peak memory of the logged steps in
`logs/memory_rank<R>.json` (`qwen3exp.run.scorecard`): the launcher's summary compares the peak
over all ranks with the plan's estimate."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import torch.distributed as dist
from torchtitan.components.metrics import BaseLogger, LoggerContainer, MetricsProcessor, _get_metrics_rank
from torchtitan.tools.logging import logger

from qwen3exp.run import rundir, scorecard
from qwen3exp.titan import trackers

VAL_REWARD_ACCURACY = "validation_metrics/reward_accuracy"
"""A preference objective's validation metric (`qwen3exp.titan.preference_validator`)."""
SOURCE_LOSS_PREFIX = trackers.SOURCE_LOSS_KEY
"""A data mixture's held-out loss of one source (`qwen3exp.titan.mixture_validator`): `val_loss_<source>`."""
PAIR_PREFIX = "preference/"
"""A preference objective's metrics (`qwen3exp.titan.preference_trainer`): written without the prefix."""


def finite_row(row: dict) -> dict:
    """`row` with every non-finite number replaced by None and those keys listed in `nonfinite`."""
    bad = [
        k for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)
    ]
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
            row = {"step": step, "val_loss": loss, "val_perplexity": _perplexity(loss)}
            if VAL_REWARD_ACCURACY in metrics:  # a preference objective's held-out pairs
                row["val_reward_accuracy"] = metrics[VAL_REWARD_ACCURACY]
            for key, value in metrics.items():  # a data mixture's sources: val_loss_<source>
                if key.startswith(SOURCE_LOSS_PREFIX):
                    row["val_loss_" + key.removeprefix(SOURCE_LOSS_PREFIX)] = value
            self._write(row)
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
        } | {k.removeprefix(PAIR_PREFIX): v for k, v in metrics.items() if k.startswith(PAIR_PREFIX)}
        self._write(row)

    def _write(self, row: dict) -> None:
        self._f.write(json.dumps(finite_row(row), allow_nan=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


class SamplesFile(BaseLogger):
    """samples.jsonl: one JSON record per answered prompt, appended (created at the first
    validation with samples, so a run without samples has none)."""

    def __init__(self, path: str):
        self._path = path
        self._f: TextIO | None = None

    def log(self, metrics: dict, step: int) -> None:
        """Metrics are not samples: nothing to write."""

    def log_samples(self, records: list[dict], step: int) -> None:
        if self._f is None:
            self._f = open(self._path, "a", buffering=1, encoding="utf-8")
        for record in records:
            self._f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()


class JsonlMetricsProcessor(MetricsProcessor):
    """torchtitan's MetricsProcessor with qwen3exp's loggers on the metrics rank: metrics.jsonl,
    and, in place of torchtitan's own, the trackers that know the experiment
    (`qwen3exp.titan.trackers`: W&B config, tags and files in the run directory; TensorBoard
    hparams).

    MFU where the peak FLOPS is unknown (CPU: `peak_flops_known` false): torchtitan divides by a
    fallback peak (an A100's), a number that means nothing. The processor then passes torchtitan's
    own switch for "this MFU would mislead", `has_quantization` (in torchtitan 0.3.0 it does nothing
    but that: `MetricsProcessor.log` computes mfu=None), so no sink gets `mfu(%)` (metrics.jsonl
    writes null, TensorBoard and W&B have no mfu series) and torchtitan's log line shows `mfu: N/A`.
    The tracker tests (tests/test_trackers.py) check that TensorBoard has no mfu on CPU, so a
    torchtitan that gave the switch another meaning would show there."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        jsonl_path: str = ""
        """Where the metrics rank appends one JSON object per logged step."""
        peak_flops_known: bool = True
        """False where torchtitan's MFU uses a fallback peak (CPU): mfu is then recorded as null."""
        run_dir: str = ""
        """The run directory: the trackers read experiment.yaml and provenance.json there, W&B
        writes its files to its `wandb/` folder. Empty: torchtitan's dump_folder."""

    device_memory_monitor: Any
    """torchtitan's monitor, read through `LastReading` (the same methods, delegated)."""

    def __init__(self, config: Config, *, has_quantization: bool = False, **kwargs):
        self._sample_sinks: list = []
        self.metric_source: Callable[[], dict[str, float]] | None = None
        """More metrics for each training row (every rank calls it at a logged step)."""
        super().__init__(config, has_quantization=has_quantization or not config.peak_flops_known, **kwargs)
        # Every rank (not only the metrics rank) keeps its own peak for the run's score.
        self._reading = LastReading(self.device_memory_monitor)
        self.device_memory_monitor = self._reading
        rank = dist.get_rank() if dist.is_initialized() else 0
        self._rank_peak = scorecard.RankPeak(Path(config.run_dir) / rundir.LOGS, rank) if config.run_dir else None

    def log(self, step: int, *args, **kwargs) -> None:
        """torchtitan's training log (every rank calls it at a logged step), then this rank's peak
        memory of the steps since the last one, the very reading the log used
        (`qwen3exp.run.scorecard.RankPeak`), before the next step's allocations."""
        if self.metric_source is not None:  # a preference objective's pair metrics, summed over the ranks
            kwargs["extra_metrics"] = {**(kwargs.get("extra_metrics") or {}), **self.metric_source()}
        super().log(step, *args, **kwargs)
        last = self._reading.last
        if self._rank_peak is not None and last is not None:
            self._rank_peak.record(step, last.max_reserved_gib)

    def log_samples(self, records: list[dict], step: int) -> None:
        """The answers of one validation to samples.jsonl and the trackers (metrics rank only)."""
        for sink in self._sample_sinks:
            sink.log_samples(records, step)

    def _build_metric_logger(
        self,
        *,
        config,
        parallel_dims,
        dump_folder,
        pp_schedule,
        ft_enable=False,
        ft_replica_id=0,
        config_dict=None,
        tag=None,
    ) -> BaseLogger:
        """The loggers of this rank: the trackers where torchtitan would put its own (the metrics
        rank, or every rank with save_for_all_ranks), metrics.jsonl and samples.jsonl on the metrics
        rank. (`config_dict`, torchtitan's Trainer.Config as a dict, is not used: W&B gets the experiment.)"""
        rank = dist.get_rank() if dist.is_initialized() else 0
        metrics_rank = _get_metrics_rank(parallel_dims=parallel_dims, pp_schedule=pp_schedule)
        loggers: list = []
        if (config.enable_tensorboard or config.enable_wandb) and (config.save_for_all_ranks or rank == metrics_rank):
            tb_folder = tensorboard_folder(config, dump_folder, ft_enable, ft_replica_id, rank)
            loggers += _trackers(config, Path(config.run_dir or dump_folder), tb_folder, tag)
        if config.jsonl_path and rank == metrics_rank:
            loggers.append(JsonlLogger(config.jsonl_path, peak_flops_known=config.peak_flops_known))
            loggers.append(SamplesFile(str(Path(config.run_dir or dump_folder) / rundir.SAMPLES)))
        container = LoggerContainer()
        for one in loggers:
            container.add_logger(one)
        self._sample_sinks = [one for one in loggers if hasattr(one, "log_samples")]
        return container


class LastReading:
    """torchtitan's DeviceMemoryMonitor, keeping its last reading (`last`): a training log reads the
    peak once and then resets it, so the rank's score takes the very figure the log shows."""

    def __init__(self, monitor) -> None:
        self._monitor = monitor
        self.last = None

    def __getattr__(self, name):
        return getattr(self._monitor, name)

    def get_peak_stats(self):
        self.last = self._monitor.get_peak_stats()
        return self.last


def _trackers(config: JsonlMetricsProcessor.Config, run_dir: Path, tb_folder: str, tag: str | None) -> list:
    """The enabled trackers, in torchtitan's order (W&B, then TensorBoard)."""
    record = trackers.RunRecord.read(run_dir)
    out: list = []
    if config.enable_wandb:
        out.append(trackers.WandbTracker(run_dir, record, tag))
    if config.enable_tensorboard:
        logger.info(f"TensorBoard logging enabled. Logs will be saved at {tb_folder}")
        out.append(trackers.TensorBoardTracker(tb_folder, trackers.hparams(record.experiment, record.origin), tag))
    return out


def tensorboard_folder(
    config: MetricsProcessor.Config, dump_folder: str, ft_enable: bool, ft_replica_id: int, rank: int
) -> str:
    """Where torchtitan 0.3.0 puts a rank's TensorBoard files: `<dump_folder>/tb/<YYYYmmdd-HHMM>`,
    then `replica_<id>` with fault tolerance and `rank_<r>` with save_for_all_ranks."""
    folder = os.path.join(dump_folder, config.save_tb_folder, datetime.now().strftime("%Y%m%d-%H%M"))
    if ft_enable:
        folder = os.path.join(folder, f"replica_{ft_replica_id}")
    if config.save_for_all_ranks:
        folder = os.path.join(folder, f"rank_{rank}")
    return folder
