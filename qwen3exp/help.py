"""`qwen3exp --help` (and `python -m qwen3exp --help`): the commands, the config groups with their
options, and every key of the composed experiment with its type, its value (the default of this
composition: `qwen3exp model=hf --help` shows the hf keys) and its docstring from the schema.
Hydra's own help stays `--hydra-help`. Nothing starts, nothing is written."""

from __future__ import annotations

from omegaconf import OmegaConf

from qwen3exp.config.argv import GROUPS, Invocation
from qwen3exp.config.compose import experiment_data
from qwen3exp.config.composer import Composer
from qwen3exp.config.schema import Experiment
from qwen3exp.config.translate import describe, field_of, type_name
from qwen3exp.run import rundir

COMMANDS = """\
usage: qwen3exp [group=option ...] [key=value ...]     (python -m qwen3exp is the same command)

  qwen3exp [overrides]                    compose, validate, plan, train (torchrun)
  qwen3exp dry_run=true [overrides]       the plan; nothing starts, nothing is written
  qwen3exp -v [overrides]                 verbose=true: every line the ranks print (known warnings too)
  qwen3exp -m key=a,b [overrides]         a sweep (Hydra multirun); hydra/sweeper=optuna for a search
  qwen3exp -cd DIR ...                    add your own config folder (experiments, group options)
  qwen3exp init [DIR]                     a repository of experiments of your own
  qwen3exp ls [-cd DIR]                   the experiments: packaged and yours, each with its description
  qwen3exp cp NAME [NEW] [-cd DIR]        copy a packaged experiment into conf/experiment/NEW.yaml to edit
  qwen3exp report PATH [PATH ...]         the table (and report.md/csv, plots) of runs, sweeps; compares runs
  qwen3exp diff RUN_A RUN_B               the keys that differ between two runs
  qwen3exp data show [overrides] [-n N]   the first training samples, the tokens the loss trains marked
  qwen3exp chat RUN [--prompt TEXT] [--compare RUN_B]   talk to a run's model (its export, else its DCP checkpoint)
  qwen3exp eval RUN [--tasks T,..] [--limit N]   lm-evaluation-harness on a run's export (as eval=lm_eval)
  qwen3exp relaunch RUN [overrides]       run a recorded run again and compare the losses
  qwen3exp --version                      qwen3exp's, torchtitan's, torch's and hydra-core's versions
  qwen3exp --hydra-help | --cfg job | --info            Hydra's own answers
  eval "$(qwen3exp -sc install=bash)"     tab completion: commands, groups, options (yours with -cd DIR), keys;
                                          fish: qwen3exp -sc install=fish | source
"""

DOCS = (
    "Docs: README.md and docs/ of the qwen3exp repository "
    "(every key: docs/configuration.md; every command: docs/terminal.md)."
)


def render(inv: Invocation) -> str:
    lines = [COMMANDS]
    with Composer(inv.config_dir, inv.config_name) as c:
        overrides = [o for o in inv.overrides if "=" in o]
        lines.append("config groups (group=option; * the option of this composition):")
        cfg = c.compose(overrides)
        data, _ = experiment_data(cfg)
        for group in GROUPS:
            chosen = OmegaConf.select(cfg, f"hydra.runtime.choices.{group}", default=None)
            options = [f"{o}*" if o == chosen else o for o in c.options(group, tuple(overrides))]
            lines.append(f"  {group:<12} {', '.join(options)}")
    lines.append("")
    lines.append("keys (key=value: type, value in this composition; what it is):")
    for key, value in rundir.flatten(data).items():
        fld = field_of(Experiment, key, data)
        kind = type_name(fld.annotation) + _bounds(fld) if fld is not None else "?"
        # The chosen option's own docstring (data=chat: ChatData's data.path), else any variant's.
        doc = (" ".join(fld.description.split()) if fld is not None and fld.description else None) or (
            describe(Experiment, key) or ""
        )
        shown = "null" if value is None else str(value)
        lines.append(f"  {key} ({kind}) = {shown if len(shown) <= 60 else shown[:57] + '...'}")
        if doc:
            lines.append(f"      {doc}")
    lines.append("")
    lines.append(DOCS)
    return "\n".join(lines)


def _bounds(fld) -> str:
    ops = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
    found = [f"{op} {getattr(m, attr)}" for m in fld.metadata for attr, op in ops if getattr(m, attr, None) is not None]
    return f" {' '.join(found)}" if found else ""
