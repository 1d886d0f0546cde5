"""The kernel overrides' modules against the stock torchtitan modules they replace, on CPU.

For each op, forward + backward of the stock module (A) and of the override's module (B) on the same
inputs and weights, interleaved A, B, A, B, ... ; the medians of the process CPU time (one intra-op
thread, so other load on the machine does not skew the ratio) are compared. Goal: B / A <= 1.2 (the
PyTorch implementations must not make CPU/GPU runs of kernels=nki_* noticeably slower).

- rope: CosSinRoPE vs NKIRoPE (qwen3exp::rope), torchtitan's per-document positions (the training path)
- moe:  GroupedExperts vs BlockwiseExperts (qwen3exp::moe_blockwise; routing metadata included)

    .venv/bin/python tests/bench/bench_kernels.py [--repeats 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _time(fn, repeats: int) -> list[float]:
    # CPU time of this process: robust to other processes sharing the cores (one intra-op thread).
    out = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        out.append(time.process_time() - t)
    return out


def side_by_side(stock, ours, repeats: int) -> tuple[float, float]:
    stock(), ours()  # warm-up
    a, b = [], []
    for _ in range(repeats):
        a += _time(stock, 1)
        b += _time(ours, 1)
    return statistics.median(a), statistics.median(b)


def rope_case(B, S, Hq, Hk, D):
    from torchtitan.models.common import CosSinRoPE

    from qwen3exp.titan.nki_rope import NKIRoPE, nki_rope

    cfg = CosSinRoPE.Config(dim=D, max_seq_len=4096, theta=1e6)
    stock, ours = cfg.build(), nki_rope(cfg).build()
    assert isinstance(ours, NKIRoPE)
    torch.manual_seed(0)
    q = torch.randn(B, S, Hq, D, requires_grad=True)
    k = torch.randn(B, S, Hk, D, requires_grad=True)
    half = S // 2
    positions = torch.cat([torch.arange(half), torch.arange(S - half)]).expand(B, S).contiguous()

    def run(module):
        def step():
            oq, ok = module(q, k, positions)
            (oq.sum() + ok.sum()).backward()

        return step

    return run(stock), run(ours)


def moe_case(T, K, D, F, E, block):
    from torchtitan.models.common.moe import GroupedExperts

    from qwen3exp.titan.nki_moe import nki_moe

    cfg = GroupedExperts.Config(dim=D, hidden_dim=F, num_experts=E)
    stock, ours = cfg.build(), nki_moe(cfg, block_size=block).build()
    torch.manual_seed(0)
    for p in stock.parameters():
        torch.nn.init.normal_(p, std=0.02)
    ours.load_state_dict(stock.state_dict())
    # realistic imbalance: router-like skewed expert choice
    probs = torch.softmax(torch.randn(E) * 1.5, 0)
    experts = torch.multinomial(probs, T * K, replacement=True)
    counts = torch.bincount(experts, minlength=E)
    x = torch.randn(T * K, D, requires_grad=True)

    def run(module):
        def step():
            module(x, counts).sum().backward()

        return step

    return run(stock), run(ours)


CASES = {
    "rope tiny    (B8 S256 H4/2 D32)": lambda: rope_case(8, 256, 4, 2, 32),
    "rope 4B-like (B2 S1024 H32/8 D128)": lambda: rope_case(2, 1024, 32, 8, 128),
    "moe tiny_moe (T2048 K2 D128 F128 E8, B128)": lambda: moe_case(2048, 2, 128, 128, 8, 128),
    "moe larger   (T2048 K4 D512 F768 E16, B128)": lambda: moe_case(2048, 4, 512, 768, 16, 128),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"forward+backward, median of {args.repeats}, {args.threads} thread(s); ratio = override / stock (goal <= 1.2)"
    )
    worst = 0.0
    for name, make in CASES.items():
        stock, ours = make()
        a, b = side_by_side(stock, ours, args.repeats)
        worst = max(worst, b / a)
        print(f"  {name:46s} stock {a * 1e3:8.2f} ms   override {b * 1e3:8.2f} ms   ratio {b / a:5.2f}")
    print(f"worst ratio {worst:.2f} ({'within' if worst <= 1.2 else 'OVER'} the 1.2x goal)")


if __name__ == "__main__":
    main()
