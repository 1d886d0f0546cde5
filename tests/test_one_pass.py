"""Compose once, check once, plan once.

- `qwen3exp.config.jobs.JobConfigs` gives a sweep's jobs the config Hydra would compose for each,
  composing only one job per shape: every derived config here equals Hydra's own composition.
- A run composes once and validates once in the launcher process; its ranks validate nothing (they
  read the planned experiment after checking its digest).
"""

from __future__ import annotations

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from omegaconf import OmegaConf

from qwen3exp.config import jobs
from qwen3exp.config.argv import CONF_DIR
from qwen3exp.config.names import register_resolvers

# Jobs of one shape (the same keys), with the values Hydra's parser turns into each scalar type, the
# keys override_dirname leaves out (dry_run), a quoted value with a comma and a null; then jobs of
# other shapes (a config group, +key, a list value, an interpolation) that Hydra composes itself.
SAME_SHAPE = [
    ["model.flavor=tiny", "training.lr=0.001", "training.seed=1", "dry_run=true"],
    ["model.flavor=tiny_moe", "training.lr=2e-3", "training.seed=-3", "dry_run=false"],
    ["model.flavor=tiny", "training.lr=1", "training.seed=7", "dry_run=true"],
]
OTHER = [
    ["name='a,b'", "training.warmup_steps=null"],
    ["name=plain", "training.warmup_steps=3"],
    ["platform=cpu", "training.lr=0.5"],
    ["platform=cpu", "training.lr=0.25"],
    ["+extra_key=1", "training.lr=0.5"],
    ["training.lr=${training.max_norm}"],
    ["model=hf", "model.hf_assets_path=/x", "training.seed=2"],
]


@pytest.fixture
def loader():
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="qwen3exp"):
        yield GlobalHydra.instance().config_loader()
    GlobalHydra.instance().clear()


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=False)


def test_every_derived_job_config_equals_hydras_own(loader):
    master = loader.load_configuration("config", ["hydra/launcher=qwen3exp"], RunMode.MULTIRUN)
    ours = jobs.JobConfigs(loader)
    before = dict(jobs.COMPOSED)
    for overrides in [*SAME_SHAPE, *OTHER]:
        expected = loader.load_sweep_config(master, list(overrides))
        assert _plain(ours.load_sweep_config(master, list(overrides))) == _plain(expected), overrides
    composed = {k: jobs.COMPOSED[k] - before.get(k, 0) for k in ("job", "derived")}
    # One composition per shape: the 3 same-shape jobs, the name pair and the platform pair share one.
    assert composed == {"job": 1 + 1 + 1 + 3, "derived": 2 + 1 + 1}, composed


def test_the_same_job_is_composed_once(loader):
    master = loader.load_configuration("config", ["hydra/launcher=qwen3exp"], RunMode.MULTIRUN)
    ours = jobs.JobConfigs(loader)
    before = jobs.COMPOSED["job"] + jobs.COMPOSED["derived"]
    first = ours.load_sweep_config(master, ["training.seed=1"])
    assert ours.load_sweep_config(master, ["training.seed=1"]) is first  # the sweeper's check, then the launcher
    assert jobs.COMPOSED["job"] + jobs.COMPOSED["derived"] - before == 1


def _counts() -> dict:
    from qwen3exp.config.schema import VALIDATIONS

    return {"composed": sum(jobs.COMPOSED.values()), "validated": sum(VALIDATIONS.values())}


@pytest.mark.slow  # it trains (torchrun or steps in a fresh process): the full tier
def test_a_run_composes_once_and_validates_once_and_its_ranks_validate_nothing(tmp_path, monkeypatch, capsys):
    """In the launcher process (here: in-process), then in a rank's reading of the run directory."""
    from qwen3exp import cli
    from qwen3exp.errors import ConfigError
    from qwen3exp.run import rundir
    from qwen3exp.worker.main import load_run

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    before = _counts()
    assert (
        cli.main(["training.steps=1", "validation.enable=false", "launcher.nproc_per_node=1", f"hydra.run.dir={run}"])
        == 0
    ), capsys.readouterr()
    after = _counts()
    assert {k: after[k] - before[k] for k in after} == {"composed": 1, "validated": 1}
    # A rank: the experiment the launcher planned, checked by its digest, validated nothing.
    text = (run / rundir.EXPERIMENT).read_text()
    monkeypatch.setenv(rundir.EXPERIMENT_DIGEST_ENV, rundir.sha256(text))
    exp, _facts = load_run(run)
    assert exp.training.steps == 1 and _counts() == after
    (run / rundir.EXPERIMENT).write_text(text.replace("steps: 1", "steps: 2"))
    with pytest.raises(ConfigError, match="changed since the launcher checked and planned it"):
        load_run(run)


def test_a_sweep_composes_and_validates_each_job_once(tmp_path, monkeypatch, capsys):
    from qwen3exp import cli

    monkeypatch.chdir(tmp_path)
    before = _counts()
    assert (
        cli.main(
            [
                "-m",
                "dry_run=true",
                "training.lr=1e-3,2e-3,3e-3",
                "training.seed=1,2",
                f"hydra.sweep.dir={tmp_path / 'sweep'}",
            ]
        )
        == 0
    ), capsys.readouterr()
    after = _counts()
    # The command line's check of the common config, Hydra's own sweep config is not counted (Hydra
    # composes it inside hydra.main); the 6 jobs: one composition, 5 derived; each validated once.
    assert {k: after[k] - before[k] for k in after} == {"composed": 1 + 6, "validated": 6}
