"""Print the plan of a dry run (`python -m qwen3exp dry_run=true ...`): one block per point.

The format is documented in docs/plan.md. With a sweep, the first point
lists every key with its source; later points list only the keys that differ from the first.
After a plan comes the first training sample, its trained tokens marked (`sample_marks`; once per
data set a sweep's points read).
"""

from __future__ import annotations

import shlex
import sys

from qwen3exp.data import figures as data_figures, marks as sample_marks, mixture_lines
from qwen3exp.data.chat import files as chat_files
from qwen3exp.data.preference import files as preference_files
from qwen3exp.data.text import hf_files as hf_data_files
from qwen3exp.plan import (
    attention_path,
    eval_tasks,
    memory,
    memory_pref,
    reference_model,
    sample_prompts,
)
from qwen3exp.platforms import neuron_cache
from qwen3exp.run.console import colour_allowed
from qwen3exp.units import human_bytes as _human


def print_plans(points, out=None) -> int:
    out = out or sys.stdout
    first_table = None
    sampled: set[tuple] = set()
    for i, point in enumerate(points):
        plan = point.plan
        if len(points) > 1:
            print(f"=== sweep point {i + 1}/{len(points)}", file=out)
        table = plan.provenance
        print(render(plan, provenance_diff=first_table), file=out)
        # The first training sample, its trained tokens marked: once per data a sweep's points read.
        seq_len = plan.exp.training.seq_len if plan.exp.data.source in ("chat", "mix") else None  # chat: fitted to it
        data = (plan.exp.data.model_dump_json(), seq_len, str(plan.files.folder))
        if data not in sampled:
            sampled.add(data)
            lines = sample_marks.dry_run_lines(plan.exp, plan.files.folder, colour_allowed(out))
            print("\n".join(lines), file=out)
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
    banner = [f"!!! WARNING: {w}" for w in plan.warnings]
    lines = [
        title or f"qwen3exp dry run: {plan.name}   (nothing was started; no model memory was allocated)",
        *banner,
        f"  overrides:     {' '.join(plan.overrides) or '(none)'}",
        f"  run directory: {plan.run_dir}",
    ]
    for section in (
        _experiment_lines(plan, provenance_diff),
        _platform_lines(plan),
        _model_lines(plan),
        _memory_lines(plan),
        _step_lines(plan),
        _layout_lines(plan),
        _training_lines(plan),
        _launch_lines(plan),
    ):
        lines += section
    lines += banner
    return "\n".join(lines)


def _experiment_lines(plan, provenance_diff) -> list[str]:
    """Every key of the experiment with its value and source (a later sweep point: those that differ)."""
    rows = plan.provenance
    if provenance_diff is not None:
        base = {k: (v, str(s)) for k, v, s in provenance_diff}
        rows = [(k, v, s) for k, v, s in rows if base.get(k) != (v, str(s))]
        lines = ["experiment (keys that differ from the first point; value, where it came from):"]
    else:
        lines = ["experiment (value, where it came from):"]
    if not rows:
        return [*lines, "  (no difference)"]
    width = max(len(k) for k, _, _ in rows)
    vwidth = min(30, max(len(_value(v)) for _, v, _ in rows))
    return lines + [f"  {k:<{width}}  {_value(v):<{vwidth}}  {s}" for k, v, s in rows]


def _platform_lines(plan) -> list[str]:
    f, m, t = plan.platform, plan.mesh, plan.exp.training
    lines = [
        f"platform:   {f.name} ({f.reason}); backend {f.dist_backend}, attention {f.attention}, "
        f"memory per rank {_human(f.memory_per_rank_bytes)}"
        + (f", {f.devices_per_node} device(s) per node" if f.devices_per_node is not None else ""),
        f"attention:  {attention_path.resolve(plan.exp, f).describe(t.local_batch_size, t.seq_len)}",
        f"device:     {f.device_type} ({f.device_name or 'unknown'}"
        f"{'' if f.device_checked else ', not checked: planned from the platform table'}), "
        f"compile backend {f.compile_backend}" + (f", LNC {f.lnc}" if f.lnc else ""),
    ]
    env = {**f.env, **{k: f"{plan.run_dir}/{v}" for k, v in f.run_dir_env.items()}}
    if env:
        lines.append(f"rank env:   {' '.join(f'{k}={v}' for k, v in env.items())}")
    lines += neuron_cache.plan_lines(plan)  # Neuron: whether this job's graph is in the compile cache
    return lines + [
        f"mesh:       {m.nnodes} node(s) x {m.nproc_per_node} ranks per node ({m.nproc_from}) "
        f"= world size {m.world_size}",
        f"            dp_replicate {m.dp_replicate} x dp_shard {m.dp_shard} x tp {m.tp} x pp {m.pp} "
        f"x cp {m.cp} (ep {m.ep});  dp_shard: {m.dp_shard_from}",
    ]


def _model_lines(plan) -> list[str]:
    a, p, m = plan.arch, plan.parameters, plan.mesh
    moe = (
        f", MoE {a.moe.num_experts} experts top-{a.moe.top_k} (expert hidden {a.moe.hidden_dim})"
        if a.moe
        else f", FFN hidden {a.hidden_dim}"
    )
    lines = [
        f"model:      {a.n_layers} layers, dim {a.dim}, heads {a.n_heads}/{a.n_kv_heads} kv x {a.head_dim}{moe}, "
        f"vocab {a.vocab_size}{', tied embeddings' if a.tied else ''}, max seq {a.max_seq_len}, "
        f"rope theta {a.rope_theta:g}"
    ]
    for what, src in plan.files.sources().items():
        lines.append(f"{'files:' if what == 'config' else '':<12}{what:<10} {_source(src)}")
    lines.append(f"parameters: total {_count(p.total)}")
    if p.is_moe:
        lines.append(f"            active per token {_count(p.active_per_token)}")
    lines.append(
        f"            per rank {_count(p.per_rank)} (after tp {m.tp}, ep {m.ep}, FSDP over dp_shard x cp = "
        f"{m.dp_shard * m.cp}, pp {m.pp})"
    )
    if p.trainable is not None:
        lora = plan.exp.peft
        lines.append(
            f"            trainable {_count(p.trainable)} (LoRA rank {lora.rank} on {', '.join(lora.targets)})"
        )
    return lines


def _memory_lines(plan) -> list[str]:
    mem = plan.memory
    verdict = "fits" if mem.fits else "DOES NOT FIT"
    return [
        "memory per rank (estimate; the formula is in qwen3exp/plan/memory.py):",
        f"  parameters     {_human(mem.parameters):>12}   {mem.param_dtype}",
        f"  gradients      {_human(mem.gradients):>12}   {mem.param_dtype}",
        f"  optimizer      {_human(mem.optimizer):>12}   AdamW, 2 states, {mem.param_dtype}",
        f"  FSDP buffers   {_human(mem.fsdp_buffers):>12}   largest unit all-gathered twice in "
        f"{mem.compute_dtype} + float32 grads",
        f"  activations    {_human(mem.activations):>12}   {mem.tokens_per_microbatch} tokens per micro-batch, "
        f"{mem.compute_dtype}, activation_checkpoint={mem.activation_checkpoint}",
        *(
            [
                f"  attention mask {_human(mem.attention_mask):>12}   dense block-causal mask: booleans + the "
                f"{mem.compute_dtype} copy SDPA saves in each layer held (none on the causal path)"
            ]
            if mem.attention_mask
            else []
        ),
        *memory_pref.plan_lines(mem, _human),
        f"  total          {_human(mem.total):>12}",
        f"  transients     {_human(mem.transients):>12}   a step's highest point beyond the total (loss chunks, "
        "head gradients, optimizer temporaries)",
        f"  step peak      {_human(mem.total + mem.transients):>12}   of {_human(mem.usable)} usable "
        f"({int(memory.USABLE_FRACTION * 100)}% of {_human(mem.budget)}); headroom {_human(mem.headroom)}: "
        f"{verdict}",
        f"  measured peak  {_human(mem.peak):>12}   what the platform measures per rank: step peak + "
        f"{_human(mem.retained)} kept by the allocator + {_human(mem.runtime)} runtime (summary.json compares)",
    ]


def _step_lines(plan) -> list[str]:
    k = plan.step
    if k is None:
        return []
    return [
        f"step time (cost model, qwen3exp/plan/layout_cost.py): {k.step_s:.3g}s predicted per step: compute "
        f"{k.compute_s:.3g}s{f' (the reference forward {k.reference_s:.3g}s)' if k.reference_s else ''}, hidden "
        f"collectives {k.hidden_s:.3g}s, exposed {k.exposed_s:.3g}s (summary.json compares)"
    ]


def _layout_lines(plan) -> list[str]:
    """What parallelism=auto / training.*=auto chose, the fastest candidates and why the winner won."""
    lay, f = plan.layout, plan.platform
    if lay is None:
        return []
    chosen = " ".join(f"{k}={v}" for k, v in lay.chosen.items())
    lines = [
        f"auto layout: {chosen}",
        f"  {lay.meshes} mesh(es) torchtitan accepts, {lay.considered} layout(s) estimated, {lay.fitting} fit; "
        f"why this one: {lay.why}",
        *([f"  {lay.global_batch}"] if lay.global_batch else []),
        f"  {'':2} {'layout':<58} {'memory':>10} {'step':>9} {'tokens/s':>10} {'compute':>9} {'exposed':>9} "
        f"{'FSDP':>9}",
    ]
    for i, c in enumerate(lay.top):
        k = c.cost
        lines.append(
            f"  {'*' if i == 0 else ' '}{i + 1} {c.describe():<58} {_human(c.memory):>10} {k.step_s:>8.3g}s "
            f"{k.tokens_per_s:>10,.0f} {k.compute_s:>8.3g}s {k.exposed_s:>8.3g}s {k.hidden_s:>8.3g}s"
        )
    rates = f"{(f.sustained_flops_per_rank or 0) / 1e12:g} TFLOP/s, {(f.link_bytes_per_s or 0) / 1e9:g} GB/s in a node"
    return [
        *lines,
        f"  predicted by qwen3exp/plan/layout_cost.py from {f.name}'s stated rates per rank ({rates}, "
        f"{(f.network_bytes_per_s or 0) / 1e9:g} GB/s between nodes); FSDP traffic runs behind compute",
    ]


def _training_lines(plan) -> list[str]:
    """Batches, tokens, the learning-rate schedule, validation and the objective."""
    b, m, t = plan.batches, plan.mesh, plan.exp.training
    dp = m.dp_replicate * m.dp_shard
    why = (
        "training.warmup_steps"
        if t.warmup_steps is not None
        else f"derived from training.steps={t.steps}: min(5, max(1, steps // 5)); set training.warmup_steps to choose"
    )
    metric, direction = plan.exp.sweep_target
    return [
        f"batches:    local {b.local_batch_size} x dp {dp} x grad accumulation {b.grad_accum_steps} = global "
        f"{b.global_batch_size} sequences",
        f"tokens:     {b.tokens_per_step:,} per step, {b.tokens_per_rank_per_step:,} per rank per step",
        *chat_files.plan_lines(plan.exp, plan.files.folder, b.global_batch_size),
        *preference_files.plan_lines(plan.exp, plan.files.folder),
        *reference_model.precompute_line(plan),
        *hf_data_files.plan_lines(plan.exp),
        *data_figures.plan_lines(plan),
        *mixture_lines.plan_lines(plan),
        f"schedule:   {t.steps} steps, lr {t.lr:g}, warm-up {t.warmup} step(s) ({why}), {t.decay_type} decay",
        f"validation: {validation_line(plan.exp)}",
        *([f"samples:    {cost}"] if (cost := sample_prompts.cost_line(plan.exp)) else []),
        *([f"evaluation: {line}"] if (line := eval_tasks.plan_line(plan.exp)) else []),
        f"objective:  {metric} ({direction}d; sweep.objective"
        + (")" if plan.exp.sweep.objective else ", null: val_loss with validation on, else last_loss)"),
    ]


def _launch_lines(plan) -> list[str]:
    """The kernel overrides, the checkpoint verdict and the commands that start the run."""
    if plan.kernel_overrides:
        lines = ["overrides:  " + ", ".join(f"{n} on {c} node(s)" for n, c in plan.kernel_overrides)]
    else:
        lines = ["overrides:  none"]
    c = plan.checkpoint
    word = {True: "compatible: ", False: "INCOMPATIBLE: ", None: ""}[c.compatible]
    lines.append(f"checkpoint: {word}{c.detail}")
    lines += [f"launch:     {note}" for note in plan.launch_notes]
    for i, cmd in enumerate(plan.commands):
        label = "command:   " if len(plan.commands) == 1 else f"node {i}:    "
        lines.append(f"{label} {shlex.join(cmd)}")
    return lines


def validation_line(exp) -> str:
    """Where the held-out loss comes from and when it is measured."""
    v, steps = exp.validation, exp.training.steps
    if not v.enable:
        return "off (validation.enable=false): no held-out loss"
    multiples = range(v.freq, steps + 1, v.freq)  # counted and sliced, never listed: steps may be 1e9
    count = len(multiples) + (1 not in multiples) + (steps not in multiples)
    at = sorted({1, steps, *multiples[:8]})
    shown = ", ".join(map(str, at)) if count <= 8 else f"{', '.join(map(str, at[:6]))}, ..., {steps}"
    if exp.data.source == "mix":  # each source alone (`qwen3exp.titan.mixture_validator`)
        held = f"each source's {v.fraction:.0%} held out, or its validation_path: val_loss_<source>, val_loss"
        return f"{v.steps} batch(es) per source at step(s) {shown}; {held} (their token-weighted mean)"
    source = f"{v.fraction:.0%} of the training documents held out (validation.fraction; the same ones every run"
    source = f"{v.path} (validation.path; training reads all of its data)" if v.path else f"{source}, never trained on)"
    return f"{v.steps} batch(es) at step(s) {shown}; {source}"


def _value(v) -> str:
    return "null" if v is None else str(v)


def _source(src: dict) -> str:
    """One model source of the plan: `Qwen/Qwen3-0.6B@main -> snapshot <commit> (<folder>): <what>`."""
    if src.get("repo_id"):
        where = (
            f"{src['repo_id']}@{src.get('revision') or 'main'} -> Hugging Face cache snapshot "
            f"{src['commit']} ({src['folder']})"
        )
    else:
        where = src.get("folder") or ""
    return f"{where}: {src['what']}" if where else src["what"]
