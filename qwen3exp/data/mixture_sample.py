"""The first training samples of a mixture, each named by its source: `qwen3exp data show` and the
dry run's sample for data=mix (one kind: `qwen3exp.data.sample` as is).

Each source's first samples are its kind's (`sample.first_samples` on the source's view), and they
are interleaved the way the blend chooses (`qwen3exp.data.mixture`): next comes the source whose
trained tokens so far fall furthest below its weight's share (deficit-greedy; a tie to the source
named first). A sample here is a kind's sample (a document, a
conversation), so the order shows which source comes when; the ranks' blend index, which chooses
per sequence, is what training reads.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from qwen3exp.config.sections.mixture import MixtureData
from qwen3exp.data import sample
from qwen3exp.data.mixture_views import views
from qwen3exp.data.sample import Sample, Samples


def first_samples(exp, folder: str | Path, count: int) -> Samples:
    """The first `count` training samples of `exp`; a mixture's labelled `source <name>: ...`."""
    if not isinstance(exp.data, MixtureData):
        return sample.first_samples(exp, folder, count)
    weights = exp.data.weights
    per = {n: sample.first_samples(v, folder, count) for n, v in views(exp).items()}
    got, taken, out = dict.fromkeys(per, 0), dict.fromkeys(per, 0), list[Sample]()
    while len(out) < count:
        ready = [n for n in per if taken[n] < len(per[n].samples)]
        if not ready:
            break
        total = sum(got.values())
        n = max(ready, key=lambda m: weights[m] * total - got[m])  # the first on a tie, as the blend
        s = per[n].samples[taken[n]]
        taken[n] += 1
        got[n] += s.trained
        out.append(replace(s, label=f"source {n} ({exp.data.sources[n].source}): {s.label}"))
    where = ", ".join(f"{n} ({exp.data.sources[n].source}, weight {weights[n]:.3g})" for n in per)
    trained = "; ".join(f"{n}: {s.trained}" for n, s in per.items())
    skipped = [f"{n}: {k}" for n, s in per.items() for k in s.skipped]
    return Samples(f"data=mix: {where}", trained, out, skipped)
