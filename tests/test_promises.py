"""Every check runs on every path: a mistake next to a model folder, a check that crashes, a signal
while planning. Each is exit 2 (a mistake), 70 (a crash: a bug, said so) or 130/143 (a signal), with
nothing left behind: not the run directory, not a lock, not Hydra's multirun.yaml.

The model-folder table runs in-process through `test_bad_inputs`'s helper processes (one per core).
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from hf_fixtures import write_checkpoint
from test_bad_inputs import WORKERS, _helper

MODEL_FORMS = {
    "hf": ("model=hf", "model.hf_assets_path={folder}"),
    "auto": ("model.flavor=auto", "model.hf_assets_path={folder}"),
}
"""The two ways an experiment reads a model folder's config.json."""

MISTAKES = {
    "training": ("training.lr=abc", "training.lr"),
    "training_choice": ("training.decay_type=cosin", "training.decay_type"),
    "kernels": ("kernels.moe.impl=bad", "kernels.moe.impl"),
    "checkpoint_unknown_key": ("checkpoint.dtype=int8", "checkpoint.dtype"),
    "checkpoint_added_key": ("+checkpoint.interval=5", "checkpoint.interval"),
    "parallelism": ("parallelism.tp=abc", "parallelism.tp"),
    "launcher": ("launcher.nproc_per_node=0", "launcher.nproc_per_node"),
    "platform": ("platform.name=gpu", "platform"),
    "data": ("data.source=nowhere", "data"),
    "metrics": ("metrics.log_freq=-1", "metrics.log_freq"),
    "validation": ("validation.fraction=2", "validation.fraction"),
    "sweep": ("sweep.parallel_jobs=0", "sweep.parallel_jobs"),
    "huge_integer": ("training.steps=99999999999999999999999", "training.steps"),
}
"""One mistake in each section (and the shapes the issue named), with the key the message names."""
REAL_TOO = ("training", "kernels", "checkpoint_added_key")
"""Rows also run without dry_run=true (the same checks; the claim of a directory is then real too)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("model") / "qwen3", tied=True)


@pytest.fixture(scope="module")
def table(folder, tmp_path_factory) -> dict[str, tuple]:
    rows, outs = [], {}
    for form, args in MODEL_FORMS.items():
        for section, (mistake, _) in MISTAKES.items():
            for dry in (True, False) if section in REAL_TOO else (True,):
                case = f"{form}-{section}-{'dry' if dry else 'real'}"
                outs[case] = tmp_path_factory.mktemp(case)
                argv = [a.format(folder=folder) for a in args] + [mistake, f"hydra.run.dir={outs[case]}/run"]
                rows.append((case, argv + (["dry_run=true"] if dry else [])))
    outs["two_mistakes"] = tmp_path_factory.mktemp("two_mistakes")
    rows.append(
        (
            "two_mistakes",
            [
                "model=hf",
                f"model.hf_assets_path={folder}",
                "training.lr=abc",
                "parallelism.tp=3",
                f"hydra.run.dir={outs['two_mistakes']}/run",
                "dry_run=true",
            ],
        )
    )
    chunks = [rows[i::WORKERS] for i in range(WORKERS)]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        helpers = [pool.submit(_helper, chunk, tmp_path_factory.mktemp("helper")) for chunk in chunks]
        return {k: (*v, outs[k]) for h in helpers for k, v in h.result().items()}


@pytest.mark.parametrize("form", MODEL_FORMS)
@pytest.mark.parametrize(
    "section,dry",
    [(s, True) for s in MISTAKES] + [(s, False) for s in REAL_TOO],
    ids=[f"{s}-dry" for s in MISTAKES] + [f"{s}-real" for s in REAL_TOO],
)
@pytest.mark.slow  # quick tier: a table of commands
def test_a_model_folder_and_a_mistake_in_any_section(table, form, section, dry):
    code, out, err, where = table[f"{form}-{section}-{'dry' if dry else 'real'}"]
    assert code == 2, out + err
    assert "Traceback" not in out + err and "configuration error" in err
    assert f"  {MISTAKES[section][1]} = " in err, err
    assert not (where / "run").exists(), sorted(p.name for p in (where / "run").rglob("*"))


@pytest.mark.slow  # quick tier: the table's commands
def test_the_folder_is_read_when_the_rest_is_wrong(table):
    """The model-folder checks still run beside a mistake in another section: a tp that does not
    divide the folder's attention heads is named together with the bad learning rate."""
    code, out, err, _ = table["two_mistakes"]
    assert code == 2 and "Traceback" not in out + err
    assert "  training.lr = 'abc'" in err and "  parallelism.tp = 3: does not divide the model's n_heads" in err, err


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An in-process command line in a scratch directory (Hydra's global state cleared)."""
    monkeypatch.chdir(tmp_path)
    GlobalHydra.instance().clear()
    yield tmp_path
    GlobalHydra.instance().clear()


def _main(*argv: str) -> int:
    from qwen3exp import cli

    return cli.main(list(argv))


@pytest.mark.parametrize("dry", [True, False], ids=["dry", "real"])
def test_a_check_that_crashes_is_a_bug_with_nothing_left(fresh, monkeypatch, capfd, dry):
    """A check that raises something other than a refusal: exit 70 (never 0, not even in a dry run),
    said to be a bug in qwen3exp, and nothing left in the run directory's place."""
    from qwen3exp.launchers import points

    def crash(*_a, **_k):
        raise AttributeError("'types.SimpleNamespace' object has no attribute 'kernels'")

    monkeypatch.setattr(points, "make_plan", crash)  # the launcher's check of a job plans it
    code = _main("training.steps=2", "hydra.run.dir=outputs/run", *(["dry_run=true"] if dry else []))
    err = capfd.readouterr().err
    assert code == 70, err
    assert "a check crashed (AttributeError" in err and "bug in qwen3exp" in err
    assert not (fresh / "outputs").exists(), sorted(str(p) for p in (fresh / "outputs").rglob("*"))


@pytest.mark.parametrize("how", ["SIGINT", "SIGHUP", "SIGTERM"])
def test_a_signal_while_planning_leaves_nothing(fresh, monkeypatch, capfd, how):
    """Ctrl-C, a hang-up or a SIGTERM while the launcher checks: 130 / 143, nothing kept, so the
    same command runs again without being refused."""
    from qwen3exp.launchers import points

    def interrupted(*_a, **_k):
        os.kill(os.getpid(), getattr(signal, how))
        raise AssertionError("the signal's handler raises before this line")

    monkeypatch.setattr(points, "make_plan", interrupted)
    # As an interactive shell starts it: a launch under nohup or `&` inherits SIGHUP/SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    code = _main("training.steps=2", "hydra.run.dir=outputs/run")
    err = capfd.readouterr().err
    assert code == (130 if how == "SIGINT" else 143), err
    assert "nothing was kept" in err and "Traceback" not in err
    assert not (fresh / "outputs").exists(), sorted(str(p) for p in (fresh / "outputs").rglob("*"))
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # the launch's handlers are gone again


def test_api_run_refuses_a_mistake_with_refused(fresh):
    from qwen3exp import api

    with pytest.raises(api.Refused, match="training.stepz"):
        api.run(["training.stepz=3"])
    assert not (fresh / "outputs").exists()


def test_a_job_that_would_change_directory_is_refused(fresh, capfd):
    """hydra.job.chdir=true would run the job in its run directory, where the relative data.path the
    plan checked names another file (the ranks failed reading it)."""
    (fresh / "data.jsonl").write_text('{"text": "a b"}\n{"text": "c d"}\n{"text": "e f"}\n')
    code = _main(
        "data=local", "data.path=data.jsonl", "hydra.job.chdir=true", "hydra.run.dir=outputs/run", "dry_run=true"
    )
    err = capfd.readouterr().err
    assert code == 2 and "  hydra.job.chdir = True: would run each job inside its run directory" in err, err
    assert not (fresh / "outputs").exists()


def test_a_sweep_over_hydra_settings_is_refused_before_anything(fresh, capfd):
    """Hydra's sweeper refuses to sweep its own settings only after the sweep directory exists
    (exit 1); qwen3exp refuses it first, naming the key."""
    code = _main(
        "-m", "training.seed=1,2", "hydra.job.name=a,../../evil", "hydra.sweep.dir=outputs/sweep", "dry_run=true"
    )
    err = capfd.readouterr().err
    assert code == 2 and "  hydra.job.name = 'a,../../evil': is a sweep over Hydra's own settings" in err, err
    assert not (fresh / "outputs").exists()
