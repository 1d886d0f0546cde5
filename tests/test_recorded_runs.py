"""Recorded runs are data: `relaunch`, `report` and `diff` (and `init`) on hostile input.

- relaunch never resolves an interpolation of a recorded `.hydra/config.yaml` (an environment secret
  copied into the new run, a logging handler built from `oc.decode`d text: code imported from the
  run directory, a file outside it truncated), never lets Hydra read config groups from the
  recorded `.hydra/`, and never continues into a folder holding a checkpoint (a pickle);
- size and depth limits come before any parsing (anchor bombs, 50 MB files, deep nesting);
- garbage metrics lines, FIFOs, read-only folders, dangling links and unknown options are exit 2
  with a message (a garbage line: left out and named), never a traceback or a hang;
- `report` never replaces a report.md (csv, png) it did not write;
- presentation keys (verbose, dry_run) are no difference;
- provenance of a repository with no commit, the experiments repository's commit in `diff
  --provenance`, and relaunch's words when there is no commit.
Everything runs in-process on hand-made run directories; the relaunches stop at their refusal or
at a dry run.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import compose

PLANTED = "import pathlib\npathlib.Path({marker!r}).write_text('planted code ran')\n{tail}\n"


@pytest.fixture(scope="module")
def composed() -> dict:
    """A composed tiny experiment, as Hydra records it in `.hydra/config.yaml` (composed once)."""
    return compose("platform=cpu", "training.steps=2", "training.warmup_steps=1", "launcher.nproc_per_node=1")


def _recorded(root: Path, config: dict, *, text: str | None = None) -> Path:
    run = root / "recorded"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(text if text is not None else yaml.safe_dump(config, sort_keys=False))
    return run


def _cli(*argv: str) -> int:
    from qwen3exp import cli

    return cli.main(list(argv))


def _within(seconds: float, fn, *fifos: Path):
    """fn() in a thread; fails when it has not returned within `seconds` (a read that blocks on a
    FIFO, a parse that expands a bomb), after opening each FIFO for writing once so that a reader
    blocked on it gets end of file."""
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(value=fn()), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail(f"still running after {seconds} s (blocked on a FIFO or expanding a bomb)")
    assert "value" in out, "it raised (see the thread's traceback above)"
    return out["value"], time.monotonic() - started


# ------------------------------------------------------------------ 1. relaunch reads data only
DECODE_HANDLERS = '${oc.decode:"{h: {class: planted_cb.Handler}}"}'


@pytest.mark.parametrize("where", ["name", "hydra.job_logging.handlers", "hydra.job_logging.handlers.f"])
def test_relaunch_resolves_no_interpolation(tmp_path, monkeypatch, capsys, composed, where):
    marker, victim, again = tmp_path / "marker", tmp_path / "victim.txt", tmp_path / "again"
    victim.write_text("precious\n")
    config = json.loads(json.dumps(composed))
    if where == "name":  # an environment secret into the new run's name (its folder, every record)
        config["name"] = "x${oc.env:QWEN3EXP_TEST_SECRET}"
    elif where == "hydra.job_logging.handlers":  # a handler class imported from the run directory
        config["hydra"] = {"job_logging": {"version": 1, "handlers": DECODE_HANDLERS, "root": {"handlers": ["h"]}}}
    else:  # a log file outside the run, opened for writing (truncated)
        handler = f'${{oc.decode:"{{class: logging.FileHandler, filename: {victim}, mode: w}}"}}'
        config["hydra"] = {"job_logging": {"version": 1, "handlers": {"f": handler}, "root": {"handlers": ["f"]}}}
    run = _recorded(tmp_path, config)
    (run / "planted_cb.py").write_text(
        PLANTED.format(marker=str(marker), tail="import logging\nclass Handler(logging.StreamHandler): pass")
    )
    monkeypatch.chdir(run)
    monkeypatch.syspath_prepend(str(run))  # as `cd RUN && qwen3exp relaunch .` has it
    monkeypatch.setenv("QWEN3EXP_TEST_SECRET", "s3cr3t-value")
    code = _cli("relaunch", ".", "dry_run=true", f"hydra.run.dir={again}")
    out, err = capsys.readouterr()
    assert code == 2, out[-2000:] + err[-2000:]
    assert f"{where} = " in err and "an interpolation" in err and "Traceback" not in err
    assert "s3cr3t-value" not in out + err and not again.exists() and not marker.exists()
    assert victim.read_text() == "precious\n"


def test_an_interpolation_the_relaunch_overrides_is_never_resolved(tmp_path):
    from qwen3exp.analysis.recorded_config import interpolation_problems

    log = {"class": "logging.FileHandler", "filename": "${hydra.runtime.output_dir}/${hydra.job.name}.log"}
    data = {
        "name": "${oc.env:HOME}",
        "data": {"path": "${oc.env:X}/a.jsonl"},
        "tags": ["a", "${oc.env:Y}"],
        "hydra": {"job_logging": {"handlers": {"file": log}}},
    }
    assert [p.key for p in interpolation_problems(data)] == ["name", "data.path", "tags[1]"]
    assert [p.key for p in interpolation_problems(data, ("name=mine", "+data.path=/d.jsonl"))] == ["tags[1]"]


def test_relaunch_reads_no_config_group_from_the_recorded_hydra_folder(tmp_path, capsys, composed):
    """Hydra looks up `hydra/launcher=qwen3exp` (which relaunch selects) in the primary config
    folder, the recorded `.hydra/`, before qwen3exp's own: a file there replaces qwen3exp's launcher config."""
    run = _recorded(tmp_path, composed)
    planted = run / ".hydra" / "hydra" / "launcher"
    planted.mkdir(parents=True)
    (planted / "qwen3exp.yaml").write_text("_target_: hydra_plugins.qwen3exp_launcher.launcher.Qwen3expLauncher\n")
    assert _cli("relaunch", str(run), "dry_run=true", f"hydra.run.dir={tmp_path / 'again'}") == 2
    err = capsys.readouterr().err
    assert f"{run.resolve() / '.hydra' / 'hydra'}" in err and "Hydra would read config groups from it" in err


class _Planted:
    """Unpickling it runs code (as a planted DCP .metadata would)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "planted pickle loaded"))


@pytest.mark.parametrize("into", ["the recorded run", "a copy beside a checkpoint"])
def test_relaunch_never_continues_into_a_checkpoint(tmp_path, capsys, into):
    """A dcp run relaunched with hydra.run.dir=<a folder holding its experiment.yaml and a
    checkpoint/step-N/.metadata> would resume: torch.distributed.checkpoint unpickles .metadata."""
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.run import identity, rundir

    config = compose(
        "platform=cpu",
        "training.steps=2",
        "training.warmup_steps=1",
        "launcher.nproc_per_node=1",
        "checkpoint=dcp",
        "checkpoint.interval=1",
    )
    run = _recorded(tmp_path, config)
    recorded = rundir.experiment_yaml(identity.recorded_data(validate_experiment(config)))
    target = run if into == "the recorded run" else tmp_path / "copy"
    marker = tmp_path / "marker"
    for folder in {run, target}:
        (folder / "checkpoint" / "step-2").mkdir(parents=True)
        (folder / "checkpoint" / "step-2" / ".metadata").write_bytes(pickle.dumps(_Planted(str(marker))))
        (folder / rundir.EXPERIMENT).write_text(recorded)
    assert _cli("relaunch", str(run), "dry_run=true", f"hydra.run.dir={target}") == 2
    err = capsys.readouterr().err
    assert f"hydra.run.dir = '{target}'" in err and "never loaded" in err
    assert not marker.exists()


# -------------------------------------------------- 2. limits before parsing, refused in < 1 s
def _bomb(levels: int = 10) -> str:
    return "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, levels)
    )


def _sparse(path: Path, size: int = 50_000_000) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@pytest.mark.parametrize(
    "name, text, why",
    [
        ("bomb.yaml", _bomb(), "alias bomb"),
        ("chain.yaml", "a0: &a0 [x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 300)), "deeper"),
        ("loop.yaml", "a: &a [x, *a]\n", "recursive"),
        ("deep.yaml", "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n", "deeper"),
        ("many.yaml", "[" + "1, " * 60_000 + "1]\n", "tokens"),
        ("deep.json", "[" * 50_000 + "]" * 50_000, "deeper"),
        ("big.yaml", None, "more than a recorded file holds"),
        ("big.json", None, "more than a recorded file holds"),
    ],
)
def test_records_refuse_bombs_and_huge_files_at_once(tmp_path, name, text, why):
    from qwen3exp.run import records

    path = tmp_path / name
    _sparse(path) if text is None else path.write_text(text)
    load = records.load_json if name.endswith(".json") else records.load_yaml

    def attempt():
        try:
            load(path)
        except records.Unreadable as e:
            return e.why
        return None

    refused, seconds = _within(20, attempt)
    assert refused is not None and why in refused and seconds < 1.0, (refused, seconds)


def test_tools_refuse_a_bomb_or_a_huge_file_with_exit_2(tmp_path, capsys, composed):
    """diff walks an experiment key by key (a 1 kB alias bomb expands to 10^9 values), report reads
    a summary, relaunch a recorded config: each exit 2 naming the file, within a second."""
    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        run.mkdir()
        (run / "experiment.yaml").write_text("training: {lr: 0.001}\n")
    (b / "experiment.yaml").write_text(_bomb())
    _sparse(a / "summary.json")
    relaunched = _recorded(tmp_path, composed, text=_bomb())
    for argv, named in (
        (("diff", str(a), str(b)), b / "experiment.yaml"),
        (("report", str(a)), a / "summary.json"),
        (("relaunch", str(relaunched)), "(recorded config)"),
    ):
        code, seconds = _within(30, lambda argv=argv: _cli(*argv))
        err = capsys.readouterr().err
        assert code == 2 and str(named) in err and "Traceback" not in err, err
        assert seconds < 1.0 or argv[0] == "relaunch", seconds  # relaunch imports Hydra first


# ------------------------------------------------------- 3. tools on hostile input
def _run_dir(
    path: Path, experiment: dict, rows: list | None = None, summary: dict | None = None, provenance: dict | None = None
) -> Path:
    from qwen3exp.run import rundir

    path.mkdir(parents=True)
    (path / rundir.EXPERIMENT).write_text(rundir.experiment_yaml(experiment))
    if rows is not None:
        (path / rundir.METRICS).write_bytes(
            b"".join(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n" for r in rows)
        )
    if summary is not None:
        (path / rundir.SUMMARY).write_text(json.dumps(summary))
    if provenance is not None:
        (path / rundir.PROVENANCE).write_text(json.dumps(provenance))
    return path


def test_report_leaves_out_garbage_metrics_lines_and_names_them(tmp_path, capsys):
    from qwen3exp.analysis import report

    garbage = [
        b"[1, 2]\n",
        b'"loss"\n',
        b'{"step": "x", "loss": 1.0}\n',
        b'{"step": 2, "loss": "abc"}\n',
        b'{"step": 3, "loss": true}\n',
        b"\xff\xfe not utf-8\n",
        b'{"step": 4, "loss": 1' + b"0" * 400 + b"}\n",
        b'{"step": 5, "tokens_per_second": {"a": 1}, "loss": 1.0}\n',
        b"{" * 70_000 + b"\n",
        b'{"step": 6, "lo',
    ]
    run = _run_dir(
        tmp_path / "run", {"training": {"lr": 0.001}}, [{"step": 1, "loss": 3.0, "tokens_per_second": 10.0}, *garbage]
    )
    assert report.main([str(run), "--no-files"]) == 0
    out, err = capsys.readouterr()
    assert "3.0000" in out and "Traceback" not in err
    assert f"{run / 'metrics.jsonl'}: 10 line(s) left out, not metrics rows: line 2: a JSON list, not an object" in err
    from qwen3exp.analysis.relaunch import compare_losses

    assert "at all 1 common steps" in compare_losses(run, run)


@pytest.mark.parametrize("fifo_name", ["summary.json", "experiment.yaml", "metrics.jsonl"])
def test_a_fifo_in_a_run_is_exit_2_and_never_blocks(tmp_path, capsys, fifo_name):
    a = _run_dir(tmp_path / "a", {"training": {"lr": 0.001}}, [{"step": 1, "loss": 3.0}])
    b = _run_dir(tmp_path / "b", {"training": {"lr": 0.002}}, [{"step": 1, "loss": 3.0}])
    fifo = b / fifo_name
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    commands = [("report", str(b), "--no-files")]
    if fifo_name == "experiment.yaml":
        commands.append(("diff", str(a), str(b)))
    for argv in commands:
        code, _ = _within(20, lambda argv=argv: _cli(*argv), fifo)
        err = capsys.readouterr().err
        assert code == 2 and f"{fifo}" in err and "FIFO" in err, (argv, err)
    # Beside a readable run, the run holding the FIFO is listed as unreadable and the rest reported.
    code, _ = _within(20, lambda: _cli("report", str(tmp_path), "--no-files", "--format", "csv"), fifo)
    out, err = capsys.readouterr()
    assert code == 0 and f"{fifo}" in err and "FIFO" in err and "listed as unreadable" in err, err
    header, *rows = (line.split(",") for line in out.splitlines())
    assert {row[0]: row[header.index("status")] for row in rows} == {
        "a": "incomplete",
        "b": "unreadable",
    }, out


def test_report_into_a_read_only_folder_is_exit_2(tmp_path, capsys, monkeypatch):
    from qwen3exp.analysis import report
    from qwen3exp.run import rundir

    run = _run_dir(tmp_path / "run", {"training": {"lr": 0.001}}, [{"step": 1, "loss": 3.0}])
    run.chmod(0o555)
    if os.geteuid() == 0:  # root writes into a 0555 folder: fail the write as the kernel would for a user

        def refuse(path, text):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))

        monkeypatch.setattr(rundir, "atomic_write_text", refuse)
    try:
        assert report.main([str(run)]) == 2
    finally:
        run.chmod(0o755)
    err = capsys.readouterr().err
    assert "no report files written" in err and "Permission denied" in err and "--out DIR" in err


def test_dangling_links_are_named(tmp_path, capsys):
    from qwen3exp import scaffold
    from qwen3exp.analysis import report

    run = _run_dir(tmp_path / "run", {"training": {"lr": 0.001}}, [{"step": 1, "loss": 3.0}])
    (run / "summary.json").symlink_to(tmp_path / "gone.json")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    assert report.main([str(run), "--no-files"]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'summary.json'}: a link to {tmp_path / 'gone.json'}, which does not exist" in err
    assert report.main([str(tmp_path / "link")]) == 2
    assert "which does not exist" in capsys.readouterr().err
    assert _cli("diff", str(tmp_path / "link"), str(run)) == 2
    # init: a dangling link where a file goes is kept (never followed), a dangling DIR is refused
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").symlink_to(tmp_path / "elsewhere.md")
    assert scaffold.main([str(repo)]) == 0
    assert (repo / "README.md").is_symlink() and not (tmp_path / "elsewhere.md").exists()
    assert scaffold.main([str(tmp_path / "link")]) == 2
    assert "a link to a missing folder" in capsys.readouterr().err


def test_unknown_options_and_impossible_folders_are_exit_2(tmp_path, capsys, monkeypatch):
    from qwen3exp import scaffold

    run = _run_dir(tmp_path / "run", {"training": {"lr": 0.001}}, [{"step": 1, "loss": 3.0}])
    monkeypatch.chdir(tmp_path)
    for argv in (
        ("report", "--frobnicate", str(run)),
        ("diff", "--frobnicate", str(run), str(run)),
        ("init", "--frobnicate"),
        ("init", "a", "b"),
        ("relaunch", str(run), "--frobnicate"),
    ):
        assert _cli(*argv) == 2, argv
        assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "--frobnicate").exists() and not (tmp_path / "a").exists()
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "conf").write_text("a file where a folder goes\n")
    assert scaffold.main([str(tmp_path / "repo")]) == 2
    assert "nothing written" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["conf"]


# ------------------------------------------------------- 4. report never replaces a user's file
def test_report_never_replaces_a_file_it_did_not_write(tmp_path, capsys):
    from qwen3exp.analysis import report

    run = _run_dir(tmp_path / "run", {"training": {"lr": 0.001}}, [{"step": 1, "loss": 3.0}])
    (run / "report.md").write_text("# my notes on this run\n")
    assert report.main([str(run)]) == 2
    assert "report.md, not written by qwen3exp report (never replaced)" in capsys.readouterr().err
    assert (run / "report.md").read_text() == "# my notes on this run\n" and not (run / "loss.png").exists()
    (run / "report.md").unlink()
    assert report.main([str(run)]) == 0  # its own files it replaces, every time
    assert report.main([str(run)]) == 0
    assert (run / "report.md").read_text().startswith(report.MARK + "\n")
    (run / "report.csv").write_text("a,b\n1,2\n")
    with pytest.raises(report.NotOurs):  # the end of a sweep writes through write_files too
        report.write_files([report.load_run(run)], run)
    assert (run / "report.csv").read_text() == "a,b\n1,2\n"


# ------------------------------------------------------- 5. presentation keys are no difference
def test_verbose_and_dry_run_are_no_difference(tmp_path, capsys):
    from qwen3exp.analysis import report
    from qwen3exp.analysis.runs import varied_keys
    from qwen3exp.run import rundir

    exp = {"name": "x", "dry_run": False, "verbose": True, "training": {"lr": 0.001}}
    a = _run_dir(tmp_path / "a", exp, [{"step": 1, "loss": 3.0}])
    b = _run_dir(tmp_path / "b", {**exp, "verbose": False, "dry_run": True}, [{"step": 1, "loss": 3.0}])
    assert rundir.experiment_hash(rundir.read_experiment(a)) == rundir.experiment_hash(rundir.read_experiment(b))
    assert _cli("diff", str(a), str(b)) == 0
    assert capsys.readouterr().out == "identical resolved experiments\n"
    runs = [report.load_run(a), report.load_run(b)]
    assert varied_keys(runs) == [] and report.compare(*runs).changes == []
    c = _run_dir(tmp_path / "c", {**exp, "training": {"lr": 0.002}}, [{"step": 1, "loss": 3.0}])
    assert varied_keys([*runs, report.load_run(c)]) == ["training.lr"]


# ------------------------------------------------------- 6. provenance
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def test_provenance_of_a_repository_with_no_commit_yet(tmp_path):
    from qwen3exp.run import provenance

    repo = tmp_path / "exps"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "staged.yaml").write_text("a: 1\n")
    (repo / "new.yaml").write_text("b: 2\n")
    _git(repo, "add", "staged.yaml")
    state, diff = provenance.git_state(repo)
    assert "error" not in state and diff is None
    assert state["commit"] is None and state["branch"] == "main" and state["note"] == "no commit yet"
    assert state["untracked"] == [{"path": "new.yaml", "size": 5}]
    assert state["staged"] == [{"path": "staged.yaml", "size": 5}] and state["dirty"] is True


def test_diff_provenance_compares_the_experiments_repository(tmp_path, capsys):
    exp = {"training": {"lr": 0.001}}
    prov = {
        "git": {"commit": "aaa", "untracked": [{"path": "x", "size": 1}]},
        "versions": {"torch": "2"},
        "experiments": {
            "config_dir": "/e/conf",
            "packaged": False,
            "git": {"commit": "c1", "dirty": False, "untracked": []},
        },
    }
    a = _run_dir(tmp_path / "a", exp, provenance=prov)
    other = json.loads(json.dumps(prov))
    other["experiments"]["git"].update(commit="c2", untracked=[{"path": "y", "size": 2}])
    other["git"]["untracked"] = []
    b = _run_dir(tmp_path / "b", exp, provenance=other)
    assert _cli("diff", "--provenance", str(a), str(b)) == 1
    assert capsys.readouterr().out == "provenance.experiments.git.commit  c1 -> c2\n"


def test_relaunch_says_what_it_compared_when_there_is_no_commit(tmp_path, capsys, monkeypatch):
    from qwen3exp.analysis import relaunch
    from qwen3exp.run import provenance

    state = {"repo": None, "commit": None, "dirty": None, "error": "qwen3exp is installed, not a checkout"}
    monkeypatch.setattr(provenance, "source_git_state", lambda: (state, None))
    run = _run_dir(
        tmp_path / "run", {"training": {"lr": 0.001}}, provenance={"git": state, "versions": provenance.versions()}
    )
    relaunch._report_code(run)
    out = capsys.readouterr().out
    assert "None" not in out and "same code as recorded" in out and "no git commit to compare" in out
