"""Benchmark: the data pipeline of data=mix alone, 3 sources against 1, and against training, in one run.

    python tests/bench/bench_data.py [--steps 20] [--batches 200] [--seq-len 256] [--workdir DIR]

First a real training run of the tiny native model on 1 CPU rank over a mixture of three sources
(the bundled corpus, the bundled conversations and a small local JSON-lines file, weights 0.6 / 0.3
/ 0.1): its tokens/s (summary.json's `tokens_per_second`: sequence positions per second, padding
included) is the rate the data must keep up with. Then, in this process, the very dataloaders a rank
builds (the run's own resolved experiment through `to_torchtitan`, dp rank 0 of 1) are read for
`--batches` batches of the run's local batch, with no model:
- kind alone:  the bundled corpus through torchtitan's text loader (what data=bundled reads);
- mix of 1:    data=mix with the bundled corpus as its only source;
- mix of 3:    the run's mixture (each sample a source's own dataset's, the blend, the token counts).
Each row: positions per second (batches x local batch x seq_len / seconds, the unit of the
training's tokens/s), and its ratio to the mix of 1 and to the training. The first batch of each
loader (opening and tokenizing the files) is not timed. Timings on a shared machine are skewed by
the other processes: compare the rows of one run only.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WEIGHTS = {"web": 0.6, "team": 0.3, "notes": 0.1}


def conf(work: Path) -> Path:
    """A user conf/ with data=mix3 (the three sources at WEIGHTS)."""
    notes = work / "notes.jsonl"
    rng, words = random.Random(0), "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()
    notes.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=200))}) + "\n" for _ in range(200)))
    data = work / "conf" / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "mix3.yaml").write_text(
        "source: mix\nsources:\n"
        f"  web: {{source: bundled, weight: {WEIGHTS['web']}}}\n"
        f"  team: {{source: chat, weight: {WEIGHTS['team']}}}\n"
        f"  notes: {{source: local, path: {notes}, weight: {WEIGHTS['notes']}}}\n"
    )
    return work / "conf"


def train(run_dir: Path, args) -> dict:
    argv = [sys.executable, "-m", "qwen3exp", "--config-dir", str(conf(args.workdir)), "data=mix3", "platform=cpu"]
    argv += [f"training.steps={args.steps}", f"training.seq_len={args.seq_len}", "training.local_batch_size=8"]
    argv += ["launcher.nproc_per_node=1", "validation.enable=false", "metrics.tensorboard=false"]
    argv += [f"hydra.run.dir={run_dir}"]
    print("  command:", " ".join(argv[3:]), flush=True)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def loaders(run_dir: Path) -> tuple[dict, int, int]:
    """The dataloaders of the three rows, built as a rank builds them; the local batch and seq_len."""
    from qwen3exp.platforms import prepare_worker
    from qwen3exp.worker.main import load_run

    exp, facts = load_run(run_dir)
    prepare_worker(facts)  # before torchtitan is imported, as in a rank
    from qwen3exp.config.sections.mixture import MixtureData
    from qwen3exp.titan.job_config import to_torchtitan
    from qwen3exp.titan.mixture_config import first_source

    one = exp.model_copy(update={"data": MixtureData(sources={"web": exp.data.sources["web"]})})
    out = {}
    for name, e in (("kind alone", first_source(exp)), ("mix of 1", one), ("mix of 3", exp)):
        config = to_torchtitan(e, facts, run_dir / "bench")
        tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
        t = config.training
        out[name] = config.dataloader.build(
            dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=t.seq_len, local_batch_size=t.local_batch_size
        )
    return out, exp.training.local_batch_size, exp.training.seq_len


def rate(loader, batches: int, positions: int) -> float:
    """Positions per second over `batches` batches, the first one (opening the data) not timed."""
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches * positions / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_data_"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    run_dir = args.workdir / "train"
    summary = train(run_dir, args)
    training = summary["tokens_per_second"]
    built, batch, seq_len = loaders(run_dir)
    rates = {name: rate(loader, args.batches, batch * seq_len) for name, loader in built.items()}
    print(f"\n1 CPU rank, local batch {batch} x seq_len {seq_len}; data: {args.batches} batches per loader")
    print(f"training's data_tokens (trained tokens per source): {summary.get('data_tokens')}")
    print(f"{'pipeline':12} {'tokens/s':>12} {'/ mix of 1':>11} {'/ training':>11}")
    for name, r in rates.items():
        print(f"{name:12} {r:12.0f} {r / rates['mix of 1']:11.2f} {r / training:11.1f}")
    print(f"{'training':12} {training:12.0f} {training / rates['mix of 1']:11.3f} {1:11.1f}")


if __name__ == "__main__":
    main()
