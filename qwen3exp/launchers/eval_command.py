"""`qwen3exp eval RUN [--tasks T1,T2] [--limit N] [--num-fewshot N] [--batch-size N] [--include-path DIR]`:
lm-evaluation-harness on the Hugging Face export of a run that already ended, exactly as eval=lm_eval
runs it after training (`qwen3exp.launchers.lm_eval_run`).

The settings are the run's own `eval` section when it ran with eval=lm_eval, else eval=lm_eval's
defaults (the bundled qwen3exp_tiny); each flag replaces one key (`--tasks`: comma-separated;
`--include-path`: relative to where this runs). They are checked as a launch checks them
(`qwen3exp.plan.eval_tasks`: every task defined, its data local) and a mistake exits 2 with nothing
started, as does a run without an export (`checkpoint.export=end` makes one).

The scores are printed and recorded in the run: summary.json's `eval` (merged with earlier scores;
the objective's value when it is one of them), lm-eval's results in `lm_eval/<stamp>.json`, and
TensorBoard / W&B as after training. Exit 1 when lm-eval fails (its output: logs/lm_eval.log).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from qwen3exp.analysis import chat
from qwen3exp.config.sections.eval import LmEval
from qwen3exp.errors import EXIT_CONFIG_ERROR, ConfigError, Problem
from qwen3exp.launchers import lm_eval_run
from qwen3exp.launchers.outcome import EXIT_SIGNAL
from qwen3exp.plan import eval_tasks
from qwen3exp.run import records, rundir

PROG = "qwen3exp eval"
FLAGS = {
    "tasks": "--tasks",
    "limit": "--limit",
    "num_fewshot": "--num-fewshot",
    "batch_size": "--batch-size",
    "include_path": "--include-path",
}
"""The keys of the eval section the flags set."""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--tasks", help="comma-separated lm-eval task names (default: the run's eval.tasks)")
    ap.add_argument("--limit", type=int, help="questions per task at most (default: the run's eval.limit)")
    ap.add_argument("--num-fewshot", type=int, help="few-shot examples per question (default: the task's own)")
    ap.add_argument("--batch-size", type=int, help="questions per forward pass (default: the run's, else 1)")
    ap.add_argument("--include-path", help="a folder of your own task YAML files (relative to here)")
    return ap


def settings(experiment: dict, args: argparse.Namespace) -> LmEval:
    """The run's eval=lm_eval section (else the defaults) with the flags given; ConfigError naming the flag."""
    found = experiment.get("eval")
    recorded: dict = found if isinstance(found, dict) else {}
    data = {k: v for k, v in recorded.items() if k in LmEval.model_fields} if recorded.get("kind") == "lm_eval" else {}
    given = {k: getattr(args, k) for k in FLAGS if getattr(args, k) is not None}
    if "tasks" in given:
        given["tasks"] = [t.strip() for t in given["tasks"].split(",") if t.strip()]
    try:
        return LmEval.model_validate({**data, **given, "kind": "lm_eval"})
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            field = str(err["loc"][0]) if err["loc"] else ""
            key = FLAGS.get(field, f"eval.{field}")
            problems.append(Problem(key, given.get(field, data.get(field)), str(err["msg"])))
        raise ConfigError(problems) from None


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse printed the usage and the mistake
        return e.code if isinstance(e.code, int) else EXIT_CONFIG_ERROR
    run: Path = args.run
    try:
        experiment = _experiment(run)
        wanted = settings(experiment, args)
        problems = eval_tasks.package_problems() + eval_tasks.task_problems(wanted)
        if problems:
            raise ConfigError(problems)
        weights = chat.find_weights(run)
        if weights.experiment is not None or not chat.export_steps(run):
            raise chat.Refused(f"{run}: this run has no Hugging Face export; rerun it with checkpoint.export=end")
    except ConfigError as err:
        print(err.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except chat.Refused as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    step = chat.export_steps(run)[-1]
    print(f"{PROG}: lm-eval {eval_tasks.describe(wanted)} on {weights.folder}", flush=True)
    done = lm_eval_run.run(lm_eval_run.request(wanted, weights, run, experiment, step), run, dict(os.environ))
    if done.error is not None:
        print(f"{PROG}: {done.error}", file=sys.stderr)
        return EXIT_SIGNAL[signal.Signals(done.signum)] if done.signum is not None else 1
    width = max((len(k) for k in done.scores), default=0)
    print("\n".join(f"  {k.ljust(width)}  {v:.6g}" for k, v in done.scores.items()) or "  no scores")
    lm_eval_run.record(run, done)
    print(f"{PROG}: {done.seconds:.1f}s; recorded in {run / rundir.SUMMARY} (eval) and {done.results}")
    return 0


def _experiment(run: Path) -> dict:
    if not run.is_dir():
        raise chat.Refused(f"{run}: not a directory (expected a qwen3exp run directory)")
    try:
        experiment = rundir.load_experiment(run)
    except records.Unreadable as e:
        raise chat.Refused(str(e)) from None
    if experiment is None:
        raise chat.Refused(f"{run}: not a qwen3exp run directory (no {rundir.EXPERIMENT})")
    return experiment
