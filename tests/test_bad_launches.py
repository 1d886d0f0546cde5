"""Mistakes outside the experiment's values, each caught before launch with exit 2, the key named,
no traceback, no worker started, and every file that existed before still there byte for byte:
broken interpolations, YAML syntax errors, malformed overrides, unsafe names, run directories
that cannot be created or written or lack disk space, an unreachable SLURM controller, an unknown
Hydra launcher or sweeper plugin.

The command lines run a few at a time (module fixture), each row still its own test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import CONF, run_cli
from test_rundir_safety import snapshot


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    key: str
    also: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    needs_mount: bool = False


CASES = [
    Case("interpolation_missing_key", ("name=${nope}",), "name", ("Interpolation key 'nope' not found",)),
    Case(
        "interpolation_cycle",
        ("training.steps=${training.warmup_steps}", "training.warmup_steps=${training.steps}"),
        "training.",
        ("refers back to itself",),
    ),
    Case(
        "interpolation_unset_env",
        ("training.lr=${oc.env:QWEN3EXP_TEST_UNSET_VAR}",),
        "training.lr",
        ("QWEN3EXP_TEST_UNSET_VAR", "oc.env"),
    ),
    Case(
        "yaml_syntax_error",
        ("--config-path", "{tmp}/conf", "experiment=broken"),
        "(config file)",
        ("broken.yaml", "YAML syntax error at line", "line 2, column"),
    ),
    Case("override_without_key", ("=5",), "(command line)", ("needs a key before '='",)),
    Case("override_unparsable", ("training.lr==5",), "training.lr = '=5'", ("cannot parse",)),
    Case("name_too_long", ("name=" + "a" * 300,), "name", ("at most",)),
    Case("name_dotdot", ("name=..",), "name", ("a single folder name",)),
    Case("name_dot", ("name=.",), "name", ("a single folder name",)),
    Case("run_dir_is_a_file", ("hydra.run.dir={tmp}/a_file",), "hydra.run.dir", ("is a file, not a directory",)),
    Case("run_dir_under_a_file", ("hydra.run.dir={tmp}/a_file/run",), "hydra.run.dir", ("cannot be created",)),
    Case("run_dir_read_only", ("hydra.run.dir={ro}/run",), "hydra.run.dir", ("read-only",), needs_mount=True),
    Case(
        "run_dir_disk_full",
        ("hydra.run.dir={small}/run",),
        "hydra.run.dir",
        ("free but the run writes about",),
        needs_mount=True,
    ),
    Case(
        "slurm_controller_down",
        ("launcher=slurm",),
        "launcher",
        ("reach", "SLURM controller"),
        env=(("SLURM_CONF", "{tmp}/slurm.conf"),),
    ),
    Case(
        "unknown_launcher_plugin",
        ("-m", "hydra.launcher._target_=my.Launcher"),
        "hydra.launcher._target_",
        ("qwen3exp runs every job through its own Hydra launcher", "hydra/launcher=qwen3exp"),
    ),
    Case(
        "unknown_sweeper_plugin",
        ("-m", "hydra.sweeper._target_=my.Sweeper"),
        "hydra.sweeper._target_",
        ("is not an installed Hydra sweeper plugin", "BasicSweeper"),
    ),
]


def _mount_tmpfs(where: Path, options: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True).returncode
        == 0
    )


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad_launches")
    shutil.copytree(CONF, tmp / "conf")
    (tmp / "conf" / "experiment" / "broken.yaml").write_text("name: broken\ntraining: [\n  steps: 3\n")
    (tmp / "a_file").write_text("not a directory\n")
    # A SLURM configuration whose controller is nobody (a closed port on loopback).
    (tmp / "slurm.conf").write_text(
        "ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
        "MessageTimeout=2\nNodeName=localhost CPUs=1\n"
        "PartitionName=p Nodes=localhost Default=YES\n"
    )
    mounts = []
    ro, small = tmp / "ro", tmp / "small"
    if _mount_tmpfs(ro, "ro,size=64m"):
        mounts.append(ro)
    if _mount_tmpfs(small, "size=1m"):
        mounts.append(small)
    try:
        yield tmp, {"ro": ro in mounts, "small": small in mounts}
    finally:
        for m in mounts:
            subprocess.run(["umount", str(m)], check=False)


@pytest.fixture(scope="module")
def results(assets):
    tmp, mounted = assets

    def one(case: Case):
        if case.needs_mount and not all(mounted.values()):
            return case.id, None

        def sub(a: str) -> str:
            return a.replace("{tmp}", str(tmp)).replace("{ro}", str(tmp / "ro")).replace("{small}", str(tmp / "small"))

        args = [sub(a) for a in case.args]
        env = {k: sub(v) for k, v in case.env}
        cwd = tmp / f"cwd_{case.id}"
        cwd.mkdir()
        before = snapshot(tmp / "conf"), (tmp / "a_file").read_bytes()
        proc = run_cli(*args, cwd=cwd, env=env, timeout=180)
        after = snapshot(tmp / "conf"), (tmp / "a_file").read_bytes()
        return case.id, (proc, before == after, cwd)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, CASES))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_launch(case: Case, results):
    got = results[case.id]
    if got is None:
        pytest.skip("needs root to mount a read-only / a 1 MiB tmpfs")
    proc, unchanged, cwd = got
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text, text
    assert "configuration error" in proc.stderr, text
    assert f"  {case.key}" in proc.stderr, proc.stderr
    for more in case.also:
        assert more in proc.stderr, proc.stderr
    assert "rank(s) on" not in proc.stdout
    assert unchanged
    assert list(cwd.iterdir()) == [], list(cwd.rglob("*"))  # no outputs/, nothing at all
