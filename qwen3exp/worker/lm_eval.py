"""The lm-evaluation-harness process: `python -m qwen3exp.worker.lm_eval REQUEST.json`, started by
`qwen3exp.launchers.lm_eval_run` once training ended (eval=lm_eval) and by `qwen3exp eval RUN`.

A process of its own: lm-eval, transformers and the model take half a minute and the model's memory
to load, which the launcher never pays; a crash or an out-of-memory kill of the evaluation is one
line of the run's summary. It runs lm-eval's public API as a person would: `simple_evaluate` on
`HFLM(pretrained=<export>)` (a LoRA export without merged weights: `peft=<adapter>`), with a
`TaskManager(include_path=[bundled, eval.include_path])` that indexes lm-eval's own tasks only when
one is asked for; lm-eval's defaults otherwise (seeds, no chat template), so the scores are those of
`lm_eval --model hf --model_args pretrained=<export> --include_path ... --tasks ...`.

Nothing that arrives with the export is executed (`trust_remote_code=False`); the launcher sets
HF_HUB_OFFLINE and HF_DATASETS_OFFLINE, so nothing is downloaded. The device: CUDA when there is
one, else the CPU (float32 there), as `qwen3exp chat`.

The request (JSON) names the export, the tasks and settings, where to write lm-eval's results
(without per-question logs), the TensorBoard folder for the scores (`eval/<task>.<metric>` at the
last step) and the W&B run to add them to. A failure writes `{"error": ...}` there and exits 1.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import lm_eval
import torch
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
from torch.utils.tensorboard import SummaryWriter

from qwen3exp.run import eval_scores, rundir

KEPT = ("results", "groups", "group_subtasks", "versions", "n-shot", "higher_is_better", "n-samples", "config")
"""What of simple_evaluate's answer is written (the per-question logs and the environment dump are not)."""


def evaluate(req: dict) -> dict:
    """lm-eval's results for the request (see the module docstring)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = HFLM(
        pretrained=req["pretrained"],
        peft=req["peft"],
        device=device,
        batch_size=req["batch_size"],
        dtype="float32" if device == "cpu" else "auto",
        trust_remote_code=False,
    )
    tasks = TaskManager(include_path=req["include_path"], include_defaults=req["include_defaults"])
    out = lm_eval.simple_evaluate(
        model=model,
        tasks=req["tasks"],
        num_fewshot=req["num_fewshot"],
        limit=req["limit"],
        task_manager=tasks,
        log_samples=False,
    )
    if out is None:
        raise RuntimeError("lm_eval.simple_evaluate returned nothing")
    kept = {k: out[k] for k in KEPT if k in out}
    return {**kept, "device": device, "lm_eval_version": getattr(lm_eval, "__version__", None)}


def track(req: dict, scores: dict[str, float]) -> None:
    """The scores as `eval/<task>.<metric>`: into the run's TensorBoard folder at its last step (a
    new event file beside the training's, so one TensorBoard run), and into the run's W&B run,
    reopened by its id (`resume="allow"`; offline: a second folder of that id, which `wandb sync`
    merges), as a logged row and in its summary."""
    tags = {f"{eval_scores.TRACKER_TAG}/{k}": v for k, v in scores.items()}
    if req.get("tensorboard"):
        writer = SummaryWriter(req["tensorboard"])
        for tag, value in tags.items():
            writer.add_scalar(tag, value, req["step"])
        writer.close()
    if req.get("wandb"):
        import wandb  # lazy: optional (the wandb extra), only with metrics.wandb=true

        run = wandb.init(**req["wandb"], resume="allow")
        run.log(tags)  # at the resumed run's next step: W&B drops a step it has passed
        run.summary.update(tags)
        run.finish()


def main(argv: list[str]) -> int:
    req = json.loads(Path(argv[0]).read_text())
    out = Path(req["results"])
    try:
        results = evaluate(req)
        track(req, eval_scores.flat(results["results"]))
    except Exception as e:  # the launcher records it as the evaluation's error (and shows the log)
        traceback.print_exc()
        rundir.atomic_write_json(out, {"error": f"{type(e).__name__}: {e}"})
        return 1
    rundir.atomic_write_json(out, json.loads(json.dumps(results, default=str)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
