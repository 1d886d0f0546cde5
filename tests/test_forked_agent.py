"""The agent a CPU launcher forks (`qwen3exp.run.forked_agent`): it starts as a new interpreter would,
holding nothing of the launcher's, and a relaunch still finds it (`procs.workers_of`).

Every CPU training of the suite runs through it; test_faults checks that the agent and the ranks of
a real launch are forks (`_forked_ranks`). Here, the parts a training does not show."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

from conftest import REPO
from qwen3exp.platforms import agent_forks, cpu_device
from qwen3exp.run import procs
from runprocs import wait_for

# A launcher's state (a flock held, a SIGTERM handler, logging to its console, an environment), a
# fork of it made fresh as the agent is, then the launcher lets go of its own lock.
LAUNCHER = """
import fcntl, json, logging, os, signal, sys, time
from pathlib import Path
from qwen3exp.run import forked_agent, procs

run_dir, lock, report = sys.argv[1:4]
fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
signal.signal(signal.SIGTERM, lambda *_: None)
logging.getLogger().addHandler(logging.StreamHandler())
logging.getLogger("qwen3exp").setLevel(logging.DEBUG)
os.environ["LAUNCHER_ONLY"] = "1"
if os.fork() == 0:
    forked_agent._fresh({"AGENT": "env"}, None)
    procs.name_this_process(procs.FORKED_AGENT_NAME)
    os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    state = {
        "env": dict(os.environ),
        "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "root_handlers": len(logging.getLogger().handlers),
        "qwen3exp_level": logging.getLogger("qwen3exp").level,
        "lock_fd": os.readlink(f"/proc/self/fd/{fd}"),
    }
    Path(report + ".tmp").write_text(json.dumps(state))
    os.replace(report + ".tmp", report)
    time.sleep(120)
    os._exit(0)
os.close(fd)
print("closed", flush=True)
os.wait()
"""


def test_a_forked_agent_holds_nothing_of_its_launcher_and_is_found_by_its_run_dir(tmp_path):
    run_dir, other, lock, report = tmp_path / "run", tmp_path / "run1", tmp_path / "x.lock", tmp_path / "state.json"
    run_dir.mkdir()
    other.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(run_dir), str(lock), str(report)], env=env, stdout=subprocess.PIPE
    )
    try:
        assert launcher.stdout.readline() == b"closed\n"
        wait_for(report.is_file, proc=launcher, timeout=60, what="the fork's state")
        state = json.loads(report.read_text())
        assert state["env"] == {"AGENT": "env"}
        assert state["sigterm"] and state["sigint"]
        assert state["root_handlers"] == 0 and state["qwen3exp_level"] == 0
        assert state["lock_fd"] == os.devnull
        # The launcher let go of its lock: nobody holds it (the fork's copy of it was dropped).
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        (agent,) = procs.descendants(launcher.pid)
        assert procs.workers_of(run_dir) == [agent]  # named qwen3exp-agent, holding run/ open
        assert procs.workers_of(other) == []
    finally:
        procs.signal_all(procs.descendants(launcher.pid), signal.SIGKILL)
        launcher.wait(timeout=30)


def test_a_launcher_that_imported_torchtitan_unprepared_starts_its_agent_anew(monkeypatch):
    """Matching kernel overrides imports torchtitan in the launcher, before any platform was
    prepared: a fork of it could not prepare the CPU ranks, so the agent is a new interpreter."""
    facts = SimpleNamespace(forked_ranks=True)
    monkeypatch.delitem(sys.modules, "torchtitan.tools.utils", raising=False)
    assert cpu_device.fork_ready() and agent_forks(facts)
    monkeypatch.setitem(sys.modules, "torchtitan.tools.utils", SimpleNamespace(device_module=object()))
    assert not cpu_device.fork_ready() and not agent_forks(facts)
    # Imported after the CPU platform was prepared (it bound the CPU device): the fork is ready.
    prepared = SimpleNamespace(device_module=object.__new__(cpu_device.CpuDeviceModule))
    monkeypatch.setitem(sys.modules, "torchtitan.tools.utils", prepared)
    assert agent_forks(facts)
    assert not agent_forks(SimpleNamespace(forked_ranks=False))
