"""The shared Neuron compile cache (`qwen3exp.platforms.neuron_cache`), contract-tested in-process.

No Trainium here: the folder a rank gets, the key that names it and the plan's "cached" / "will
compile" line are checked on the tiny model planned for platform=neuron (dry runs, and one launch
preflight against a faked device probe). A compile is the fake's `neff_cache.compile_into`, which
stores a NEFF where TorchNeuron's persistent cache does. The fake `torch_neuronx` itself is never
imported in this process (renaming PrivateUse1 cannot be undone); its package metadata is read.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from conftest import REPO, compose
from qwen3exp import platforms
from qwen3exp.cli import main
from qwen3exp.config.schema import Experiment, validate_experiment
from qwen3exp.config.sections.platform import CpuPlatform
from qwen3exp.errors import ConfigError
from qwen3exp.launchers.torchrun import rank_env
from qwen3exp.plan.build import make_plan
from qwen3exp.platforms import neuron, neuron_cache, probe
from qwen3exp.platforms.neuron_cache import CACHE_ENV, KEY_ENV

FAKES = REPO / "tests" / "fakes"
NEURON = ("platform=neuron", "launcher.nproc_per_node=2")
GIB = 2**30


@pytest.fixture(autouse=True)
def root(tmp_path, monkeypatch) -> Path:
    """The shared cache's root for this test; nothing from the shell decides a folder."""
    monkeypatch.setattr(probe, "_cache", {})
    monkeypatch.setenv(neuron_cache.ROOT_ENV, str(tmp_path / "cache"))
    for name in (CACHE_ENV, "NEURON_CC_FLAGS", "NEURON_LOGICAL_NC_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def base() -> dict:
    """The tiny experiment on platform=neuron (2 ranks), composed once."""
    return compose("dry_run=true", *NEURON)


def _plan(base: dict, run_dir: Path, **changes):
    """The plan of `base` with dotted keys changed (`training__seq_len=512`)."""
    data = copy.deepcopy(base)
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = data
        for part in path:
            node = node[part]
        node[last] = value
    return make_plan(validate_experiment(data), run_dir)


def _fake_compiler():
    """tests/fakes/neff_cache.py, loaded by path (it imports no fake torch_neuronx)."""
    spec = importlib.util.spec_from_file_location("neff_cache", FAKES / "neff_cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _folder(plan) -> str:
    return plan.platform.env[CACHE_ENV]


def _compile_line(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("compile:")]


def test_runs_of_one_graph_share_a_folder_and_another_graph_gets_another(base, tmp_path, root):
    first = _plan(base, tmp_path / "a")
    # Another run of the same graph: other name, run directory, steps, lr, seed, data order.
    again = _plan(base, tmp_path / "b", name="other", training__steps=7, training__lr=1e-4, training__seed=3)
    assert _folder(first) == _folder(again) and Path(_folder(first)).parent == root
    assert first.platform.env[KEY_ENV] == Path(_folder(first)).name
    others = {
        "seq_len": _plan(base, tmp_path / "c", training__seq_len=512),
        "batch": _plan(base, tmp_path / "d", training__local_batch_size=4),
        "mesh": _plan(base, tmp_path / "e", parallelism__dp_shard=1, parallelism__dp_replicate=2),
        "checkpointing": _plan(base, tmp_path / "f", training__activation_checkpoint="full"),
    }
    folders = {what: _folder(p) for what, p in others.items()}
    assert len({_folder(first), *folders.values()}) == 1 + len(others), folders
    assert all(Path(f).parent == root for f in folders.values())
    # A kernel override (its claims need torchtitan: the key is compared directly on the experiment).
    key = neuron_cache.graph_key
    args = (first.arch, first.mesh, first.batches, first.platform, {})
    nki = validate_experiment({**base, "kernels": {"rope": {"impl": "nki"}}})
    idle = validate_experiment({**base, "kernels": {"moe": {"block_size": 256}}})  # dense model: no override
    assert neuron_cache.key_hash(key(first.exp, *args)) == first.platform.env[KEY_ENV]
    assert neuron_cache.key_hash(key(nki, *args)) != first.platform.env[KEY_ENV]
    assert neuron_cache.key_hash(key(idle, *args)) == first.platform.env[KEY_ENV]
    # Other platforms have no compile cache: their facts pass through unchanged.
    cpu = platforms.resolve(CpuPlatform(), dry_run=True)
    assert neuron_cache.for_graph(cpu, first.exp, first.arch, first.mesh, first.batches) is cpu


def test_the_attention_kernel_is_in_the_key(base, tmp_path):
    """model.attention changes the compiled graph, so it is in the key: `auto` is the platform's own
    kernel (sdpa on Neuron), the same graph as naming it; another kernel is another key (compared on
    the experiment: the plan refuses flex on Neuron today, the key must not depend on that)."""
    auto = _plan(base, tmp_path / "a")
    sdpa = _plan(base, tmp_path / "b", model__attention="sdpa")
    assert _folder(sdpa) == _folder(auto)
    args = (auto.arch, auto.mesh, auto.batches, auto.platform, {})
    flex = validate_experiment({**base, "model": {**base["model"], "attention": "flex"}})
    assert neuron_cache.graph_key(flex, *args)["model"]["attention"] == "flex"
    assert neuron_cache.key_hash(neuron_cache.graph_key(flex, *args)) != auto.platform.env[KEY_ENV]


def test_the_objective_is_in_the_key(base, tmp_path):
    """A pair objective is another loss (and DPO a reference pass), its beta a constant of it."""
    auto = _plan(base, tmp_path / "a")
    args = (auto.arch, auto.mesh, auto.batches, auto.platform, {})
    keys = [
        neuron_cache.key_hash(neuron_cache.graph_key(validate_experiment({**base, "objective": o}), *args))
        for o in ({"kind": "sft"}, {"kind": "dpo"}, {"kind": "dpo", "beta": 0.2})
    ]
    assert keys[0] == auto.platform.env[KEY_ENV] and len(set(keys)) == 3


def _models(annotation) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation names (a section's variants, through unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def _schema_keys() -> set[tuple[str, str]]:
    """(section, key) of every key of every section's variants; ("", key) for top-level scalars."""
    keys = set()
    for name, field in Experiment.model_fields.items():
        models = _models(field.annotation)
        keys |= {(name, k) for m in models for k in m.model_fields} if models else {("", name)}
    return keys


def test_every_schema_key_is_placed_in_or_out_of_the_key():
    """A key that changes the graph cannot be forgotten: each one is in exactly one of GRAPH_FIELDS,
    PLANNED_FIELDS and INPUT_FIELDS (a new key fails here until it is placed)."""
    tables = (neuron_cache.GRAPH_FIELDS, neuron_cache.PLANNED_FIELDS, neuron_cache.INPUT_FIELDS)
    placed = [(s, k) for t in tables for s, keys in t.items() for k in keys]
    assert len(placed) == len(set(placed)), [p for p in placed if placed.count(p) > 1]
    assert set(placed) == _schema_keys(), (_schema_keys() - set(placed), set(placed) - _schema_keys())


def test_compilers_flags_and_versions_are_in_the_key(base, tmp_path, monkeypatch):
    plan = _plan(base, tmp_path / "a")
    args = (plan.exp, plan.arch, plan.mesh, plan.batches, plan.platform)
    bare = neuron_cache.graph_key(*args, {})
    assert bare["compiler"] == {
        "lnc": 2,
        "device": "trn2",
        "NEURON_CC_FLAGS": "",
        "torch-neuronx": None,
        "neuronx-cc": None,
    }
    flags = neuron_cache.graph_key(*args, {"NEURON_CC_FLAGS": " --model-type  transformer"})
    assert flags["compiler"]["NEURON_CC_FLAGS"] == "--model-type transformer"
    monkeypatch.syspath_prepend(str(FAKES))  # the fake's package metadata: what the launcher reads
    faked = neuron_cache.graph_key(*args, {})
    assert (faked["compiler"]["torch-neuronx"], faked["compiler"]["neuronx-cc"]) == ("2.14.3.0+fake", "2.21.0.0+fake")
    assert len({neuron_cache.key_hash(k) for k in (bare, flags, faked)}) == 3
    # Flags given to the ranks (platform.runtime_env) are the ones the compiler sees.
    own = _plan(base, tmp_path / "b", platform={"name": "neuron", "runtime_env": {"NEURON_CC_FLAGS": "-O1"}})
    assert (
        neuron_cache.graph_key(own.exp, own.arch, own.mesh, own.batches, own.platform, {})["compiler"][
            "NEURON_CC_FLAGS"
        ]
        == "-O1"
    )


def test_an_explicit_folder_wins_and_run_keeps_the_per_run_cache(base, tmp_path, root):
    mine = tmp_path / "mine"
    plan = _plan(base, tmp_path / "a", platform={"name": "neuron", "compile_cache_dir": str(mine)})
    assert plan.platform.env[CACHE_ENV] == str(mine) and KEY_ENV not in plan.platform.env
    assert neuron_cache.plan_lines(plan) == [
        f"compile:    will compile into {mine} (platform.compile_cache_dir, not keyed by graph)"
    ]
    _fake_compiler().compile_into(mine)
    assert neuron_cache.plan_lines(plan)[0].startswith(f"compile:    cached: {mine} holds compiled graphs")
    per_run = _plan(base, tmp_path / "b", platform={"name": "neuron", "compile_cache_dir": "run"})
    assert CACHE_ENV not in per_run.platform.env and per_run.platform.run_dir_env == {CACHE_ENV: "neuron_cache"}
    assert rank_env(per_run.platform, tmp_path / "b")[CACHE_ENV] == str(tmp_path / "b" / "neuron_cache")
    assert "this run's own cache" in neuron_cache.plan_lines(per_run)[0]
    assert not root.exists()  # neither touched the shared cache
    with pytest.raises(ConfigError) as e:
        validate_experiment({**base, "platform": {"name": "neuron", "runtime_env": {KEY_ENV: "x"}}})
    assert "is set by platform.compile_cache_dir" in e.value.render()


def test_the_dry_run_says_will_compile_then_cached_per_sweep_point(capsys, tmp_path, root):
    assert main(["dry_run=true", *NEURON, f"hydra.run.dir={tmp_path / 'run'}"]) == 0
    out = capsys.readouterr().out
    folder = next(w for w in out.split() if w.startswith(f"{CACHE_ENV}=")).split("=", 1)[1]
    assert Path(folder).parent == root
    assert _compile_line(out) == [
        f"compile:    will compile into {folder} (key {Path(folder).name}, shared by every run and sweep job "
        "of this graph; from the first launch on, key.json there says what the key stands for)"
    ]
    assert not root.exists()  # a dry run writes nothing
    _fake_compiler().compile_into(folder)  # the run's first step compiled there
    sweep = ["-m", "dry_run=true", *NEURON, "training.seq_len=256,512", f"hydra.sweep.dir={tmp_path / 's'}"]
    assert main(sweep) == 0
    lines = _compile_line(capsys.readouterr().out)
    assert len(lines) == 2, lines
    assert (
        lines[0] == f"compile:    cached: {folder} (key {Path(folder).name}: a run of this graph compiled there before)"
    )
    assert lines[1].startswith(f"compile:    will compile into {root}/") and folder not in lines[1]


def test_a_launch_gives_the_ranks_the_folder_and_writes_its_key(base, tmp_path, root, monkeypatch):
    # The launch preflight finds a (faked) trn2.48xlarge: 64 logical cores at LNC=2.
    monkeypatch.setattr(neuron, "device_hint", lambda: "torch_neuronx is installed")
    answer = {"importable": True, "available": True, "count": 64, "name": "trn2", "total_memory": 24 * GIB}
    monkeypatch.setattr(probe, "probe", lambda kind, env=None: {**answer, "version": "2.14.3.0+fake"})
    plan = _plan(base, tmp_path / "run", dry_run=False)
    folder, digest = Path(_folder(plan)), plan.platform.env[KEY_ENV]
    assert plan.platform.device_checked and folder == root / digest
    env = rank_env(plan.platform, tmp_path / "run")  # what torchrun gives every rank
    assert (env[CACHE_ENV], env[KEY_ENV]) == (str(folder), digest)
    assert plan.as_json()["platform"]["env"][CACHE_ENV] == str(folder)  # plan.json and platform.json
    record = json.loads((folder / "key.json").read_text())
    assert record["hash"] == digest == neuron_cache.key_hash(record["key"])
    assert record["key"]["training"]["seq_len"] == 256 and record["key"]["mesh"]["dp_shard"] == 2
    # Another launch of the graph (say a concurrent sweep job) leaves what is there as it is.
    neff = _fake_compiler().compile_into(folder)
    (folder / "key.json").write_text("written by another run\n")
    again = _plan(base, tmp_path / "run2", dry_run=False, name="again")
    assert _folder(again) == str(folder) and neff.exists()
    assert (folder / "key.json").read_text() == "written by another run\n"


def test_the_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    own, neuron_var = str(tmp_path / "own"), str(tmp_path / "neff")
    assert neuron_cache.root({neuron_cache.ROOT_ENV: own, CACHE_ENV: neuron_var}) == Path(own)
    assert neuron_cache.root({CACHE_ENV: neuron_var}) == Path(neuron_var)
    assert neuron_cache.root({"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == tmp_path / "xdg/qwen3exp/neuron-compile"
    assert neuron_cache.root({}) == tmp_path / "home/.cache/qwen3exp/neuron-compile"
