"""The schema's defaults as Hydra configs, so that every default has one home: the field's default
in the schema. conf/ files pull these configs in through their defaults lists and state only what
they change; `Experiment(...)` from Python and the command line therefore get the same values.

Registered in Hydra's ConfigStore (group `schema`):
- `schema/root`: the experiment's own keys (`name: ???`, dry_run, verbose), its sections that are
  no config group (training, metrics, validation, sweep), then the sections of the config groups
  with one class (parallelism, kernels: whichever option is chosen, the keys are the same, so an
  option states only what it changes). conf/config.yaml's first default (`/schema/root@_here_`).
  The composed config keeps the order conf/config.yaml gave its keys (`model` now follows `kernels`).
- `schema/<section>/<tag>`: each variant of a section with variants (`schema/platform/cuda`,
  `schema/checkpoint/dcp`, ...), named by its discriminator value. The group file of that variant
  pulls it in (`- /schema/platform/cuda@_here_`) and keeps its tag (`name: cuda`), which says
  which variant it is. A variant's keys cannot sit in schema/root: the keys of `model: native`
  would be merged into `model: hf`.
So every key exists in the composed config: it is set from the command line without `+`, and
Hydra's struct mode still refuses a misspelt one. A field without a default is `???` (required).

`register_schema_defaults` runs before every composition: `names.register_resolvers` calls it, and
every process that composes calls that first.
"""

from __future__ import annotations

import typing
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from qwen3exp.config.argv import GROUPS
from qwen3exp.config.schema import Experiment

GROUP = "schema"
"""Hydra's config group of these configs (a schema/ folder in the primary config folder would shadow them)."""
ROOT = f"{GROUP}/root"
PROVIDER = "qwen3exp"
"""The provider Hydra names for these configs (`--info defaults`)."""


def variants(fld: FieldInfo) -> list[type[BaseModel]]:
    """The classes of a section with variants (a discriminated union's members, in order); [] for
    any other field."""
    if fld.discriminator is None:
        return []
    out, todo = [], [fld.annotation]
    while todo:
        a = todo.pop(0)
        if isinstance(a, type) and issubclass(a, BaseModel):
            out.append(a)
        else:
            todo.extend(typing.get_args(a))
    return out


def tag(cls: type[BaseModel], discriminator: str) -> str:
    """A variant's discriminator value (`cuda` for CudaPlatform): its literal's default."""
    return str(cls.model_fields[discriminator].default)


def default_value(fld: FieldInfo) -> Any:
    """A field's default as plain data (a section's default: its keys); `???` when it has none."""
    if fld.is_required():
        return MISSING
    return to_jsonable_python(fld.get_default(call_default_factory=True))


def class_defaults(cls: type[BaseModel]) -> dict[str, Any]:
    return {name: default_value(fld) for name, fld in cls.model_fields.items()}


def nodes() -> dict[str, dict[str, Any]]:
    """Each config's path in Hydra's config tree (schema/root, schema/platform/cuda, ...) and its
    keys, in the schema's field order (schema/root: the config groups' sections last)."""
    root: dict[str, Any] = {}
    grouped: dict[str, Any] = {}
    out = {ROOT: root}
    for name, fld in Experiment.model_fields.items():
        classes = variants(fld)
        if not classes:
            (grouped if name in GROUPS else root)[name] = default_value(fld)
            continue
        assert fld.discriminator is not None
        for cls in classes:
            out[f"{GROUP}/{name}/{tag(cls, str(fld.discriminator))}"] = class_defaults(cls)
    root.update(grouped)
    return out


def register_schema_defaults() -> None:
    """Store every config of `nodes()` in Hydra's ConfigStore, once per process."""
    store = ConfigStore.instance()
    if GROUP in store.repo:
        return
    for path, node in nodes().items():
        group, _, name = path.rpartition("/")
        store.store(name=name, node=node, group=group, provider=PROVIDER)
