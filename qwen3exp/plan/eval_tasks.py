"""The checks of `eval=lm_eval` before anything starts (exit 2, no worker started), and the task
folders the evaluation after training is given (`task_folders`, `uses_builtin`).

- lm-eval is installed (the `lm-eval` extra); a LoRA export without merged weights also needs peft
  (lm-eval applies the adapter: HFLM's `peft=`).
- The run writes a Hugging Face export (`checkpoint.export`): that is what lm-eval evaluates.
- Every name of `eval.tasks` is a task, group or tag (`qwen3exp.plan.lm_eval_tasks`: the bundled
  folder, `eval.include_path`, lm-eval's own tasks), and every task it stands for reads local data
  only: its own code (`custom_dataset`, a task class), files (`dataset_path: json|csv|parquet|arrow|
  text` with `dataset_kwargs.data_files`, relative to the working directory as `datasets` reads
  them), a local folder, or a Hugging Face dataset in the local cache (found as data=hf finds one,
  `qwen3exp.data.text.hf_source`; the problem's hint is the command that fetches it). The
  evaluation runs with HF_HUB_OFFLINE and HF_DATASETS_OFFLINE set, so nothing is downloaded then.
- An `eval.` objective (`sweep.objective`) names a task of eval.tasks and, for a task (not a group),
  a metric it reports: its `metric_list`, else lm-eval's defaults for its `output_type`.
"""

from __future__ import annotations

import glob
import importlib.util
from collections.abc import Iterator
from pathlib import Path

from qwen3exp.assets import LM_EVAL_DIR
from qwen3exp.config.sections.eval import LmEval
from qwen3exp.config.sections.sweep import EVAL_PREFIX
from qwen3exp.data.text import hf_source as hf_data_source
from qwen3exp.errors import Problem, did_you_mean, nearby_path, one_of
from qwen3exp.plan import lm_eval_tasks, model_ref

LM_EVAL_INSTALL = "pip install 'qwen3exp[lm-eval]'"
FILE_BUILDERS = ("json", "csv", "parquet", "arrow", "text")
"""`dataset_path` values that are `datasets` builders of local files (`dataset_kwargs.data_files`)."""
DEFAULT_METRICS = {
    "multiple_choice": ("acc", "acc_norm"),
    "loglikelihood": ("perplexity", "acc"),
    "loglikelihood_rolling": ("word_perplexity", "byte_perplexity", "bits_per_byte"),
    "generate_until": ("exact_match",),
}
"""The metrics lm-eval reports for a task without `metric_list`, by its output_type."""
TASKS_KEY = "eval.tasks"


def task_folders(e: LmEval) -> list[Path]:
    """The task folders lm-eval's TaskManager is given (`include_path`), the later winning: the
    bundled folder, then eval.include_path (absolute: resolved against the working directory)."""
    return [LM_EVAL_DIR, *([Path(e.include_path).expanduser().resolve()] if e.include_path else [])]


def uses_builtin(e: LmEval) -> bool:
    """Whether a task comes from lm-eval's own folder (then its TaskManager indexes it: a minute here)."""
    folders = task_folders(e)
    return any(lm_eval_tasks.find(t, folders)[1] for t in e.tasks)


def problems(exp) -> list[Problem]:
    """Everything that rules out the experiment's evaluation (see the module docstring)."""
    found = objective_problems(exp)
    if not isinstance(exp.eval, LmEval):
        return found
    found += setup_problems(exp)
    return found + task_problems(exp.eval)


def package_problems() -> list[Problem]:
    """lm-eval is not installed."""
    if importlib.util.find_spec("lm_eval") is not None:
        return []
    why = "runs lm-evaluation-harness (the lm-eval package), which is not installed"
    return [Problem("eval", "lm_eval", why, "eval=none, or install lm-eval", LM_EVAL_INSTALL)]


def setup_problems(exp) -> list[Problem]:
    found = package_problems()
    c = exp.checkpoint
    if not c.exports:
        found.append(
            Problem(
                "checkpoint.export",
                c.export,
                "eval=lm_eval evaluates the run's Hugging Face export, and this run writes none",
                "end or interval (the preset checkpoint=hf_export sets end)",
                "add checkpoint.export=end",
            )
        )
    elif exp.peft.kind == "lora" and not c.merge_lora and importlib.util.find_spec("peft") is None:
        found.append(
            Problem(
                "checkpoint.merge_lora",
                False,
                "lm-eval applies the export's LoRA adapter with peft, which is not installed",
                "true (lm-eval reads the merged weights), or install peft",
                "pip install 'qwen3exp[peft]'",
            )
        )
    return found


def task_problems(e: LmEval) -> list[Problem]:
    """The names of eval.tasks that are not defined, or stand for a task whose data is not local."""
    if e.include_path is not None and not Path(e.include_path).expanduser().is_dir():
        path = Path(e.include_path).expanduser()
        allowed = "a folder of lm-eval task YAML files (relative to the working directory)"
        return [Problem("eval.include_path", e.include_path, "is not a folder", allowed, nearby_path(path.resolve()))]
    folders, found = task_folders(e), []
    for name in dict.fromkeys(e.tasks):
        entry, _ = lm_eval_tasks.find(name, folders)
        if entry is None:
            local = lm_eval_tasks.local_names(folders)
            builtin = list(lm_eval_tasks.builtin_index().entries)
            where = " and ".join([", ".join(str(f) for f in folders), *(["lm-eval's own tasks"] if builtin else [])])
            found.append(
                Problem(
                    TASKS_KEY,
                    name,
                    f"no lm-eval task, group or tag has this name (searched {where})",
                    f"{one_of(local)}, a task of eval.include_path or one of lm-eval's own",
                    did_you_mean(name, local + builtin),
                )
            )
            continue
        found += [p for task, cfg, path in _tasks_of(entry, folders) if (p := data_problem(name, task, cfg, path))]
    return found


def _tasks_of(entry: lm_eval_tasks.Entry, folders: list[Path], depth: int = 0) -> Iterator[tuple[str, dict, Path]]:
    """(task name, its keys, its file) of every task `entry` stands for (a group's and a tag's members)."""
    if entry.kind == "task":
        yield entry.name, lm_eval_tasks.read_task(entry.paths[0]), entry.paths[0]
        return
    if depth >= lm_eval_tasks.MAX_DEPTH:
        return
    for member in lm_eval_tasks.members(entry):
        if isinstance(member, dict):  # a task written inside the group's file
            base = entry.paths[0]
            inc = member.get("include")
            cfg = {**(lm_eval_tasks.read_task(base.parent / str(inc)) if inc else {}), **member}
            yield str(cfg.get("task")), cfg, base
        elif (found := lm_eval_tasks.find(member, folders)[0]) is not None:
            yield from _tasks_of(found, folders, depth + 1)


def data_problem(name: str, task: str, cfg: dict, path: Path) -> Problem | None:
    """Why task `task` (of the name `name` of eval.tasks, defined in `path`) would not read local data, or None."""
    if cfg.get("custom_dataset") or cfg.get("class"):
        return None  # the task's own code reads its data
    dataset = cfg.get("dataset_path")
    given = cfg.get("dataset_kwargs")
    kwargs: dict = given if isinstance(given, dict) else {}
    if not isinstance(dataset, str):
        return None
    which = f"task {task} ({path})" + (f", of {name}," if task != name else "")
    if dataset in FILE_BUILDERS:
        files = kwargs.get("data_files")
        listed = [files] if isinstance(files, str) else list(files.values()) if isinstance(files, dict) else files or []
        flat = [str(f) for f in listed for f in (f if isinstance(f, list) else [f])]
        remote = [f for f in flat if "://" in f]
        missing = [f for f in flat if "://" not in f and not glob.glob(str(Path(f).expanduser()))]
        if remote or missing:
            why = "reads from the network" if remote else "does not exist (relative to the working directory)"
            return Problem(TASKS_KEY, name, f"{which} reads {(remote or missing)[0]}, which {why}", "local data files")
        return None
    if Path(dataset).expanduser().is_dir():
        return None
    revision = kwargs.get("revision")
    if hf_data_source.cached_snapshot(dataset, revision) is not None:
        return None
    subset = f" (subset {cfg['dataset_name']})" if cfg.get("dataset_name") else ""
    return Problem(
        TASKS_KEY,
        name,
        f"{which} reads the Hugging Face dataset {dataset}{subset}, which the local Hugging Face cache "
        f"({model_ref.hub_cache_dir()}) does not hold (nothing is downloaded)",
        "tasks whose dataset is local: in the Hugging Face cache, or files",
        f"fetch it first: {hf_data_source.fetch_command(dataset, revision)}",
    )


def objective_problems(exp) -> list[Problem]:
    """An `eval.<task>.<metric>` objective: the task is one of eval.tasks and reports the metric."""
    metric = exp.sweep.objective
    if not metric or not metric.startswith(EVAL_PREFIX):
        return []
    tasks = exp.eval.tasks if isinstance(exp.eval, LmEval) else []
    if not tasks:
        why = "is a score of eval=lm_eval, and this run evaluates nothing (eval=none)"
        return [Problem("sweep.objective", metric, why, "val_loss, last_loss or tokens_per_second, or eval=lm_eval")]
    task = max((t for t in tasks if metric.startswith(f"{EVAL_PREFIX}{t}.")), key=len, default=None)
    if task is None:
        allowed = f"eval.<task>.<metric> with a task of eval.tasks ({one_of(tasks)}), e.g. eval.{tasks[0]}.acc"
        return [Problem("sweep.objective", metric, "names no task of eval.tasks", allowed)]
    name = metric[len(EVAL_PREFIX) + len(task) + 1 :].partition(",")[0]
    entry, _ = lm_eval_tasks.find(task, task_folders(exp.eval))
    reported = metrics_of(lm_eval_tasks.read_task(entry.paths[0])) if entry and entry.kind == "task" else []
    if not reported or name in reported:
        return []
    why = f"task {task} reports {one_of(reported)}"
    return [Problem("sweep.objective", metric, why, one_of(f"eval.{task}.{r}" for r in reported))]


def metrics_of(cfg: dict) -> list[str]:
    """The metric names a task reports: its metric_list, else lm-eval's defaults; [] when unknown."""
    listed = cfg.get("metric_list")
    if isinstance(listed, list):
        names = [m.get("metric") if isinstance(m, dict) else None for m in listed]
        plain = all(isinstance(n, str) and not n.startswith("!function") for n in names)
        return [str(n) for n in names] if plain else []  # a metric function's name is known when it runs
    return list(DEFAULT_METRICS.get(str(cfg.get("output_type")), ()))


def describe(e: LmEval) -> str:
    """`qwen3exp_tiny (limit 8, 0-shot)`: the tasks and the settings given."""
    settings = [f"limit {e.limit}"] * (e.limit is not None) + [f"{e.num_fewshot}-shot"] * (e.num_fewshot is not None)
    return ", ".join(e.tasks) + (f" ({', '.join(settings)})" if settings else "")


def plan_line(exp) -> str | None:
    """The plan's line on the evaluation after training; None with eval=none."""
    if not isinstance(exp.eval, LmEval):
        return None
    return (
        f"lm-eval {describe(exp.eval)} on the Hugging Face export once training ends, batch size "
        f"{exp.eval.batch_size}; scores in summary.json (eval.<task>.<metric>)"
    )
