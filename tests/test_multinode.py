"""Multi-node torchrun on loopback: two launchers (`python -m qwen3exp launcher.nnodes=2
launcher.node_rank=i ...`) into one shared run directory, started in any order and seconds apart,
each starting one torchrun agent with one rank, meet in a c10d rendezvous on 127.0.0.1 and train
the tiny model exactly like one node with two ranks."""

from __future__ import annotations

import json
import time

import pytest

from conftest import read_metrics, read_summary, run_cli
from runprocs import TINY, assert_no_survivors, free_port, kill_leftovers, start_cli


def _node_claim(run, node: int, *extra: str):
    """What `python -m qwen3exp` of one node of a 2-node run does first: compose, claim the folder."""
    from qwen3exp.config.argv import parse_argv
    from qwen3exp.config.precheck import precheck
    from qwen3exp.launchers import command

    inv = parse_argv(
        [
            *TINY,
            "launcher.nnodes=2",
            "launcher.nproc_per_node=1",
            "launcher.rdzv_endpoint=127.0.0.1:1",
            f"launcher.node_rank={node}",
            f"hydra.run.dir={run}",
            *extra,
        ]
    )
    return command._claim(precheck(inv))


def _hydra_started(run) -> None:
    """What a node's launch has written into the folder before its experiment.yaml (observed: 0.2-0.7 s
    on an idle machine, several seconds on a loaded one)."""
    (run / "multirun.yaml").write_text("hydra: {}\n")
    (run / ".hydra").mkdir(exist_ok=True)
    (run / "plan.json").write_text("{}")


def test_a_node_joins_the_folder_another_node_has_started_writing(tmp_path):
    from qwen3exp.errors import ConfigError

    run = tmp_path / "run"
    node0 = _node_claim(run, 0)
    _hydra_started(run)
    node1 = _node_claim(run, 1)  # was: "already holds files that are not a qwen3exp run (multirun.yaml)"
    # Node 1 refused later (or a dry run): what node 0 wrote stays, and so does node 0's claim.
    node1.release(discard=True)
    assert {p.name for p in run.iterdir()} == {"multirun.yaml", ".hydra", "plan.json", ".qwen3exp.lock"}
    # A node of another experiment is refused, naming why.
    with pytest.raises(ConfigError, match="another node's launcher of a different experiment"):
        _node_claim(run, 1, "training.lr=0.001")
    assert {p.name for p in run.iterdir()} == {"multirun.yaml", ".hydra", "plan.json", ".qwen3exp.lock"}
    node0.release()


def test_the_node_that_made_the_folder_leaves_the_other_nodes_files(tmp_path):
    run = tmp_path / "run"
    node1 = _node_claim(run, 1)  # started first: it creates the folder
    node0 = _node_claim(run, 0)
    _hydra_started(run)
    node1.release(discard=True)
    assert {"multirun.yaml", ".hydra", "plan.json", ".qwen3exp.lock"} == {p.name for p in run.iterdir()}
    node0.release(discard=True)  # the last one out removes what is new to it (none of it was there before)
    assert list(run.iterdir()) == []


def test_a_foreign_folder_is_still_refused_to_a_multinode_run(tmp_path):
    from qwen3exp.errors import ConfigError

    run = tmp_path / "run"
    run.mkdir()
    _hydra_started(run)  # the same files, but no lock of a node of this run
    with pytest.raises(ConfigError, match=r"not a qwen3exp run \(\.hydra|not a qwen3exp run \(multirun"):
        _node_claim(run, 1)
    assert {"multirun.yaml", ".hydra", "plan.json"} == {p.name for p in run.iterdir()}


# (seconds between the two launchers, which node starts first): together; node 1 a few seconds
# after node 0, while node 0 is still planning (its folder holds multirun.yaml and .hydra/ but no
# experiment.yaml yet: node 1 was refused); node 0 long after node 1, whose agent waits meanwhile.
SPACINGS = ((0, 0), (3, 0), (20, 1))


@pytest.mark.slow
def test_two_nodes_started_apart_match_one_node_with_two_ranks(tmp_path, reference_losses):
    """The three spacings side by side (6 launchers, 6 ranks on the machine's cores: ~70 s on 2)."""
    runs = {gap: tmp_path / f"apart_{gap}s" for gap, _ in SPACINGS}
    starts = sorted((gap * (node != first), gap, node) for gap, first in SPACINGS for node in (0, 1))
    endpoints = {gap: f"127.0.0.1:{free_port()}" for gap in runs}
    procs = {}
    began = time.monotonic()
    try:
        for at, gap, node in starts:
            time.sleep(max(0.0, began + at - time.monotonic()))
            procs[gap, node] = start_cli(
                *TINY,
                "launcher.nnodes=2",
                "launcher.nproc_per_node=1",
                f"launcher.rdzv_endpoint={endpoints[gap]}",
                f"hydra.run.dir={runs[gap]}",
                f"launcher.node_rank={node}",
                log=tmp_path / f"{gap}s_node{node}.log",
            )
        codes = {key: proc.wait(timeout=600) for key, proc in procs.items()}
    finally:
        for run in runs.values():
            kill_leftovers(run)
    logs = "".join(f"\n--- {p.name}\n" + p.read_text()[-1500:] for p in sorted(tmp_path.glob("*.log")))
    assert set(codes.values()) == {0}, f"{codes}{logs}"
    for gap, run in runs.items():
        assert_no_survivors(run)
        s0 = read_summary(run)
        s1 = json.loads((run / "summary_node1.json").read_text())
        assert s0["status"] == s1["status"] == "completed"
        assert (s0["world_size"], s0["nnodes"], s0["node_rank"], s1["node_rank"]) == (2, 2, 0, 1)
        assert "--nnodes 2 --nproc-per-node 1" in (run / "command.txt").read_text()
        assert f"--rdzv-endpoint {endpoints[gap]}" in (run / "command_node1.txt").read_text()
        # Same global batch, same seed, FSDP over 2 ranks either way (and one thread per rank): the
        # same numbers, bit for bit (measured; c10d may give node 1's rank global rank 0, which only
        # swaps the two addends of every 2-rank reduction).
        assert [row["loss"] for row in read_metrics(run)] == reference_losses, f"{gap} s apart"


@pytest.mark.slow
def test_a_finished_multinode_run_directory_is_not_joined(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    r = run_cli(
        *TINY, "launcher.nnodes=2", "launcher.node_rank=1", "launcher.rdzv_endpoint=127.0.0.1:1", f"hydra.run.dir={run}"
    )
    assert r.returncode == 2 and "never overwritten" in r.stderr and "Traceback" not in r.stderr
