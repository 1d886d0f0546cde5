"""Shared test helpers: run the real command line in a subprocess, compose configs in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import cli_fork
from hf_fixtures import write_checkpoint

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"

# The README's test command runs the suite on 2 pytest-xdist workers, a module at a time
# (`-n 2 --dist loadfile --no-loadscope-reorder`: the training a module's tests share is set up
# once), handed out longest first so that the last module to start is a short one. The order comes
# from a measured run (`--durations=0`, summed per module); a module not named is short and goes
# after these, in its usual order.
LONGEST_FIRST = (
    "test_docs",
    "test_search",
    "test_lm_eval",
    "test_sweeps",
    "test_hf_moe",
    "test_platforms",
    "test_sft_pack",
    "test_kernels_training",
    "test_faults",
    "test_signals_anytime",
    "test_installed",
    "test_fuzz",
    "test_auto_layout",
    "test_hf_checkpoints",
    "test_experiments",
    "test_multinode",
    "test_memory_score",
    "test_plan",
    "test_platform_cpu",
    "test_lora",
    "test_cli",
    "test_sft",
    "test_rundir_safety",
    "test_bad_inputs",
    "test_dcp_resume",
    "test_samples",
    "test_chat",
)


def pytest_configure(config: pytest.Config) -> None:
    """The quick tier (`-m "not slow"`) trains nothing: the fork server (tests/cli_fork_server.py)
    need not import torchtitan for it. The tests press Ctrl-C on the commands they start, as at a
    terminal: started in the background of a script (`pytest ... &`, nohup), this process would
    pass an ignored SIGINT on to every command, which keeps it ignored (POSIX; Python too)."""
    if "not slow" in (config.option.markexpr or ""):
        os.environ["QWEN3EXP_TESTS_PRELOAD"] = "0"
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__ if item.module else "", len(rank)))


def cli_env(env: dict | None = None) -> dict[str, str]:
    """The environment of a command the tests run: this one, the repository importable, no Hub."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("HF_HUB_OFFLINE", "1")
    return {**full_env, **(env or {})}


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 600,
    module: str = "qwen3exp",
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """`python -m qwen3exp ARGS` in a subprocess (the way a user runs it), forked from a process that
    has imported it (tests/cli_fork.py) unless `fresh` (a new interpreter). `module`
    qwen3exp.analysis.report / diff / relaunch: the command `qwen3exp report|diff|relaunch ARGS`."""
    if module.startswith("qwen3exp.analysis."):
        args, module = (module.rsplit(".", 1)[1], *args), "qwen3exp"
    full_env = cli_env(env)
    if not fresh and module == "qwen3exp":  # the same command, forked from a process that has imported it
        if (done := cli_fork.run(list(args), cwd or REPO, full_env, timeout, base=cli_env())) is not None:
            return done
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def metrics_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def read_metrics(run_dir: Path) -> list[dict]:
    """The training rows (one per logged step)."""
    return [r for r in metrics_rows(run_dir) if "loss" in r]


def read_validation(run_dir: Path) -> list[dict]:
    """The validation rows (step, val_loss, val_perplexity)."""
    return [r for r in metrics_rows(run_dir) if "val_loss" in r]


def compose(*overrides: str) -> dict:
    """Compose conf/ with overrides (as the command line would), returning the plain experiment."""
    from qwen3exp.config.compose import experiment_data
    from qwen3exp.config.composer import Composer
    from qwen3exp.errors import ConfigError

    with Composer() as c:
        data, problems = experiment_data(c.compose(list(overrides)))
    if problems:
        raise ConfigError(problems)
    return data


def all_conf_files() -> list[tuple[str, str]]:
    """(group, option) for every YAML under conf/ except the root config and Hydra's own groups
    (conf/hydra/job_logging/qwen3exp.yaml: every run uses it; tests/test_cli.py reads the
    qwen3exp.log it writes)."""
    out = []
    for path in sorted(CONF.rglob("*.yaml")):
        if path.parent == CONF or path.relative_to(CONF).parts[0] == "hydra":
            continue
        out.append((path.parent.name, path.stem))
    return out


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return tmp_path / "run"


@pytest.fixture(scope="session")
def reference_losses(tmp_path_factory) -> list[float]:
    """The losses of an uninterrupted `runprocs.TINY` run on one node with 2 ranks, trained once
    and shared by the multi-node, fault and resume tests (each compares its own run with these)."""
    from runprocs import TINY

    run = tmp_path_factory.mktemp("reference") / "run"
    r = run_cli(*TINY, "launcher.nproc_per_node=2", f"hydra.run.dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    losses = [row["loss"] for row in read_metrics(run)]
    assert len(losses) == 6
    return losses


@pytest.fixture(scope="session")
def sft_run(tmp_path_factory) -> Path:
    """One real 2-rank tiny SFT run (model=native, 3 steps, validation off, local batch 4) that
    loads a transformers checkpoint (`hf_fixtures.write_checkpoint`, tied, seed 3: the run's
    `ckpt` folder beside it), saves a signed DCP checkpoint and a float32 Hugging Face export of its
    last step. Shared by tests/test_sft.py (its step-1 loss) and tests/test_chat.py (its answers)."""
    root = tmp_path_factory.mktemp("sft")
    ckpt, path = write_checkpoint(root / "ckpt", tied=True, seed=3), root / "run"
    r = run_cli(
        "experiment=tiny_sft", "model.flavor=auto", f"model.hf_assets_path={ckpt}", "checkpoint=hf_roundtrip",
        "checkpoint.save=true", "checkpoint.dtype=float32", "platform=cpu", "platform.threads_per_rank=1",
        "training.steps=3", "training.warmup_steps=1", "training.local_batch_size=4", "validation.enable=false",
        "metrics.tensorboard=false", f"hydra.run.dir={path}",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (path / "export" / "step-3" / "config.json").is_file()
    assert (path / "checkpoint" / "step-3" / ".metadata").is_file()
    return path
