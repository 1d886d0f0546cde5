"""Which torchtitan overrides an experiment activates, and what the launcher refuses before launch
without torchtitan (pure: no torch, no torchtitan; `qwen3exp.titan.overrides` does the rest).

A kernel override is one module here (`nki_rope`, `nki_moe`), following `KernelOverride`, found by
the class of the `kernels` section field that activates it (`BY_SECTION`). Activations come from
those fields (`kernels.rope.impl=nki`, `kernels.moe.impl=nki`), in the section's field order, and
from every `kernels.overrides` entry (your own `@override` factories). A new kernel override is its
module here and one entry in `OVERRIDES`, its torchtitan factory in `qwen3exp.titan`, its field in
`qwen3exp.config.sections.kernels` and its `conf/kernels/<name>.yaml`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from qwen3exp.config.sections.kernels import Kernels
from qwen3exp.errors import Problem
from qwen3exp.kernels import neuron, nki_moe, nki_rope

ALIAS_MODULE = "qwen3exp.titan.overrides"
"""Where an activation that carries its own `fqns` is registered under an alias (by
`qwen3exp.titan.overrides.register_aliases`); torchtitan imports the alias by this module name."""


class KernelOverride(Protocol):
    """A built-in kernel override module: everything the launcher knows about it without torch."""

    # Read-only (properties): a module's constants satisfy them with their own, narrower types.
    @property
    def SECTION(self) -> type[BaseModel]:
        """The class of the `kernels` field that activates it (RopeKernel)."""
        ...

    @property
    def IMPL(self) -> str:
        """The field's `impl` that activates it (nki)."""
        ...

    @property
    def FACTORY(self) -> str:
        """`module.function` of its torchtitan `@override` factory (in qwen3exp.titan)."""
        ...

    @property
    def DEFAULT_FQNS(self) -> list[str]:
        """The nodes it claims (torchtitan FQN globs) unless the field's `fqns` narrows them."""
        ...

    @property
    def LOCAL_ONLY(self) -> tuple[str, ...]:
        """Parallelism degrees that must be 1: its operator gets local (non-sharded) tensors only."""
        ...

    def kwargs(self, section) -> dict[str, Any]:
        """The factory's keyword arguments from the field."""
        ...

    def neuron_problems(self, exp, key: str, section, lnc: int) -> list[Problem]:
        """What its nkilib kernels refuse, with `lnc` logical cores per rank."""
        ...

    def no_match_problem(self, key: str, candidates: list[str]) -> Problem | None:
        """Its own message when it matches no node (`candidates`: the target class's nodes); None:
        the generic one."""
        ...


OVERRIDES: tuple[KernelOverride, ...] = (nki_rope, nki_moe)
BY_SECTION: dict[type, KernelOverride] = {m.SECTION: m for m in OVERRIDES}
BY_KEY: dict[str, KernelOverride] = {
    f"kernels.{name}": BY_SECTION[info.annotation]
    for name, info in Kernels.model_fields.items()
    if info.annotation in BY_SECTION
}
"""The built-in overrides by the experiment key of their field (kernels.rope)."""


@dataclass(frozen=True)
class Activation:
    key: str
    """The experiment key that activated it (kernels.rope, kernels.moe, kernels.overrides.0)."""
    target: str
    """`module.function` of the `@override` factory."""
    fqns: tuple[str, ...] | None
    """Node selection replacing the factory's own; None keeps the factory's."""
    kwargs: dict[str, Any]

    @property
    def import_name(self) -> str:
        """The `override.imports` entry: the factory itself, or the alias carrying `fqns`."""
        if self.fqns is None:
            return self.target
        digest = hashlib.sha1(json.dumps([self.target, list(self.fqns)]).encode()).hexdigest()[:8]
        return f"{ALIAS_MODULE}.{self.target.rpartition('.')[2]}__{digest}"

    @property
    def target_key(self) -> str:
        """The key that names the factory: a user override's `target`, a built-in one's `impl`."""
        return f"{self.key}.target" if self.key.startswith("kernels.overrides.") else f"{self.key}.impl"


def active(kernels: Kernels) -> list[tuple[str, KernelOverride, Any]]:
    """(key, module, field) of every built-in override the section turns on, in field order."""
    found = []
    for name in type(kernels).model_fields:
        section = getattr(kernels, name)
        module = BY_SECTION.get(type(section))
        if module is not None and section.impl == module.IMPL:
            found.append((f"kernels.{name}", module, section))
    return found


def activations(kernels: Kernels) -> list[Activation]:
    """The overrides a validated `Kernels` section activates."""
    out = [Activation(key, m.FACTORY, _tuple(section.fqns), m.kwargs(section)) for key, m, section in active(kernels)]
    for i, o in enumerate(kernels.overrides):
        out.append(Activation(f"kernels.overrides.{i}", o.target, _tuple(o.fqns), dict(o.kwargs)))
    return out


def _tuple(fqns) -> tuple[str, ...] | None:
    return None if fqns is None else tuple(fqns)


def problems(exp, facts) -> list[Problem]:
    """What the active built-in overrides refuse on these platform facts: sharded tensors (any
    platform), then their nkilib kernels' limits on Neuron."""
    found = active(exp.kernels)
    out = []
    for key, module, _ in found:
        for name in module.LOCAL_ONLY:
            degree = getattr(exp.parallelism, name)
            if degree > 1:
                out.append(
                    Problem(
                        f"parallelism.{name}",
                        degree,
                        f"{key}.impl={module.IMPL} runs on local (non-sharded) tensors only",
                        "1",
                        f"or {key}.impl=torchtitan",
                    )
                )
    if not neuron.runs_on_neuron(facts):
        return out
    lnc = neuron.lnc_from_env({**os.environ, **facts.env})
    for key, module, section in found:
        out += module.neuron_problems(exp, key, section, lnc)
    return out
