"""Platforms: cpu / cuda / neuron / auto resolution, the preflight of real launches, and the worker
preparation.

The Neuron path cannot run here (no Trainium, and the real torch-neuronx is not installable): it is
covered by contract tests against the fake `torch_neuronx` in tests/fakes, which does on import what
TorchNeuron documents. The fake is only ever imported in SUBPROCESSES (renaming PrivateUse1 cannot be
undone), either the device probe or a small script; the pytest process only puts its folder on
sys.path so that `find_spec("torch_neuronx")` sees an installed package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import typing
from dataclasses import asdict

import pytest

from conftest import REPO, read_summary, run_cli
from qwen3exp import platforms
from qwen3exp.config.schema import validate_experiment
from qwen3exp.config.sections.platform import AutoPlatform, CpuPlatform, CudaPlatform, NeuronPlatform, Platform
from qwen3exp.errors import ConfigError
from qwen3exp.platforms import PlatformFacts, cuda, experiment_problems, neuron, probe, resolve

FAKES = REPO / "tests" / "fakes"
GIB = 2**30


@pytest.fixture(autouse=True)
def _fresh_probe_cache(monkeypatch):
    monkeypatch.setattr(probe, "_cache", {})
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    for k in [k for k in os.environ if k.startswith("FAKE_NEURON")]:
        monkeypatch.delenv(k)


@pytest.fixture
def fake_neuron(monkeypatch):
    """Make the fake torch_neuronx 'installed': visible to find_spec here and importable in the
    probe subprocess. Yields a setter for the fake's knobs."""
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKES), str(REPO), os.environ.get("PYTHONPATH", "")]))
    return lambda **knobs: [monkeypatch.setenv(f"FAKE_NEURON_{k.upper()}", str(v)) for k, v in knobs.items()]


def _problems(exc: ConfigError) -> dict[str, str]:
    return {p.key: p.render() for p in exc.problems}


# -------------------------------------------------------------------------------- registry
def test_every_platform_section_has_its_module():
    """A platform is one module found by its section's class: every member of the schema's union
    (platform=auto is the registry's own resolution) has one, and error messages list them all."""
    members = typing.get_args(typing.get_args(Platform)[0])
    assert set(platforms.BY_SECTION) | {AutoPlatform} == set(members)
    assert all(m.NAME == m.SECTION.model_fields["name"].default for m in platforms.PLATFORMS)
    assert platforms.variant.ALLOWED == "auto, cpu, cuda, neuron"
    assert list(platforms.probed()) == ["cuda", "neuron"]


# ------------------------------------------------------------------------------------ auto
def test_auto_picks_cpu_here_and_says_why():
    assert cuda.device_hint() is None and neuron.device_hint() is None, "this test expects no accelerators"
    facts = resolve(AutoPlatform())
    assert facts.name == "cpu"
    assert "platform=auto" in facts.reason
    assert "no CUDA GPU" in facts.reason and "torch_neuronx is not installed" in facts.reason


def test_auto_prints_the_choice(tmp_path):
    """(A real run records it in platform.json: see test_experiments.py::test_cpu_twin_trains_here.)"""
    r = run_cli("dry_run=true", "platform=auto")
    assert r.returncode == 0, r.stderr
    assert "cpu (platform=auto: no CUDA GPU" in r.stdout
    assert "torch_neuronx is not installed: using cpu" in r.stdout


@pytest.mark.slow  # quick tier: a fresh interpreter imports torch (the probe or a worker's preparation)
def test_auto_picks_neuron_when_torch_neuronx_works(fake_neuron):
    facts = resolve(AutoPlatform())
    assert facts.name == "neuron" and facts.device_checked
    assert "platform=auto: 64 NeuronCore(s) visible (trn2)" in facts.reason
    assert facts.ranks_per_node == 64 and facts.lnc == 2


@pytest.mark.slow  # quick tier: a fresh interpreter imports torch (the probe or a worker's preparation)
def test_auto_falls_back_to_cpu_when_torch_neuronx_is_broken(fake_neuron):
    fake_neuron(import_error="WRONG PACKAGE: this is a placeholder")
    facts = resolve(AutoPlatform())
    assert facts.name == "cpu"
    assert "torch_neuronx is installed but no NeuronCore is usable" in facts.reason
    assert "WRONG PACKAGE" in facts.reason


def test_auto_picks_cuda_when_torch_sees_a_gpu(monkeypatch):
    _fake_gpus(monkeypatch, count=4)
    facts = resolve(AutoPlatform())
    assert facts.name == "cuda" and facts.reason.startswith("platform=auto: 4 CUDA GPU(s) visible (NVIDIA H100")


# ------------------------------------------------------------------------------------ neuron
def test_neuron_dry_run_plans_from_the_table_without_a_device():
    facts = resolve(NeuronPlatform(), dry_run=True)
    assert (facts.name, facts.device_type, facts.dist_backend) == ("neuron", "neuron", "neuron")
    assert (facts.attention, facts.compile_backend) == ("sdpa", "neuron")
    assert facts.ranks_per_node == 64 and facts.memory_per_rank_bytes == 24 * GIB
    assert not facts.device_checked and "device not checked (dry run)" in facts.reason
    assert facts.env["NEURON_LOGICAL_NC_CONFIG"] == "2"
    assert facts.run_dir_env == {} and "TORCH_NEURONX_NEFF_CACHE_DIR" in facts.env
    assert facts.peak_flops_per_rank == 2 * 79e12
    assert facts.comm_init_timeout_s == 1800


@pytest.mark.parametrize(
    "cfg, ranks, gib",
    [
        (dict(lnc=1), 128, 12),
        (dict(instance_type="trn2.3xlarge"), 4, 24),
        (dict(cores_per_node=32, hbm_per_core_gib=20), 32, 20),
    ],
)
def test_neuron_table_values(cfg, ranks, gib):
    facts = resolve(NeuronPlatform(**cfg), dry_run=True)
    assert (facts.ranks_per_node, facts.memory_per_rank_bytes) == (ranks, gib * GIB)


def test_neuron_user_compile_cache_and_runtime_env(tmp_path):
    facts = resolve(
        NeuronPlatform(compile_cache_dir=str(tmp_path / "neff"), runtime_env={"NEURON_RT_NUM_CORES": 4}), dry_run=True
    )
    assert facts.env == {
        "NEURON_LOGICAL_NC_CONFIG": "2",
        "NEURON_RT_NUM_CORES": "4",
        "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff"),
    }
    assert facts.run_dir_env == {}


def test_neuron_schema_errors_name_the_key():
    base = {"name": "x", "model": {"backend": "native", "flavor": "tiny"}}
    with pytest.raises(ConfigError) as e:
        validate_experiment({**base, "platform": {"name": "neuron", "lnc": 4}})
    assert "allowed: 1 or 2" in _problems(e.value)["platform.lnc"]
    with pytest.raises(ConfigError) as e:
        validate_experiment(
            {
                **base,
                "platform": {
                    "name": "neuron",
                    "instance_type": "trn2.48xl",
                    "runtime_env": {"NEURON_LOGICAL_NC_CONFIG": "1", "9BAD": "x"},
                },
            }
        )
    problems = _problems(e.value)
    assert "did you mean trn2.48xlarge?" in problems["platform.instance_type"]
    assert "is set by platform.lnc" in problems["platform.runtime_env.NEURON_LOGICAL_NC_CONFIG"]
    assert "not an environment variable name" in problems["platform.runtime_env.9BAD"]


def test_neuron_lnc_in_the_shell_must_agree(monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    with pytest.raises(ConfigError) as e:
        resolve(NeuronPlatform(lnc=2), dry_run=True)
    assert "disagrees with NEURON_LOGICAL_NC_CONFIG=1" in _problems(e.value)["platform.lnc"]
    assert resolve(NeuronPlatform(lnc=1), dry_run=True).ranks_per_node == 128


def test_neuron_more_ranks_than_cores_is_refused():
    assert resolve(NeuronPlatform(), dry_run=True).devices_per_node == 64
    r = run_cli("platform=neuron", "dry_run=true", "launcher.nproc_per_node=65")
    assert r.returncode == 2
    assert "launcher.nproc_per_node = 65" in r.stderr and "allowed: 1..64" in r.stderr


def test_neuron_real_launch_without_torch_neuronx_is_refused():
    assert neuron.device_hint() is None
    with pytest.raises(ConfigError) as e:
        resolve(NeuronPlatform(), dry_run=False)
    msg = _problems(e.value)["platform"]
    assert "torch_neuronx cannot be imported" in msg and "pip.repos.neuron.amazonaws.com" in msg


def test_cli_platform_neuron_without_torch_neuronx_exits_2_with_the_install_hint(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli("platform=neuron", f"hydra.run.dir={run_dir}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "torch_neuronx cannot be imported" in r.stderr
    assert "--extra-index-url https://pip.repos.neuron.amazonaws.com" in r.stderr
    assert "dry_run=true" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (run_dir / "summary.json").exists()


def test_cli_flex_attention_on_neuron_is_refused():
    r = run_cli("platform=neuron", "dry_run=true", "model.attention=flex")
    assert r.returncode == 2
    assert "model.attention = 'flex': FlexAttention is not available on Neuron" in r.stderr


@pytest.mark.slow  # quick tier: a fresh interpreter imports torch (the probe or a worker's preparation)
def test_neuron_real_launch_with_the_fake_device_is_checked(fake_neuron):
    facts = resolve(NeuronPlatform(), dry_run=False)
    assert facts.device_checked and facts.device_name == "trn2"
    assert facts.ranks_per_node == 64 and facts.memory_per_rank_bytes == 24 * GIB
    assert "64 logical NeuronCores at LNC=2 checked (torch-neuronx 2.14.3.0+fake)" in facts.reason


@pytest.mark.slow  # quick tier: a fresh interpreter imports torch (the probe or a worker's preparation)
def test_neuron_lnc_disagreeing_with_the_device_count_is_refused(fake_neuron):
    fake_neuron(device_count=128)  # a runtime that shows 128 logical cores although LNC=2 was asked
    with pytest.raises(ConfigError) as e:
        resolve(NeuronPlatform(lnc=2), dry_run=False)
    msg = _problems(e.value)["platform.lnc"]
    assert "disagrees with the device count: expected 64" in msg and "shows 128" in msg
    assert "set platform.lnc=1" in msg


@pytest.mark.slow  # quick tier: a fresh interpreter imports torch (the probe or a worker's preparation)
def test_neuron_other_instance_needs_its_table_entry(fake_neuron):
    fake_neuron(physical_cores=8)  # one Trainium2 chip: 4 logical cores at LNC=2
    with pytest.raises(ConfigError) as e:
        resolve(NeuronPlatform(), dry_run=False)
    assert "set platform.instance_type" in _problems(e.value)["platform.lnc"]
    assert resolve(NeuronPlatform(instance_type="trn2.3xlarge"), dry_run=False).ranks_per_node == 4


@pytest.mark.slow  # quick tier: a fresh interpreter imports torch (the probe or a worker's preparation)
def test_neuron_placeholder_package_is_refused_with_the_hint(fake_neuron):
    fake_neuron(import_error="WRONG PACKAGE")
    with pytest.raises(ConfigError) as e:
        resolve(NeuronPlatform(), dry_run=False)
    msg = _problems(e.value)["platform"]
    assert "RuntimeError: WRONG PACKAGE" in msg and "pip.repos.neuron.amazonaws.com" in msg


# --------------------------------------------------------------------------- neuron worker side
def _run_script(code: str, env: dict[str, str] | None = None, fake: bool = True) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NEURON", "NEURON_"))}
    full["PYTHONPATH"] = os.pathsep.join([str(FAKES)] * fake + [str(REPO)])
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True, timeout=300
    )


def _facts_json(**over) -> str:
    facts = resolve(NeuronPlatform(), dry_run=True)
    return json.dumps({**asdict(facts), **over})


PREPARE = """
    import json, os, sys
    from qwen3exp.platforms import PlatformFacts, prepare_worker
    facts = PlatformFacts(**json.loads(sys.argv[1] if len(sys.argv) > 1 else os.environ["FACTS"]))
"""


@pytest.mark.slow  # quick tier: a fresh interpreter imports torch (the probe or a worker's preparation)
def test_neuron_prepare_worker_makes_torchtitan_pick_neuron():
    # The fake registers the backend without claiming the device (FAKE_NEURON_NO_DEVICE_MAP): the
    # map entry torchtitan needs then exists only because prepare_worker adds it.
    r = _run_script(
        PREPARE
        + """
    import multiprocessing
    import torch, torch_neuronx, torch.distributed as dist
    before = dist.Backend.default_device_backend_map.get("neuron")
    prepare_worker(facts)
    from torchtitan.tools import utils
    print(json.dumps({"before": before, "device_type": utils.device_type,
                      "backend": dist.Backend.default_device_backend_map.get(utils.device_type),
                      "module": utils.device_module.__name__, "start": multiprocessing.get_start_method()}))
    """,
        env={
            "FACTS": _facts_json(),
            "NEURON_LOGICAL_NC_CONFIG": "2",
            "FAKE_NEURON_NO_DEVICE_MAP": "1",
            "LOCAL_WORLD_SIZE": "64",
        },
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {
        "before": None,
        "device_type": "neuron",
        "backend": "neuron",
        "module": "torch.neuron",
        "start": "spawn",
    }


@pytest.mark.parametrize(
    "env, fake, message",
    [
        ({}, False, "torch_neuronx cannot be imported"),
        ({"FAKE_NEURON_IMPORT_ERROR": "WRONG PACKAGE"}, True, "WRONG PACKAGE"),
        ({"FAKE_NEURON_NO_BACKEND": "1"}, True, "did not register the 'neuron' process-group backend"),
        ({"NEURON_LOGICAL_NC_CONFIG": "1"}, True, "NEURON_LOGICAL_NC_CONFIG='1' but the run was planned with LNC=2"),
        ({"LOCAL_WORLD_SIZE": "96", "FAKE_NEURON_PHYSICAL_CORES": "128"}, True, "96 ranks on this node"),
        ({"IMPORT_TORCHTITAN_FIRST": "1"}, True, "must be prepared before torchtitan is imported"),
    ],
)
@pytest.mark.slow  # quick tier: a fresh interpreter imports torch (the probe or a worker's preparation)
def test_neuron_prepare_worker_fails_clearly(env, fake, message):
    env = {"FACTS": _facts_json(), "NEURON_LOGICAL_NC_CONFIG": "2", **env}
    r = _run_script(
        PREPARE
        + """
    if os.environ.get("IMPORT_TORCHTITAN_FIRST"):
        import torchtitan.tools.utils
    prepare_worker(facts)
    """,
        env=env,
        fake=fake,
    )
    assert r.returncode != 0
    assert message in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_neuron_real_launch_reaches_the_neuron_process_group(tmp_path):
    """The whole Neuron path as far as a fake can go: the launcher's preflight probes the (fake)
    device, the rank gets LNC and the compile cache, prepares the platform, and torchtitan sets
    device neuron:0 and asks torch.distributed for the `neuron` backend with the raised timeout;
    there the fake stops (it has no collectives)."""
    run_dir = tmp_path / "run"
    r = run_cli(
        "experiment=trn2_qwen3_4b_native",
        "launcher.nproc_per_node=1",
        f"hydra.run.dir={run_dir}",
        f"model.hf_assets_path={REPO / 'qwen3exp' / 'assets' / 'tokenizer'}",
        env={"PYTHONPATH": os.pathsep.join([str(FAKES), str(REPO)]), "QWEN3EXP_NEURON_CACHE": str(tmp_path / "neff")},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    platform = json.loads((run_dir / "platform.json").read_text())
    assert platform["name"] == "neuron" and platform["device_checked"] and platform["lnc"] == 2
    error = read_summary(run_dir)["error"]
    assert "fake torch_neuronx: process group 'neuron' requested (rank 0 of 1, timeout 1800s" in error
    assert "NEURON_LOGICAL_NC_CONFIG=2" in error
    key = platform["env"]["QWEN3EXP_NEURON_CACHE_KEY"]  # the shared cache's folder of this graph
    assert f"TORCH_NEURONX_NEFF_CACHE_DIR={tmp_path / 'neff'}/{key}," in error
    assert "set_device(neuron:0)" in error


# ------------------------------------------------------------------------------------ cuda
def _fake_gpus(monkeypatch, *, count: int):
    """The probe's contract, faked in-process: what the subprocess would report on a GPU host."""
    monkeypatch.setattr(cuda, "device_hint", lambda: "/dev/nvidia0 exists")
    monkeypatch.setattr(
        probe,
        "probe",
        lambda kind, env=None: {
            "kind": "cuda",
            "available": True,
            "count": count,
            "name": "NVIDIA H100 80GB HBM3",
            "total_memory": 80 * GIB,
            "peak_flops": 989e12,
            "torch_cuda": "13.0",
            "error": None,
        },
    )


def test_cuda_uses_torchtitan_defaults_and_the_probed_gpus(monkeypatch):
    _fake_gpus(monkeypatch, count=4)
    facts = resolve(CudaPlatform())
    assert (facts.device_type, facts.dist_backend, facts.attention, facts.compile_backend) == (
        "cuda",
        "nccl",
        "flex",
        "inductor",
    )
    assert facts.ranks_per_node == 4 and facts.memory_per_rank_bytes == 80 * GIB
    assert facts.peak_flops_per_rank == 989e12 and facts.device_checked and not facts.force_sum_reductions
    assert facts.devices_per_node == 4 and facts.devices_exclusive  # the plan refuses a 5th rank
    with pytest.raises(ConfigError) as e:
        resolve(CudaPlatform(gpus_per_node=5))
    assert "more ranks than visible GPUs (4)" in _problems(e.value)["platform.gpus_per_node"]


def test_cuda_without_gpu_real_launch_is_refused_and_dry_run_plans():
    with pytest.raises(ConfigError) as e:
        resolve(CudaPlatform(), dry_run=False)
    assert "no CUDA GPU is usable here" in _problems(e.value)["platform"]
    facts = resolve(CudaPlatform(), dry_run=True)
    assert not facts.device_checked and facts.ranks_per_node == 8 and facts.memory_per_rank_bytes == 80 * GIB
    assert "device not checked (dry run" in facts.reason


@pytest.mark.slow  # quick tier: a fresh interpreter imports torch (the probe or a worker's preparation)
def test_cuda_probe_here_reports_no_gpu():
    info = probe.probe("cuda")
    assert info["available"] is False and info["count"] == 0


@pytest.mark.slow  # quick tier: a fresh interpreter imports torch (the probe or a worker's preparation)
def test_cuda_prepare_worker_refuses_a_rank_without_gpu():
    facts = json.dumps(
        asdict(
            PlatformFacts(
                name="cuda",
                reason="test",
                device_type="cuda",
                dist_backend="nccl",
                ranks_per_node=1,
                memory_per_rank_bytes=1,
                attention="flex",
                compile_backend="inductor",
                peak_flops_per_rank=None,
            )
        )
    )
    r = _run_script(PREPARE + "    prepare_worker(facts)\n", env={"FACTS": facts}, fake=False)
    assert r.returncode != 0 and "torch.cuda.is_available() is False in this rank" in r.stderr


# ------------------------------------------------------------------------------------ cpu
def test_flex_attention_on_cpu_is_refused():
    exp = validate_experiment(
        {
            "name": "x",
            "model": {"backend": "native", "flavor": "tiny", "attention": "flex"},
            "platform": {"name": "cpu"},
        }
    )
    problems = experiment_problems(exp, resolve(CpuPlatform()))
    assert "FlexAttention has no backward on the CPU" in _problems(ConfigError(problems))["model.attention"]
