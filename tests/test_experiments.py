"""The walkthrough as versioned experiments: every `trn2_*` file plans and converts here with the
Neuron platform (dry run: no Trainium needed), and its CPU twin really trains here.

The trn2 files are found by globbing conf/experiment/, so a new one is covered automatically; each
names its twin on line 3 (`# CPU twin: NAME ...`), and the twin must share everything the hardware
does not force apart (backend, kernels, checkpoint kind, parallel degrees other than data
parallelism, compile on/off, resolved attention).
"""

from __future__ import annotations

import re
import pytest

from conftest import CONF, compose, read_metrics, read_summary, run_cli
from qwen3exp.launch import prepare
from qwen3exp.schema import validate_experiment
from trn2_assets import overrides_for

EXPERIMENTS = CONF / "experiment"
TRN2 = sorted(p.stem for p in EXPERIMENTS.glob("trn2_*.yaml"))


def header(name: str) -> list[str]:
    return (EXPERIMENTS / f"{name}.yaml").read_text().splitlines()[:3]


def twin_of(name: str) -> str:
    m = re.match(r"# CPU twin: (\w+)", header(name)[2])
    assert m, f"{name}.yaml line 3 must name its CPU twin ('# CPU twin: NAME ...')"
    return m.group(1)


TWINS = sorted({twin_of(n) for n in TRN2})


def plan(name: str, *overrides: str):
    extra = overrides_for(name) if name.startswith("trn2_") else ["dry_run=true"]
    data = compose(f"experiment={name}", *extra, *overrides)
    exp = validate_experiment(data)
    return exp, prepare(exp)


def test_the_walkthrough_files_exist():
    assert "trn2_qwen3_4b_native" in TRN2
    assert "tiny_native" in TWINS


@pytest.mark.parametrize("name", TRN2 + TWINS)
def test_experiment_file_starts_with_its_command_and_why(name):
    first, second = header(name)[:2]
    assert first.startswith(f"# python -m qwen3exp experiment={name}"), first
    assert second.startswith("# Why: ") and len(second) > 20, second


@pytest.mark.parametrize("name", TRN2)
def test_trn2_experiment_plans_and_converts_for_neuron(name, tmp_path):
    from qwen3exp.titan.attention import DocumentSDPAttention
    from qwen3exp.to_torchtitan import to_torchtitan

    exp, prep = plan(name, "platform=neuron")
    facts = prep.facts
    assert (facts.name, facts.device_type, facts.dist_backend) == ("neuron", "neuron", "neuron")
    assert not facts.device_checked and "device not checked (dry run)" in facts.reason
    assert prep.mesh.world_size == 64 and prep.mesh.nproc_per_node == 64
    assert exp.training.seq_len % (128 * facts.lnc) == 0, "Neuron kernels tile sequences by 128 x LNC"

    config = to_torchtitan(exp, facts, tmp_path)
    assert config.compile.backend == "neuron"
    assert config.compile.enable is exp.training.compile
    assert config.comm.init_timeout_seconds == 1800
    inner = [layer.attention.inner_attention for layer in config.model_spec.model.layers]
    assert inner and all(type(a) is DocumentSDPAttention.Config for a in inner)
    assert config.training.mixed_precision_param == "bfloat16"
    assert config.training.seq_len == exp.training.seq_len
    assert config.dump_folder == str(tmp_path)


def test_trn2_compile_uses_the_neuron_backend(tmp_path):
    from qwen3exp.to_torchtitan import to_torchtitan

    exp, prep = plan("trn2_qwen3_4b_native", "training.compile=true")
    config = to_torchtitan(exp, prep.facts, tmp_path)
    assert config.compile.enable and config.compile.backend == "neuron"


def test_trn2_native_is_the_4b_architecture(tmp_path):
    exp, _ = plan("trn2_qwen3_4b_native")
    arch = exp.model.arch()
    assert (arch.n_layers, arch.dim, arch.n_heads, arch.n_kv_heads, arch.vocab_size, arch.tied) == \
        (36, 2560, 32, 8, 151936, True)


def _structure(name: str, platform: str) -> dict:
    exp, prep = plan(name, f"platform={platform}")
    m = exp.model
    return {
        "model.backend": m.backend,
        "attention": prep.facts.attention if getattr(m, "attention", "auto") == "auto" else m.attention,
        "moe": m.arch().is_moe if m.arch() else None,
        "kernels": exp.kernels.model_dump(),
        "checkpoint.kind": exp.checkpoint.kind,
        "parallelism": {k: v for k, v in exp.parallelism.model_dump().items() if k not in ("dp_shard", "dp_replicate")},
        "training.compile": exp.training.compile,
    }


@pytest.mark.parametrize("name", TRN2)
def test_cpu_twin_differs_only_where_the_hardware_forces_it(name):
    assert _structure(name, "neuron") == _structure(twin_of(name), "cpu")


@pytest.mark.slow
# tiny_native is the default experiment: tests/test_cli.py already trains it to `completed` (12 steps).
@pytest.mark.parametrize("twin", [t for t in TWINS if t != "tiny_native"] or [pytest.param("none", marks=pytest.mark.skip)])
def test_cpu_twin_trains_here(twin, tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(f"experiment={twin}", "platform=cpu", "training.steps=3", "training.warmup_steps=1",
                "training.seq_len=128", "training.local_batch_size=4",
                "metrics.tensorboard=false", f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    assert summary["platform"] == "cpu"
    losses = [row["loss"] for row in read_metrics(run_dir)]
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
