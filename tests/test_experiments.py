"""The walkthrough as versioned experiments: every `trn2_*` file plans and converts here with the
Neuron platform (dry run: no Trainium needed), and its CPU twin really trains here.

The trn2 files are found by globbing conf/experiment/, so a new one is covered automatically; each
names its twin on line 3 (`# CPU twin: NAME ...`), and the twin must share everything the hardware
does not force apart (backend, kernels, checkpoint kind, parallel degrees other than data
parallelism, compile on/off, resolved attention).
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import CONF, compose, read_metrics, read_summary
from qwen3exp.config.schema import validate_experiment
from qwen3exp.launchers.local import prepare
from runprocs import Background
from trn2_assets import overrides_for

EXPERIMENTS = CONF / "experiment"
TRN2 = sorted(p.stem for p in EXPERIMENTS.glob("trn2_*.yaml"))


def header(name: str) -> list[str]:
    """The comment lines after `# @package _global_`: the command, why, the CPU twin."""
    lines = (EXPERIMENTS / f"{name}.yaml").read_text().splitlines()
    assert lines[0] == "# @package _global_", f"{name}.yaml must start with '# @package _global_'"
    return lines[1:4]


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
    assert set(TRN2) >= {
        "trn2_qwen3_4b_native",
        "trn2_qwen3_4b_hf",
        "trn2_qwen3_30b_a3b_nki_moe",
        "trn2_qwen3_4b_nki_rope",
    }
    assert set(TWINS) >= {"tiny_native", "tiny_hf", "tiny_moe_nki", "tiny_nki_rope"}


@pytest.mark.parametrize("name", TRN2 + TWINS)
def test_experiment_file_starts_with_its_command_and_why(name):
    first, second = header(name)[:2]
    assert first.startswith(f"# python -m qwen3exp experiment={name}"), first
    assert second.startswith("# Why: ") and len(second) > 20, second


@pytest.mark.parametrize("name", TRN2)
def test_trn2_experiment_plans_and_converts_for_neuron(name, tmp_path):
    from qwen3exp.plan.attention_path import resolve
    from qwen3exp.titan.attention import CausalSDPAttention, DocumentSDPAttention
    from qwen3exp.titan.job_config import to_torchtitan

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
    # One conversation (SFT) or one side of a pair (DPO) per sequence: is_causal, no mask; packed text: a document mask.
    causal = resolve(exp, facts).causal
    assert causal == (exp.data.source == "preference" or exp.data.source == "chat" and not exp.data.pack)
    match exp.model.backend:
        case "native":
            inner = [layer.attention.inner_attention for layer in config.model_spec.model.layers]
            want = CausalSDPAttention.Config if causal else DocumentSDPAttention.Config
            assert inner and all(isinstance(a, want) for a in inner)
        case "hf":
            from qwen3exp.titan.hf_model import HFQwen3CausalSdpaModel, HFQwen3SdpaModel

            want = HFQwen3CausalSdpaModel.Config if causal else HFQwen3SdpaModel.Config
            assert type(config.model_spec.model) is want
    assert config.training.mixed_precision_param == "bfloat16"
    assert config.training.seq_len == exp.training.seq_len
    assert config.dump_folder == str(tmp_path)


@pytest.mark.parametrize("name", TRN2)
def test_trn2_plan_fits_the_hbm_of_a_logical_core(name, tmp_path):
    from qwen3exp.plan.build import make_plan
    from qwen3exp.titan.job_config import override_claims

    exp, _ = plan(name)
    p = make_plan(exp, tmp_path, claims_of=override_claims)
    assert p.memory.fits and not p.warnings, p.warnings
    assert p.platform.memory_per_rank_bytes == 24 * 2**30


@pytest.mark.parametrize("name", TRN2 + TWINS)
def test_kernel_overrides_replace_one_module_per_layer(name):
    """The walkthrough's check: one nki_rope per Qwen3 layer (36 for the 4B), one NKI MoE per MoE layer."""
    exp, prep = plan(name)
    n_layers = prep.files.arch.n_layers
    claimed = {o["key"]: len(o["nodes"]) for o in prep.overrides}
    expected = {
        k: n_layers
        for k, impl in (("kernels.rope", exp.kernels.rope.impl), ("kernels.moe", exp.kernels.moe.impl))
        if impl == "nki"
    }
    assert claimed == expected
    if name == "trn2_qwen3_4b_nki_rope":
        assert claimed == {"kernels.rope": 36}


def test_trn2_moe_is_the_reduced_30b_a3b():
    exp, prep = plan("trn2_qwen3_30b_a3b_nki_moe")
    arch = prep.files.arch
    assert (arch.n_layers, arch.moe.num_experts, arch.moe.top_k, arch.dim) == (4, 64, 4, 2048)
    assert (prep.mesh.dp_shard, prep.mesh.tp, prep.mesh.ep) == (64, 1, 1)
    assert exp.training.compile is False  # eager, as in the walkthrough


def test_trn2_compile_uses_the_neuron_backend(tmp_path):
    from qwen3exp.titan.job_config import to_torchtitan

    exp, prep = plan("trn2_qwen3_4b_native", "training.compile=true")
    config = to_torchtitan(exp, prep.facts, tmp_path)
    assert config.compile.enable and config.compile.backend == "neuron"


@pytest.mark.parametrize("name", [n for n in TRN2 if "_4b_" in n])
def test_trn2_4b_is_the_published_architecture(name):
    """The checkpoint's own config.json decides (rope theta 5e6, not the built-in 4B flavor's 1e6)."""
    _, prep = plan(name)
    arch = prep.files.arch
    assert (arch.n_layers, arch.dim, arch.n_heads, arch.n_kv_heads, arch.head_dim, arch.hidden_dim) == (
        36,
        2560,
        32,
        8,
        128,
        9728,
    )
    assert (arch.vocab_size, arch.tied, arch.rope_theta) == (151936, True, 5e6)


def test_trn2_hf_loads_and_exports_hugging_face_weights(tmp_path):
    from qwen3exp.titan.job_config import to_torchtitan
    from trn2_assets import standins

    exp, prep = plan("trn2_qwen3_4b_hf")
    assert prep.files.weights == standins()["4b"]
    config = to_torchtitan(exp, prep.facts, tmp_path)
    assert config.checkpoint.initial_load_in_hf and config.checkpoint.initial_load_path == str(standins()["4b"])
    assert config.checkpoint.export_root == str(tmp_path.resolve() / "export")
    assert config.checkpoint.export_dtype == "bfloat16" and not config.checkpoint.keep_dcp


def _structure(name: str, platform: str) -> dict:
    exp, prep = plan(name, f"platform={platform}")
    m = exp.model
    return {
        "model.backend": m.backend,
        "attention": prep.facts.attention if m.attention == "auto" else m.attention,
        "moe": prep.files.arch.is_moe,
        "kernels": exp.kernels.model_dump(),
        # Loading published weights is the one difference no hardware forces: no tiny published
        # checkpoint exists (tests/test_hf_checkpoints.py loads tiny checkpoints it writes itself).
        "checkpoint.exports": exp.checkpoint.exports,
        "checkpoint.dcp": exp.checkpoint.save,
        "parallelism": {k: v for k, v in exp.parallelism.model_dump().items() if k not in ("dp_shard", "dp_replicate")},
        "training.compile": exp.training.compile,
    }


@pytest.mark.parametrize("name", TRN2)
def test_cpu_twin_differs_only_where_the_hardware_forces_it(name):
    assert _structure(name, "neuron") == _structure(twin_of(name), "cpu")


# tiny_native is the default experiment: tests/test_cli.py already trains it to `completed` (12 steps).
TRAINED_TWINS = [t for t in TWINS if t != "tiny_native"]


@pytest.fixture(scope="module")
def twin_runs(tmp_path_factory):
    """Every twin trained for 3 steps through the real command line, the runs started side by side."""
    root = tmp_path_factory.mktemp("twins")
    steps = ("training.steps=3", "training.warmup_steps=1", "training.seq_len=128", "training.local_batch_size=4")
    procs = {
        twin: Background(
            f"experiment={twin}",
            *steps,
            "metrics.tensorboard=false",
            f"hydra.run.dir={root / twin}",
            folder=root / "logs" / twin,
        )  # fmt: skip
        for twin in TRAINED_TWINS
    }
    done = {twin: p.result(timeout=1200) for twin, p in procs.items()}
    return {twin: (root / twin, r.returncode, r.stdout + r.stderr) for twin, r in done.items()}


@pytest.mark.slow
@pytest.mark.parametrize("twin", TRAINED_TWINS)
def test_cpu_twin_trains_here(twin, twin_runs):
    run_dir, code, out = twin_runs[twin]
    assert code == 0, out[-4000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    # Twins keep platform=auto: here it picks the CPU, and the run records why.
    assert summary["platform"] == "cpu" and summary["world_size"] == 2
    platform = json.loads((run_dir / "platform.json").read_text())
    assert platform["name"] == "cpu" and platform["reason"].startswith("platform=auto: no CUDA GPU")
    losses = [row["loss"] for row in read_metrics(run_dir)]
    assert len(losses) == 3 and all(loss > 0 for loss in losses)
    exp, prep = plan(twin)
    if exp.checkpoint.exports:  # the twin of an export checks it too
        assert summary["export"]["ok"] and summary["export"]["unexpected_keys"] == []
    # the overrides really applied at run time (torchtitan's own log lines), one per layer
    assert {o["key"]: o["applied"] for o in summary["overrides"]} == {o["key"]: len(o["nodes"]) for o in prep.overrides}


def test_trn2_dpo_lora_plans_the_pairs_and_no_second_model(tmp_path):
    """The 4B's DPO: the base with the adapters off is the reference (no second model in the
    memory plan), one pair per rank and 64 per step, the pairs planned."""
    from qwen3exp.plan.build import make_plan
    from qwen3exp.plan.render import render

    exp, _ = plan("trn2_qwen3_4b_dpo_lora")
    assert (exp.objective.kind, exp.peft.kind, exp.data.source) == ("dpo", "lora", "preference")
    p = make_plan(exp, tmp_path)
    text = render(p)
    assert "objective=dpo" in text and "adapters switched off (no second model)" in text, text
    assert "pairs:      320 pairs" in text and "0 dropped" in text, text
    assert p.batches.global_batch_size == 128  # sequences: 64 pairs, chosen and rejected
