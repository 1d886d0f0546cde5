"""Pre-launch checks of a mixture (exit 2 before any worker, naming `data.sources.<name>.<key>`).

Each source is checked by its kind's own checks on its view (`mixture_views`), the problems named
by the mixture's keys. The mixture adds: the objective trains the source's kind (sft: text and
conversations; dpo, orpo, simpo: preference pairs only); no two sources read the same files; the
plain-text sources end their documents with one separator (resolved: null is the tokenizer's own);
validation.path is the sources' own (`data.sources.<name>.validation_path`); and, once the plan has
counted the sources (`mixture_figures`), a source read more than its `max_epochs` with
over_max_epochs=refuse. Weights (>= 0, not all 0) and source names are the schema's
(`qwen3exp.config.sections.mixture`).
"""

from __future__ import annotations

from pathlib import Path

from qwen3exp.assets import CORPUS_DIR
from qwen3exp.config.sections.data import ChatData, HFData, LocalData, PreferenceData
from qwen3exp.config.sections.mixture import MixtureData
from qwen3exp.data import figures as data_figures, files as data_files
from qwen3exp.data.chat import packing as chat_packing
from qwen3exp.data.chat.render import chat_files
from qwen3exp.data.mixture_lines import count
from qwen3exp.data.mixture_views import rekeyed, views
from qwen3exp.data.preference import files as preference_files
from qwen3exp.data.text import hf_files as hf_data_files
from qwen3exp.data.text.hf_source import resolve
from qwen3exp.errors import Problem
from qwen3exp.objectives import registry

TEXT_KINDS = "bundled, local, hf or chat"


def problems(exp, folder: Path | None, ranks: int | None = None) -> list[Problem]:
    """Every problem of a mixture's sources (none for one kind); `ranks`: the data-parallel ranks
    (None: the mesh is not known, the split is checked for one rank)."""
    if not isinstance(exp.data, MixtureData):
        return []
    out = _validation_path(exp)
    for n, v in views(exp).items():
        wrong = _kind_problems(exp, n, v.data)
        out += wrong or rekeyed(_source_problems(v, folder, ranks), n)
    out += _same_files(exp) + _separators(exp, folder)
    return list({(p.key, p.message): p for p in out}.values())  # one source's checks may repeat one


def _source_problems(v, folder: Path | None, ranks: int | None) -> list[Problem]:
    """One source's problems, found by its kind's checks."""
    d, t = v.data, v.training
    ps = [] if isinstance(d, ChatData) else data_files.data_problems(d, v.validation, ranks=ranks or 1)
    ps += hf_data_files.hf_problems(d, t, v.validation)
    ps += preference_files.record_problems(d, v.validation, folder, t.seq_len, v.objective, t, v)
    ps += data_figures.eos_problems(d, folder)
    if ranks is not None and folder is not None:
        ps += chat_packing.rank_problems(v, ranks, folder)
    return ps


def _kind_problems(exp, name: str, d) -> list[Problem]:
    """The objective cannot train this source's kind."""
    objective = exp.objective.kind
    if registry.of(exp.objective).DATA == "pairs" and not isinstance(d, PreferenceData):
        why = f"objective={objective} trains on preference pairs, and source {name} is {d.source} data"
        allowed = f"preference (objective={objective} trains every source of a mixture on pairs)"
        return [Problem(f"data.sources.{name}.source", d.source, why, allowed, "objective=sft for text and chats")]
    if registry.of(exp.objective).DATA != "pairs" and isinstance(d, PreferenceData):
        why = f"holds preference pairs, which objective={objective} does not train on"
        hint = "objective=dpo, orpo or simpo with preference sources only"
        return [Problem(f"data.sources.{name}.source", d.source, why, f"{TEXT_KINDS} with objective={objective}", hint)]
    return []


def _separators(exp, folder: Path | None) -> list[Problem]:
    """The plain-text sources end their documents with different tokens: one tokenizer appends one."""
    resolved = {n: data_figures.separator(s, folder) for n, s in exp.data.sources.items() if s.weight > 0}
    seps = {n: sep for n, sep in resolved.items() if sep is not None}
    if len(set(seps.values())) < 2:
        return []
    (first, sep), *rest = seps.items()
    name, other = next((n, x) for n, x in rest if x != sep)
    why = f"ends its documents with {other[0]}, and source {first} with {sep[0]}: the run's tokenizer appends one"
    return [Problem(f"data.sources.{name}.eos", exp.data.sources[name].eos, why, f"{sep[0]} (as source {first})")]


def _validation_path(exp) -> list[Problem]:
    if not (exp.validation.enable and exp.validation.path is not None):
        return []
    names = ", ".join(f"data.sources.{n}.validation_path" for n in exp.data.sources)
    why = "is one file for one data set; a mixture validates each source on its own held-out records"
    return [Problem("validation.path", exp.validation.path, why, "null with data=mix", f"set {names}")]


def files_of(d) -> set[str]:
    """The resolved files a source reads ({} when they cannot be listed: its own checks say why)."""
    try:
        if isinstance(d, (ChatData, PreferenceData)):
            return {str(f.resolve()) for f in chat_files(d.location)}
        if isinstance(d, HFData):
            src, _ = resolve(d)
            return {str(Path(f).resolve()) for f in src.files} if src is not None else set()
        path = d.path if isinstance(d, LocalData) else CORPUS_DIR
        return {str(Path(f).resolve()) for f in data_files.data_files(path)}
    except OSError:
        return set()


def _same_files(exp) -> list[Problem]:
    """Two sources that read the same file: its records would count twice, under two weights."""
    out, seen = [], dict[str, str]()
    for n, v in views(exp).items():
        for f in sorted(files_of(v.data)):
            if f in seen:
                key = "path" if isinstance(v.data, (ChatData, PreferenceData, LocalData)) else "source"
                value = getattr(v.data, key) if key == "path" else v.data.source
                why = f"reads {f}, which source {seen[f]} reads too: its records would count twice"
                allowed = "each file in one source only"
                hint = f"one source with the sum of their weights, or drop data.sources.{n}"
                out.append(Problem(f"data.sources.{n}.{key}", value, why, allowed, hint))
                break
            seen[f] = n
    return out


def epoch_problems(exp, figures: dict | None) -> list[Problem]:
    """A source the plan finds would be read more than its max_epochs, with over_max_epochs=refuse."""
    if figures is None:
        return []
    out = []
    for n, f in figures["sources"].items():
        share = exp.data.sources[n]
        if share.max_epochs is None or share.over_max_epochs != "refuse" or f["epochs"] is None:
            continue
        if f["epochs"] > share.max_epochs:
            why = (
                f"source {n} would be read {f['epochs']:.3g} times within training.steps={exp.training.steps} "
                f"(weight {f['weight']:.3g}: {f['trained']:,.0f} trained tokens of its "
                f"{count(f['tokens'])} tokens)"
            )
            allowed = f"at least {f['epochs']:.3g}, or over_max_epochs=cap (it stops; the other sources fill its place)"
            hint = "or a lower weight, fewer training.steps or more data"
            out.append(Problem(f"data.sources.{n}.max_epochs", share.max_epochs, why, allowed, hint))
    return out + _run_out(exp, figures)


def _run_out(exp, figures: dict) -> list[Problem]:
    """Every source capped (over_max_epochs=cap) before training.steps end: the ranks' blend has
    nothing left to draw and the run would stop short."""
    drawn, total, steps = (
        sum(s["sequences"] for s in figures["sources"].values()),
        figures["sequences"],
        exp.training.steps,
    )
    if drawn >= total * (1 - 1e-9):
        return []
    k = int(drawn / total * steps)
    why = f"every source reaches its max_epochs (over_max_epochs=cap) after about {k} of the {steps} steps: "
    why += "the data runs out"
    return [
        Problem("training.steps", steps, why, f"at most {k}", "or higher data.sources.<name>.max_epochs, or more data")
    ]
