"""Benchmark: chat SFT's data pipeline against its training, and LoRA's memory against a full fine-tune.

    python tests/bench/bench_sft.py [--quick] [--ranks 2] [--checkpoint DIR] [--workdir DIR] [--skip data|memory]

Printed side by side in one run:
1. Data against training, experiment=tiny_sft (data=chat: the bundled conversations, the tiny native
   model, 2 CPU ranks). The training's tokens/s is the run's own (`python -m qwen3exp
   experiment=tiny_sft`): summary.json's `tokens_per_second`, torchtitan's throughput of rank 0
   (sequence positions, padding included, per second), mean after the first step. The data
   pipeline's tokens/s is the same unit from the rank's own dataloader, built in this process from
   that run's experiment.yaml exactly as the rank builds it (`qwen3exp.titan.chat_dataset`:
   `loader_config`, `ChatDataLoader` over `ChatDataset`: read, render with the chat template,
   tokenize, mask, fit to seq_len, pack or pad, collate), data-parallel rank 0 of the run's world,
   one thread; `data.pack=false` and `true`. Goal: data / training >= 10 (data never limits a step).
2. Memory per rank, LoRA (`peft=lora`) against a full fine-tune (`peft=none`) of a random
   Qwen3-0.6B-shaped checkpoint (tests/hf_fixtures.py `write_0p6b_checkpoint`): `model=native
   model.flavor=auto checkpoint=hf_load` on the bundled conversations (`data.max_len_policy=truncate`
   at a small seq_len), `training.dtype=bfloat16` with float32 compute, validation off. For each run:
   the peak resident memory of every rank (sampled every 0.1 s for the whole run, loading included:
   `bench_hf_0p6b.Sampler`), metrics.jsonl's largest `memory_gib` (rank 0's peak within a step), and
   plan.json's `memory.total` (the model only: no Python/torch runtime); then LoRA / full of each.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import yaml
from bench_hf_0p6b import ENV, GIB, REPO, Sampler  # first: it puts the repository and tests/ on sys.path

from hf_fixtures import write_0p6b_checkpoint
from qwen3exp.config.schema import validate_experiment

GOAL = 10.0
"""Data tokens/s over training tokens/s at least this: the data pipeline never limits a step."""
QUICK = {"train_steps": 8, "batches": 40, "packs": (False,), "steps": 2, "seq_len": 64, "batch": 1}
FULL = {"train_steps": 30, "batches": 200, "packs": (False, True), "steps": 3, "seq_len": 128, "batch": 1}
"""--quick and the full run: tiny_sft's training steps, the dataloader's batches per measure, the
data.pack values trained (data is measured for both), the 0.6B runs' steps, seq_len, batch."""


def run_cli(run_dir: Path, overrides: list[str]) -> tuple[dict, Sampler, float]:
    """`python -m qwen3exp OVERRIDES` into `run_dir`, every process below it sampled: (summary, sampler, s)."""
    argv = [sys.executable, "-m", "qwen3exp", *overrides, "metrics.tensorboard=false", f"hydra.run.dir={run_dir}"]
    print("  command:", " ".join(argv[3:]), flush=True)
    t = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    out, _ = proc.communicate()
    sampler.done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{out[-4000:]}")
    return json.loads((run_dir / "summary.json").read_text()), sampler, time.perf_counter() - t


def data_rate(run_dir: Path, pack: bool, batches: int) -> dict:
    """The dataloader of data-parallel rank 0 of the run in `run_dir`, with data.pack=`pack`: the
    sequence positions (and trained tokens) of `batches` batches per second of iterating them."""
    import torch  # lazy: heavy

    from qwen3exp.titan.chat_dataset import ChatDataLoader, loader_config  # lazy: imports torchtitan
    from qwen3exp.titan.job_config import hf_assets_path  # lazy: imports torchtitan

    torch.set_num_threads(1)  # as a CPU rank (OMP_NUM_THREADS=1)
    warnings.filterwarnings("ignore", message=".*set_vital")  # torchdata calls a deprecated torch function
    data = yaml.safe_load((run_dir / "experiment.yaml").read_text())
    data["data"]["pack"] = pack
    exp = validate_experiment(data)
    world = int(json.loads((run_dir / "summary.json").read_text())["world_size"])
    loader = ChatDataLoader(
        loader_config(exp, str(hf_assets_path(exp)), validation=False),
        dp_world_size=world,
        dp_rank=0,
        seq_len=exp.training.seq_len,
        local_batch_size=exp.training.local_batch_size,
    )
    it = iter(loader)
    positions = trained = 0
    t = time.perf_counter()
    for _ in range(batches):
        _, labels = next(it)
        positions += labels.numel()
        trained += int((labels != -100).sum())
    s = time.perf_counter() - t
    return {"positions": positions / s, "trained": trained / s, "batch_s": s / batches}


def data_against_training(work: Path, p: dict) -> None:
    print("\n1. data pipeline against training, experiment=tiny_sft", flush=True)
    runs = {}
    for pack in p["packs"]:
        run_dir = work / f"tiny_sft-pack-{str(pack).lower()}-{time.strftime('%H%M%S')}"
        summary, _, wall = run_cli(
            run_dir, ["experiment=tiny_sft", f"data.pack={str(pack).lower()}", f"training.steps={p['train_steps']}"]
        )
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        step_s = [r["step_seconds"] for r in rows if "loss" in r][1:]
        runs[pack] = (run_dir, summary["tokens_per_second"], sum(step_s) / max(len(step_s), 1))
        done = f"{summary['world_size']} ranks, {summary['steps_completed']} steps"
        print(f"  {summary['status']} in {wall:.1f} s, {done}")
    print(
        f"\n  {'data.pack':<10} {'data tok/s':>11} {'trained/s':>10} {'s/batch':>8} {'train tok/s':>12} "
        f"{'s/step':>7} {'data/train':>11}  goal >= {GOAL:g}"
    )
    for pack in (False, True):
        run_dir, train_tps, step_s = runs.get(pack, runs[p["packs"][0]])
        d = data_rate(run_dir, pack, p["batches"])
        ratio = d["positions"] / train_tps
        trained_in = "" if pack in runs else f" (training of data.pack={str(p['packs'][0]).lower()})"
        print(
            f"  {str(pack).lower():<10} {d['positions']:>11,.0f} {d['trained']:>10,.0f} {d['batch_s']:>8.4f} "
            f"{train_tps:>12,.0f} {step_s:>7.3f} {ratio:>11.1f}  {'PASS' if ratio >= GOAL else 'below goal'}"
            f"{trained_in}"
        )
    print(
        f"  (data: {p['batches']} batches of data-parallel rank 0 after the loader was built; tok/s = "
        "sequence positions per second, torchtitan's unit; trained/s = tokens in the loss)"
    )


def memory_run(work: Path, ckpt: Path, peft: str, p: dict, ranks: int) -> dict:
    """A fine-tune of the 0.6B-shaped checkpoint with peft=`peft`: its measured and planned memory."""
    run_dir = work / f"0p6b-{peft}-{time.strftime('%H%M%S')}"
    summary, sampler, wall = run_cli(
        run_dir,
        [
            "experiment=tiny_sft",
            "model.flavor=auto",
            f"model.hf_assets_path={ckpt}",
            "checkpoint=hf_load",
            f"peft={peft}",
            f"training.steps={p['steps']}",
            "training.warmup_steps=1",
            f"training.seq_len={p['seq_len']}",
            f"training.local_batch_size={p['batch']}",
            "training.dtype=bfloat16",
            "data.max_len_policy=truncate",
            "validation.enable=false",
            f"launcher.nproc_per_node={ranks}",
        ],
    )
    plan = json.loads((run_dir / "plan.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    peaks = [r["memory_gib"] * GIB for r in rows if r.get("memory_gib") is not None]
    labels = {pid: sampler.labels.get(pid, "") for pid in sampler.peak}
    ranks_peak = {labels[pid]: v for pid, v in sampler.peak.items() if labels[pid].startswith("rank")}
    print(
        f"  {summary['status']} in {wall:.1f} s; step-1 loss {summary['step1_loss']:.4f}, last "
        f"{summary['last_loss']:.4f}; weights_loaded={summary['weights_loaded']}",
        flush=True,
    )
    return {
        "ranks": dict(sorted(ranks_peak.items())),
        "metrics": max(peaks) if peaks else float("nan"),
        "plan": int(plan["memory"]["total"]),
        "trainable": plan["parameters"]["trainable"] or plan["parameters"]["total"],
    }


def lora_against_full(work: Path, ckpt: Path, p: dict, ranks: int) -> None:
    print(f"\n2. memory per rank, LoRA against a full fine-tune, Qwen3-0.6B-shaped, {ranks} rank(s)", flush=True)
    if not (ckpt / "model.safetensors.index.json").is_file():
        t = time.perf_counter()
        write_0p6b_checkpoint(ckpt)
        print(f"  checkpoint written in {time.perf_counter() - t:.1f} s: {ckpt}")
    full = memory_run(work, ckpt, "none", p, ranks)
    lora = memory_run(work, ckpt, "lora", p, ranks)
    print(
        f"\n  seq_len {p['seq_len']} x batch {p['batch']}, {p['steps']} steps, bfloat16 stored, float32 compute; "
        f"trainable: full {full['trainable']:,}, LoRA {lora['trainable']:,}"
    )
    print(f"  {'GiB per rank':<42} {'full':>7} {'LoRA':>7} {'LoRA/full':>10}")

    def line(what: str, f: float, lo: float) -> None:
        print(f"  {what:<42} {f / GIB:>7.2f} {lo / GIB:>7.2f} {lo / f:>10.2f}")

    for rank in full["ranks"]:
        line(f"measured peak, {rank} (whole run)", full["ranks"][rank], lora["ranks"].get(rank, float("nan")))
    line("measured, metrics.jsonl memory_gib (max)", full["metrics"], lora["metrics"])
    line("plan estimate (plan.json memory.total)", full["plan"], lora["plan"])
    for name, r in (("full", full), ("LoRA", lora)):
        worst = max(r["ranks"].values(), default=float("nan"))
        ratios = f"largest rank {worst / r['plan']:.2f}, metrics.jsonl {r['metrics'] / r['plan']:.2f}"
        print(f"  {name}: measured / plan: {ratios}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="fewer steps and batches; the 0.6B runs at seq_len 64 x batch 1"
    )
    ap.add_argument("--ranks", type=int, default=2, help="ranks of the 0.6B runs (1 where memory is short)")
    ap.add_argument("--checkpoint", type=Path, help="reuse (or write once) the 0.6B-shaped checkpoint here")
    ap.add_argument("--workdir", type=Path, help="run directories' parent (default: a temporary folder)")
    ap.add_argument("--skip", choices=["data", "memory"], help="leave one of the two parts out")
    args = ap.parse_args()
    p = QUICK if args.quick else FULL
    work = args.workdir or Path(tempfile.mkdtemp(prefix="qwen3exp-bench-sft-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"bench_sft ({'quick' if args.quick else 'full'}): run directories under {work}")
    t = time.perf_counter()
    if args.skip != "data":
        data_against_training(work, p)
    if args.skip != "memory":
        lora_against_full(work, args.checkpoint or work / "qwen3-0.6b-random", p, args.ranks)
    print(f"\nbench_sft: {time.perf_counter() - t:.0f} s")


if __name__ == "__main__":
    main()
