"""What `qwen3exp relaunch RUN` takes from a recorded run directory, checked as data before
anything is composed: the run's `.hydra/config.yaml` and the `.hydra/` folder that holds it.

A recorded run directory is data (a copied run, a teammate's folder), and qwen3exp never runs code
from it. Hydra instantiates `_target_`s (callbacks, launcher, sweeper), `logging.config` builds
handlers and `()` factories from the `hydra:` section of the config it composes, and OmegaConf
resolves every `${...}` in it when the run is composed again (`oc.env` copies an environment
variable, a secret among them, into the new run; `oc.decode` turns a string into a mapping that no
check of the file's shape has seen: a logging handler class imported from the run directory, a log
file outside it opened for writing). So the file is read with `qwen3exp.run.records` (a regular
file within size and depth limits, plain YAML, nothing resolved), and refused (exit 2, the key
named) when it asks for any code or holds any interpolation: see `recorded_code_problems`.

Interpolations are refused rather than kept as literal strings: Hydra writes config.yaml from the
composed experiment as written in the experiment files, so a `${...}` there is either a user's
own (its resolved value is in experiment.yaml: pass `KEY=VALUE` to relaunch and the recorded
interpolation is replaced, never resolved) or a planted one; a literal `${oc.env:X}` is no value
any key of the experiment accepts, and quietly escaping it would relaunch something else than the
recorded run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from qwen3exp.analysis.recorded_hydra import LOG_FILENAMES, hydra_section_problems
from qwen3exp.analysis.recorded_keys import DATA_NOT_CODE, dotted_key, refused, walk
from qwen3exp.errors import Problem
from qwen3exp.run import records

INTERPOLATION = "${"
"""What starts an OmegaConf interpolation or resolver call (escaped or not: `\\${` is refused too)."""


def recorded_code_problems(config_yaml: Path, run: Path, overrides: tuple[str, ...] = ()) -> list[Problem]:
    """Everything in a recorded `.hydra/config.yaml` that would make relaunching it run code, one
    Problem per key (empty: the file is plain data). Read with `records.load_yaml`, nothing resolved.

    Refused: a `defaults` list (a recorded config is Hydra's composed output and has none; a list
    would select config groups); `_target_` or `()` anywhere outside `hydra:` (qwen3exp's schema has
    none); in `hydra:` every `_target_` that is not an ALLOWED_TARGETS plugin at its place, every
    `()` factory, any `hydra.callbacks`, `hydra.launcher.setup` (shell lines), `hydra.job.env_set`
    (LD_PRELOAD, PYTHONPATH load code), `hydra.searchpath`, multirun mode, an `output_subdir`
    other than .hydra, and logging that is not Hydra's default shape (`qwen3exp.analysis.recorded_hydra`);
    `kernels.overrides` whose module lies inside the run directory (an override import is code by
    design, but must be code you installed, not a file that came with the run); any interpolation
    `${...}` whose key the relaunch's `overrides` do not set (see the module's docstring)."""
    try:
        data = records.load_yaml(config_yaml)
    except records.Unreadable as e:
        return [
            Problem(
                "(recorded config)",
                str(config_yaml),
                f"not readable as plain data: {e.why}",
                "Hydra's own config.yaml of a run (plain YAML, no tags, a few kB)",
            )
        ]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return [
            Problem(
                "(recorded config)", type(data).__name__, "the file is no mapping", "Hydra's own config.yaml of a run"
            )
        ]
    problems: list[Problem] = []
    if "defaults" in data:
        problems.append(
            refused("defaults", data["defaults"], "a defaults list selects config groups (code among them)")
        )
    for path, key, value in walk({k: v for k, v in data.items() if k not in ("hydra", "defaults")}):
        if key in ("_target_", "()"):
            problems.append(
                refused(
                    dotted_key(path, key),
                    value,
                    "qwen3exp's experiment has no targets: qwen3exp did not write this file",
                )
            )
    hydra = data.get("hydra")
    if hydra is not None:
        problems += (
            hydra_section_problems(hydra)
            if isinstance(hydra, dict)
            else [Problem("hydra", hydra, "not a mapping", "no hydra section (a run records it in hydra.yaml)")]
        )
    problems += _override_import_problems(data, run)
    problems += interpolation_problems(data, overrides)
    return problems


def interpolation_problems(data: dict, overrides: tuple[str, ...] = ()) -> list[Problem]:
    """One Problem per value (or key) that holds an interpolation, except Hydra's default job log
    file name at a logging FileHandler's `filename` (pinned to the new run directory) and values
    under a key the relaunch's own overrides set (replaced before anything is resolved)."""
    given = [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]
    problems: list[Problem] = []
    for path, key, value in walk(data):
        dotted = dotted_key(path, key)
        if any(dotted == g or dotted.startswith((g + ".", g + "[")) for g in given):
            continue
        if INTERPOLATION in key:
            problems.append(
                Problem(dotted, key, "a key with an interpolation", "plain keys", hint=f"refused: {DATA_NOT_CODE}")
            )
        for where, text in _strings(value, dotted):
            if INTERPOLATION in text and not (key == "filename" and text in LOG_FILENAMES and where == dotted):
                problems.append(
                    Problem(
                        where,
                        text,
                        "an interpolation: composing the run again would resolve it "
                        "(read the environment, decode text into config, ...)",
                        "plain values",
                        hint=f"{where} holds the value the run resolved in "
                        f"experiment.yaml; pass {where}=VALUE to relaunch to use a value of your own "
                        "(the recorded interpolation is then never resolved)",
                    )
                )
    return problems


def _strings(value, where: str):
    """(dotted key, text) of `value` when it is a string, and of the strings in it when it is a list
    (a mapping's own entries are walked by `_walk`)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                yield from _strings(item, f"{where}[{i}]")


def hydra_folder_problems(hydra_dir: Path) -> list[Problem]:
    """`.hydra/` is the primary config folder of a relaunch, and Hydra reads `<group>/<option>.yaml`
    from it for any config group it selects (`hydra/launcher=qwen3exp`, a `+group=option` override):
    Hydra writes only files there (config.yaml, hydra.yaml, overrides.yaml), so a folder in it
    came with the run from elsewhere."""
    try:
        folders = sorted(p.name for p in hydra_dir.iterdir() if p.is_dir())
    except OSError as e:
        return [
            Problem(
                "(recorded run)",
                str(hydra_dir),
                f"cannot be listed: {e.strerror or type(e).__name__}",
                "a readable run directory",
            )
        ]
    return [
        Problem(
            "(recorded run)",
            str(hydra_dir / name),
            "a folder of config files inside the recorded .hydra/: Hydra would read config groups from it",
            "only Hydra's own files (config.yaml, hydra.yaml, overrides.yaml)",
            hint=f"refused: {DATA_NOT_CODE}",
        )
        for name in folders
    ]


def _override_import_problems(data: dict, run: Path) -> list[Problem]:
    kernels = data.get("kernels")
    entries = kernels.get("overrides") if isinstance(kernels, dict) else None
    problems: list[Problem] = []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        target = entry.get("target") if isinstance(entry, dict) else entry
        if not isinstance(target, str) or not target.split(".")[0].isidentifier():
            continue  # the schema names what is wrong with it
        # find_spec of a top-level name locates it without importing anything.
        spec = importlib.util.find_spec(target.split(".")[0])
        if spec is None:
            continue
        # origin is a file only with has_location ("built-in", "frozen" are no paths).
        places = [
            *([spec.origin] if spec.has_location and spec.origin else []),
            *(spec.submodule_search_locations or ()),
        ]
        inside = [p for p in places if Path(p).resolve().is_relative_to(run)]
        if inside:
            problems.append(
                refused(
                    f"kernels.overrides[{i}].target",
                    target,
                    f"the module would be imported from the run directory ({inside[0]})",
                )
            )
    return problems
