"""Benchmark: preference tuning against SFT on the same pairs, side by side in one run.

    python tests/bench/bench_pref.py [--steps 20] [--ranks 2] [--workdir DIR]

The tiny native model on 2 CPU ranks (FSDP), the pairs shipped with qwen3exp
(qwen3exp/assets/preference), the same number of pairs per step (4 per rank):
- sft:       data=chat on each pair's prompt + chosen answer (one sequence per pair, local batch 4);
- dpo_lora:  experiment=tiny_dpo (two sequences per pair, local batch 8, plus the reference's
             forward with the adapters off);
- dpo_full:  the same with peft=none (the reference: a frozen copy of the starting weights, swapped in);
- orpo, simpo (peft=lora): two sequences per pair, no reference pass.
Each row: tokens/s (summary.json's `tokens_per_second`, torchtitan's throughput of rank 0: sequence
positions per second, padding included; a pair objective counts both sides), the mean step time
after the first step (metrics.jsonl's `step_seconds`) and pairs per second (pairs per step /
step time). Expect a DPO step to cost about 3 forward passes against SFT's 1 (two sides, plus the
reference), and 2 backward passes against 1. Timings on a shared machine are skewed by the other
processes: compare the rows of one run only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAIRS = REPO / "qwen3exp" / "assets" / "preference" / "train.jsonl"


def sft_file(folder: Path) -> Path:
    """The pairs as conversations for data=chat: each prompt with its chosen answer."""
    out = folder / "chosen.jsonl"
    with out.open("w") as f:
        for line in PAIRS.read_text().splitlines():
            pair = json.loads(line)
            prompt = (
                pair["prompt"] if isinstance(pair["prompt"], list) else [{"role": "user", "content": pair["prompt"]}]
            )
            f.write(json.dumps({"messages": [*prompt, {"role": "assistant", "content": pair["chosen"]}]}) + "\n")
    return out


def run(run_dir: Path, overrides: list[str]) -> dict:
    argv = [sys.executable, "-m", "qwen3exp", *overrides, "platform=cpu", "metrics.tensorboard=false"]
    argv += ["validation.enable=false", f"hydra.run.dir={run_dir}"]
    print("  command:", " ".join(argv[3:]), flush=True)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    step = sum(r["step_seconds"] for r in rows[1:]) / max(1, len(rows) - 1)
    return {"tokens_per_second": summary["tokens_per_second"], "step_seconds": step}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_pref_"))
    common = [f"training.steps={args.steps}", f"launcher.nproc_per_node={args.ranks}", "training.seq_len=192"]
    dpo = ["experiment=tiny_dpo", *common, "training.local_batch_size=8"]
    runs = {
        "sft": [
            "experiment=tiny_sft",
            "peft=lora",
            f"data.path={sft_file(work)}",
            *common,
            "training.local_batch_size=4",
        ],
        "dpo_lora": dpo,
        "dpo_full": [*dpo, "peft=none"],
        "orpo": [*dpo, "objective=orpo"],
        "simpo": [*dpo, "objective=simpo"],
    }
    results = {name: run(work / name, overrides) for name, overrides in runs.items()}
    pairs = 4 * args.ranks
    print(f"\n{pairs} pairs per step, {args.ranks} CPU ranks, {args.steps} steps (run folders: {work})")
    print(f"{'run':10} {'tokens/s':>10} {'step s':>8} {'pairs/s':>8} {'step / sft':>10}")
    base = results["sft"]["step_seconds"]
    for name, r in results.items():
        step = r["step_seconds"]
        print(f"{name:10} {r['tokens_per_second']:10.0f} {step:8.3f} {pairs / step:8.1f} {step / base:10.2f}")


if __name__ == "__main__":
    main()
