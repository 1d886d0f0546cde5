"""`parallelism=auto`, `training.local_batch_size=auto`, `training.activation_checkpoint=auto`: the plan
chooses the layout before anything starts (qwen3exp/plan/auto_layout.py), the dry run shows the
candidates, nothing fitting is exit 2 with the smallest change that fits, the chosen values are what
is recorded and launched, and a sweep point that does not fit is refused by the same plan (an
Optuna search goes on past it).

Fast tests plan in-process or run one dry run; the trn2 check builds torchtitan's model on the meta
device over a fake process group of 64 ranks; the slow ones train the tiny model for 2 steps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, compose, read_metrics, read_summary, run_cli
from qwen3exp.config.schema import validate_experiment
from qwen3exp.config.sections.parallelism import DEGREES
from qwen3exp.plan import auto_layout, memory, model_files
from qwen3exp.plan.build import make_plan
from qwen3exp.plan.memory_fit import DoesNotFit
from qwen3exp.platforms import resolve
from qwen3exp.titan.job_config import override_claims
from trn2_assets import QWEN3_4B_INSTRUCT_2507, overrides_for, write_folder

TWO_CPU_RANKS = ("platform=cpu", "launcher.nproc_per_node=2")
AUTO = ("parallelism=auto", "training.local_batch_size=auto")
EVERYTHING_AUTO = (*AUTO, "training.activation_checkpoint=auto")
TRN2 = ["trn2_qwen3_4b_native", "trn2_qwen3_4b_hf", "trn2_qwen3_30b_a3b_nki_moe", "trn2_qwen3_4b_nki_rope"]


def _plan(*overrides: str, run_dir: str = "/tmp/unused"):
    return make_plan(validate_experiment(compose(*overrides)), run_dir, claims_of=override_claims)


# ------------------------------------------------------------------------ 2 CPU ranks, planned
def test_dry_run_on_two_cpu_ranks_picks_a_layout_and_lists_the_candidates():
    r = run_cli(*TWO_CPU_RANKS, *AUTO, "dry_run=true")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "auto layout: parallelism.dp_replicate=1 parallelism.dp_shard=" in out
    assert "why this one:" in out and "  *1 " in out and "layout(s) estimated" in out
    assert "training.local_batch_size       " in out and "chosen by the plan: auto in command line" in out
    assert "predicted by qwen3exp/plan/layout_cost.py" in out


def test_the_chosen_values_are_the_experiment_recorded_and_launched():
    plan = _plan(*TWO_CPU_RANKS, *EVERYTHING_AUTO, "dry_run=true")
    exp, layout = plan.exp, plan.layout
    assert not exp.parallelism.auto and not exp.training.auto  # concrete: no key left to the plan
    recorded = exp.model_dump(mode="json")
    for key, value in layout.chosen.items():
        section, name = key.split(".")
        assert recorded[section][name] == value != "auto"
    m = plan.mesh
    assert (m.dp_replicate, m.dp_shard, m.tp, m.pp, m.cp, m.ep) == tuple(
        layout.chosen[f"parallelism.{k}"] for k in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")
    )
    assert m.world_size == 2 and plan.memory.fits
    assert (
        1 <= len(layout.top) <= auto_layout.SHOWN
        and layout.top[0].shape.local_batch_size == exp.training.local_batch_size
    )
    shown = plan.as_json()["auto_layout"]
    assert shown["chosen"] == layout.chosen and shown["top"][0]["layout"] == layout.top[0].describe()
    # The CPU's attention cannot be split by context parallelism: no candidate uses it.
    assert all(c.shape.degrees.cp == 1 for c in layout.top)


def test_a_given_degree_stays_fixed():
    plan = _plan(*TWO_CPU_RANKS, *AUTO, "parallelism.tp=2", "dry_run=true")
    assert plan.mesh.tp == 2 and plan.mesh.dp_shard == 1
    assert "parallelism.tp" not in plan.layout.chosen and "parallelism.dp_shard" in plan.layout.chosen


def test_a_budget_only_full_checkpointing_fits_picks_full():
    """The budget lies between the least memory any layout needs with activation_checkpoint=full and
    the least with selective (both from the plan's own search with room to spare)."""
    base = (*TWO_CPU_RANKS, *EVERYTHING_AUTO, "training.seq_len=2048", "dry_run=true")
    exp = validate_experiment(compose(*base))
    arch = model_files.check(exp).arch
    found = auto_layout.search(exp, arch, resolve(exp.platform, nproc_per_node=2, dry_run=True), lambda e: [])
    least = {
        mode: min(c.memory for c in found.fitting if c.shape.activation_checkpoint == mode)
        for mode in ("none", "selective", "full")
    }
    assert least["full"] < least["selective"] < least["none"], least
    gib = (least["full"] + least["selective"]) / 2 / memory.USABLE_FRACTION / 2**30
    plan = _plan(*base, f"platform.memory_per_rank_gib={gib!r}")
    assert plan.layout.chosen["training.activation_checkpoint"] == "full"
    assert plan.exp.training.activation_checkpoint == "full" and plan.memory.fits


def test_nothing_fits_exits_2_with_the_smallest_change_that_fits():
    with pytest.raises(DoesNotFit) as e:
        _plan(
            *TWO_CPU_RANKS,
            "parallelism=auto",
            "model.flavor=8B",
            "training.local_batch_size=8",
            "platform.memory_per_rank_gib=4",
        )
    (p,) = e.value.problems
    assert p.key == "parallelism" and p.value == "auto" and "no layout fits" in p.message
    assert "smallest change that fits: launcher.nnodes=" in p.hint and "training.activation_checkpoint=full" in p.hint
    r = run_cli(*TWO_CPU_RANKS, "parallelism=auto", "platform.memory_per_rank_gib=0.001")
    assert r.returncode == 2 and "no layout fits" in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


# ----------------------------------------------------- trn2 on 64 ranks: torchtitan accepts it
ACCEPT = r"""
import json, os, sys, tempfile
from pathlib import Path
from qwen3exp.platforms import PlatformFacts, prepare_worker, resolve
from qwen3exp.config.sections.platform import CpuPlatform
prepare_worker(resolve(CpuPlatform()))
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchtitan.config.override import apply_overrides
from torchtitan.distributed import ParallelDims
from qwen3exp.config.schema import parse_experiment
from qwen3exp.titan.job_config import to_torchtitan

def accept(case):
    # What Trainer.__init__ does up to the parallelized model: the mesh, the model on the meta
    # device, the overrides, and the model's own parallelize function (FSDP, TP, EP, AC).
    exp, facts, folder = parse_experiment(case["exp"]), PlatformFacts(**case["facts"]), Path(tempfile.mkdtemp())
    config = to_torchtitan(exp, facts, folder)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=case["world"])
    dims = ParallelDims.from_config(config.parallelism, case["world"])
    spec = config.model_spec
    spec.model.update_from_config(config=config)
    if config.override.imports:
        apply_overrides(config.override, config)
    with torch.device("meta"):
        model = spec.model.build()
    if dims.pp_enabled:
        return {"parallelized": False}
    spec.parallelize_fn(model, parallel_dims=dims, training=config.training, parallelism=config.parallelism,
                        compile_config=config.compile, ac_config=config.activation_checkpoint, dump_folder=str(folder))
    return {"parallelized": True}

# One forked child per case: torchtitan keeps mesh state between parallelize calls in one process.
out = []
for case in json.loads(sys.stdin.read()):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = accept(case)
        except BaseException as e:
            res = {"error": repr(e)[:3000]}
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out.append(json.loads(f.read()))
    os.waitpid(pid, 0)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("name", TRN2)
def test_trn2_parallelism_auto_plans_on_64_ranks(name):
    """`parallelism=auto` replaces the file's FSDP over 64 ranks: every degree is chosen (a dry run,
    Neuron from the table); a degree given on the command line stays."""
    plan = _plan(f"experiment={name}", *overrides_for(name), "parallelism=auto")
    assert plan.mesh.world_size == 64 and plan.memory.fits and plan.layout is not None
    assert set(plan.layout.keys) == {f"parallelism.{d}" for d in DEGREES}
    fixed = _plan(f"experiment={name}", *overrides_for(name), "parallelism=auto", "parallelism.tp=1")
    assert "parallelism.tp" not in fixed.layout.keys and fixed.exp.parallelism.tp == 1


# https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (the values that differ from the 4B's)
QWEN3_8B = {
    **QWEN3_4B_INSTRUCT_2507,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "tie_word_embeddings": False,
    "rope_theta": 1000000,
    "max_position_embeddings": 40960,
}


def test_the_auto_layout_keeps_the_global_batch_by_accumulation(tmp_path):
    """Issue 39: trn2_qwen3_4b_hf with an 8B config.json at seq 8192: parallelism=auto chose tp 4 x dp 16
    and trained 16 sequences a step where parallelism=fsdp (every rank data-parallel) trains 128. The
    chosen layout now keeps the default layout's global batch by gradient accumulation, and says so."""
    folder = write_folder(tmp_path / "Qwen3-8B", QWEN3_8B, weights=True)
    base = ("experiment=trn2_qwen3_4b_hf", f"model.hf_assets_path={folder}", "training.seq_len=8192", "dry_run=true")
    fsdp = _plan(*base, "parallelism=fsdp").batches
    assert (fsdp.local_batch_size, fsdp.grad_accum_steps, fsdp.global_batch_size) == (2, 1, 128)  # 64 ranks x 2
    plan = _plan(*base, "parallelism=auto", "training.activation_checkpoint=auto")
    b, m = plan.batches, plan.mesh
    assert m.tp > 1 and b.global_batch_size == 128 == b.local_batch_size * m.dp_shard * b.grad_accum_steps
    assert b.grad_accum_steps == 64 // m.dp_shard > 1 and plan.exp.training.global_batch_size == 128
    assert "global batch 128 sequences, kept" in plan.layout.global_batch
    # The issue's command (the local batch left to auto too): the global batch parallelism=fsdp gives.
    issue = (*base, "parallelism=auto", "training.local_batch_size=auto", "training.activation_checkpoint=auto")
    default = _plan(*base, *issue[-2:], "parallelism=fsdp").batches.global_batch_size
    r = run_cli(*issue, f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    chosen = _plan(*issue)
    b, dp = chosen.batches, chosen.mesh.dp_shard * chosen.mesh.dp_replicate
    assert chosen.mesh.tp > 1 and b.global_batch_size == default == 64 and b.grad_accum_steps == 64 // dp > 1
    assert f"global batch {default} sequences, kept (training.global_batch_size=-1)" in r.stdout
    line = f"batches:    local {b.local_batch_size} x dp {dp} x grad accumulation {b.grad_accum_steps} = global 64"
    assert line in r.stdout and "kept by the plan: -1 in schema default" in r.stdout


@pytest.mark.slow
def test_trn2_auto_layouts_are_accepted_by_torchtitan():
    """Each of the 4 trn2 experiments with the whole mesh, the batch and the checkpointing left to
    auto: torchtitan builds the chosen layout (its config checks, ParallelDims over 64 ranks, the
    model parallelized on the meta device over a fake process group)."""
    cases, chosen = [], {}
    for name in TRN2:
        plan = _plan(f"experiment={name}", *overrides_for(name), *EVERYTHING_AUTO)
        assert plan.mesh.world_size == 64 and plan.memory.fits, name
        chosen[name] = plan.layout.top[0].describe()
        facts = dataclasses.asdict(plan.platform)
        cases.append({"exp": plan.exp.model_dump(mode="json"), "facts": facts, "world": plan.mesh.world_size})
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", ACCEPT], input=json.dumps(cases), env=env, cwd=REPO, capture_output=True, text=True
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name, result in zip(TRN2, json.loads(line[len("RESULT ") :]), strict=True):
        assert "error" not in result, (name, chosen[name], result)


# ------------------------------------------------------------------------- slow: real trainings
@pytest.mark.slow
def test_auto_on_two_cpu_ranks_trains_within_its_budget(tmp_path):
    """A real 2-step run: the chosen values are in experiment.yaml and plan.json, and the ranks'
    measured peak (the platform's measure: resident memory, Python and torch included) stays within
    the memory per rank the plan chose for."""
    run = tmp_path / "run"
    budget_gib = 2.0
    r = run_cli(
        *TWO_CPU_RANKS,
        *AUTO,
        f"platform.memory_per_rank_gib={budget_gib}",
        "training.steps=2",
        "metrics.tensorboard=false",
        f"hydra.run.dir={run}",
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert read_summary(run)["status"] == "completed"
    recorded = yaml.safe_load((run / "experiment.yaml").read_text())
    plan = json.loads((run / "plan.json").read_text())
    chosen = plan["auto_layout"]["chosen"]
    assert recorded["training"]["local_batch_size"] == chosen["training.local_batch_size"] >= 1
    assert recorded["parallelism"]["dp_shard"] == chosen["parallelism.dp_shard"] == plan["mesh"]["dp_shard"]
    peak = max(row["memory_gib"] for row in read_metrics(run))
    assert 0 < peak <= budget_gib, peak


def _fit_search(tmp_path: Path) -> Path:
    """An Optuna search (grid sampler: both values, in some order) over a batch that fits and one
    that cannot fit in 1 GiB per rank; 2 steps, 1 rank, no validation."""
    conf = tmp_path / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "fit_search.yaml").write_text(
        "# @package _global_\n"
        "defaults:\n  - override /model: native\n  - override /platform: cpu\n"
        "  - override /hydra/sweeper: optuna\n  - override /hydra/sweeper/sampler: grid\n"
        "name: fit_search\n"
        "platform:\n  memory_per_rank_gib: 1.0\n"
        "launcher:\n  nproc_per_node: 1\n"
        "metrics:\n  tensorboard: false\n"
        "training:\n  steps: 2\n  seq_len: 64\n  warmup_steps: 1\n"
        "validation:\n  enable: false\n"
        "sweep:\n  objective: last_loss\n"
        "hydra:\n  sweeper:\n    direction: minimize\n    n_trials: 2\n    n_jobs: 1\n"
        "    study_name: fit_search\n    storage: sqlite:///${hydra.sweep.dir}/optuna.db\n"
        "    params:\n      training.local_batch_size: choice(2, 4096)\n"
    )
    return conf


@pytest.mark.slow
def test_an_optuna_trial_that_does_not_fit_is_refused_and_the_search_goes_on(tmp_path):
    import optuna

    d = tmp_path / "search"
    r = run_cli("--config-dir", str(_fit_search(tmp_path)), "-m", "experiment=fit_search", f"hydra.sweep.dir={d}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "training.local_batch_size=4096" in r.stderr and "the sweeper gets inf for it and goes on" in r.stderr
    assert "Traceback" not in r.stderr
    runs = [p.parent for p in d.glob("*/summary.json")]
    assert len(runs) == 1 and read_summary(runs[0])["status"] == "completed"  # only the one that fits ran
    assert yaml.safe_load((runs[0] / "experiment.yaml").read_text())["training"]["local_batch_size"] == 2
    study = optuna.load_study(study_name="fit_search", storage=f"sqlite:///{d}/optuna.db")
    values = sorted(t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    assert len(study.trials) == 2 and values[-1] == float("inf") and values[0] == read_summary(runs[0])["last_loss"]
