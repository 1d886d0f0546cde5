"""The attention path qwen3exp picks against SDPA's `is_causal=True`, on CPU, at the trn2 4B shape.

One attention layer, forward + backward, of the two SDPA paths (`qwen3exp.plan.attention_path`):
- block_causal: `qwen3exp.titan.attention.DocumentSDPAttention` on a packed batch (documents of
  seq/4 tokens), its dense mask built from the positions as `DocumentMaskQwen3Model` builds it once
  per step for every layer (`positions_mask`) and held for the step, as in training; what packed
  text (the default) and data.pack=true take;
- causal: `qwen3exp.titan.attention.CausalSDPAttention` (`is_causal=True`, no mask); what one
  conversation per sequence and data.cross_document_attention=true take.
The shape is Qwen3-4B's per layer as far as two cores allow: local batch 2 (the trn2 experiments'),
head_dim 128 and its 4:1 grouped-query ratio, with 8 query / 2 kv heads instead of 32 / 8 (the
ratios do not depend on the head count: both paths scale with it). bfloat16, the trn2 compute dtype.

Time: the process CPU time with one intra-op thread, the two paths interleaved (A, B, A, B), median,
so other processes on the machine do not skew the ratio. Memory: the peak resident memory a fresh
process adds over its inputs during one forward + backward (VmHWM after `clear_refs`), each path in
its own process. `plan`: the plan's mask term for this one layer (`attention_path.mask_bytes`, the
boolean mask and the bfloat16 copy SDPA saves), to compare with `mask - causal`; `4B plan`: the term
for the 36 layers of Qwen3-4B at this sequence (activation_checkpoint none / full).

    .venv/bin/python tests/bench/bench_attention.py [--seqs 1024,2048,4096,8192] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

BATCH, HEADS, KV_HEADS, HEAD_DIM = 2, 8, 2, 128
DTYPE = torch.bfloat16
LAYERS_4B = 36


def _inputs(seq: int):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(BATCH, seq, HEADS, HEAD_DIM, generator=g).to(DTYPE).requires_grad_()
    k, v = (torch.randn(BATCH, seq, KV_HEADS, HEAD_DIM, generator=g).to(DTYPE).requires_grad_() for _ in range(2))
    positions = torch.arange(seq).remainder(seq // 4).expand(BATCH, seq)  # four documents per row
    return q, k, v, positions


def step(path: str, q, k, v, positions) -> None:
    """One layer's forward and backward on `path` (block_causal or causal), as training runs it."""
    from qwen3exp.titan.attention import CausalSDPAttention, DocumentSDPAttention, positions_mask

    if path == "causal":
        out = CausalSDPAttention(CausalSDPAttention.Config())(q, k, v, enable_gqa=True)
    else:
        mask = positions_mask(positions)  # the model's, once per step
        out = DocumentSDPAttention(DocumentSDPAttention.Config())(q, k, v, attention_masks=mask, enable_gqa=True)
    out.float().square().mean().backward()


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def memory_one(path: str, seq: int) -> int:
    """Peak bytes a forward + backward adds over its inputs (run in a fresh process)."""
    inputs = _inputs(seq)
    step(path, *_inputs(256))  # imports and first-call allocations, before the baseline
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident size
    before = _status("VmRSS")
    step(path, *inputs)
    return _status("VmHWM") - before


def times(seq: int, repeats: int) -> tuple[float, float]:
    inputs = _inputs(seq)
    out: dict[str, list[float]] = {"block_causal": [], "causal": []}
    for i in range(repeats + 1):
        for path in out:
            t = time.process_time()
            step(path, *inputs)
            if i:  # the first round warms up
                out[path].append(time.process_time() - t)
            for x in inputs[:3]:
                x.grad = None
    return statistics.median(out["block_causal"]), statistics.median(out["causal"])


def _memory(path: str, seq: int) -> int:
    cmd = [sys.executable, __file__, "--memory", path, str(seq)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["peak"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="1024,2048,4096,8192")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--memory", nargs=2, metavar=("PATH", "SEQ"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.memory:
        print(json.dumps({"peak": memory_one(args.memory[0], int(args.memory[1]))}))
        return
    from qwen3exp.plan.attention_path import mask_bytes

    mib = 2**20
    print(f"batch {BATCH}, heads {HEADS}/{KV_HEADS} kv x {HEAD_DIM}, {str(DTYPE)[6:]}, one layer forward + backward")
    head = (
        f"{'seq':>6} {'mask s':>8} {'causal s':>9} {'time x':>7} {'mask MiB':>9} {'causal MiB':>11} {'mem x':>6} "
        f"{'mask-causal':>12} {'plan MiB':>9} {'4B plan GiB (ac none/full)':>27}"
    )
    print(head)
    for seq in (int(s) for s in args.seqs.split(",")):
        t_mask, t_causal = times(seq, args.repeats)
        m_mask, m_causal = _memory("block_causal", seq), _memory("causal", seq)
        plan = mask_bytes(True, BATCH, seq, 2, 1, "none")
        full_4b = [mask_bytes(True, BATCH, seq, 2, LAYERS_4B, ac) / 2**30 for ac in ("none", "full")]
        print(
            f"{seq:>6} {t_mask:>8.2f} {t_causal:>9.2f} {t_mask / t_causal:>7.2f} {m_mask / mib:>9.0f} "
            f"{m_causal / mib:>11.0f} {m_mask / max(m_causal, 1):>6.2f} {(m_mask - m_causal) / mib:>12.0f} "
            f"{plan / mib:>9.0f} {full_4b[0]:>15.2f} / {full_4b[1]:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
