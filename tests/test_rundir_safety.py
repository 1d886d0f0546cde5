"""Nothing lost, nothing overwritten: run directories are claimed before anything is written, a
refused launch removes only what it created, and two launches never share one directory.

Every case runs the real command line and checks, besides the exit code and the message, that
every file that existed before the launch is still there byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import read_metrics, read_summary, run_cli
from qwen3exp.errors import ConfigError
from qwen3exp.run import claim, procs
from runprocs import TINY, start_cli, wait_for

FAST = (
    "training.steps=2",
    "training.warmup_steps=0",
    "training.seq_len=32",
    "training.local_batch_size=1",
    "metrics.tensorboard=false",
    "platform=cpu",
    "platform.threads_per_rank=1",
    "launcher.nproc_per_node=1",
)


def snapshot(root: Path) -> dict[str, str]:
    """path -> sha256 (or 'dir') of everything under root."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def assert_refused(proc: subprocess.CompletedProcess, key: str, *also: str) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text, text
    assert f"  {key} = " in proc.stderr, proc.stderr
    for more in also:
        assert more in proc.stderr, proc.stderr
    assert "rank(s) on" not in proc.stdout, proc.stdout


# ------------------------------------------------------------------------------------ the claim
def test_claim_is_exclusive_and_released(tmp_path):
    run = tmp_path / "a" / "run"
    first = claim.claim(run)
    with pytest.raises(ConfigError) as e:
        claim.claim(run)
    assert "in use by another qwen3exp launch" in e.value.render()
    assert f"pid {os.getpid()}" in e.value.render()
    first.release()
    claim.claim(run).release()  # free again
    assert (run / claim.LOCK).is_file()  # the lock file stays: deleting it would let two holders in


def test_discard_removes_only_what_the_launch_created(tmp_path):
    keep = tmp_path / "keep"
    (keep / "sub").mkdir(parents=True)
    (keep / "notes.txt").write_text("notes")
    (keep / "sub" / "x").write_text("x")
    before = snapshot(keep)
    c = claim.claim(keep)
    (keep / "experiment.yaml").write_text("name: x\n")
    (keep / ".hydra").mkdir()
    c.release(discard=True)
    assert snapshot(keep) == before

    fresh = tmp_path / "new" / "deeper" / "run"
    c = claim.claim(fresh)
    (fresh / "summary.json").write_text("{}")
    c.release(discard=True)
    assert not (tmp_path / "new").exists()  # the parents it made went too; tmp_path stayed

    # A file another program put into the directory meanwhile is never removed (nor the directory),
    # and a bookkeeping file that was there (a completed run's multirun.yaml) is put back as it was.
    (keep / "multirun.yaml").write_text("recorded\n")
    before = snapshot(keep)
    c = claim.claim(keep)
    (keep / "multirun.yaml").write_text("rewritten by Hydra's sweeper\n")
    (keep / "theirs.txt").write_text("another program's\n")
    c.release(discard=True)
    assert (keep / "theirs.txt").read_text() == "another program's\n"
    (keep / "theirs.txt").unlink()
    assert snapshot(keep) == before
    c = claim.claim(fresh)
    (fresh / "theirs.txt").write_text("x")
    c.release(discard=True)
    assert (fresh / "theirs.txt").read_text() == "x"


def test_a_folder_holding_only_a_hydra_apps_files_is_not_empty(tmp_path):
    """`.hydra/` (and qwen3exp.log, multirun.yaml) count as a launch's leftovers only beside a
    qwen3exp lock file: a Hydra app's own `.hydra/` is somebody else's folder."""
    theirs = tmp_path / "theirs"
    (theirs / ".hydra").mkdir(parents=True)
    c = claim.claim(theirs)
    try:
        assert claim.not_a_run_problem(c) is not None
    finally:
        c.release(discard=True)
    assert (theirs / ".hydra").is_dir() and not (theirs / claim.LOCK).exists()
    ours = tmp_path / "ours"  # what a launch SIGKILLed while it planned leaves
    (ours / ".hydra").mkdir(parents=True)
    (ours / "multirun.yaml").write_text("x\n")
    (ours / claim.LOCK).write_text("{}\n")
    c = claim.claim(ours)
    try:
        assert claim.not_a_run_problem(c) is None
    finally:
        c.release(discard=True)


def test_discard_keeps_parents_that_gained_other_files(tmp_path):
    fresh = tmp_path / "p" / "run"
    c = claim.claim(fresh)
    (tmp_path / "p" / "someone_elses.txt").write_text("x")
    c.release(discard=True)
    assert not fresh.exists()
    assert (tmp_path / "p" / "someone_elses.txt").read_text() == "x"


def test_in_use_compares_paths_exactly(tmp_path):
    """A live run in runs/exp10 is not a run in runs/exp1 (the old check compared substrings)."""
    exp10, exp1 = tmp_path / "runs" / "exp10", tmp_path / "runs" / "exp1"
    exp10.mkdir(parents=True)
    fake = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "qwen3exp.worker.main", "exp10"],
        cwd=tmp_path / "runs",
    )
    try:
        wait_for(lambda: procs.workers_of(exp10), timeout=10, what="the fake worker")
        assert procs.workers_of(exp10) == [fake.pid]
        assert procs.workers_of(exp1) == []
    finally:
        fake.kill()
        fake.wait()


# ----------------------------------------------------------------- refusals keep what was there
def test_refused_launch_keeps_a_users_folder(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("notes\n")
    before = snapshot(keep)
    r = run_cli(*FAST, f"hydra.run.dir={keep}", timeout=120)
    assert_refused(r, "hydra.run.dir", "not a qwen3exp run (notes.txt)")
    assert snapshot(keep) == before


def test_refused_sweep_keeps_a_users_folder(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("notes\n")
    before = snapshot(keep)
    r = run_cli("-m", *FAST, "training.lr=1e-3,2e-3", f"hydra.sweep.dir={keep}", timeout=120)
    assert_refused(r, "hydra.sweep.dir", "not a qwen3exp sweep (notes.txt)")
    assert snapshot(keep) == before


def test_refused_launch_into_a_checkout(tmp_path):
    """hydra.run.dir=. in a checkout: refused, .git untouched."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "README").write_text("mine\n")
    before = snapshot(repo)
    r = run_cli(*FAST, "hydra.run.dir=.", cwd=repo, timeout=120)
    assert_refused(r, "hydra.run.dir", "not a qwen3exp run")
    assert snapshot(repo) == before


def test_checkpoint_without_its_run_is_not_resumed(tmp_path):
    """A folder holding only someone else's checkpoint/ (DCP metadata is a pickle) is refused."""
    d = tmp_path / "foreign"
    (d / "checkpoint" / "step-5").mkdir(parents=True)
    (d / "checkpoint" / "step-5" / ".metadata").write_bytes(b"\x80\x04not really")
    before = snapshot(d)
    r = run_cli(*FAST, "checkpoint=dcp", f"hydra.run.dir={d}", timeout=120)
    assert_refused(r, "hydra.run.dir", "holds a checkpoint/ but no experiment.yaml")
    assert snapshot(d) == before


def _fake_worker(run_dir: Path) -> subprocess.Popen:
    """A process that looks like a live rank of `run_dir` (the launcher waits for it, then refuses)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "qwen3exp.worker.main", str(run_dir)]
    )


@pytest.mark.parametrize("existing", [True, False], ids=["existing_empty_dir", "new_dir"])
@pytest.mark.slow  # quick tier: starts torchrun and its ranks
def test_refused_inside_the_job_removes_only_its_own_files(tmp_path, existing):
    """A refusal found after the preflight, inside the Hydra job (here: ranks of an earlier launch
    still live in the directory), used to `rmtree` the whole run directory."""
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "other.txt").write_text("other\n")
    run = parent / "run" / "deeper"
    if existing:
        run.mkdir(parents=True)
    before = snapshot(parent)
    fake = _fake_worker(run)
    try:
        wait_for(lambda: procs.workers_of(run), timeout=10, what="the fake worker")
        r = run_cli(*FAST, "launcher.stop_timeout_s=0.5", f"hydra.run.dir={run}", timeout=180)
    finally:
        fake.kill()
        fake.wait()
    assert_refused(r, "hydra.run.dir", "is in use by running process(es)")
    assert snapshot(parent) == before


# --------------------------------------------------------------------------------- concurrency
@pytest.mark.slow
def test_concurrent_launches_get_their_own_directories(tmp_path):
    """4 launches of one experiment started at once, default directory: 4 distinct run
    directories, each with its own complete, consistent files."""
    n = 4

    def one(i: int):
        # A secret on the command line (here: an environment variable Hydra sets for the job) must not
        # land in any file of the run.
        return run_cli(
            *FAST, f"training.seed={i}", "+hydra.job.env_set.WANDB_API_KEY=sekrit_abc123", cwd=tmp_path, timeout=900
        )

    with ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(one, range(n)))
    for r in results:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    runs = sorted(p.parent for p in (tmp_path / "outputs" / "tiny_native").glob("*/summary.json"))
    assert len(runs) == n, runs
    seeds = set()
    for run in runs:
        summary = read_summary(run)
        assert summary["status"] == "completed", summary
        assert [m["step"] for m in read_metrics(run)] == [1, 2]
        seed = int(
            next(
                line for line in (run / "experiment.yaml").read_text().splitlines() if line.strip().startswith("seed:")
            ).split(":")[1]
        )
        seeds.add(seed)
        # Its own command, plan and Hydra record: all name this directory, none another one.
        assert str(run.relative_to(tmp_path)) in (run / "command.txt").read_text()
        assert json.loads((run / "plan.json").read_text())["run_dir"].endswith(run.name)
        assert f"training.seed={seed}" in (run / ".hydra" / "overrides.yaml").read_text()
    assert seeds == set(range(n))
    leaked = [str(p) for p in tmp_path.rglob("*") if p.is_file() and b"sekrit_abc123" in p.read_bytes()]
    assert not leaked, leaked
    names = [r.name for r in runs]
    assert names == sorted(names) and len(set(names)) == n


@pytest.mark.slow
def test_second_launch_into_the_same_directory_is_refused(tmp_path):
    run = tmp_path / "shared"
    log = tmp_path / "first.log"
    first = start_cli(*TINY, "launcher.nproc_per_node=1", "training.steps=100000", f"hydra.run.dir={run}", log=log)
    try:
        wait_for(
            lambda: (run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").stat().st_size > 0,
            proc=first,
            timeout=300,
            what="the first launch's first step",
        )
        experiment = (run / "experiment.yaml").read_bytes()
        second = run_cli(*TINY, "launcher.nproc_per_node=1", "training.seed=7", f"hydra.run.dir={run}", timeout=120)
        assert_refused(second, "hydra.run.dir", "in use by another qwen3exp launch", str(run))
        assert (run / "experiment.yaml").read_bytes() == experiment  # the first one's, untouched
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=120)
    summary = read_summary(run)
    assert summary["status"] == "interrupted", summary
    assert "seed: 7" not in (run / "experiment.yaml").read_text()


def test_default_names_are_unique_and_sortable():
    from qwen3exp.run import rundir

    stamps = [rundir.stamp() for _ in range(8)]  # 8 launches in one millisecond: 8 names
    assert len(set(stamps)) == len(stamps)
    import re

    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{3}-[0-9a-f]{6}", s) for s in stamps), stamps[:3]
    first = stamps[0]
    time.sleep(0.002)
    assert rundir.stamp() > first
