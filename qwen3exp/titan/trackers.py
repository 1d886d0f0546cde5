"""Trackers that know the experiment: the TensorBoard and Weights & Biases loggers of the metrics
rank, fed with what the launcher recorded in the run directory rather than with torchtitan's
`Trainer.Config` (whose dict holds function reprs and none of the experiment's own keys).

What they read (`RunRecord.read`): `experiment.yaml` (the resolved experiment as recorded,
`qwen3exp.run.identity.recorded_data`) and the Hydra origin in `provenance.json`. Both are plain
data the launcher wrote (YAML through `safe_load`, JSON); nothing from the run directory is
executed.

- W&B (`WandbTracker`): config = the experiment's keys flattened with dots (`training.lr`,
  `model.flavor`, ...); tags = a sweep job's overrides (`training.lr=0.001`, `sweep_tags`); group,
  name, project and the rest from the WANDB_* variables torchtitan reads (the launcher sets
  project, name and group, `qwen3exp.plan.tracking.env`; values the user set win); files in the
  run directory's own `wandb/` folder.
- TensorBoard (`TensorBoardTracker`): torchtitan's scalars, plus at close the run's hparams
  (`hparams`: the keys its overrides set) with the final training loss and the last validation
  loss as the hparams metrics `hparam/last_loss` and `hparam/val_loss` (a data mixture: also
  `hparam/val_loss_<source>` of each source), in the same folder as
  the scalars (`write_hparams` says why).
- eval.samples (`log_samples`, both trackers): the answers of each validation, as TensorBoard text
  (`samples/<i>`, one tag per prompt, at the validation's step: `sample_markdown`) and as a W&B
  table (`samples`: step, prompt, text).

The loggers are plain objects with torchtitan's logger protocol (`log(metrics, step)`, `close()`);
`qwen3exp.titan.metrics` builds them on the metrics rank. Neither imports torchtitan.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwen3exp.run import redact, rundir

OVERRIDE_DIRNAME_EXCLUDES = rundir.IDENTITY_IGNORES
"""Keys left out of a job's overrides, as in `hydra.job.config.override_dirname.exclude_keys`
(conf/config.yaml): they change nothing a run computes (dry_run, verbose)."""
DEFAULT_HPARAMS = ("name", "model.flavor", "training.lr", "training.steps")
"""The hparams of a run started without overrides: which experiment, which model, the two
numbers most often compared. Enough to tell such runs apart in TensorBoard's HParams table."""
HPARAM_METRICS = {"loss_metrics/global_avg_loss": "hparam/last_loss", "validation_metrics/loss": "hparam/val_loss"}
"""torchtitan's metric key -> the hparams metric holding its last value."""
SOURCE_LOSS_KEY = "validation_metrics/loss_"
"""A data mixture's held-out loss of one source (`qwen3exp.titan.mixture_validator`): hparam/val_loss_<source>."""
SAMPLES_TAG = "samples"
"""The tracker name of eval.samples' answers (TensorBoard `samples/<i>`, the W&B table `samples`)."""
WANDB_TAG_MAX = 64
"""W&B refuses a tag longer than this (wandb.init raises)."""


@dataclass(frozen=True)
class RunRecord:
    """What the launcher recorded about a run: its experiment (plain data) and Hydra origin."""

    experiment: dict = field(default_factory=dict)
    origin: dict = field(default_factory=dict)
    """provenance.json's `hydra`: mode (RUN / MULTIRUN), task_overrides, override_dirname, sweep_dir."""

    @classmethod
    def read(cls, run_dir: Path) -> RunRecord:
        """From experiment.yaml and provenance.json; an absent or unreadable file reads as empty."""
        prov = rundir.read_json(Path(run_dir) / rundir.PROVENANCE)
        origin = prov.get("hydra") if isinstance(prov, dict) else None
        return cls(rundir.read_experiment(Path(run_dir)) or {}, origin if isinstance(origin, dict) else {})


def flat_experiment(experiment: Mapping) -> dict[str, Any]:
    """The experiment's keys flattened with dots (`{"training.lr": 0.003, ...}`); lists stay values."""
    return rundir.flatten(dict(experiment))


def job_overrides(origin: Mapping) -> list[tuple[str, str]]:
    """(key, value) of each command-line override of the job, as Hydra rendered it (a sweep job:
    its point of the sweep and the sweep's common overrides, which together name its folder).
    `+`/`++` prefixes are dropped; deletions (`~key`), hydra.* keys, OVERRIDE_DIRNAME_EXCLUDES
    and keys named like a secret (their values are recorded as ***) are left out."""
    out = []
    for item in origin.get("task_overrides") or []:
        key, eq, value = str(item).partition("=")
        key = key.lstrip("+")
        if not eq or key.startswith(("~", "hydra.")) or key in OVERRIDE_DIRNAME_EXCLUDES or redact.is_secret_name(key):
            continue
        out.append((key, value))
    return out


def sweep_tags(origin: Mapping) -> list[str]:
    """W&B tags of a run: `key=value` for each override of a sweep job (`training.lr=0.001`);
    none for a plain run (it has nothing to tell apart from within a group). A tag longer than
    W&B's 64 characters (a long path) is left out: the config holds the full value."""
    if origin.get("mode") != "MULTIRUN":
        return []
    tags = [f"{key}={value}" for key, value in job_overrides(origin)]
    return [t for t in tags if len(t) <= WANDB_TAG_MAX]


def hparams(experiment: Mapping, origin: Mapping) -> dict[str, Any]:
    """TensorBoard hparams: the keys the run's overrides set (a sweep job's point, a plain run's
    command line), else DEFAULT_HPARAMS. A key of the experiment takes its recorded value (typed:
    `training.lr` is a number); a config-group choice (`model=hf`) the chosen option's name."""
    flat = flat_experiment(experiment)
    pairs = job_overrides(origin) or [(k, flat[k]) for k in DEFAULT_HPARAMS if k in flat]
    return {key: hparam_value(flat.get(key, value)) for key, value in pairs}


def hparam_value(value: Any) -> bool | int | float | str:
    """A value TensorBoard's hparams take (bool, number, string): others as JSON (`null`, `[1, 2]`)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value)


def env_tags(env: Mapping[str, str]) -> list[str]:
    """Tags the user set: torchtitan's WANDB_RUN_TAGS and wandb's own WANDB_TAGS, comma-separated."""
    return [t for name in ("WANDB_RUN_TAGS", "WANDB_TAGS") for t in env.get(name, "").split(",") if t]


def wandb_init_args(run_dir: Path, record: RunRecord, env: Mapping[str, str]) -> dict[str, Any]:
    """The arguments of `wandb.init`: the WANDB_* variables torchtitan's WandBLogger reads (so
    what the user sets wins as before), the experiment as config, the user's tags (now split at
    commas: torchtitan passes WANDB_RUN_TAGS as one string, which wandb.init turns into a tuple of
    its characters) followed by the sweep's, and the run directory as W&B's folder (`wandb/` in it)."""
    tags = list(dict.fromkeys([*env_tags(env), *sweep_tags(record.origin)]))
    return {
        "entity": env.get("WANDB_TEAM"),
        "project": env.get("WANDB_PROJECT"),
        "name": env.get("WANDB_RUN_NAME"),
        "id": env.get("WANDB_RUN_ID"),
        "notes": env.get("WANDB_RUN_NOTES"),
        "tags": tags or None,
        "group": env.get("WANDB_RUN_GROUP"),
        "job_type": env.get("WANDB_RUN_JOB_TYPE"),
        "resume_from": env.get("WANDB_RESUME_FROM"),
        "fork_from": env.get("WANDB_FORK_FROM"),
        "dir": str(run_dir),
        "config": flat_experiment(record.experiment),
    }


def _tagged(metrics: Mapping[str, Any], tag: str | None) -> dict[str, Any]:
    return {(k if tag is None else f"{tag}/{k}"): v for k, v in metrics.items()}


class WandbTracker:
    """A W&B run of the experiment (see `wandb_init_args`). A failing `wandb.init` fails the rank
    (torchtitan would log a line and train without W&B): `qwen3exp.plan.tracking.check` has ruled
    out the expected causes before launch, so what is left deserves an error, not a run that
    silently has no W&B record."""

    def __init__(self, run_dir: Path, record: RunRecord, tag: str | None = None):
        import wandb  # lazy: optional (the wandb extra), only with metrics.wandb=true

        self._wandb = wandb
        self._tag = tag
        self._run = wandb.init(**wandb_init_args(run_dir, record, os.environ))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._run.log(_tagged(metrics, self._tag), step=step)

    def log_samples(self, records: list[dict], step: int) -> None:
        rows = [[r["step"], r["prompt"], r["text"]] for r in records]
        table = self._wandb.Table(columns=["step", "prompt", "text"], data=rows)
        self._run.log(_tagged({SAMPLES_TAG: table}, self._tag), step=step)

    def close(self) -> None:
        """Finish the run and stop wandb's service process: a finished rank ends with os._exit
        (`qwen3exp.worker.main`), which skips wandb's own atexit teardown."""
        self._run.finish()
        self._wandb.teardown()


class TensorBoardTracker:
    """torchtitan's scalars in `log_dir` (as its TensorBoardLogger writes them) and, at close, the
    run's hparams with its last losses (`write_hparams`)."""

    def __init__(self, log_dir: str, hparams: dict[str, Any], tag: str | None = None):
        from torch.utils.tensorboard import SummaryWriter  # lazy: torch, only with TensorBoard on

        self.writer = SummaryWriter(log_dir, max_queue=1000)
        self._hparams = hparams
        self._tag = tag
        self._last: dict[str, tuple[float, int]] = {}

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for name, value in _tagged(metrics, self._tag).items():
            self.writer.add_scalar(name, value, step)
        for key, name in HPARAM_METRICS.items():
            if key in metrics:
                self._last[name] = (float(metrics[key]), step)
        for key in metrics:  # a data mixture's sources: hparam/val_loss_<source>
            if key.startswith(SOURCE_LOSS_KEY):
                self._last["hparam/val_loss_" + key.removeprefix(SOURCE_LOSS_KEY)] = (float(metrics[key]), step)

    def log_samples(self, records: list[dict], step: int) -> None:
        texts = {f"{SAMPLES_TAG}/{i}": sample_markdown(record) for i, record in enumerate(records)}
        for name, text in _tagged(texts, self._tag).items():
            self.writer.add_text(name, text, step)
        self.writer.flush()

    def close(self) -> None:
        write_hparams(self.writer, self._hparams, self._last)
        self.writer.close()


def sample_markdown(record: Mapping[str, Any]) -> str:
    """One answer as TensorBoard shows text (Markdown): the prompt and the answer as code blocks,
    so that whatever the model wrote is shown as written."""

    def block(text: str) -> str:
        return "\n".join("    " + line for line in (text.splitlines() or [""]))

    return (
        f"prompt:\n\n{block(record['prompt'])}\n\nanswer ({len(record['tokens'])} tokens):\n\n{block(record['text'])}"
    )


def write_hparams(writer, hparams: dict[str, Any], last: dict[str, tuple[float, int]]) -> None:
    """The hparams summaries and their metrics (`{name: (value, step)}`) through `writer`'s own
    file writer, so into the folder of the run's scalars. (`SummaryWriter.add_hparams` writes them
    into a new subfolder, which TensorBoard shows as a run of its own, apart from the loss curves
    of the same training; `summary.hparams` is the public function add_hparams itself uses.)"""
    from torch.utils.tensorboard.summary import hparams as hparams_summaries  # lazy: torch, only with TensorBoard

    metrics = {name: value for name, (value, _step) in last.items()}
    for summary in hparams_summaries(hparams, metrics):
        writer.file_writer.add_summary(summary)
    for name, (value, step) in last.items():
        writer.add_scalar(name, value, step)
