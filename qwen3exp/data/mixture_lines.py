"""The plan's lines about a mixture (`qwen3exp.plan.render`): each source, what it gives the run."""

from __future__ import annotations

from qwen3exp.config.sections.mixture import MixtureData
from qwen3exp.data.figures import epochs_text


def count(value) -> str:
    """A count with thousands separators, ? when not known."""
    return "?" if value is None else f"{value:,}"


def plan_lines(plan) -> list[str]:
    """data=mix: one block per source (kind, where, records, tokens, weight, trained tokens within
    training.steps and the epochs they make); none for one kind."""
    f, d = plan.data, plan.exp.data
    if not isinstance(d, MixtureData) or not f:
        return []
    steps, gbs = plan.exp.training.steps, plan.batches.global_batch_size
    lines = [
        f"data:       a mixture of {len(d.sources)} sources (data=mix), blended by trained tokens: {steps} steps x "
        f"{gbs} sequences, {f['trained']:,} trained tokens ({f['trained_from']})"
    ]
    for n, s in f["sources"].items():
        raw = d.sources[n].weight
        est = " (estimated)" if s["estimated"] else ""
        capped = f"; capped at data.sources.{n}.max_epochs={d.sources[n].max_epochs:g}" if s["capped"] else ""
        lines += [
            f"  {n}: {s['source']}, {s['location']}",
            f"            {count(s['records'])} {s['unit']}, {count(s['tokens'])} tokens ({s['tokens_from']}); "
            f"weight {s['weight']:.3g} (data.sources.{n}.weight={raw:g}, normalised)",
            f"            within training.steps: {s['trained']:,.0f} trained tokens{est} in {s['sequences']:,.1f} "
            f"sequences = {epochs_text(s['epochs'])}{capped}; trains {s['trains']}",
        ]
        if s["kind"].get("separator"):
            lines.append(f"            separator {s['kind']['separator']} (id {s['kind']['separator_id']})")
    lines += [f"  {n}: weight 0, off (not read)" for n in f["off"]]
    units = {s["unit"] for s in f["sources"].values()}
    if "documents" in units and "conversations" in units:
        lines.append(
            "            plain text and conversations in one run: plain text trains every token, a conversation "
            "the turns its data.sources.<name>.loss_on names"
        )
    return lines
