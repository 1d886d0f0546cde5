"""Benchmark: a Qwen3-0.6B-shaped Hugging Face checkpoint through hf_roundtrip on 2 CPU ranks, and
the measured peak memory of every rank next to the plan's per-rank estimate.

    python tests/bench/bench_hf_0p6b.py [--dtype bfloat16|float32] [--backend native|hf]
                                        [--seq-len 32] [--local-batch-size 1] [--steps 2]
                                        [--checkpoint DIR] [--workdir DIR]

1. A random checkpoint with Qwen/Qwen3-0.6B's published config (596M parameters, vocab 151,936,
   tied embeddings) written by transformers' `save_pretrained(max_shard_size=...)` in bfloat16:
   several shards + model.safetensors.index.json, the bundled tokenizer next to it (its 2,048 ids
   fit the embedding). `--checkpoint DIR` reuses (or creates once) that folder.
2. `python -m qwen3exp model.flavor=auto (or model=hf) model.hf_assets_path=CKPT
   checkpoint=hf_roundtrip`: hf_load at step 0, the steps, a sharded bfloat16 export
   (`checkpoint.max_shard_mb`) and its verification.
3. The export reloaded offline with `AutoModelForCausalLM.from_pretrained` in a fresh process
   (missing / unexpected keys, a forward pass with a finite loss).

Peak memory per rank: while the run lasts, every 0.1 s, VmRSS and VmHWM of each process below the
command (`/proc/<pid>/status`), the rank taken from the process's RANK environment variable; the
peak is the largest value seen. (VmHWM alone would not do: torchtitan's memory monitor resets the
peak every step through the CPU platform's `reset_peak_memory_stats`, so metrics.jsonl's
`memory_gib` is rank 0's peak within a step; it is shown as well.) The estimate is plan.json's
`memory.total` (parameters, gradients, AdamW states, FSDP buffers, activations: the model only);
the CPU pre-launch check adds `RANK_RUNTIME_BYTES` per rank for Python, torch and torchtitan, so
the ratio is printed against both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
GIB = 2**30


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "PPid"):
                    out[key] = int(rest.split()[0]) * (1 if key == "PPid" else 1024)
    except (OSError, ValueError, IndexError):
        pass
    return out


def _label(pid: int) -> str:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
    if "qwen3exp.run.agent" in cmd:
        return "agent"
    if "qwen3exp.worker" in cmd:
        rank = next((e[5:].decode() for e in env if e.startswith(b"RANK=")), "?")
        return f"rank {rank}"
    return "cli" if "-m qwen3exp" in cmd else "other"


class Sampler(threading.Thread):
    """Peak resident memory of every process below `root`, sampled every `interval` seconds."""

    def __init__(self, root: int, interval: float = 0.1):
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.peak: dict[int, int] = {}
        self.labels: dict[int, str] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            parents = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    parents[int(entry)] = _status(int(entry)).get("PPid")
            tree, grew = {self.root}, True
            while grew:
                more = {p for p, pp in parents.items() if pp in tree} - tree
                tree |= more
                grew = bool(more)
            for pid in tree:
                s = _status(pid)
                rss = max(s.get("VmRSS", 0), s.get("VmHWM", 0))
                if rss:
                    self.peak[pid] = max(self.peak.get(pid, 0), rss)
                    if self.labels.get(pid, "?") == "?":
                        self.labels[pid] = _label(pid)
            time.sleep(self.interval)


RELOAD = """
import json, sys, torch
from transformers import AutoModelForCausalLM
model, info = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, output_loading_info=True)
ids = torch.arange(1, 33)[None]
loss = model(input_ids=ids, labels=ids).loss.item()
print(json.dumps({"missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]), "loss": loss,
                  "params": sum(p.numel() for p in model.parameters())}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["float32", "bfloat16"],
        help="training.dtype: parameters, gradients, AdamW states as stored (float32: ~2x the memory)",
    )
    ap.add_argument(
        "--compute-dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="training.mixed_precision_param (bfloat16 matmuls are ~20x slower than float32 on "
        "CPUs without AVX512-BF16)",
    )
    ap.add_argument("--backend", default="native", choices=["native", "hf"])
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--local-batch-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--max-shard-size", default="400MB", help="save_pretrained's shards of the source checkpoint")
    ap.add_argument("--export-shard-mb", type=int, default=400, help="checkpoint.max_shard_mb of the export")
    ap.add_argument("--checkpoint", type=Path, help="reuse (or write once) the source checkpoint here")
    ap.add_argument("--workdir", type=Path, help="run directory parent (default: a temporary folder)")
    args = ap.parse_args()

    from hf_fixtures import write_0p6b_checkpoint
    from qwen3exp.platforms.cpu import RANK_RUNTIME_BYTES

    work = args.workdir or Path(tempfile.mkdtemp(prefix="qwen3exp-bench-0p6b-"))
    ckpt = args.checkpoint or work / "qwen3-0.6b-random"
    if not (ckpt / "model.safetensors.index.json").is_file():
        t = time.perf_counter()
        write_0p6b_checkpoint(ckpt, max_shard_size=args.max_shard_size)
        print(f"checkpoint: written in {time.perf_counter() - t:.1f} s")
    shards = sorted(p.name for p in ckpt.glob("*.safetensors"))
    print(
        f"checkpoint: {ckpt}: {len(shards)} shards + index, "
        f"{sum((ckpt / s).stat().st_size for s in shards) / GIB:.2f} GiB"
    )

    run_dir = work / f"run-{args.backend}-{args.dtype}-{args.compute_dtype}-{time.strftime('%H%M%S')}"
    model = ["model.flavor=auto"] if args.backend == "native" else ["model=hf"]
    argv = [
        sys.executable,
        "-m",
        "qwen3exp",
        *model,
        f"model.hf_assets_path={ckpt}",
        "checkpoint=hf_roundtrip",
        f"checkpoint.max_shard_mb={args.export_shard_mb}",
        f"training.steps={args.steps}",
        "training.warmup_steps=1",
        f"training.seq_len={args.seq_len}",
        f"training.local_batch_size={args.local_batch_size}",
        f"training.dtype={args.dtype}",
        f"training.mixed_precision_param={args.compute_dtype}",
        "launcher.nproc_per_node=2",
        "validation.enable=false",
        "metrics.tensorboard=false",
        f"hydra.run.dir={run_dir}",
    ]
    print("command:", " ".join(argv[1:]))
    t = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    out, _ = proc.communicate()
    sampler.done.set()
    sampler.join()
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{out[-4000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    plan = json.loads((run_dir / "plan.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    export = summary["export"]
    folder = Path(export["path"])
    out_shards = sorted(p.name for p in folder.glob("*.safetensors"))
    print(
        f"run:        {summary['status']} in {wall:.1f} s; step-1 loss {summary['step1_loss']:.4f}; "
        f"export ok={export['ok']}: {len(out_shards)} shards + "
        f"{'index' if (folder / 'model.safetensors.index.json').is_file() else 'NO INDEX'}"
    )

    est = int(plan["memory"]["total"])
    print(
        f"\nmemory per rank ({args.backend}, {args.dtype} stored, {args.compute_dtype} compute, "
        f"seq {args.seq_len} x batch {args.local_batch_size}, "
        f"dp_shard 2); plan estimate {est / GIB:.2f} GiB, + runtime {RANK_RUNTIME_BYTES / GIB:.2f} GiB "
        f"= {(est + RANK_RUNTIME_BYTES) / GIB:.2f} GiB"
    )
    print(f"  {'process':<8} {'measured peak':>14} {'estimate':>9} {'ratio':>6} {'ratio (+runtime)':>17}")
    for pid, peak in sorted(sampler.peak.items(), key=lambda kv: sampler.labels.get(kv[0], "")):
        label = sampler.labels.get(pid, "?")
        if label.startswith("rank"):
            print(
                f"  {label:<8} {peak / GIB:>10.2f} GiB {est / GIB:>5.2f} GiB {peak / est:>6.2f} "
                f"{peak / (est + RANK_RUNTIME_BYTES):>17.2f}"
            )
        else:
            print(f"  {label:<8} {peak / GIB:>10.2f} GiB")
    per_step = [x["memory_gib"] for x in rows if x.get("memory_gib") is not None]
    if per_step:
        print(
            f"  metrics.jsonl memory_gib (rank 0, peak within each step): {', '.join(f'{v:.2f}' for v in per_step)}"
            f" GiB; ratio {max(per_step) * GIB / est:.2f}"
        )
    ranks = [v for p, v in sampler.peak.items() if sampler.labels.get(p, "").startswith("rank")]
    print(
        f"  sum of the peaks of all processes: {sum(sampler.peak.values()) / GIB:.2f} GiB "
        f"(the {len(ranks)} ranks: {sum(ranks) / GIB:.2f} GiB)"
    )

    print()
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", RELOAD, str(folder)], env=ENV, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"reload failed:\n{r.stderr[-3000:]}")
    reload = json.loads(r.stdout.strip().splitlines()[-1])
    print(
        f"reload:     AutoModelForCausalLM in {time.perf_counter() - t:.1f} s: {reload['params']:,} parameters, "
        f"missing {reload['missing']}, unexpected {reload['unexpected']}, loss {reload['loss']:.4f}"
    )


if __name__ == "__main__":
    main()
