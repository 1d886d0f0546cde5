"""The plan's figures of a mixture: each source counted by its kind's own code, then what the blend
gives it within training.steps (plan.json's and summary.json's "data", `"sources"`).

The blend (`qwen3exp.data.mixture`, the ranks' index) gives each source its weight's share of the
trained tokens: a source whose sequences train `t` tokens each is chosen in proportion to
weight / t. Over the run's S sequences (global batch x training.steps), the trained tokens are
T = S / sum(weight_i / t_i), source i gives weight_i x T of them in weight_i x T / t_i sequences,
and its epochs are the epochs a one-source run of S sequences makes (its kind's figure) scaled by
its share of the sequences. `t` per kind, as the ranks count it (labels not ignored): plain text,
seq_len (packed documents: every position is a label); conversations and pairs, the mean trained tokens of
the conversations the kind's plan checked (an estimate, and said so); packed conversations, that
mean x the conversations per packed sequence. A source over its `max_epochs` with
over_max_epochs=cap keeps the sequences max_epochs allows and the others share the rest.
"""

from __future__ import annotations

from qwen3exp.assets import CORPUS_DIR
from qwen3exp.config.sections.data import ChatData, HFData, LocalData, PreferenceData
from qwen3exp.config.sections.mixture import MixtureData
from qwen3exp.data import figures as data_figures
from qwen3exp.data.chat import files as chat_files
from qwen3exp.data.mixture_views import views
from qwen3exp.data.preference import files as preference_files

REPEAT_WARNING = 4.0
"""A source read more often than this within training.steps is warned about in the plan."""


def location(d) -> str:
    """Where a source's records are, in words."""
    if isinstance(d, (ChatData, PreferenceData)):
        return d.location if d.path is not None else f"bundled {d.source} data {d.location}"
    if isinstance(d, LocalData):
        return d.path
    if isinstance(d, HFData):
        return d.name or d.files or "?"
    return f"bundled corpus {CORPUS_DIR}"


def _per_sequence(v, f, folder) -> tuple[float | None, str, str]:
    """(trained tokens per sequence, what a record is called, what is trained) of one source."""
    d, seq_len = v.data, v.training.seq_len
    if isinstance(d, ChatData):
        s = chat_files.stats(d, folder, seq_len)
        kept = s.checked - s.dropped
        t = s.trained / kept if kept else None
        if t is not None and d.pack and f.sequences and s.total:
            t *= s.total * kept / s.checked * (1 - (v.validation.held_out or 0.0)) / f.sequences
        return t, "conversations", f"its data.loss_on={d.loss_on} turns"
    if isinstance(d, PreferenceData):
        p = preference_files.stats(d, folder, seq_len)
        kept = p.checked - p.dropped
        return ((p.chosen + p.rejected) / (2 * kept) if kept else None), "pairs", "each side's final answer"
    return float(seq_len), "documents", "every position of its sequences"


def _shares(sources: dict, total: int) -> dict[str, float]:
    """Sequences per source (of `total`): weight / t, with the capped sources held at their cap."""
    fixed: dict[str, float] = {}
    while True:
        free = {n: s for n, s in sources.items() if n not in fixed}
        room = total - sum(fixed.values())
        inv = sum(s["weight"] / s["trained_per_sequence"] for s in free.values())
        out = {n: room * s["weight"] / s["trained_per_sequence"] / inv if inv else 0.0 for n, s in free.items()}
        over = {n: s["cap"] for n, s in free.items() if s["cap"] is not None and out[n] > s["cap"]}
        if not over or len(over) == len(free):
            return {**fixed, **{n: min(out[n], over.get(n, out[n])) for n in out}}
        fixed.update(over)


def figures(exp, folder, batches) -> dict | None:
    """plan.json's "data" of a mixture (None for one kind): each source's kind figures and its share."""
    if not isinstance(exp.data, MixtureData):
        return None
    weights, total = exp.data.weights, batches.global_batch_size * exp.training.steps
    sources: dict[str, dict] = {}
    for n, v in views(exp).items():
        f = data_figures.figures(v, folder, batches)
        t, unit, trains = _per_sequence(v, f, folder)
        per_seq = f.epochs / total if f.epochs else None  # epochs one sequence of this source makes
        share = exp.data.sources[n]
        cap = share.max_epochs / per_seq if per_seq and share.max_epochs and share.over_max_epochs == "cap" else None
        sources[n] = {
            "source": share.source,
            "location": location(v.data),
            "unit": unit,
            "weight": weights[n],
            "records": f.documents,
            "tokens": f.tokens,
            "tokens_from": f.tokens_from,
            "trains": trains,
            "trained_per_sequence": t or float(v.training.seq_len),
            "estimated": isinstance(v.data, (ChatData, PreferenceData)) or f.tokens_from != "counted",
            "cap": cap,
            "per_sequence_epochs": per_seq,
            "kind": f.as_json(),
        }
    seqs = _shares(sources, total)
    for n, s in sources.items():
        s["sequences"] = seqs[n]
        s["trained"] = seqs[n] * s["trained_per_sequence"]
        per = s.pop("per_sequence_epochs")
        s["epochs"] = seqs[n] * per if per else None
        cap = s.pop("cap")
        s["capped"] = cap is not None and seqs[n] >= cap * (1 - 1e-9)
    return {**_totals(exp, sources), "sequences": total}


def _totals(exp, sources: dict) -> dict:
    off = [n for n, s in exp.data.sources.items() if s.weight == 0]
    chats = any(s["unit"] != "documents" for s in sources.values())
    guessed = "estimated: a conversation or pair trains the checked ones' mean" if chats else "estimated"
    return {
        "source": "mix",
        "documents": _sum(s["records"] for s in sources.values()),
        "tokens": _sum(s["tokens"] for s in sources.values()),
        "tokens_from": "each source counted by its kind",
        "epochs": None,
        "trained": round(sum(s["trained"] for s in sources.values())),
        "trained_from": guessed if any(s["estimated"] for s in sources.values()) else "counted",
        "sources": sources,
        "off": off,
    }


def _sum(values) -> int | None:
    vals = list(values)
    return None if any(v is None for v in vals) else sum(vals)


def warnings(figures: dict | None) -> list[str]:
    """A source read more than `REPEAT_WARNING` times within training.steps, or never reached
    (its weight gives it less than one sequence)."""
    out = []
    for n, s in (figures or {}).get("sources", {}).items():
        if s["epochs"] is not None and s["epochs"] > REPEAT_WARNING:
            out.append(
                f"source {n} repeats {s['epochs']:.3g} epochs within training.steps (more than {REPEAT_WARNING:g}): "
                f"lower data.sources.{n}.weight, train fewer steps or add data (max_epochs refuses or caps it)"
            )
        if s["sequences"] < 1:
            out.append(
                f"source {n} is never reached: weight {s['weight']:.3g} gives it {s['sequences']:.2g} sequences "
                f"within training.steps (less than one); raise data.sources.{n}.weight, or set it to 0 (off)"
            )
    return out
