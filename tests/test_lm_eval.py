"""eval=lm_eval: lm-evaluation-harness on the exported model after training, its scores in
summary.json, the report, TensorBoard and a sweep's objective; `qwen3exp eval RUN`; the checks
that refuse (exit 2) before any worker starts.

One 2-point sweep of the tiny model (2 steps, HF export, the bundled task `qwen3exp_tiny` on 4
questions, ranked by its brier score: continuous, so two runs do not tie as accuracy on 4
questions can) is trained once per module and shared: its jobs are the "tiny experiment that
records a score", and the score is compared with lm-eval run by hand on the exported folder in a
fresh process (`reference`). One rank with one thread per job: the 2-core machine the suite runs on
is shared, and more threads than free cores made each of the tiny model's matmuls 20x slower.
`qwen3exp eval RUN` is checked here for its refusals; a real evaluation through it runs the same
code as after training (`lm_eval_run.run`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hydra.core.global_hydra import GlobalHydra

from conftest import read_summary, run_cli
from hf_fixtures import in_fresh_process
from qwen3exp.assets import LM_EVAL_DIR

LIMIT = 4
OBJECTIVE = "eval.qwen3exp_tiny.brier_score"
TINY = ["experiment=tiny_sweep", "training.steps=2", "launcher.nproc_per_node=1", "platform=cpu"]
TINY += ["platform.threads_per_rank=1", "checkpoint=hf_export", "eval=lm_eval", f"eval.limit={LIMIT}"]
LRS = ("0.001", "0.3")


def reference(folder: str, limit: int) -> dict:
    """lm-eval's own numbers for the bundled task on an exported folder, as a person runs it
    (called in a fresh process: `in_fresh_process("test_lm_eval.reference", ...)`)."""
    import lm_eval
    import torch
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    torch.set_num_threads(1)  # as the run's evaluation (platform.threads_per_rank=1): the same sums
    model = HFLM(pretrained=folder, device="cpu", batch_size=1, dtype="float32", trust_remote_code=False)
    tasks = TaskManager(include_path=[str(LM_EVAL_DIR)], include_defaults=False)
    out = lm_eval.simple_evaluate(model=model, tasks=["qwen3exp_tiny"], limit=limit, task_manager=tasks)
    return {k: v for k, v in out["results"]["qwen3exp_tiny"].items() if isinstance(v, float)}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The 2-point sweep (training.lr), ranked by the bundled task's brier score (lower is better),
    its jobs run side by side (sweep.parallel_jobs=2)."""
    sweep_dir = tmp_path_factory.mktemp("lm_eval") / "sweep"
    r = run_cli(
        "-m", *TINY, f"sweep.objective={OBJECTIVE}", f"training.lr={','.join(LRS)}", f"hydra.sweep.dir={sweep_dir}",
        "sweep.parallel_jobs=2",  # the two 1-rank jobs side by side on the 2 cores
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return sweep_dir, _jobs(sweep_dir), r.stdout


def _jobs(sweep_dir: Path) -> dict[str, Path]:
    """The sweep's run directories by their training.lr (as LRS spells it)."""
    runs = [p for p in sweep_dir.iterdir() if (p / "experiment.yaml").is_file()]
    return {str(yaml.safe_load((p / "experiment.yaml").read_text())["training"]["lr"]): p for p in runs}


@pytest.mark.slow
def test_a_tiny_run_records_the_score_lm_eval_gives_by_hand(sweep):
    _, jobs, _ = sweep
    run = jobs[LRS[0]]
    s = read_summary(run)
    assert s["status"] == "completed" and s["error"] is None, s
    assert set(s["eval"]) == {"qwen3exp_tiny.acc", "qwen3exp_tiny.acc_norm", "qwen3exp_tiny.brier_score"}, s["eval"]
    assert s["objective"] == {
        "metric": OBJECTIVE,
        "direction": "minimize",
        "value": s["eval"]["qwen3exp_tiny.brier_score"],
    }
    by_hand = in_fresh_process("test_lm_eval.reference", str(run / "export" / "step-2"), LIMIT)
    for metric in ("acc", "acc_norm", "brier_score"):
        assert s["eval"][f"qwen3exp_tiny.{metric}"] == pytest.approx(by_hand[f"{metric},none"], abs=1e-9), metric
    # lm-eval's own record of the evaluation, and its output, stay in the run
    (results,) = (run / "lm_eval").glob("*[0-9a-f].json")
    recorded = json.loads(results.read_text())
    assert recorded["results"]["qwen3exp_tiny"]["sample_len"] == LIMIT and recorded["device"] == "cpu"
    assert (run / "logs" / "lm_eval.log").stat().st_size > 0


@pytest.mark.slow
def test_scores_reach_tensorboard_and_the_report(sweep, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from qwen3exp.analysis import report

    sweep_dir, jobs, _ = sweep
    run = jobs[LRS[0]]
    (tb,) = (run / "tb").iterdir()
    events = EventAccumulator(str(tb))
    events.Reload()
    (point,) = events.Scalars("eval/qwen3exp_tiny.acc")
    assert point.step == 2 and point.value == pytest.approx(read_summary(run)["eval"]["qwen3exp_tiny.acc"])
    assert "loss_metrics/global_avg_loss" in events.Tags()["scalars"]  # beside the training's scalars
    assert report.main([str(sweep_dir), "--no-files"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[:5] == ["#", "training.lr", "eval.qwen3exp_tiny.acc", "eval.qwen3exp_tiny.acc_norm", OBJECTIVE]


@pytest.mark.slow
def test_the_sweep_ranks_by_the_score(sweep):
    _, jobs, stdout = sweep
    brier = {lr: read_summary(run)["eval"]["qwen3exp_tiny.brier_score"] for lr, run in jobs.items()}
    assert brier[LRS[0]] != brier[LRS[1]], brier
    best = min(brier, key=brier.__getitem__)
    assert f"best by {OBJECTIVE} (minimized): training.lr={best}  {OBJECTIVE} {brier[best]:.6g}" in stdout, stdout
    table = stdout[stdout.index("qwen3exp sweep finished") :].splitlines()
    rows = [line.split() for line in table if line.split()[:1] in (["1"], ["2"])]
    assert [float(r[1]) for r in rows] == [float(best), float(next(lr for lr in LRS if lr != best))], table


# ------------------------------------------------------------------ refused before any worker
@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An in-process command line in a scratch directory (Hydra's global state cleared)."""
    monkeypatch.chdir(tmp_path)
    GlobalHydra.instance().clear()
    yield tmp_path
    GlobalHydra.instance().clear()


def _task(folder: Path, name: str, data: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\n{data}\noutput_type: multiple_choice\ntest_split: test\n"
        "doc_to_text: '{{q}}'\ndoc_to_choice: '{{c}}'\ndoc_to_target: 0\n"
    )
    return folder


def test_a_missing_task_dataset_exits_2_with_the_fetch_command(fresh, capfd):
    from qwen3exp import cli

    _task(fresh / "tasks", "absent_data", "dataset_path: qwen3exp-tests/no-such-dataset\ndataset_name: main")
    code = cli.main([*TINY, "eval.include_path=tasks", "eval.tasks=[absent_data]", f"hydra.run.dir={fresh / 'run'}"])
    err = capfd.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert "eval.tasks = 'absent_data': task absent_data" in err
    assert "reads the Hugging Face dataset qwen3exp-tests/no-such-dataset (subset main)" in err
    assert "fetch it first: hf download qwen3exp-tests/no-such-dataset --repo-type dataset" in err
    assert not (fresh / "run").exists()


def test_tasks_objectives_and_exports_are_checked(fresh):
    """The plan's eval checks (`eval_tasks.problems`: wired into the plan, as the test above shows)."""
    from qwen3exp import api
    from qwen3exp.plan import eval_tasks

    def problems(*overrides: str) -> list[str]:
        return [f"{p.key}: {p.message}" for p in eval_tasks.problems(api.compose([*TINY, *overrides]))]

    _task(fresh / "tasks", "local_files", "dataset_path: json\ndataset_kwargs:\n  data_files: {test: data/q.jsonl}")
    found = problems("eval.include_path=tasks", "eval.tasks=[qwen3exp_tiy,local_files]")
    assert found[0].startswith("eval.tasks: no lm-eval task, group or tag has this name"), found
    assert found[1].startswith("eval.tasks: task local_files") and "reads data/q.jsonl, which does not" in found[1]
    assert problems("checkpoint=none") == [
        "checkpoint.export: eval=lm_eval evaluates the run's Hugging Face export, and this run writes none"
    ]
    assert problems("sweep.objective=eval.arc_easy.acc") == ["sweep.objective: names no task of eval.tasks"]
    assert problems("sweep.objective=eval.qwen3exp_tiny.perplexity") == [
        "sweep.objective: task qwen3exp_tiny reports acc, acc_norm, brier_score"
    ]
    (fresh / "data").mkdir()
    (fresh / "data" / "q.jsonl").write_text('{"q": "a", "c": ["b", "c"]}\n')
    assert problems("eval.include_path=tasks", "eval.tasks=[local_files,qwen3exp_tiny]") == []


def test_objective_names_and_directions_are_validated():
    from qwen3exp.config.sections.eval import LmEval
    from qwen3exp.config.sections.sweep import Sweep

    assert Sweep(objective="eval.qwen3exp_tiny.acc").direction_of("eval.qwen3exp_tiny.acc") == "maximize"
    assert (
        Sweep(objective="eval.gsm8k.exact_match,strict-match").direction_of("eval.gsm8k.exact_match,strict-match")
        == "maximize"
    )
    assert Sweep(objective="eval.my.task.score", direction="minimize").direction_of("eval.my.task.score") == "minimize"
    for bad in (
        {"objective": "acc"},
        {"objective": "eval.t.score"},
        {"objective": "val_loss", "direction": "maximize"},
    ):
        with pytest.raises(ValueError):
            Sweep(**bad)
    assert LmEval().tasks == ["qwen3exp_tiny"]


def test_scores_are_flattened_as_recorded():
    from qwen3exp.run import eval_scores

    results = {
        "t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": 0.1, "brier_score,none": 1.25, "x_stderr,none": "N/A"},
        "gsm8k": {"exact_match,strict-match": 0.25, "exact_match,flexible-extract": 0.5, "sample_len": 4},
    }
    assert eval_scores.flat(results) == {
        "t.acc": 0.5,
        "t.brier_score": 1.25,
        "gsm8k.exact_match,strict-match": 0.25,
        "gsm8k.exact_match,flexible-extract": 0.5,
    }


def test_eval_command_refuses_runs_without_an_export(tmp_path, capsys):
    from qwen3exp import cli

    run = tmp_path / "run"
    run.mkdir()
    (run / "experiment.yaml").write_text("name: x\nmodel: {backend: native}\n")
    assert cli.main(["eval", str(run)]) == 2
    assert "has no Hugging Face export" in capsys.readouterr().err
    assert cli.main(["eval", str(run), "--limit", "0"]) == 2
    assert "--limit = 0: Input should be greater than 0" in capsys.readouterr().err
    assert cli.main(["eval", str(tmp_path / "none")]) == 2
