"""Experiment trackers: TensorBoard (on by default, event files in the run directory) and
Weights & Biases (opt-in, `metrics.wandb=true`).

Both loggers live on the metrics rank (`qwen3exp.titan.metrics`). When torchtitan's own W&B logger
could not start (package missing, not logged in) it logged one line and trained on without it, so
the run silently had no W&B record; qwen3exp's fails the rank instead, and `check()` turns both
cases into configuration errors before anything starts.
`env()` names the W&B run after the experiment and groups a sweep's runs; in the ranks the
trackers (`qwen3exp.titan.trackers`) give the W&B run the experiment as its config, a sweep job's
overrides as its tags and the run directory's `wandb/` folder for its files.
"""

from __future__ import annotations

import importlib.util
import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

from qwen3exp.config.schema import Experiment
from qwen3exp.errors import Problem

_NO_LOGIN_MODES = ("offline", "disabled", "dryrun")


def check(exp: Experiment) -> list[Problem]:
    if not exp.metrics.wandb:
        return []
    if importlib.util.find_spec("wandb") is None:
        return [
            Problem(
                "metrics.wandb",
                True,
                "needs the wandb package, which is not installed",
                "false, or install it",
                "pip install 'qwen3exp[wandb]'",
            )
        ]
    if (
        os.environ.get("WANDB_MODE", "online") in _NO_LOGIN_MODES
        or os.environ.get("WANDB_API_KEY")
        or _netrc_has(urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname)
    ):
        return []
    return [
        Problem(
            "metrics.wandb",
            True,
            "W&B is not logged in (no WANDB_API_KEY, no ~/.netrc entry) and WANDB_MODE is not offline; "
            "torchtitan would drop the W&B logger with one log line",
            hint="run `wandb login`, set WANDB_API_KEY, or set WANDB_MODE=offline (files stay in the run directory)",
        )
    ]


def _netrc_has(host: str | None) -> bool:
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return host is not None and netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def env(exp: Experiment, run_dir: Path, *, sweep_dir: str | None = None) -> dict[str, str]:
    """Environment for the ranks (values the user already set win): WANDB_PROJECT, WANDB_RUN_NAME
    and, for a sweep job, WANDB_RUN_GROUP, read in the ranks as torchtitan's W&B logger reads them."""
    if not exp.metrics.wandb:
        return {}
    out = {"WANDB_PROJECT": exp.metrics.wandb_project, "WANDB_RUN_NAME": f"{exp.name}/{run_dir.name}"}
    if sweep_dir:
        out["WANDB_RUN_GROUP"] = f"{exp.name}/{Path(sweep_dir).name}"
    return {k: v for k, v in out.items() if k not in os.environ}
