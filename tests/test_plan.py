"""The plan of a dry run: parameter counts against torchtitan's own model, memory arithmetic,
provenance, the composition cache, the printed plan, and plan.json of a real run."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CONF, REPO, read_summary, run_cli
from qwen3exp.config.composer import Composer
from qwen3exp.config.schema import validate_experiment
from qwen3exp.config.sections.model import NativeModel
from qwen3exp.errors import ConfigError
from qwen3exp.plan import memory
from qwen3exp.plan.build import make_plan
from qwen3exp.plan.mesh import mesh_problems
from qwen3exp.platforms import PlatformFacts

# ------------------------------------------------------- parameters: plan vs torchtitan's model
# Runs in a subprocess (torchtitan must be imported after the CPU platform is prepared): builds each
# model with torchtitan on the meta device and counts numel; with world > 1, also applies
# torchtitan's own parallelize_qwen3 (FSDP / TP / EP) on a fake process group of that size and
# counts rank 0's local shards.
COUNT_SCRIPT = r"""
import json, os, sys
from qwen3exp.platforms import prepare_worker, resolve
from qwen3exp.config.sections.model import NativeModel
from qwen3exp.config.sections.platform import CpuPlatform
prepare_worker(resolve(CpuPlatform()))
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.models.qwen3 import parallelize_qwen3
from torchtitan.trainer import Trainer
from qwen3exp.titan.model import qwen3_model_config

def count(c):
    arch = NativeModel(**c["model"]).arch()
    world, tp, ep = c["world"], c.get("tp", 1), c.get("ep", 1)
    pc = ParallelismConfig(data_parallel_shard_degree=world // tp, tensor_parallel_degree=tp, expert_parallel_degree=ep)
    mc = qwen3_model_config(arch, attention="sdpa")
    mc.update_from_config(config=Trainer.Config(parallelism=pc))
    with torch.device("meta"):
        model = mc.build()
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".routed_experts." in n)
    active = total - expert + (expert * arch.moe.top_k // arch.moe.num_experts if arch.moe else 0)
    local = None
    if world > 1:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        model = parallelize_qwen3(model, parallel_dims=ParallelDims.from_config(pc, world), training=TrainingConfig(),
                                  parallelism=pc, compile_config=CompileConfig(), ac_config=None, dump_folder="/tmp")
        if arch.tied:  # the trainer re-ties in init_states, after parallelize
            model.tok_embeddings.weight = model.lm_head.weight
        local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    return {"total": total, "active": active, "local": local}

# One forked child per case: torchtitan keeps mesh state between parallelize calls in one process,
# and forking after the imports costs nothing.
out = []
for c in json.loads(sys.argv[1]):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = count(c)
        except BaseException as e:
            res = {"error": repr(e)}
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out.append(json.loads(f.read()))
    os.waitpid(pid, 0)
print("RESULT " + json.dumps(out))
"""

REDUCED_MOE = {"flavor": "30B-A3B", "n_layers": 4, "num_experts": 64, "top_k": 4}
COUNT_CASES = [
    {"model": REDUCED_MOE, "world": 4},
    {"model": REDUCED_MOE, "world": 4, "ep": 2},
    {"model": {"flavor": "tiny_moe"}, "world": 16},  # more ranks than experts: FSDP on dim 1
    {"model": {"flavor": "tiny_moe"}, "world": 4, "tp": 2},  # experts split by tp on their hidden dim
    {"model": {"flavor": "tiny"}, "world": 1},
    {"model": {"flavor": "tiny"}, "world": 4},
    {"model": {"flavor": "tiny"}, "world": 4, "tp": 2},
    {"model": {"backend": "native", "flavor": "0.6B"}, "world": 8},
    {"model": {"flavor": "4B"}, "world": 2},
]


@pytest.fixture(scope="module")
def titan_counts() -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", COUNT_SCRIPT, json.dumps(COUNT_CASES)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT ") :])


def _exp(data: dict):
    """An experiment from a few sections (Hydra always supplies the union tags; here they are added)."""
    merged = {"name": "t", **data, "model": {"backend": "native", "flavor": "tiny", **data.get("model", {})}}
    if "launcher" in merged:
        merged["launcher"] = {"kind": "local", **merged["launcher"]}
    return validate_experiment(merged)


def _plan_for(case: dict):
    m = case["model"]
    overrides = {
        "name": "t",
        "dry_run": True,
        "model": {"backend": "native", **m},
        "launcher": {"kind": "local", "nproc_per_node": case["world"]},
        "parallelism": {"tp": case.get("tp", 1), "ep": case.get("ep", 1)},
        "training": {"seq_len": 64},
        "platform": {"name": "cpu"},
    }
    return make_plan(_exp(overrides), "/tmp/unused")


@pytest.mark.parametrize(
    "i",
    range(len(COUNT_CASES)),
    ids=[f"{c['model']['flavor']}-w{c['world']}-tp{c.get('tp', 1)}-ep{c.get('ep', 1)}" for c in COUNT_CASES],
)
@pytest.mark.slow  # quick tier: builds torchtitan's models
def test_parameter_counts_equal_torchtitans(i, titan_counts):
    case, titan = COUNT_CASES[i], titan_counts[i]
    assert "error" not in titan, titan
    plan = _plan_for(case)
    assert plan.parameters.total == titan["total"]
    assert plan.parameters.active_per_token == titan["active"]
    assert plan.parameters.is_moe == ("num_experts" in case["model"] or "moe" in case["model"]["flavor"])
    if titan["local"] is not None:
        assert plan.parameters.per_rank == titan["local"]
    else:
        assert plan.parameters.per_rank == titan["total"]


def test_required_flavors_are_covered():
    flavors = {c["model"]["flavor"] for c in COUNT_CASES}
    assert {"tiny", "0.6B", "4B", "30B-A3B"} <= flavors


# -------------------------------------------------------------------------- memory arithmetic
@pytest.mark.parametrize("dtype,nbytes", [("float32", 4), ("bfloat16", 2)])
@pytest.mark.parametrize("world,tp", [(1, 1), (2, 1), (8, 2)])
def test_state_memory_is_the_arithmetic(dtype, nbytes, world, tp):
    exp = _exp(
        {
            "name": "t",
            "dry_run": True,
            "model": {"backend": "native", "flavor": "0.6B"},
            "launcher": {"kind": "local", "nproc_per_node": world},
            "parallelism": {"tp": tp},
            "training": {"dtype": dtype, "mixed_precision_param": "bfloat16", "seq_len": 128},
            "platform": {"name": "cpu", "ranks_per_node": world},
        }
    )
    plan = make_plan(exp, "/tmp/unused")
    arch = NativeModel(flavor="0.6B").arch()
    # Independent arithmetic: each tensor split by tp on its tp dim, then by FSDP on dim 0, rounded up.
    per_rank = 0
    for t in memory.param_tensors(arch):
        shape = list(t.shape)
        if t.tp_dim is not None:
            shape[t.tp_dim] = math.ceil(shape[t.tp_dim] / tp)
        shape[0] = math.ceil(shape[0] / (world // tp))
        per_rank += math.prod(shape)
    if world == 1:
        assert per_rank == sum(arch.param_counts()[:1])
    m = plan.memory
    assert plan.parameters.per_rank == per_rank
    assert m.parameters == per_rank * nbytes
    assert m.gradients == per_rank * nbytes
    assert m.optimizer == 2 * per_rank * nbytes
    assert m.total == m.parameters + m.gradients + m.optimizer + m.fsdp_buffers + m.activations + m.attention_mask
    assert m.usable == int(m.budget * memory.USABLE_FRACTION)
    assert m.headroom == m.usable - (m.total + m.transients) and m.transients > 0
    assert m.peak == m.total + m.transients + m.retained + m.runtime
    assert (m.fsdp_buffers == 0) == (world // tp == 1)


def test_activation_checkpointing_lowers_activations():
    def acts(mode):
        exp = _exp(
            {
                "name": "t",
                "dry_run": True,
                "model": {"backend": "native", "flavor": "0.6B"},
                "training": {"activation_checkpoint": mode, "seq_len": 2048},
            }
        )
        return make_plan(exp, "/tmp/unused").memory.activations

    none, selective, full = acts("none"), acts("selective"), acts("full")
    assert none > selective > full > 0
    # Twice the tokens, about twice the activations.
    exp = _exp(
        {
            "name": "t",
            "dry_run": True,
            "model": {"backend": "native", "flavor": "0.6B"},
            "training": {"local_batch_size": 16, "seq_len": 2048},
        }
    )
    assert make_plan(exp, "/tmp/unused").memory.activations == pytest.approx(2 * none, rel=0.01)


def test_not_fitting_is_an_error_unless_dry_run():
    data = {
        "name": "t",
        "model": {"backend": "native", "flavor": "4B"},
        "platform": {"name": "cpu", "memory_per_rank_gib": 8},
    }
    with pytest.raises(ConfigError) as e:
        make_plan(_exp(data), "/tmp/unused")
    assert e.value.problems[0].key == "model.flavor"
    plan = make_plan(_exp({**data, "dry_run": True}), "/tmp/unused")
    assert not plan.memory.fits and plan.memory.headroom < 0
    assert any("DOES NOT FIT" in w for w in plan.warnings)


# ---------------------------------------------------------------------- platform vs devices
def _facts(devices: int, exclusive: bool) -> PlatformFacts:
    return PlatformFacts(
        name="cuda",
        reason="test",
        device_type="cuda",
        dist_backend="nccl",
        ranks_per_node=8,
        memory_per_rank_bytes=80 * 2**30,
        attention="flex",
        compile_backend="inductor",
        peak_flops_per_rank=1e15,
        devices_per_node=devices,
        devices_exclusive=exclusive,
    )


def test_more_ranks_than_devices_is_an_error_on_accelerators():
    exp = _exp({"name": "t", "launcher": {"kind": "local", "nproc_per_node": 8}})
    mesh, problems = mesh_problems(exp.parallelism, exp.launcher, _facts(4, exclusive=True))
    assert mesh is None
    (p,) = problems
    assert p.key == "launcher.nproc_per_node" and p.value == 8 and p.allowed == "1..4"
    mesh, problems = mesh_problems(exp.parallelism, exp.launcher, _facts(4, exclusive=False))
    assert mesh is not None and not problems  # cpu cores may be shared: the plan warns instead


def test_cpu_oversubscription_is_a_warning():
    exp = _exp(
        {
            "name": "t",
            "dry_run": True,
            "launcher": {"kind": "local", "nproc_per_node": 64},
            "training": {"seq_len": 64, "local_batch_size": 1},
        }
    )
    plan = make_plan(exp, "/tmp/unused")
    assert any("64 ranks share" in w for w in plan.warnings)


# ------------------------------------------------------------------------ hooks and commands
def test_override_hook_and_multinode_commands(monkeypatch):
    from qwen3exp.plan.render import render

    exp = _exp(
        {
            "name": "t",
            "dry_run": True,
            "launcher": {"kind": "local", "nnodes": 2, "rdzv_endpoint": "head:29500", "nproc_per_node": 2},
        }
    )
    plan = make_plan(exp, "/tmp/run")
    assert "overrides:  none" in render(plan)
    assert [c[c.index("--node-rank") + 1] for c in plan.commands] == ["0", "1"]
    assert "node 1:" in render(plan)


@pytest.mark.slow  # quick tier: imports torchtitan to check the overrides
def test_dry_run_shows_kernel_overrides_with_node_counts(tmp_path):
    proc = run_cli("dry_run=true", "kernels=nki_rope", f"hydra.run.dir={tmp_path}/run")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("overrides:"))
    assert "on 2 node(s)" in line, line  # one rotary embedding per layer of the tiny model


# --------------------------------------------------------------- composition cache, provenance
POINTS = [
    [],
    ["training.steps=7", "name=x"],
    ["model=native", "model.flavor=tiny_moe", "+training.extra=1"],
    ["experiment=tiny_native", "~training.compile"],
    ["parallelism.tp=2", "hydra.run.dir=/tmp/somewhere/${name}"],
    ["platform=cpu", "platform.ranks_per_node=1"],
]


def _compose_from_scratch(overrides: list[str]) -> tuple[dict, str]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from qwen3exp.config.names import register_resolvers

    register_resolvers()  # conf/config.yaml's run directory uses ${qwen3exp.stamp:}
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    GlobalHydra.instance().clear()
    run_dir = str(cfg.hydra.run.dir)
    job = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    return OmegaConf.to_container(job, resolve=True), run_dir


def test_cached_composition_equals_hydra_compose():
    from qwen3exp.config.compose import experiment_data

    expected = [_compose_from_scratch(p) for p in POINTS]
    with Composer() as c:
        got = [c.compose(p) for p in POINTS]
        again = [c.compose(p) for p in POINTS]
    assert all(a is b for a, b in zip(got, again, strict=True))  # cached by the overrides
    for (data, run_dir), cfg in zip(expected, got, strict=True):
        assert experiment_data(cfg)[0] == data
        assert str(cfg.hydra.run.dir).rsplit("/", 1)[0] == run_dir.rsplit("/", 1)[0]  # up to the timestamp


def test_unknown_keys_are_all_reported():
    with Composer() as c, pytest.raises(ConfigError) as e:
        c.compose(["training.stepz=1", "trainng.lr=2", "training.steps=4"])
    assert [p.key for p in e.value.problems] == ["training.stepz", "trainng.lr"]


@pytest.fixture
def conf_copy(tmp_path) -> Path:
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    root = (conf / "config.yaml").read_text()
    (conf / "config.yaml").write_text(root.replace("  seed: 42\n", ""))  # now only the schema sets it
    (conf / "parallelism" / "tp2.yaml").write_text("dp_replicate: 1\ndp_shard: -1\ntp: 2\npp: 1\ncp: 1\nep: 1\n")
    (conf / "experiment" / "prov.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /parallelism: tp2\n\n"
        "name: prov\ntraining:\n  steps: 12\nmodel:\n  flavor: tiny\n"
    )
    return conf


def test_provenance_names_every_layer(conf_copy):
    from qwen3exp.config.compose import experiment_data
    from qwen3exp.config.schema import validate_experiment as validate
    from qwen3exp.launchers.points import HydraFiles

    overrides = ["experiment=prov", "training.lr=0.01", "data=bundled"]
    with Composer(conf_copy) as c:
        data, _ = experiment_data(c.compose(overrides))
        prov = HydraFiles(c.loader, "config").provenance(overrides)
    exp = validate(data)
    table = {k: (v, str(s)) for k, v, s in prov.table(exp.model_dump(mode="json"))}
    assert table["training.steps"] == (12, "experiment file conf/experiment/prov.yaml")
    assert table["parallelism.tp"] == (2, "group file conf/parallelism/tp2.yaml")  # swapped by the experiment
    assert table["training.lr"] == (0.01, "command line training.lr=0.01")
    assert table["training.seq_len"] == (256, "schema default")
    assert table["training.seed"] == (42, "schema default")
    assert table["data.source"] == ("bundled", "group file conf/data/bundled.yaml (chosen on the command line)")


# ------------------------------------------------------------------------ the command line
def test_dry_run_prints_the_plan_without_torch(tmp_path):
    code = (
        "import sys; from qwen3exp.cli import main; rc = main(sys.argv[1:]); "
        "heavy = sorted(m for m in ('torch', 'torchtitan', 'transformers') if m in sys.modules); "
        "print('HEAVY', heavy); sys.exit(rc)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code, "dry_run=true", "model.flavor=4B", f"hydra.run.dir={tmp_path}/run"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "HEAVY []" in out
    assert not (tmp_path / "run").exists()
    import re

    assert re.search(r"\n  model\.flavor +4B +command line model\.flavor=4B\n", out), out
    assert re.search(r"\n  training\.steps +30 +experiment file conf/experiment/tiny_native\.yaml\n", out)
    assert re.search(r"\n  training\.seed +42 +schema default\n", out)
    for text in (
        "dp_shard: -1 -> 2 (world 2 / other degrees 1)",
        "parameters: total 4,022,468,096 (4.02B)",
        "per rank 2,011,234,048",
        "optimizer",
        "activations",
        "headroom",
        "!!! WARNING: DOES NOT FIT",
        "tokens:     4,096 per step, 2,048 per rank per step",
        "overrides:  none",
        "checkpoint: load=none save=none export=none: nothing is loaded (random",
        "-m qwen3exp.run.agent --nnodes 1 --nproc-per-node 2",
    ):
        assert text in out, out


def test_dry_run_sweep_plans_every_point(tmp_path):
    proc = run_cli(
        "-m",
        "dry_run=true",
        "model.flavor=tiny,tiny_moe",
        "training.seq_len=64,128",
        f"hydra.sweep.dir={tmp_path}/sweep",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("qwen3exp dry run:") == 4
    assert "=== sweep point 4/4" in proc.stdout
    assert "active per token 822,016" in proc.stdout  # tiny_moe
    assert f"{tmp_path}/sweep/model.flavor=tiny_moe,training.seq_len=128" in proc.stdout  # named by overrides
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_real_run_writes_plan_json(tmp_path):
    run = tmp_path / "run"
    proc = run_cli(
        "training.steps=2",
        "training.warmup_steps=0",
        "training.seq_len=64",
        "training.local_batch_size=2",
        "metrics.tensorboard=false",
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read_summary(run)["status"] == "completed"
    plan = json.loads((run / "plan.json").read_text())
    assert plan["parameters"]["total"] == NativeModel(flavor="tiny").arch().param_counts()[0]
    assert plan["mesh"]["world_size"] == 2 and plan["mesh"]["dp_shard"] == 2
    assert plan["memory"]["fits"] is True
    assert plan["provenance"]["training.steps"] == {"value": 2, "source": "command line training.steps=2"}
    assert plan["provenance"]["model.flavor"]["source"] == "schema default"
    assert plan["provenance"]["training.seq_len"]["source"] == "command line training.seq_len=64"
    assert plan["commands"] == [(run / "command.txt").read_text().strip()]
    assert plan["kernel_overrides"] == [] and plan["checkpoint"]["compatible"] is None


# ------------------------------------------------------------- the plan is what the launcher runs
def test_the_plan_holds_what_the_launcher_runs():
    """One resolve step: the plan carries the experiment, the checked files, the placement, the
    override claims and this node's torchrun command; plan.json shows the redacted commands."""
    exp = _exp({"name": "t", "launcher": {"kind": "local", "nproc_per_node": 2}})
    plan = make_plan(exp, "/tmp/run")
    assert plan.exp is exp and plan.files.arch == plan.arch and plan.kernel_claims == []
    assert plan.placement.nnodes == 1 and plan.placement.standalone
    assert plan.command[:7] == [sys.executable, "-m", "qwen3exp.run.agent", "--nnodes", "1", "--nproc-per-node", "2"]
    assert plan.command[-3:] == ["-m", "qwen3exp.worker.main", "/tmp/run"]
    # CPU ranks are forked from the agent (`forked_ranks`): torchrun is asked for that start method.
    assert plan.platform.name == "cpu" and plan.command[-5:-3] == ["--start-method", "fork"]
    assert plan.commands == [plan.command]
    assert "exp" not in plan.as_json() and "command" not in plan.as_json()


def test_the_launcher_and_a_plan_do_not_import_torch():
    """The launcher starts torchrun without importing torch or torchtitan (the ranks import them);
    a plain experiment is planned without them too."""
    code = (
        "import sys; sys.path.insert(0, 'tests'); from conftest import compose; "
        "from qwen3exp.config.schema import validate_experiment; from qwen3exp.plan.build import make_plan; "
        "import qwen3exp.launchers.local, qwen3exp.worker.main; "
        "make_plan(validate_experiment(compose()), '/tmp/unused'); "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchtitan')); "
        "assert not heavy, heavy"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr[-3000:]


REFUSE_IN_RANKS = """
import os
if os.environ.get("QWEN3EXP_TEST_REFUSE"):
    import qwen3exp.titan.job_config as job_config

    original = job_config.to_torchtitan

    def refuse(*args, **kwargs):  # only in the ranks (forked from the agent on the CPU: RANK is set then)
        if "RANK" not in os.environ:
            return original(*args, **kwargs)
        raise ValueError("training.local_batch_size (8) must be evenly divisible by "
                         "parallelism.pipeline_parallel_microbatch_size (3) (test)")

    job_config.to_torchtitan = refuse
"""


@pytest.mark.slow
def test_torchtitan_refusing_the_config_in_the_ranks_is_exit_2_before_any_step(tmp_path):
    """torchtitan's own checks run where Trainer.Config is built: in the ranks, for a plain
    experiment. A refusal stops torchrun at once (not restarted), exits 2 with the message and no
    traceback, and the launch leaves nothing behind."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(REFUSE_IN_RANKS)
    run = tmp_path / "run"
    proc = run_cli(
        "training.steps=3",
        "training.warmup_steps=1",
        "launcher.max_restarts=2",
        f"hydra.run.dir={run}",
        env={
            "QWEN3EXP_TEST_REFUSE": "1",
            "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]),
        },
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "(torchtitan Trainer.Config) = 'ValueError': training.local_batch_size (8) must be evenly" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "qwen3exp: step " not in proc.stdout and "training from step" not in proc.stdout  # no step ran
    assert not run.exists()  # the claim of this launch is released with what it wrote
