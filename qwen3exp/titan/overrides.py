"""The torchtitan side of kernel overrides: checked against the config tree before launch, handed to
torchtitan, confirmed at run time.

Activations come from the `kernels` section (`qwen3exp.kernels.registry`, which needs no torchtitan):
`kernels.rope.impl=nki` (`qwen3exp.kernels.nki_rope`), `kernels.moe.impl=nki`
(`qwen3exp.kernels.nki_moe`) and every `kernels.overrides` entry (your own `@override` factories).
torchtitan applies them in `Trainer.__init__` from `override.imports`; it only warns
when an override matches nothing (and only when all of them together match nothing) and it never
tells you which experiment key was wrong. So before any worker starts, `claims()` walks the same
config tree torchtitan will walk (the `Trainer.Config`, FQNs `model_spec.model.layers.0...`, with
torchtitan's own traversal and glob matcher, no model built) and refuses:
- an override that matches no node (naming the nodes its target class does have),
- two overrides claiming one node, or one claiming an ancestor of another's node (naming both),
- a module that does not import, a name that is not an `@override` factory, kwargs it cannot take,
- what each built-in override refuses itself (`qwen3exp.kernels.registry.problems`): sharded
  tensors; on Neuron, nki_rope with `training.seq_len` not a multiple of 128 x LNC, nki_moe with a
  block size nkilib does not have, or a hidden size the backward kernel cannot shard over LNC.
The claims (override -> nodes) go to summary.json; the worker also records the `[Override]` lines
torchtitan logs while building the model (`overrides_applied.json`), so the count is confirmed.

`fqns` given in the experiment replace the factory's own selection. torchtitan takes the selection
from the `@override` decorator, so such an activation is registered once more under an alias in
this module (`qwen3exp.titan.overrides.<function>__<hash>`), with the same factory and target.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from qwen3exp.errors import ConfigError, Problem, did_you_mean, one_of
from qwen3exp.kernels.registry import ALIAS_MODULE, BY_KEY, Activation, activations, problems as kernel_problems
from qwen3exp.run import rundir


# ------------------------------------------------------------------------- torchtitan registry
def _registered(act: Activation, problems: list[Problem]):
    """Import the factory's module (running its @override decorators) and return the registered
    override, or record why not."""
    # torchtitan keeps registered overrides in a private dict and has no public lookup; this is the
    # one place that reads it.
    from torchtitan.config.override import _REGISTRY  # lazy: plain experiments never import torchtitan here

    module, _, func = act.target.rpartition(".")
    try:
        importlib.import_module(module)
    except Exception as e:
        problems.append(
            Problem(
                act.target_key,
                act.target,
                f"module {module!r} does not import: {type(e).__name__}: {e}",
                hint="the module must be importable on every rank (installed, or on PYTHONPATH)",
            )
        )
        return None
    ov = _REGISTRY.get(act.target)
    if ov is None:
        here = sorted(k.rpartition(".")[2] for k in _REGISTRY if k.rpartition(".")[0] == module)
        problems.append(
            Problem(
                act.target_key,
                act.target,
                f"{func!r} is not an @override factory of module {module}",
                one_of(f"{module}.{h}" for h in here) or f"(module {module} registers none)",
                did_you_mean(func, here),
            )
        )
    return ov


def _check_kwargs(act: Activation, ov, problems: list[Problem]) -> None:
    try:
        inspect.signature(ov.factory).bind(None, **act.kwargs)
    except TypeError as e:
        params = [p for p in list(inspect.signature(ov.factory).parameters)[1:]]
        problems.append(
            Problem(
                f"{act.key}.kwargs",
                act.kwargs,
                f"{act.target} cannot take them: {e}",
                one_of(params) or "no keyword arguments",
            )
        )


def register_aliases(acts: list[Activation]) -> None:
    """Register the alias of every activation that carries its own `fqns` (idempotent)."""
    from torchtitan.config import override  # lazy: plain experiments never import torchtitan here
    from torchtitan.config.override import _REGISTRY  # lazy: the same

    for act in acts:
        name = act.import_name
        if act.fqns is None or name in _REGISTRY:
            continue
        problems: list[Problem] = []
        ov = _registered(act, problems)
        if ov is None:
            raise ConfigError(problems)
        factory = ov.factory

        def alias(cfg, _factory=factory, **kwargs):
            return _factory(cfg, **kwargs)

        alias.__module__, alias.__name__ = ALIAS_MODULE, name.rpartition(".")[2]
        alias.__qualname__ = alias.__name__
        override(
            target=ov.target_cls,
            fqns=list(act.fqns),
            exact=ov.exact,
            description=f"{ov.description} (fqns from {act.key})",
        )(alias)


def import_entries(kernels) -> list:
    """torchtitan's `override.imports` for the experiment (registers aliases; [] when none)."""
    acts = activations(kernels)
    if not acts:
        return []
    register_aliases(acts)
    return [(a.import_name, a.kwargs) if a.kwargs else a.import_name for a in acts]


# ----------------------------------------------------------------------------- the checks
@dataclass(frozen=True)
class Claim:
    key: str
    target: str
    import_name: str
    replaces: str
    """The config class it replaces (e.g. CosSinRoPE.Config)."""
    fqns: list[str]
    """The selection that was matched (the experiment's, else the factory's; ["*"] for all)."""
    nodes: list[str]
    """The FQNs of the nodes it replaces."""


def claims(acts: list[Activation], trainer_config) -> list[Claim]:
    """Match every activation against the config tree exactly as torchtitan will; raise ConfigError
    on anything torchtitan would silently skip or report late."""
    from torchtitan.config.override import Override  # lazy: plain experiments never import torchtitan here

    problems: list[Problem] = []
    out: list[Claim] = []
    for act in acts:
        ov = _registered(act, problems)
        if ov is None:
            continue
        _check_kwargs(act, ov, problems)
        selector = Override(
            target_cls=ov.target_cls,
            factory=ov.factory,
            fqns=list(act.fqns) if act.fqns is not None else ov.fqns,
            description=ov.description,
            origin_module=ov.origin_module,
            exact=ov.exact,
        )
        candidates = [
            fqn
            for fqn, cfg, _, _ in trainer_config.traverse(ov.target_cls)
            if not (ov.exact and type(cfg) is not ov.target_cls)
        ]
        nodes = [fqn for fqn in candidates if selector.matches(fqn)]
        cls = ov.target_cls.__qualname__
        if not nodes:
            problems.append(_no_match(act, selector.fqns, cls, candidates))
            continue
        out.append(Claim(act.key, act.target, act.import_name, cls, selector.fqns or ["*"], nodes))
    problems += _conflicts(out)
    if problems:
        raise ConfigError(problems)
    return out


def _no_match(act: Activation, fqns, cls: str, candidates: list[str]) -> Problem:
    builtin = BY_KEY.get(act.key)
    if builtin is not None and (own := builtin.no_match_problem(act.key, candidates)) is not None:
        return own
    key = f"{act.key}.fqns" if act.fqns is not None else act.key
    shown = candidates[:6] + ([f"... ({len(candidates)} in all)"] if len(candidates) > 6 else [])
    return Problem(
        key,
        list(fqns) if fqns is not None else act.target,
        f"{act.target} matches no node of the config tree (torchtitan would only warn)",
        f"globs over the {cls} nodes: {one_of(shown)}" if candidates else f"(the model has no {cls} node)",
        "FQNs start with model_spec.model. ; * also crosses dots",
    )


def _conflicts(found: list[Claim]) -> list[Problem]:
    problems = []
    for i, a in enumerate(found):
        for b in found[i + 1 :]:
            same = sorted(set(a.nodes) & set(b.nodes))
            nested = sorted(f"{x} (under {y})" for x in a.nodes for y in b.nodes if x.startswith(y + ".")) + sorted(
                f"{y} (under {x})" for x in a.nodes for y in b.nodes if y.startswith(x + ".")
            )
            if same or nested:
                where = same or nested
                problems.append(
                    Problem(
                        b.key,
                        b.target,
                        f"claims {len(where)} node(s) also claimed by {a.key} ({a.target}): {one_of(where[:4])}"
                        + (" ..." if len(where) > 4 else ""),
                        hint=f"narrow {a.key}.fqns or {b.key}.fqns so that they select disjoint nodes",
                    )
                )
    return problems


def check(exp, facts, build_config) -> list[dict]:
    """The pre-launch check. `build_config()` returns the Trainer.Config (only called when an
    override is active, so plain experiments never import torchtitan here). Returns the claims as
    plain data for summary.json."""
    acts = activations(exp.kernels)
    if not acts:
        return []
    problems = kernel_problems(exp, facts)
    if problems:
        raise ConfigError(problems)
    return [asdict(c) for c in claims(acts, build_config())]


# --------------------------------------------------------------------- runtime confirmation
_LINE = re.compile(r"^\[Override\] (\S+): (\S+) (\S+) -> (\S+)")


@contextmanager
def record_applied(run_dir: Path, *, write: bool):
    """Collect the `[Override] name: fqn Old -> New` lines torchtitan logs while the trainer is
    built, and write them to `overrides_applied.json` (rank 0)."""
    lines: list[dict] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            m = _LINE.match(record.getMessage())
            if m:
                lines.append({"name": m[1], "node": m[2], "old": m[3], "new": m[4]})

    handler = _Collect(level=logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        if write:
            rundir.atomic_write_json(run_dir / rundir.OVERRIDES_APPLIED, lines)


def merge_applied(claimed: list[dict], run_dir: Path) -> list[dict]:
    """summary.json's `overrides`: each claim with `nodes` (count), `node_fqns`, and `applied` (the
    count torchtitan logged at run time; null when the run did not get that far)."""
    applied = rundir.read_json(run_dir / rundir.OVERRIDES_APPLIED)
    out = []
    for c in claimed:
        row = {k: v for k, v in c.items() if k != "nodes"}
        row["nodes"] = len(c["nodes"])
        row["node_fqns"] = c["nodes"]
        row["applied"] = None if applied is None else sum(1 for a in applied if a["name"] == c["import_name"])
        out.append(row)
    return out
