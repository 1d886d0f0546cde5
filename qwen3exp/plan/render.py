"""Print the plan of a dry run (`python -m qwen3exp dry_run=true ...`): one block per point.

The format is documented in README.md ("Plan before you spend"). With a sweep, the first point
lists every key with its source; later points list only the keys that differ from the first.
"""

from __future__ import annotations

import shlex
import sys

from qwen3exp.plan import memory
from qwen3exp.units import human_bytes as _human


def print_plans(points, out=None) -> int:
    out = out or sys.stdout
    first_table = None
    for i, point in enumerate(points):
        plan = point.plan
        if len(points) > 1:
            print(f"=== sweep point {i + 1}/{len(points)}", file=out)
        table = plan.provenance
        print(render(plan, provenance_diff=first_table), file=out)
        if first_table is None:
            first_table = table
    return 0


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n:,} ({n / size:.2f}{unit})"
    return f"{n:,}"


def render(plan, provenance_diff=None, *, title: str | None = None) -> str:
    """The plan as text; `title`: the first line (default: the dry run's)."""
    lines: list[str] = []
    add = lines.append
    banner = [f"!!! WARNING: {w}" for w in plan.warnings]
    add(title or f"qwen3exp dry run: {plan.name}   (nothing was started; no model memory was allocated)")
    lines += banner
    add(f"  overrides:     {' '.join(plan.overrides) or '(none)'}")
    add(f"  run directory: {plan.run_dir}")

    # --- experiment and provenance
    rows = plan.provenance
    if provenance_diff is not None:
        base = {k: (v, str(s)) for k, v, s in provenance_diff}
        rows = [(k, v, s) for k, v, s in rows if base.get(k) != (v, str(s))]
        add("experiment (keys that differ from the first point; value, where it came from):")
    else:
        add("experiment (value, where it came from):")
    if rows:
        width = max(len(k) for k, _, _ in rows)
        vwidth = min(30, max(len(_value(v)) for _, v, _ in rows))
        for k, v, s in rows:
            add(f"  {k:<{width}}  {_value(v):<{vwidth}}  {s}")
    else:
        add("  (no difference)")

    # --- platform and mesh
    f, m = plan.platform, plan.mesh
    add(f"platform:   {f.name} ({f.reason}); backend {f.dist_backend}, attention {f.attention}, "
        f"memory per rank {_human(f.memory_per_rank_bytes)}"
        + (f", {f.devices_per_node} device(s) per node" if f.devices_per_node is not None else ""))
    add(f"device:     {f.device_type} ({f.device_name or 'unknown'}"
        f"{'' if f.device_checked else ', not checked: planned from the platform table'}), "
        f"compile backend {f.compile_backend}" + (f", LNC {f.lnc}" if f.lnc else ""))
    env = {**f.env, **{k: f"{plan.run_dir}/{v}" for k, v in f.run_dir_env.items()}}
    if env:
        add(f"rank env:   {' '.join(f'{k}={v}' for k, v in env.items())}")
    add(f"mesh:       {m.nnodes} node(s) x {m.nproc_per_node} ranks per node ({m.nproc_from}) "
        f"= world size {m.world_size}")
    add(f"            dp_replicate {m.dp_replicate} x dp_shard {m.dp_shard} x tp {m.tp} x pp {m.pp} x cp {m.cp}"
        f" (ep {m.ep});  dp_shard: {m.dp_shard_from}")

    # --- model and parameters
    a, p = plan.arch, plan.parameters
    moe = f", MoE {a.moe.num_experts} experts top-{a.moe.top_k} (expert hidden {a.moe.hidden_dim})" if a.moe else \
        f", FFN hidden {a.hidden_dim}"
    add(f"model:      {a.n_layers} layers, dim {a.dim}, heads {a.n_heads}/{a.n_kv_heads} kv x {a.head_dim}{moe}, "
        f"vocab {a.vocab_size}{', tied embeddings' if a.tied else ''}, max seq {a.max_seq_len}, "
        f"rope theta {a.rope_theta:g}")
    for what, src in plan.files.sources().items():
        add(f"{'files:' if what == 'config' else '':<12}{what:<10} {_source(src)}")
    add(f"parameters: total {_count(p.total)}")
    if p.is_moe:
        add(f"            active per token {_count(p.active_per_token)}")
    add(f"            per rank {_count(p.per_rank)} (after tp {m.tp}, ep {m.ep}, FSDP over dp_shard x cp = "
        f"{m.dp_shard * m.cp}, pp {m.pp})")

    # --- memory
    mem = plan.memory
    verdict = "fits" if mem.fits else "DOES NOT FIT"
    add("memory per rank (estimate; the formula is in qwen3exp/plan/memory.py):")
    add(f"  parameters     {_human(mem.parameters):>12}   {mem.param_dtype}")
    add(f"  gradients      {_human(mem.gradients):>12}   {mem.param_dtype}")
    add(f"  optimizer      {_human(mem.optimizer):>12}   AdamW, 2 states, {mem.param_dtype}")
    add(f"  FSDP buffers   {_human(mem.fsdp_buffers):>12}   largest unit all-gathered twice in {mem.compute_dtype}"
        " + float32 grads")
    add(f"  activations    {_human(mem.activations):>12}   {mem.tokens_per_microbatch} tokens per micro-batch, "
        f"{mem.compute_dtype}, activation_checkpoint={mem.activation_checkpoint}")
    add(f"  total          {_human(mem.total):>12}   of {_human(mem.usable)} usable "
        f"({int(memory.USABLE_FRACTION * 100)}% of {_human(mem.budget)}); headroom {_human(mem.headroom)}: {verdict}")

    # --- batches
    b = plan.batches
    dp = m.dp_replicate * m.dp_shard
    add(f"batches:    local {b.local_batch_size} x dp {dp} x grad accumulation {b.grad_accum_steps} = global "
        f"{b.global_batch_size} sequences")
    add(f"tokens:     {b.tokens_per_step:,} per step, {b.tokens_per_rank_per_step:,} per rank per step")
    t = plan.exp.training
    why = "training.warmup_steps" if t.warmup_steps is not None else \
        f"derived from training.steps={t.steps}: min(5, max(1, steps // 5)); set training.warmup_steps to choose"
    add(f"schedule:   {t.steps} steps, lr {t.lr:g}, warm-up {t.warmup} step(s) ({why}), {t.decay_type} decay")
    add(f"validation: {validation_line(plan.exp)}")
    metric, direction = plan.exp.objective
    add(f"objective:  {metric} ({direction}d; sweep.objective"
        + (")" if plan.exp.sweep.objective else ", null: val_loss with validation on, else last_loss)"))

    # --- overrides, checkpoint, commands
    if plan.kernel_overrides:
        add("overrides:  " + ", ".join(f"{n} on {c} node(s)" for n, c in plan.kernel_overrides))
    else:
        add("overrides:  none")
    c = plan.checkpoint
    word = {True: "compatible: ", False: "INCOMPATIBLE: ", None: ""}[c.compatible]
    add(f"checkpoint: {word}{c.detail}")
    for note in plan.launch_notes:
        add(f"launch:     {note}")
    for i, cmd in enumerate(plan.commands):
        label = "command:   " if len(plan.commands) == 1 else f"node {i}:    "
        add(f"{label} {shlex.join(cmd)}")
    lines += banner
    return "\n".join(lines)


def validation_line(exp) -> str:
    """Where the held-out loss comes from and when it is measured."""
    v, steps = exp.validation, exp.training.steps
    if not v.enable:
        return "off (validation.enable=false): no held-out loss"
    multiples = range(v.freq, steps + 1, v.freq)  # counted and sliced, never listed: steps may be 1e9
    count = len(multiples) + (1 not in multiples) + (steps not in multiples)
    at = sorted({1, steps, *multiples[:8]})
    shown = ", ".join(map(str, at)) if count <= 8 else f"{', '.join(map(str, at[:6]))}, ..., {steps}"
    source = (f"{v.path} (validation.path; training reads all of its data)" if v.path is not None else
              f"{v.fraction:.0%} of the training documents held out (validation.fraction; the same ones every "
              "run, never trained on)")
    return f"{v.steps} batch(es) at step(s) {shown}; {source}"


def _value(v) -> str:
    return "null" if v is None else str(v)


def _source(src: dict) -> str:
    """One model source of the plan: `Qwen/Qwen3-0.6B@main -> snapshot <commit> (<folder>): <what>`."""
    if src.get("repo_id"):
        where = (f"{src['repo_id']}@{src.get('revision') or 'main'} -> Hugging Face cache snapshot "
                 f"{src['commit']} ({src['folder']})")
    else:
        where = src.get("folder") or ""
    return f"{where}: {src['what']}" if where else src["what"]
