"""The command line end to end: a real 2-rank CPU training through `python -m qwen3exp`, and
mistakes that exit 2 before any worker starts."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from conftest import read_metrics, read_summary, read_validation, run_cli


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("cli") / "tiny"
    r = run_cli("training.steps=12", "training.warmup_steps=2", f"hydra.run.dir={run}")
    return run, r


def test_default_experiment_trains_on_two_ranks(trained):
    run, r = trained
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = read_summary(run)
    assert s["status"] == "completed" and s["exit_code"] == 0 and s["error"] is None
    assert s["world_size"] == 2 and s["steps_completed"] == 12
    assert s["last_loss"] < s["first_loss"]
    assert set(s) >= {"status", "exit_code", "world_size", "steps_completed", "first_loss", "last_loss",
                      "wall_seconds", "error"}
    rows = read_metrics(run)
    assert [row["step"] for row in rows] == list(range(1, 13))
    for row in rows:
        assert set(row) >= {"step", "loss", "grad_norm", "tokens_per_second", "memory_gib", "mfu"}
        assert row["tokens_per_second"] > 0 and row["memory_gib"] > 0 and row["mfu"] is None  # CPU: no peak
    assert rows[0]["loss"] == s["first_loss"] and rows[-1]["loss"] == s["last_loss"]
    # The held-out loss: at step 1, every validation.freq=10 steps and at the last step; measured
    # on other documents after the step's update, so it is not the training loss; it falls.
    val = read_validation(run)
    assert [v["step"] for v in val] == [1, 10, 12]
    by_step = {row["step"]: row["loss"] for row in rows}
    assert all(v["val_loss"] != by_step[v["step"]] for v in val)
    assert val[-1]["val_loss"] < val[0]["val_loss"]
    assert all(abs(v["val_perplexity"] - math.exp(v["val_loss"])) < 1e-6 * v["val_perplexity"] for v in val)
    assert s["val_loss"] == val[-1]["val_loss"] and s["first_val_loss"] == val[0]["val_loss"] and s["val_step"] == 12
    assert s["objective"] == {"metric": "val_loss", "direction": "minimize", "value": s["val_loss"]}
    # The user sees torchtitan's per-step lines and one closing line.
    assert "step: 12" in r.stdout and "loss:" in r.stdout
    assert f"qwen3exp: completed: {run}" in r.stdout


def test_run_directory_contract(trained):
    run, _ = trained
    for name in ("experiment.yaml", "platform.json", "torchtitan_config.json", "command.txt",
                 ".hydra/config.yaml", ".hydra/overrides.yaml", "summary.json", "metrics.jsonl"):
        assert (run / name).is_file(), name
    exp = yaml.safe_load((run / "experiment.yaml").read_text())
    assert exp["training"]["steps"] == 12 and exp["model"]["flavor"] == "tiny"
    assert json.loads((run / "platform.json").read_text())["name"] == "cpu"
    cmd = (run / "command.txt").read_text()
    assert "-m qwen3exp.run.agent" in cmd and "--nproc-per-node 2" in cmd and "qwen3exp.worker.main" in cmd
    rank_logs = sorted(p.parent.name for p in (run / "logs").rglob("stdout.log"))
    assert rank_logs == ["0", "1"]
    events = list((run / "tb").rglob("events.out.tfevents.*"))
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    val = [e.value for e in acc.Scalars("validation_metrics/loss")]  # the validator's loss reaches TensorBoard
    assert len(val) == 3 and val[-1] < val[0]


def test_existing_run_directory_is_never_overwritten(trained):
    run, _ = trained
    before = (run / "summary.json").read_text()
    r = run_cli("training.steps=6", f"hydra.run.dir={run}")
    assert r.returncode == 2 and "already holds a run" in r.stderr and "Traceback" not in r.stderr
    assert (run / "summary.json").read_text() == before


@pytest.mark.parametrize("args,key,allowed", [
    (["training.stepz=3"], "training.stepz", "did you mean training.steps?"),
    (["model=natve"], "model", "allowed: hf, native"),
    (["experiment=tiny_natve"], "experiment", "did you mean tiny_native?"),
    (["training.steps=0"], "training.steps", "a number > 0"),
    (["parallelism.tp=3"], "parallelism.tp", "allowed: 1, 2"),
])
def test_mistakes_exit_2_before_any_worker(args, key, allowed, tmp_path):
    run = tmp_path / "run"
    r = run_cli(*args, f"hydra.run.dir={run}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert key in r.stderr and allowed in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not run.exists()  # nothing started, nothing written


@pytest.mark.parametrize("overrides", [(), ("model=hf", "launcher=slurm", "checkpoint=dcp")])
def test_help_documents_every_key_group_and_command(overrides):
    from conftest import compose
    from qwen3exp.config.compose import GROUPS, Composer
    from qwen3exp.run import rundir

    r = run_cli(*overrides, "--help")
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stderr
    for key in rundir.flatten(compose(*overrides)):
        assert f"\n  {key} (" in r.stdout, key
    with Composer() as c:
        for group in GROUPS:
            line = next(ln for ln in r.stdout.splitlines() if ln.startswith(f"  {group} "))
            assert all(o in line for o in c.options(group)), (group, line)
    for command in ("init", "report PATH", "diff RUN_A RUN_B", "relaunch RUN", "--version", "dry_run=true"):
        assert f"qwen3exp {command}" in r.stdout, command
    # the schema's docstrings, with types and this composition's values
    assert "training.lr (float > 0) = 0.003" in r.stdout
    assert "sweep.objective (val_loss|last_loss|tokens_per_second or null) = null" in r.stdout


def test_version_names_what_it_runs_with():
    r = run_cli("--version")
    assert r.returncode == 0
    for name in ("qwen3exp", "torchtitan", "torch", "hydra-core"):
        assert f"{name} " in r.stdout
