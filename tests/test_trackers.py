"""Trackers that know the experiment (`qwen3exp.titan.trackers`): the W&B run's config is the
recorded experiment, its tags a sweep job's overrides, its files in the run directory's `wandb/`;
TensorBoard gets the run's hparams with its final losses; no sink gets an MFU on CPU.

One real training (a one-job sweep on 1 CPU rank, W&B offline: nothing reaches the network) and
unit tests of the functions that compute tags and hparams from the recorded data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import read_summary, run_cli
from qwen3exp.titan import trackers

# Offline, and every folder wandb writes outside the run directory inside the test's tmp folder.
WANDB_OFFLINE = ("WANDB_MODE", "WANDB_SILENT", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")
ARGS = (
    "platform=cpu",
    "launcher.nproc_per_node=1",
    "platform.threads_per_rank=1",
    "training.steps=3",
    "training.warmup_steps=1",
    "training.seq_len=64",
    "training.local_batch_size=2",
    "validation.steps=1",
    "metrics.wandb=true",
)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """The run directory of a one-job sweep (-m training.lr=0.001) with W&B offline."""
    tmp = tmp_path_factory.mktemp("trackers")
    env = dict(
        zip(
            WANDB_OFFLINE,
            ("offline", "true", str(tmp / "wandb-config"), str(tmp / "wandb-cache"), str(tmp / "wandb-data")),
            strict=True,
        )
    )
    r = run_cli("-m", *ARGS, "training.lr=0.001", f"hydra.sweep.dir={tmp / 'sweep'}", env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run,) = [p.parent for p in (tmp / "sweep").glob("*/summary.json")]
    assert read_summary(run)["status"] == "completed"
    return run


# ------------------------------------------------------------------ the .wandb file of an offline run
_BLOCK, _HEADER = 32768, 7
_FULL, _LAST = 1, 4


def wandb_records(path: Path):
    """The records of an offline W&B run's transaction log (`run-<id>.wandb`), decoded with wandb's
    own protobuf definitions. wandb 0.31 has no public reader of the file; its framing is the
    LevelDB log format (a 7-byte file header `:W&B` + magic + version, then 32 KiB blocks of
    records: crc32c, 2-byte length, 1-byte type FULL / FIRST / MIDDLE / LAST)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:_HEADER]
    pos, parts = _HEADER, []
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        parts.append(data[pos + _HEADER : pos + _HEADER + length])
        pos += _HEADER + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


@pytest.mark.slow
def test_wandb_run_has_the_experiment_as_config_and_the_sweep_overrides_as_tags(job):
    (log,) = job.glob("wandb/offline-run-*/run-*.wandb")
    records = list(wandb_records(log))
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["training.lr"] == 0.001 and config["model.flavor"] == "tiny" and config["training.steps"] == 3
    assert "training" not in config and not any("model_spec" in k for k in config)  # not torchtitan's dict
    assert "training.lr=0.001" in run.tags and "training.steps=3" in run.tags
    assert all(len(tag) > 1 for tag in run.tags)  # torchtitan's bare string became one tag per character
    assert run.run_group == "tiny_native/sweep" and run.display_name == f"tiny_native/{job.name}"
    logged = {
        item.key or "/".join(item.nested_key)
        for r in records
        if r.WhichOneof("record_type") == "history"
        for item in r.history.item
    }
    assert "loss_metrics/global_avg_loss" in logged and not any("mfu" in k for k in logged)  # CPU: no peak
    # torchtitan put W&B's files next to the TensorBoard events; now tb/ holds TensorBoard's only.
    assert [p.name for p in job.glob("tb/*/*")] == [p.name for p in job.glob("tb/*/events.out.tfevents.*")]


@pytest.mark.slow
def test_tensorboard_has_the_hparams_and_the_final_losses(job):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    (events,) = job.glob("tb/*/events.out.tfevents.*")  # the hparams are in the scalars' own folder
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["training.lr"].number_value == 0.001
    assert start.hparams["training.steps"].number_value == 3
    assert start.hparams["platform"].string_value == "cpu"  # a config-group choice: the option's name
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    assert {m.name.tag for m in experiment.metric_infos} == {"hparam/last_loss", "hparam/val_loss"}
    s = read_summary(job)
    (last,) = acc.Scalars("hparam/last_loss")
    (val,) = acc.Scalars("hparam/val_loss")
    assert last.step == 3 and last.value == pytest.approx(s["last_loss"], rel=1e-6)
    assert val.step == 3 and val.value == pytest.approx(s["val_loss"], rel=1e-6)
    scalars = acc.Tags()["scalars"]
    assert "loss_metrics/global_avg_loss" in scalars and not any("mfu" in t for t in scalars)


@pytest.mark.slow
def test_torchtitan_log_line_says_mfu_is_unknown_on_cpu(job):
    (out,) = job.glob("logs/*/attempt_0/0/stdout.log")
    steps = [line for line in out.read_text().splitlines() if "grad_norm:" in line]
    assert len(steps) == 3 and all(line.endswith("mfu: N/A") for line in steps), steps


# ------------------------------------------------------------------ unit: tags, hparams, wandb.init
SWEEP_JOB = {
    "mode": "MULTIRUN",
    "task_overrides": [
        "experiment=tiny_sweep",
        "training.lr=0.001",
        "training.seed=1",
        "dry_run=false",
        "+wandb_api_key=***",
        "~validation.path",
        "data.path=/" + "x" * 80,
    ],
    "override_dirname": "experiment=tiny_sweep,training.lr=0.001,training.seed=1",
    "sweep_dir": "/s/d",
}
PLAIN = {"mode": "RUN", "task_overrides": ["training.lr=0.01", "++model.flavor=tiny"], "sweep_dir": None}
EXPERIMENT = {
    "name": "tiny_sweep",
    "model": {"flavor": "tiny", "backend": "native"},
    "training": {"lr": 0.001, "steps": 5, "seed": 1, "warmup_steps": None},
    "kernels": {"rope": {"fqns": ["a", "b"]}},
}


def test_sweep_job_tags_are_its_overrides():
    # dry_run (not in the folder name), a secret-named key, a deletion, a tag over W&B's 64 characters: left out
    assert trackers.sweep_tags(SWEEP_JOB) == ["experiment=tiny_sweep", "training.lr=0.001", "training.seed=1"]


def test_a_plain_run_has_no_tags():
    assert trackers.sweep_tags(PLAIN) == [] and trackers.sweep_tags({}) == []


def test_hparams_are_the_overridden_keys_with_their_recorded_values():
    assert trackers.hparams(EXPERIMENT, SWEEP_JOB) == {
        "experiment": "tiny_sweep",
        "training.lr": 0.001,
        "training.seed": 1,
        "data.path": "/" + "x" * 80,
    }
    # a plain run: its command-line overrides (++ dropped), typed from the experiment
    assert trackers.hparams(EXPERIMENT, PLAIN) == {"training.lr": 0.001, "model.flavor": "tiny"}
    # no overrides at all: the small default set
    assert trackers.hparams(EXPERIMENT, {"mode": "RUN", "task_overrides": []}) == {
        "name": "tiny_sweep",
        "model.flavor": "tiny",
        "training.lr": 0.001,
        "training.steps": 5,
    }
    assert trackers.hparam_value(None) == "null" and trackers.hparam_value(["a", "b"]) == '["a", "b"]'


def test_wandb_init_args(tmp_path):
    record = trackers.RunRecord(EXPERIMENT, SWEEP_JOB)
    env = {
        "WANDB_PROJECT": "p",
        "WANDB_RUN_NAME": "tiny_sweep/job",
        "WANDB_RUN_GROUP": "tiny_sweep/d",
        "WANDB_RUN_TAGS": "mine,training.lr=0.001",
        "WANDB_TEAM": "team",
    }
    args = trackers.wandb_init_args(tmp_path, record, env)
    assert args["dir"] == str(tmp_path) and args["project"] == "p" and args["entity"] == "team"
    assert args["name"] == "tiny_sweep/job" and args["group"] == "tiny_sweep/d"
    assert args["tags"] == ["mine", "training.lr=0.001", "experiment=tiny_sweep", "training.seed=1"]
    assert args["config"]["training.lr"] == 0.001 and args["config"]["kernels.rope.fqns"] == ["a", "b"]
    assert trackers.wandb_init_args(tmp_path, trackers.RunRecord(EXPERIMENT, PLAIN), {})["tags"] is None


def test_run_record_reads_the_run_directory(tmp_path):
    from qwen3exp.run import rundir

    assert trackers.RunRecord.read(tmp_path) == trackers.RunRecord()  # nothing recorded: empty
    rundir.atomic_write_text(tmp_path / rundir.EXPERIMENT, rundir.experiment_yaml(EXPERIMENT))
    rundir.atomic_write_json(tmp_path / rundir.PROVENANCE, {"hydra": SWEEP_JOB, "env": {}})
    assert trackers.RunRecord.read(tmp_path) == trackers.RunRecord(EXPERIMENT, SWEEP_JOB)
