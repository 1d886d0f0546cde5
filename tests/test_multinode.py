"""Multi-node torchrun on loopback: two launchers (`python -m qwen3exp launcher.nnodes=2
launcher.node_rank=i ...`), each starting one torchrun agent with one rank, meet in a c10d
rendezvous on 127.0.0.1 and train the tiny model exactly like one node with two ranks."""

from __future__ import annotations

import json

import pytest

from conftest import read_metrics, read_summary, run_cli
from runprocs import TINY, assert_no_survivors, free_port, kill_leftovers, start_cli, wait_for

pytestmark = pytest.mark.slow


def test_two_nodes_match_one_node_with_two_ranks(tmp_path, reference_losses):
    run = tmp_path / "two_nodes"
    endpoint = f"127.0.0.1:{free_port()}"
    common = (*TINY, "launcher.nnodes=2", "launcher.nproc_per_node=1", f"launcher.rdzv_endpoint={endpoint}",
              f"hydra.run.dir={run}")
    try:
        node0 = start_cli(*common, "launcher.node_rank=0", log=tmp_path / "node0.log")
        # Node 1 starts once node 0 has written the run directory: it joins that run (same
        # experiment, no summary yet) instead of being refused as "already holds a run".
        wait_for(lambda: (run / "experiment.yaml").is_file(), proc=node0, what="node 0's run files")
        node1 = start_cli(*common, "launcher.node_rank=1", log=tmp_path / "node1.log")
        codes = [node0.wait(timeout=600), node1.wait(timeout=600)]
    finally:
        kill_leftovers(run)
    assert codes == [0, 0], (tmp_path / "node0.log").read_text()[-2000:] + (tmp_path / "node1.log").read_text()[-2000:]
    assert_no_survivors(run)

    s0 = read_summary(run)
    s1 = json.loads((run / "summary_node1.json").read_text())
    assert s0["status"] == s1["status"] == "completed"
    assert (s0["world_size"], s0["nnodes"], s0["node_rank"], s1["node_rank"]) == (2, 2, 0, 1)
    assert "--nnodes 2 --nproc-per-node 1" in (run / "command.txt").read_text()
    assert f"--rdzv-endpoint {endpoint}" in (run / "command_node1.txt").read_text()

    # Same global batch, same seed, FSDP over 2 ranks either way (and one thread per rank): the
    # same numbers, bit for bit (measured; c10d may give node 1's rank global rank 0, which only
    # swaps the two addends of every 2-rank reduction).
    assert [row["loss"] for row in read_metrics(run)] == reference_losses


def test_a_finished_multinode_run_directory_is_not_joined(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    r = run_cli(*TINY, "launcher.nnodes=2", "launcher.node_rank=1", "launcher.rdzv_endpoint=127.0.0.1:1",
                f"hydra.run.dir={run}")
    assert r.returncode == 2 and "never overwritten" in r.stderr and "Traceback" not in r.stderr
