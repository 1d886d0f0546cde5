"""The Python API (qwen3exp.api): compose -> Experiment, plan -> Plan, run -> summary, with the
command line's checks."""

from __future__ import annotations

import pytest

from qwen3exp import api
from qwen3exp.config.schema import Experiment
from qwen3exp.errors import ConfigError

FAST = [
    "training.steps=2",
    "training.warmup_steps=0",
    "training.seq_len=32",
    "training.local_batch_size=1",
    "metrics.tensorboard=false",
    "platform=cpu",
    "platform.threads_per_rank=1",
    "launcher.nproc_per_node=1",
]


def test_compose_and_plan():
    exp = api.compose(["experiment=tiny_native", "training.steps=7"])
    assert isinstance(exp, Experiment) and exp.training.steps == 7 and exp.name == "tiny_native"
    plan = api.plan(exp)
    assert plan.mesh.world_size == 2 and plan.name == "tiny_native"
    assert plan.run_dir.startswith("outputs/tiny_native/")


def test_compose_with_a_users_config_dir(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "nb.yaml").write_text("# @package _global_\nname: nb\ntraining:\n  lr: 0.001\n")
    exp = api.compose(["experiment=nb"], config_dir=tmp_path)
    assert exp.name == "nb" and exp.training.lr == 0.001


def test_mistakes_raise_config_error_naming_the_key():
    with pytest.raises(ConfigError) as e:
        api.compose(["training.stepz=3"])
    assert [p.key for p in e.value.problems] == ["training.stepz"]
    with pytest.raises(ConfigError) as e:
        api.plan(api.compose(["parallelism.tp=3"]))
    assert "parallelism.tp" in {p.key for p in e.value.all_problems}


def test_run_refused_before_anything_starts(tmp_path):
    with pytest.raises(api.Refused) as e:
        api.run([*FAST, "training.lr=inf"], run_dir=tmp_path / "run")
    assert "training.lr" in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_run_returns_the_summary(tmp_path):
    summary = api.run(FAST, run_dir=tmp_path / "run")
    assert summary["status"] == "completed" and summary["steps_completed"] == 2
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
