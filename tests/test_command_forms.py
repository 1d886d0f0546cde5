"""Every command-line form either goes through the checks (and honours dry_run=true) or is refused
with exit 2 before anything starts: no form reaches Hydra's job unchecked."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import run_cli

EXP = "# @package _global_\ndefaults:\n  - override /model: one_layer\nname: user_exp\n"
MODEL = "backend: native\nflavor: tiny\nn_layers: 1\n"

# (id, args, expected exit code, text that must be printed)
FORMS = [
    ("config_dir", ("--config-dir", "{conf}", "experiment=user_exp", "dry_run=true"), 0, "qwen3exp dry run: user_exp"),
    ("config_dir_eq", ("--config-dir={conf}", "experiment=user_exp", "dry_run=true"), 0, "qwen3exp dry run: user_exp"),
    ("cd", ("-cd", "{conf}", "experiment=user_exp", "dry_run=true"), 0, "qwen3exp dry run: user_exp"),
    (
        "searchpath",
        ("hydra.searchpath=[file://{conf}]", "experiment=user_exp", "dry_run=true"),
        0,
        "qwen3exp dry run: user_exp",
    ),
    ("run_flag", ("--run", "dry_run=true"), 0, "qwen3exp dry run"),
    ("r_flag", ("-r", "dry_run=true"), 0, "qwen3exp dry run"),
    ("multirun_dry", ("-m", "training.lr=1e-3,2e-3", "dry_run=true"), 0, "qwen3exp dry run"),
    ("cfg_job", ("--cfg", "job", "dry_run=true"), 0, "dry_run: true"),
    ("cfg_job_package", ("--cfg", "job", "-p", "training"), 0, "steps: 30"),
    ("info", ("--info", "searchpath"), 0, "Config search path"),
    ("help", ("--help",), 0, "qwen3exp"),
    ("version", ("--version",), 0, "torchtitan 0.3.0"),
    ("package_without_cfg", ("-p", "training", "dry_run=true"), 2, "together with --cfg"),
    ("experimental_rerun", ("--experimental-rerun", "x.pickle"), 2, "qwen3exp relaunch"),
    ("unknown_flag", ("--fast", "dry_run=true"), 2, "unknown flag"),
    ("config_dir_missing", ("--config-dir", "{tmp}/nope", "dry_run=true"), 2, "folder does not exist"),
    ("cd_typo_in_user_option", ("-cd", "{conf}", "model=one_layr", "dry_run=true"), 2, "did you mean one_layer?"),
    ("mode_multirun", ("hydra.mode=MULTIRUN", "training.lr=1e-3,2e-3", "dry_run=true"), 0, "=== sweep point 2/2"),
    ("sweep_without_m", ("training.lr=1e-3,2e-3", "dry_run=true"), 2, "add -m (--multirun)"),
    ("other_hydra_launcher", ("hydra/launcher=basic", "dry_run=true"), 2, "through its own Hydra launcher"),
    ("shadowed_user_file", ("-cd", "{shadow}", "dry_run=true"), 2, "would be ignored"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forms")
    conf = tmp / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "model").mkdir()
    (conf / "experiment" / "user_exp.yaml").write_text(EXP)
    (conf / "model" / "one_layer.yaml").write_text(MODEL)
    shadow = tmp / "shadow"  # a user file named like a packaged option: Hydra would ignore it
    (shadow / "model").mkdir(parents=True)
    (shadow / "model" / "native.yaml").write_text(MODEL)

    def one(form):
        name, args, _code, _text = form
        cwd = tmp / f"cwd_{name}"
        cwd.mkdir()
        args = [
            a.replace("{conf}", str(conf)).replace("{tmp}", str(tmp)).replace("{shadow}", str(shadow)) for a in args
        ]
        return name, (run_cli(*args, cwd=cwd, timeout=180), cwd)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, FORMS))


@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_form(form, outcomes):
    name, _args, code, text = form
    proc, cwd = outcomes[name]
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    assert text in out, out[-3000:]
    assert "Traceback" not in out
    assert "rank(s) on" not in out  # no worker, on any path
    assert not (cwd / "outputs").exists() and not (cwd / "multirun").exists()
