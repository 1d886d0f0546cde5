"""What a run ends with after its outcome line: whether it kept its weights, and the next command.

- A completed run that saved nothing (checkpoint.save=false, no export) says so in one line, with
  the key that keeps the weights: a newcomer's default run keeps none, and would find out only when
  `chat` or a resume has nothing to read.
- Then one line names the next useful commands: `qwen3exp report RUN`, `qwen3exp chat RUN` when the
  run left weights chat can load (`qwen3exp.analysis.chat.find_weights`: an export, or a signed DCP
  checkpoint of a model=native run), and `qwen3exp relaunch RUN` to run it again. A failed run
  names where the ranks' output is and the command that resumes it from its checkpoint (the
  recorded command in this run directory), else the relaunch.
- A job of a sweep ends with neither: the end of the sweep names the report of all its jobs.
Everything is read from the run directory (its experiment.yaml, provenance.json, checkpoint and
export folders), so a SLURM job ends the same way as a local run.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from qwen3exp.analysis import chat
from qwen3exp.config.argv import quote_value
from qwen3exp.run import rundir

SEPARATOR = "  |  "


def lines(summary: dict, run_dir: Path) -> list[str]:
    """The lines after the outcome (none for a sweep's job, a requeued or time-limited run)."""
    run_dir = Path(run_dir)
    prov = _mapping(rundir.read_json(run_dir / rundir.PROVENANCE))
    if _mapping(prov.get("hydra")).get("mode") == "MULTIRUN":
        return []
    checkpoint = _mapping(_mapping(rundir.read_experiment(run_dir)).get("checkpoint"))
    where = shlex.quote(str(run_dir))
    match summary.get("status"):
        case "completed":
            out = [] if _keeps_weights(checkpoint) else [nothing_saved(checkpoint)]
            commands = [f"qwen3exp report {where}"]
            if chat_ready(run_dir):
                commands.append(f"qwen3exp chat {where}")
            commands.append(f"qwen3exp relaunch {where} (runs it again)")
            return [*out, "qwen3exp: next: " + SEPARATOR.join(commands)]
        case "failed":
            logs = shlex.quote(str(run_dir / rundir.LOGS))
            step = rundir.latest_checkpoint_step(run_dir) if checkpoint.get("save") else None
            again = (
                f"to resume from checkpoint step-{step}: {resume_command(prov.get('command'), run_dir)}"
                if step is not None
                else f"to run it again: qwen3exp relaunch {where}"
            )
            return [f"qwen3exp: next: the ranks' output is in {logs}; {again}"]
    return []


def _mapping(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _keeps_weights(checkpoint: dict) -> bool:
    return bool(checkpoint.get("save")) or checkpoint.get("export", "none") != "none"


def nothing_saved(checkpoint: dict) -> str:
    """The line of a run that kept no weights, with the key to add (the preset when it loaded none)."""
    if checkpoint.get("load", "none") == "none":
        return "qwen3exp: no checkpoint was saved (checkpoint=none); add checkpoint=dcp to keep the weights"
    return (
        "qwen3exp: no checkpoint was saved (checkpoint.save=false, checkpoint.export=none); add "
        "checkpoint.save=true to keep the weights"
    )


def chat_ready(run_dir: Path) -> bool:
    """Whether `qwen3exp chat RUN` finds weights it can load (it checks the rest when it runs)."""
    try:
        chat.find_weights(run_dir)
    except (chat.Refused, OSError, ValueError):
        return False
    return True


def resume_command(command: object, run_dir: Path) -> str:
    """The recorded command line (provenance.json: already redacted) run again in `run_dir`."""
    if not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)):
        return f"the same command with hydra.run.dir={quote_value(str(run_dir))}"
    args = [a for a in command if not a.lstrip("+").startswith("hydra.run.dir=")]
    return shlex.join([*args, f"hydra.run.dir={quote_value(str(run_dir))}"])
