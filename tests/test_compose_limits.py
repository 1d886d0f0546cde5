"""Composition-level promises: sizes that hung are refused in seconds, Hydra's placement keys stay
inside the run directory, and secrets inside values never reach what a run writes or prints.

Everything runs in-process (`qwen3exp.cli.main`), from a user's repository as `qwen3exp init`
writes it; a case that hung before its fix fails on a deadline instead of hanging the suite.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

SECONDS = 20
"""Each refusal takes 1-2 s here; the deadline leaves room for a loaded machine."""


class Hung(BaseException):
    """Raised by the deadline (a BaseException: no `except Exception` of the code under test eats it)."""


@contextmanager
def deadline(seconds: float = SECONDS):
    def hung(_signum, _frame):
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.5)  # again every 0.5 s: a bare `except:` may eat one
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def user_repo(tmp_path_factory) -> Path:
    from qwen3exp.scaffold import init

    repo = tmp_path_factory.mktemp("repo")
    init(repo)
    return repo


@pytest.fixture
def cli(user_repo, monkeypatch, capsys):
    """`qwen3exp ARGV` in-process from the user's repository: (exit code, stdout, stderr)."""
    from hydra.core.global_hydra import GlobalHydra

    from qwen3exp.cli import main
    from qwen3exp.launchers.job import COMMAND_ENV

    monkeypatch.chdir(user_repo)
    monkeypatch.delenv(COMMAND_ENV, raising=False)  # main() sets it: put back after the test

    def run(*argv: str) -> tuple[int, str, str]:
        GlobalHydra.instance().clear()
        started = time.monotonic()
        try:
            with deadline():
                code = main(list(argv))
        finally:
            GlobalHydra.instance().clear()
        out = capsys.readouterr()
        assert time.monotonic() - started < SECONDS, "hung (the deadline was caught inside)"
        assert "Traceback" not in out.out + out.err
        return code, out.out, out.err

    return run


@pytest.fixture
def user_file(user_repo):
    """Write conf/<rel> in the user's repository for one test (removed afterwards)."""
    written: list[Path] = []

    def write(rel: str, text: str | bytes) -> Path:
        path = user_repo / "conf" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        written.append(path)
        return path

    yield write
    for path in written:
        path.unlink()


def _nothing_written(repo: Path) -> None:
    assert not (repo / "outputs").exists() and not (repo / "multirun").exists()


# ------------------------------------------------------------------------------ sizes
def test_yaml_anchor_bomb_is_refused(cli, user_repo, user_file):
    levels = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9))
    head = "# @package _global_\nname: bomb\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n"
    path = user_file("experiment/bomb.yaml", head + levels)  # 10^9 values from 9 lines
    code, _, err = cli("-cd", "conf", "experiment=bomb", "dry_run=true")
    assert code == 2, err
    assert f"(config file) = '{path}'" in err and "YAML aliases" in err and "at most 100,000" in err, err
    _nothing_written(user_repo)


def test_a_50_mb_experiment_file_is_refused_before_parsing(cli, user_repo, user_file):
    path = user_file("experiment/huge.yaml", "# @package _global_\nname: huge\nvalues:\n" + "  - 1\n" * 9_000_000)
    code, _, err = cli("-cd", "conf", "experiment=huge", "dry_run=true")
    assert code == 2, err
    assert f"(config file) = '{path}': is 51.5 MiB" in err and "at most 1 MiB" in err, err
    _nothing_written(user_repo)


@pytest.mark.parametrize(
    "sweep",
    [
        ("training.seed=range(0,100000000)",),
        ("training.seed=range(0,10000)", "training.lr=range(0.001,0.01,0.000001)"),  # 10^4 x 9,000
        ("training.seed=shuffle(range(0,100000000))",),
    ],
    ids=["range", "product", "shuffled"],
)
def test_a_sweep_of_1e8_points_is_refused_before_it_is_listed(cli, user_repo, sweep):
    code, _, err = cli("-m", *sweep, "dry_run=true")
    assert code == 2, err
    assert "at most 10,000" in err and sweep[0].split("=")[0] in err, err
    _nothing_written(user_repo)


@pytest.mark.parametrize(
    "args, key",
    [
        (("launcher.nproc_per_node=100000000",), "launcher.nproc_per_node"),
        (("launcher.nnodes=100000000", "launcher.rdzv_endpoint=node0:29500"), "launcher.nnodes"),
        (("platform=cpu", "platform.ranks_per_node=100000000"), "platform.ranks_per_node"),
        (("model.n_layers=100000000",), "model.n_layers"),
        (("parallelism.dp_shard=100000000",), "parallelism.dp_shard"),
    ],
    ids=lambda x: x[0] if isinstance(x, tuple) else None,
)
def test_degrees_and_layers_of_1e8_are_refused_in_seconds(cli, user_repo, args, key):
    code, _, err = cli(*args, "dry_run=true")
    assert code == 2, err
    assert f"  {key} = 100000000" in err and "allowed:" in err, err
    _nothing_written(user_repo)


def test_a_billion_steps_plans_in_seconds(cli):
    """The plan lists the validation steps: it counted them by listing every multiple of freq (in
    one C call that no signal interrupts: 18 s here, and memory in GiB)."""
    from qwen3exp.config.composer import compose_experiment
    from qwen3exp.plan.render import validation_line

    exp = compose_experiment(["training.steps=1000000000"])
    started = time.monotonic()
    line = validation_line(exp)
    assert time.monotonic() - started < 1
    assert "at step(s) 1, 10, 20, 30, 40, 50, ..., 1000000000;" in line
    code, out, err = cli("training.steps=1000000000", "dry_run=true")
    assert code == 0 and line in out, err


# ------------------------------------------------------------------------------ files a run does not read
def _broken(kind: str, path: Path, pwned: Path) -> None:
    """A config file a launch must refuse when it reads it, and only then."""
    if kind == "syntax":  # a half-written option on a branch
        path.write_text("# @package _global_\nname: half\ntraining: [\n  steps: 3\n")
    elif kind == "python_tag":  # PyYAML's unsafe loaders would run the command
        path.write_text(f"# @package _global_\nname: half\nx: !!python/object/apply:os.system ['touch {pwned}']\n")
    elif kind == "too_large":
        path.write_text("# @package _global_\nname: half\nvalues:\n" + "  - 1\n" * 400_000)  # 2.3 MiB
    elif kind == "link_loop":
        path.symlink_to(path.name)
    else:
        os.mkfifo(path)  # Hydra would read it without end


BROKEN = {
    "syntax": "YAML syntax error at line 5, column 1",
    "python_tag": "holds the YAML tag !!python/object/apply:os.system at line 3, column 4",
    "too_large": "is 2.3 MiB; Hydra would parse it for minutes",
    "link_loop": "cannot be read: Too many levels of symbolic links",
    "fifo": "is not a regular file",
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_file_refuses_only_the_runs_that_read_it(cli, user_repo, tmp_path, kind):
    """Hydra reads only the options a composition selects: a broken option nobody selects is named
    in a one-line warning and every other run goes on; a run that selects it is refused (exit 2, the
    file named), as are `--cfg` and `--info`, which compose it too."""
    pwned = tmp_path / "pwned"
    path = user_repo / "conf" / "experiment" / "half.yaml"
    _broken(kind, path, pwned)
    try:
        code, out, err = cli("-cd", "conf", "experiment=my_experiment", "dry_run=true")
        assert code == 0, err
        assert "qwen3exp dry run: my_experiment" in out, out
        warned = [line for line in err.splitlines() if str(path) in line]
        assert len(warned) == 1 and warned[0].startswith(f"warning: {path}: {BROKEN[kind]}"), err
        assert "not read by this run" in warned[0], err
        for argv in (("experiment=half", "dry_run=true"), ("--cfg", "job", "experiment=half")):
            code, out, err = cli("-cd", "conf", *argv)
            assert code == 2, out + err
            assert (
                f"(config file) = '{path}': {BROKEN[kind]}" in err
                or f"experiment = 'half': {path} {BROKEN[kind]}" in err
            ), err
    finally:
        path.unlink()
    assert not pwned.exists()  # the command was never run
    _nothing_written(user_repo)


def test_ls_lists_a_broken_experiment_as_broken(user_repo, capsys, monkeypatch, tmp_path):
    from qwen3exp.config.catalog import main_ls

    monkeypatch.chdir(user_repo)
    paths = {kind: user_repo / "conf" / "experiment" / f"half_{kind}.yaml" for kind in BROKEN}
    for kind, path in paths.items():
        _broken(kind, path, tmp_path / "pwned")
    try:
        with deadline():  # the FIFO is never opened (reading it would block)
            code = main_ls([])
    finally:
        for path in paths.values():
            path.unlink()
    out = capsys.readouterr().out
    assert code == 0 and "my_experiment" in out, out
    for kind in paths:
        assert f"! broken: {BROKEN[kind]}" in out.split(f"half_{kind} ", 1)[1], (kind, out)


# ------------------------------------------------------------------------------ placement
@pytest.mark.parametrize(
    "args, key",
    [
        (("hydra.output_subdir={victim}",), "hydra.output_subdir"),
        (("hydra.output_subdir={victim}", "dry_run=false"), "hydra.output_subdir"),  # a real launch: the same check
        (("hydra.output_subdir=../../../victim",), "hydra.output_subdir"),
        (("hydra.job.name=../../../victim/qwen3exp",), "hydra.job.name"),
        (
            ("hydra.job_logging.handlers.file.filename={victim}/log.txt", "dry_run=false"),
            "hydra.job_logging.handlers.file.filename",
        ),
        (("-m", "hydra.sweep.subdir={victim}", "training.seed=1,2"), "hydra.sweep.subdir"),
        (("-m", "hydra.sweep.subdir=../../../../victim", "training.seed=1,2", "dry_run=false"), "hydra.sweep.subdir"),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, tuple) else None,
)
def test_hydra_placement_keys_stay_in_the_run_directory(cli, user_repo, args, key):
    """Each of these wrote into (or appended to) a file outside the run directory."""
    victim = user_repo / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "log.txt").write_text("mine\n")
    argv = [a.replace("{victim}", str(victim)) for a in args]
    code, _, err = cli(*argv, *([] if any(a.startswith("dry_run=") for a in argv) else ["dry_run=true"]))
    assert code == 2, err
    assert f"  {key} = " in err and ("outside the run directory" in err or "a plain name without /" in err), err
    assert sorted(p.name for p in victim.iterdir()) == ["log.txt"] and (victim / "log.txt").read_text() == "mine\n"
    _nothing_written(user_repo)


# ------------------------------------------------------------------------------ secrets
TOKEN = "tok3nVALUE"


@pytest.mark.parametrize(
    "args",
    [
        ("metrics.wandb_host=https://user:tok3nVALUE@wandb.example",),  # an unknown key: its refusal printed it
        ("metrics.wandb_project=https://user:tok3nVALUE@wandb.example",),  # a valid key: planned, printed, recorded
        ("-m", "metrics.wandb_project=a,https://user:tok3nVALUE@wandb.example"),  # the second point of a sweep
        ("-cd", "conf", "experiment=with_url"),  # in a file
    ],
    ids=["unknown_key", "value", "sweep", "file"],
)
def test_url_credentials_in_values_are_refused_masked(cli, user_repo, user_file, args):
    user_file(
        "experiment/with_url.yaml",
        f"# @package _global_\nname: with_url\nmetrics:\n  wandb_project: https://user:{TOKEN}@wandb.example\n",
    )
    code, out, err = cli(*args, "dry_run=true")
    assert code == 2, err
    assert TOKEN not in out + err and "https://***@wandb.example" in err, err
    assert "holds credentials in a URL" in err
    _nothing_written(user_repo)


@pytest.mark.parametrize(
    "text",
    [
        "- metrics.wandb_project=https\\://user\\:tok3nVALUE@host",  # as Hydra records an override
        "- hydra.job.env_set.WANDB_API_KEY=tok3nVALUE more,tok3nVALUE",  # spaces and commas
        "    env_set:\n      HF_TOKEN: tok3nVALUE b,tok3nVALUE\n      OTHER: 1\n",  # hydra.yaml
        "{HF_TOKEN: tok3nVALUE tok3nVALUE, OTHER: 1}",
    ],
)
def test_redaction_covers_escaped_urls_and_values_with_spaces(text):
    from qwen3exp.run.redact import redact_argv, redact_text

    assert TOKEN not in redact_text(text)
    assert TOKEN not in " ".join(redact_argv(text.splitlines()))
    assert "OTHER: 1" in redact_text(text) or "OTHER" not in text


def test_hydra_records_of_env_set_values_are_redacted(tmp_path):
    """`hydra.job.env_set` values with spaces and commas, as OmegaConf writes them into hydra.yaml
    and multirun.yaml: the redaction left everything after the first space or comma."""
    from omegaconf import OmegaConf

    from qwen3exp.run.redact import redact_hydra_record

    env_set = {"WANDB_API_KEY": f"{TOKEN} x,{TOKEN}", "HF_ENDPOINT": f"https://u:{TOKEN}@hub.example"}
    cfg = OmegaConf.create(
        {
            "hydra": {
                "job": {"env_set": env_set},
                "overrides": {"hydra": [f"+hydra.job.env_set.WANDB_API_KEY='{TOKEN} x,{TOKEN}'"]},
            }
        }
    )
    OmegaConf.save(cfg, tmp_path / "multirun.yaml")
    assert TOKEN in (tmp_path / "multirun.yaml").read_text()
    redact_hydra_record(tmp_path, ("multirun.yaml",))
    text = (tmp_path / "multirun.yaml").read_text()
    assert TOKEN not in text and "hub.example" in text


def test_multirun_yaml_holds_no_secret_while_the_jobs_are_checked(cli, user_repo, monkeypatch):
    """Hydra's sweeper writes multirun.yaml (hydra.job.env_set included) before qwen3exp's launcher
    gets the batch; it was redacted only once a job started: while the jobs were checked (a refusal,
    a kill) the secret lay in the sweep directory."""
    from qwen3exp.launchers import batch

    seen: list[str] = []
    check_job = batch.check_job  # the launcher's own name for it (qwen3exp.launchers.points.check_job)

    def spy(cfg, files, overrides, **kw):
        seen.extend(p.read_text() for p in (user_repo / "outputs").rglob("multirun.yaml"))
        return check_job(cfg, files, overrides, **kw)

    monkeypatch.setattr(batch, "check_job", spy)
    code, out, err = cli("-m", "training.seed=1,2", f"+hydra.job.env_set.WANDB_API_KEY={TOKEN} x", "dry_run=true")
    assert code == 0, err
    assert seen and not any(TOKEN in text for text in seen)
    assert TOKEN not in out + err
    _nothing_written(user_repo)
