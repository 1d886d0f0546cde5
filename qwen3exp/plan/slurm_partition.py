"""The nodes of a `launcher=slurm` job as its submit host knows them: what SLURM's `sinfo` says of
the partition's nodes (CPUs, memory, gres), overridden by what the job asks for
(`launcher.cpus_per_node`, `launcher.mem_gb`, `launcher.gpus_per_node`). The plan made on the submit
host checks the run against these (`qwen3exp.platforms.elsewhere`), never against the submit host's
own devices; inside the job the plan is made again on its first node, with a real device check.

`sinfo -h -o '%P|%c|%m|%G'` lists one line per group of alike nodes: the partition (the default one
ends with `*`), CPUs per node, memory per node in MB and the generic resources (`gpu:a100:8(S:0-1)`,
`neuron:16`, `(null)`); a `+` marks a group whose nodes differ (its smallest value is given). The
smallest node of the partition is planned for: the job may land on any of them.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping

from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.launcher import SlurmLauncher
from qwen3exp.platforms.elsewhere import JobNode
from qwen3exp.units import GIB, MIB

SINFO_FORMAT = "%P|%c|%m|%G"
SINFO_TIMEOUT_S = 30.0
_NUMBER = re.compile(r"^(\d+)")


def submitted_from_here(exp: Experiment, env: Mapping[str, str] | None = None) -> bool:
    """launcher=slurm outside its job: the ranks run on the partition's nodes, not here."""
    env = os.environ if env is None else env
    return isinstance(exp.launcher, SlurmLauncher) and "SLURM_JOB_ID" not in env


def job_node(la: SlurmLauncher) -> JobNode:
    """One node of the job: the partition's smallest (sinfo), with the job's own requests first."""
    node = query(la.partition)
    return JobNode(
        node.source,
        cpus=la.cpus_per_node or node.cpus,
        memory_bytes=la.mem_gb * GIB if la.mem_gb else node.memory_bytes,
        gpus=la.gpus_per_node or node.gpus,
        neuron_devices=node.neuron_devices,
    )


_answers: dict[tuple[str | None, str | None], JobNode] = {}


def query(partition: str | None) -> JobNode:
    """What sinfo says of the partition's nodes (the default partition when None), asked once per
    launcher process (every point of a sweep is planned with the same answer)."""
    key = (partition, os.environ.get("PATH"))
    if key not in _answers:
        _answers[key] = _ask(partition)
    return _answers[key]


def _ask(partition: str | None) -> JobNode:
    what = f"sinfo -p {partition}" if partition else "sinfo (the default partition)"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", SINFO_FORMAT, *(["-p", partition] if partition else [])],
            capture_output=True,
            text=True,
            timeout=SINFO_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return JobNode(f"{what} did not answer ({type(e).__name__})")
    rows = [line.split("|") for line in out.stdout.splitlines() if line.count("|") == 3]
    rows = [r for r in rows if (r[0].rstrip("*") == partition if partition else r[0].endswith("*"))]
    if out.returncode != 0 or not rows:
        why = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}" if out.returncode else "no nodes"])[-1]
        return JobNode(f"{what} said nothing of its nodes ({why})")
    cpus = _smallest(_number(r[1]) for r in rows)
    memory = _smallest(_number(r[2]) for r in rows)
    return JobNode(
        what,
        cpus=cpus,
        memory_bytes=memory * MIB if memory else None,
        gpus=_smallest(_gres(r[3], "gpu") for r in rows),
        neuron_devices=_smallest(_gres(r[3], "neuron") for r in rows),
    )


def _number(text: str) -> int | None:
    m = _NUMBER.match(text.strip())
    return int(m[1]) if m else None


def _gres(text: str, name: str) -> int | None:
    """The count of `name` in a gres list (`gpu:a100:8(S:0-1),gpu:4`): summed over its entries."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", text).split(","):
        parts = item.strip().split(":")
        if parts[0] == name and len(parts) > 1 and parts[-1].isdigit():
            total += int(parts[-1])
    return total or None


def _smallest(values) -> int | None:
    """The smallest of the values, counting an unknown one as 0 (None: nothing known or none at all)."""
    found = [v or 0 for v in values]
    return min(found) or None if found else None
