"""qwen3exp the way a team gets it: a wheel installed (non-editable) into a fresh virtual
environment, driven from the team's own git repository of experiments, far from this source tree.

The fresh venv sees the dependencies (torch, torchtitan, ...) of the test's own environment through
a `.pth` file, so that no test downloads several GB; qwen3exp itself comes only from the wheel
(checked: its module file lies in the fresh venv, and nothing points at this repository).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO, read_summary

pytestmark = pytest.mark.slow  # every test shares the wheel installed into a fresh virtualenv (and one trains)

MY_MODEL = """\
# A new option of the packaged model group: the tiny flavor cut to one layer.
backend: native
flavor: tiny
n_layers: 1
"""

MY_EXPERIMENT = """\
# @package _global_
defaults:
  - override /model: tiny_one_layer
  - override /data: my_data
  - override /platform: cpu

name: mine
training:
  steps: 3
  warmup_steps: 1
  seq_len: 64
  local_batch_size: 2
metrics:
  tensorboard: false
platform:
  threads_per_rank: 1
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("installed")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(REPO),
            "-w",
            str(tmp / "dist"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp / "dist").glob("qwen3exp-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    purelib = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # The test environment's packages, after the fresh venv's own (a .pth line is appended to sys.path;
    # the editable-install hook of this repository in that folder is a .pth of its own and not run).
    (purelib / "_qwen3exp_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("HF_HUB_OFFLINE", "1")
    repo = tmp / "experiments"

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(venv / "bin" / "qwen3exp"), *args], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout
        )

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [str(venv / "bin" / "qwen3exp"), *args],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    repo.mkdir()
    init = run("init")
    assert init.returncode == 0, init.stdout + init.stderr
    (repo / "conf" / "model").mkdir()
    (repo / "conf" / "model" / "tiny_one_layer.yaml").write_text(MY_MODEL)
    (repo / "conf" / "experiment" / "mine.yaml").write_text(MY_EXPERIMENT)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "experiments"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import qwen3exp, qwen3exp.config.compose as c; print(qwen3exp.__file__); print(c.CONF_DIR)",
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {"run": run, "start": start, "repo": repo, "commit": commit, "venv": venv, "where": where, "init": init}


def test_the_wheel_is_what_runs(installed):
    module, conf = installed["where"]
    assert module.startswith(str(installed["venv"])), module
    assert conf.startswith(str(installed["venv"])) and Path(conf, "config.yaml").is_file(), conf
    assert str(REPO) not in module


def test_init_writes_a_repository_of_experiments(installed):
    repo = installed["repo"]
    for rel in (
        "conf/experiment/my_experiment.yaml",
        "conf/data/my_data.yaml",
        "data/sample.jsonl",
        ".gitignore",
        "README.md",
    ):
        assert (repo / rel).is_file(), rel
    assert "outputs/" in (repo / ".gitignore").read_text()
    again = installed["run"]("init")
    assert again.returncode == 0 and "kept (exists)" in again.stdout  # never overwrites


def test_help_and_info_work_from_the_wheel(installed):
    for args in (("--help",), ("--info", "searchpath"), ("-cd", "conf", "--cfg", "job", "experiment=mine")):
        r = installed["run"](*args, timeout=120)
        assert r.returncode == 0, (args, r.stdout[-1500:], r.stderr[-1500:])
        assert "Traceback" not in r.stdout + r.stderr
    r = installed["run"]("-cd", "conf", "--cfg", "job", "experiment=mine", timeout=120)
    assert "n_layers: 1" in r.stdout and "name: mine" in r.stdout


def test_ls_and_cp_from_the_wheel(installed, tmp_path):
    """`qwen3exp ls` in the user's repository lists its experiment as theirs beside the packaged
    ones; `cp` copies a packaged one (into a folder outside the repository: its git tree stays clean
    for the provenance tests)."""
    r = installed["run"]("ls", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert any(line.split()[:2] == ["mine", "yours"] for line in r.stdout.splitlines()), r.stdout
    assert any(line.split()[:2] == ["tiny_native", "packaged"] for line in r.stdout.splitlines()), r.stdout
    r = installed["run"]("cp", "tiny_native", "mine_native", "-cd", str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "name: mine_native" in (tmp_path / "experiment" / "mine_native.yaml").read_text()


def test_dry_run_from_the_users_repo(installed):
    r = installed["run"]("-cd", "conf", "experiment=mine", "dry_run=true", timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "qwen3exp dry run: mine" in r.stdout and "nothing was started" in r.stdout
    assert not (installed["repo"] / "outputs").exists()


@pytest.mark.parametrize(
    "form",
    [("--config-dir", "conf"), ("--config-dir=conf",), ("-cd", "conf"), ("hydra.searchpath=[file://{repo}/conf]",)],
    ids=["config-dir", "config-dir=", "cd", "searchpath"],
)
def test_a_typo_in_the_users_repo_is_exit_2(installed, form):
    form = [f.replace("{repo}", str(installed["repo"])) for f in form]
    r = installed["run"](*form, "experiment=mine", "training.stepz=3", timeout=180)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stdout + r.stderr
    assert "  training.stepz = " in r.stderr and "did you mean training.steps?" in r.stderr
    assert not (installed["repo"] / "outputs").exists()


def _finish(proc: subprocess.Popen, timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_train_and_sweep_from_the_users_repo(installed):
    """A run and a sweep, started side by side (separate output folders; nothing depends on timing)."""
    repo, start = installed["repo"], installed["start"]
    one = start("-cd", "conf", "experiment=mine", "hydra.run.dir=outputs/one")
    sweep = start(
        "-cd",
        "conf",
        "-m",
        "experiment=mine",
        "training.lr=1e-3,2e-3",
        "training.steps=2",
        "hydra.sweep.dir=outputs/sweep",
    )
    r, s = _finish(one), _finish(sweep)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = read_summary(repo / "outputs" / "one")
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    prov = json.loads((repo / "outputs" / "one" / "provenance.json").read_text())
    assert prov["experiments"]["git"]["commit"] == installed["commit"]
    assert prov["experiments"]["config_dir"] == str(repo / "conf")
    assert prov["git"]["commit"] is None and "installed" in prov["git"]["error"]
    assert prov["versions"]["qwen3exp"]
    exp = (repo / "outputs" / "one" / "experiment.yaml").read_text()
    assert "n_layers: 1" in exp and "data/sample.jsonl" in exp

    assert s.returncode == 0, s.stdout[-3000:] + s.stderr[-3000:]
    assert "2 completed" in s.stdout
    summaries = [read_summary(p.parent) for p in (repo / "outputs" / "sweep").glob("*/summary.json")]
    assert sorted(x["status"] for x in summaries) == ["completed", "completed"]
