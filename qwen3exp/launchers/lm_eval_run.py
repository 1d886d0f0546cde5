"""eval=lm_eval: lm-evaluation-harness on a run's Hugging Face export, in a process of its own
(`qwen3exp.worker.lm_eval`), once training completed (`after_training`, called by the local
launcher where the run ends, before summary.json is written) and for `qwen3exp eval RUN`
(`qwen3exp.launchers.eval_command`).

- What is evaluated: the newest export, as `qwen3exp chat` finds it (`qwen3exp.analysis.chat.
  find_weights`): a LoRA run's merged weights (checkpoint.merge_lora), else the base (the export's
  copy, or the base model the adapter names) with the adapter applied by lm-eval (HFLM's `peft=`).
- Tasks: `eval.tasks` from the bundled folder and eval.include_path (`qwen3exp.plan.eval_tasks`,
  which checked them before anything started); lm-eval's own tasks are indexed only when one is
  asked for.
- Recorded: lm-eval's results in `lm_eval/<stamp>.json`, its output in `logs/lm_eval.log`, the
  scores (`qwen3exp.run.eval_scores`: `{"<task>.<metric>": value}`) in summary.json's `eval` and,
  for an `eval.` objective, its value; TensorBoard and W&B get `eval/<task>.<metric>` at the last
  step (the child writes them into the run's own TensorBoard folder and W&B run).
- An evaluation that fails fails the run (as an export that does not verify does): the message is
  the child's error and `logs/lm_eval.log` has its traceback. Ctrl-C or SIGTERM stops the child;
  the run is then `interrupted` (its training and export are complete and kept).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from qwen3exp.analysis import chat
from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.eval import LmEval
from qwen3exp.config.sections.sweep import EVAL_PREFIX
from qwen3exp.launchers.outcome import EXIT_SIGNAL
from qwen3exp.launchers.torchrun import Interrupted, StopSignals, rank_env
from qwen3exp.plan import eval_tasks
from qwen3exp.plan.build import Plan
from qwen3exp.run import console, eval_scores, objective, procs, rundir

WORKER = "qwen3exp.worker.lm_eval"
FOLDER = "lm_eval"
"""In the run directory: lm-eval's results of each evaluation (`<stamp>.json`) and its request."""
LOG = "lm_eval.log"
"""Under logs/: what the lm-eval process printed (appended, one evaluation after the other)."""
TB = "tb"
"""The run's TensorBoard folder (torchtitan's save_tb_folder): the scores go into its newest run."""
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


@dataclass
class Evaluation:
    scores: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    signum: int | None = None
    """The signal that stopped it (Ctrl-C, SIGTERM), else None."""
    seconds: float = 0.0
    results: Path | None = None
    """lm-eval's results (`lm_eval/<stamp>.json`)."""


def wanted(exp: Experiment) -> bool:
    return isinstance(exp.eval, LmEval)


def request(e: LmEval, weights: chat.Weights, run_dir: Path, exp: dict, step: int) -> dict:
    """What the lm-eval process does (`qwen3exp.worker.lm_eval`): `exp`, the run's recorded experiment."""
    metrics = exp.get("metrics") or {}
    return {
        "pretrained": str(weights.folder),
        "peft": str(weights.adapter) if weights.adapter is not None else None,
        "tasks": list(e.tasks),
        "num_fewshot": e.num_fewshot,
        "limit": e.limit,
        "batch_size": e.batch_size,
        "include_path": [str(f) for f in eval_tasks.task_folders(e)],
        "include_defaults": eval_tasks.uses_builtin(e),
        "results": str(run_dir / FOLDER / f"{rundir.stamp()}.json"),
        "tensorboard": _tensorboard(run_dir) if metrics.get("tensorboard", True) else None,
        "step": step,
        "wandb": _wandb_run(run_dir, metrics) if metrics.get("wandb") else None,
    }


def _tensorboard(run_dir: Path) -> str | None:
    """The newest TensorBoard folder the run's metrics rank wrote (`tb/<YYYYmmdd-HHMM>`), if any."""
    runs = sorted(p for p in (run_dir / TB).glob("*") if p.is_dir()) if (run_dir / TB).is_dir() else []
    return str(runs[-1]) if runs else None


def _wandb_run(run_dir: Path, metrics: dict) -> dict | None:
    """wandb.init's arguments that reopen the run's W&B run (its id: the newest `wandb/*run-<ts>-<id>`)."""
    found = sorted((run_dir / "wandb").glob("*run-*-*"), key=lambda p: p.name.split("run-", 1)[-1])
    if not found:
        return None
    project = os.environ.get("WANDB_PROJECT", metrics.get("wandb_project"))
    return {"id": found[-1].name.rsplit("-", 1)[-1], "project": project, "dir": str(run_dir)}


def run(req: dict, run_dir: Path, env: dict[str, str]) -> Evaluation:
    """Start the lm-eval process for `req` with `env` (offline), wait for it, read its results."""
    results = Path(req["results"])
    results.parent.mkdir(parents=True, exist_ok=True)
    ask = results.with_suffix(".request.json")
    rundir.atomic_write_json(ask, req)
    logs = run_dir / rundir.LOGS
    logs.mkdir(parents=True, exist_ok=True)
    begun, me = time.monotonic(), os.getpid()
    code: int | None = None
    with open(logs / LOG, "ab") as log, StopSignals() as stop:
        try:
            if stop.signum is not None:  # a signal that came after the training (qwen3exp.run.stopping)
                raise Interrupted(stop.signum)
            stop.proc = subprocess.Popen(
                [sys.executable, "-m", WORKER, str(ask)],
                env={**env, **OFFLINE},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: procs.die_with_parent(signal.SIGTERM, me),
            )
            code = stop.proc.wait()
        except Interrupted:
            pass
        finally:
            if stop.proc is not None and stop.proc.poll() is None:
                stop.stop_torchrun()  # SIGTERM to the lm-eval process's group, as to torchrun's
                stop.proc.wait()
    seconds = round(time.monotonic() - begun, 3)
    if stop.signum is not None:
        how = signal.Signals(stop.signum).name
        return Evaluation(error=f"lm-eval stopped by {how}", signum=stop.signum, seconds=seconds)
    found = rundir.read_json(results)
    if code == 0 and isinstance(found, dict) and isinstance(found.get("results"), dict):
        return Evaluation(eval_scores.flat(found["results"]), seconds=seconds, results=results)
    why = found.get("error") if isinstance(found, dict) and found.get("error") else f"exit code {code}"
    return Evaluation(error=f"lm-eval failed: {why} (its output: {logs / LOG})", seconds=seconds)


def after_training(plan: Plan, run_dir: Path) -> Evaluation:
    """eval=lm_eval on the export a completed run just wrote (the plan checked everything it needs)."""
    exp = plan.exp
    assert isinstance(exp.eval, LmEval), "after_training runs for eval=lm_eval"
    log = console.logger("qwen3exp.launch")
    try:
        weights = chat.find_weights(run_dir)
    except chat.Refused as e:
        return Evaluation(error=f"lm-eval: {e}")
    log.info(f"qwen3exp: lm-eval {eval_tasks.describe(exp.eval)} on {_shown(weights, run_dir)}", extra=console.LIVE)
    req = request(exp.eval, weights, run_dir, exp.model_dump(mode="json"), exp.training.steps)
    # The ranks' environment: the platform's settings (a CPU rank's intra-op threads, ...) hold here too.
    done = run(req, run_dir, rank_env(plan.platform, run_dir))
    if done.error is None:
        log.info(f"qwen3exp: lm-eval {scores_line(done.scores)} ({done.seconds:.1f}s)")
    return done


def _shown(weights: chat.Weights, run_dir: Path) -> str:
    folder = weights.folder.relative_to(run_dir) if weights.folder.is_relative_to(run_dir) else weights.folder
    return str(folder) + (f" + adapter {weights.adapter.name}" if weights.adapter is not None else "")


def scores_line(scores: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in scores.items()) or "no scores"


def summary_fields(exp: Experiment, done: Evaluation) -> dict:
    """summary.json's `eval` (the scores) and, for an `eval.` objective, the objective with its value
    (summarize computed it without the scores; these fields are written over it)."""
    metric, direction = exp.sweep_target
    fields: dict = {"eval": done.scores}
    if metric.startswith(EVAL_PREFIX):
        value = objective.value_of(metric, last_loss=None, val_loss=None, tokens_per_second=None, scores=done.scores)
        fields["objective"] = objective.record(metric, direction, value)
    return fields


def outcome(done: Evaluation, ended: tuple[str, int, str | None]) -> tuple[str, int, str | None]:
    """The run's (status, exit code, error) once its evaluation ended: failed when it failed,
    interrupted when a signal stopped it."""
    if done.signum is not None:
        return "interrupted", EXIT_SIGNAL[signal.Signals(done.signum)], f"{done.error} (training and export completed)"
    if done.error is not None:
        return "failed", 1, done.error
    return ended


def record(run_dir: Path, done: Evaluation) -> None:
    """`qwen3exp eval`: the new scores into the run's summary.json (`eval`, merged), and the value of
    an `eval.` objective they give; a run without a summary keeps none (nothing is made up)."""
    path = run_dir / rundir.SUMMARY
    summary = rundir.read_json(path)
    if not isinstance(summary, dict):
        return
    summary["eval"] = {**(summary.get("eval") or {}), **done.scores}
    obj = summary.get("objective")
    if isinstance(obj, dict) and str(obj.get("metric", "")).startswith(EVAL_PREFIX):
        value = eval_scores.of(str(obj["metric"]), summary["eval"])
        summary["objective"] = {**obj, "value": value if value is not None else obj.get("value")}
    rundir.atomic_write_json(path, summary)
