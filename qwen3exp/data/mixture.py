"""The blending rule of data=mix: which source the next sample comes from (plain Python, no torch).

Megatron's blended datasets pick, for sample n, the source whose count lags its weight the most
(argmax of weight x n - drawn). A mixture's `weight` is a source's share of the trained tokens, not
of the samples (a chat sample trains its assistant turns, a text sample every token), so the rule
here runs on trained tokens: the next sample comes from the active source with the largest deficit
`weight_s x T - tokens_s` (T: the trained tokens of all sources so far; ties: the order of
data.sources). After every sample each source's tokens are within one sample of weight_s x T, so
the realised shares follow the weights at every point of a run, not only on average, and the
sequence of picks is a function of the weights and the samples' token counts alone (the same
samples for the same data and seed).

A source with weight 0 is never drawn. A capped source (data.sources.<s>.max_epochs with
over_max_epochs=cap: the ranks cap it once it has read its records max_epochs times) is drawn no
more; the others fill its place, still in proportion to their weights (the deficits are taken
over the active sources: their weights renormalised, their tokens' total). `Blend` holds the state (the
tokens each source gave, which are capped) as plain data, saved with dcp checkpoints by the ranks
(`qwen3exp.titan.mixture_dataset`), so a resumed run picks exactly as the uninterrupted one would.
`allotment` is the same rule in the large, for a plan: the tokens each source contributes within a
run's tokens when some sources hold fewer than their share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def pick(weights: Sequence[float], tokens: Sequence[int], active: Sequence[bool]) -> int | None:
    """The index of the source the next sample comes from: of the active sources with a weight
    above 0, the one with the largest deficit weight x total - tokens, weights and total over the
    active sources (the first one on a tie); None when no source is left."""
    live = [i for i, (w, on) in enumerate(zip(weights, active, strict=True)) if on and w > 0]
    norm, total = sum(weights[i] for i in live), sum(tokens[i] for i in live)
    best, best_deficit = None, 0.0
    for i in live:
        deficit = weights[i] / norm * total - tokens[i]
        if best is None or deficit > best_deficit:
            best, best_deficit = i, deficit
    return best


def shares(tokens: Sequence[int]) -> list[float]:
    """Each source's share of the tokens (0 for all before any)."""
    total = sum(tokens)
    return [t / total if total else 0.0 for t in tokens]


def allotment(weights: Sequence[float], total: float, limits: Sequence[float | None]) -> list[float]:
    """The tokens each source gives within `total` trained tokens: weight x total, except that a
    source with a limit (its tokens x max_epochs, when capped) gives at most its limit and the
    other sources share what it leaves in proportion to their weights. The sum is below `total`
    only when every source with a weight reached its limit."""
    out = [0.0] * len(weights)
    left, open_ = float(total), [i for i, w in enumerate(weights) if w > 0]
    while open_ and left > 0:
        norm = sum(weights[i] for i in open_)
        room = {i: limit - out[i] for i in open_ if (limit := limits[i]) is not None}
        full = [i for i in room if weights[i] / norm * left >= room[i]]
        if not full:
            for i in open_:
                out[i] += weights[i] / norm * left
            return out
        for i in full:  # these reach their limit: the rest is shared again by the others
            left -= room[i]
            out[i] += room[i]
        open_ = [i for i in open_ if i not in full]
    return out


@dataclass
class Blend:
    """The blend's state in one rank: the trained tokens each source gave, the samples drawn from
    each, and which sources are capped. `state_dict`/`load_state_dict`: plain lists."""

    weights: list[float]
    """Normalised weights, in the order of data.sources."""
    tokens: list[int] = field(default_factory=list)
    draws: list[int] = field(default_factory=list)
    capped: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.weights)
        self.tokens = self.tokens or [0] * n
        self.draws = self.draws or [0] * n
        self.capped = self.capped or [False] * n

    def next(self) -> int | None:
        """The source of the next sample (None: every source with a weight is capped)."""
        return pick(self.weights, self.tokens, [not c for c in self.capped])

    def add(self, source: int, tokens: int) -> None:
        """A sample of `source` with `tokens` trained tokens was yielded."""
        self.tokens[source] += tokens
        self.draws[source] += 1

    def cap(self, source: int) -> None:
        self.capped[source] = True

    def state_dict(self) -> dict[str, list]:
        return {"tokens": list(self.tokens), "draws": list(self.draws), "capped": list(self.capped)}

    def load_state_dict(self, state: dict[str, list]) -> None:
        self.tokens = [int(t) for t in state["tokens"]]
        self.draws = [int(d) for d in state["draws"]]
        self.capped = [bool(c) for c in state["capped"]]
