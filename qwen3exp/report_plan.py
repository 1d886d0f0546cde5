"""Print what a dry run would do (grows into the full plan of issue 6)."""

from __future__ import annotations

import shlex
from pathlib import Path


def print_plans(points) -> int:
    from qwen3exp.launch import prepare, torchrun_argv

    for overrides, exp, run_dir in points:
        prep = prepare(exp)
        m = prep.mesh
        print(f"qwen3exp dry run: {exp.name}  [{' '.join(overrides)}]")
        print(f"  platform: {prep.facts.name} ({prep.facts.reason})")
        print(f"  mesh: {m.nnodes} node(s) x {m.nproc_per_node} = {m.world_size} ranks; "
              f"dp_replicate {m.dp_replicate}, dp_shard {m.dp_shard} ({m.dp_shard_from}), tp {m.tp}, pp {m.pp}, "
              f"cp {m.cp}, ep {m.ep}")
        b = prep.batches
        print(f"  batch: local {b.local_batch_size}, global {b.global_batch_size}, grad accumulation "
              f"{b.grad_accum_steps}, tokens/step {b.tokens_per_step}")
        for o in prep.overrides:
            print(f"  override {o['key']}: {o['target']} replaces {len(o['nodes'])} {o['replaces']} node(s) "
                  f"({', '.join(o['fqns'])})")
        print(f"  run directory: {run_dir}")
        print(f"  command: {shlex.join(torchrun_argv(prep, Path(run_dir)))}")
    return 0
