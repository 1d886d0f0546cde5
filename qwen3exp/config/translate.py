"""pydantic's ValidationErrors translated into Problems named by YAML key, and the lookups of a
dotted key in the schema they need (`describe`, `field_of`, `type_name`; `--help` uses them too).

Every function takes the root model (`Experiment`) as an argument, so that this module sits below
the schema that calls it."""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from qwen3exp.config.sections.base import SEP, TAG
from qwen3exp.errors import MISSING, Problem, did_you_mean, one_of

Root = type[BaseModel]
"""The model a dotted key starts from (`Experiment`)."""


def problems_from_validation(root: Root, e: ValidationError, data: dict, prefix: str | None = None) -> list[Problem]:
    """Problems named by YAML key. `prefix`: the section the validated data sits under (errors of a
    section validated on its own)."""
    out: list[Problem] = []
    for err in e.errors(include_url=False):
        if prefix:
            err = {**err, "loc": (prefix, *err["loc"])}
        msg = str(err.get("msg", ""))
        if TAG in msg:
            out += _untagged(msg, _key(root, err["loc"]), data)
            continue
        key = _key(root, err["loc"], data)
        value = value_at(data, key)
        if "[key]" in err["loc"]:  # a mapping's key (a source's name) that is not valid
            key = key.split(".[key]")[0]
            pattern = (err.get("ctx") or {}).get("pattern", "")
            name = key.rsplit(".", 1)[-1]
            out.append(Problem(key, name, f"is not a valid name: {msg}", f"a name matching {pattern}"))
        elif err["type"] == "union_tag_not_found":
            out.append(_no_tag(key, value, data))
        elif err["type"] == "extra_forbidden":
            siblings = _field_names(root, key, data)
            out.append(
                Problem(
                    key,
                    value,
                    "unknown key",
                    one_of(s.split(".")[-1] for s in siblings) or None,
                    did_you_mean(key, siblings),
                )
            )
        elif err["type"] == "missing":
            out.append(Problem(key, MISSING, "required key is missing", describe(root, key)))
        else:
            out.append(Problem(key, value, msg, _allowed_for(err), _value_hint(err, value)))
    return out


def _untagged(msg: str, where: str, data: dict) -> list[Problem]:
    """The Problems a section's validator raised as `tagged` lines (`where`: the section's key)."""
    out = []
    for line in msg.split(TAG)[1:]:
        key, value, message, allowed, hint = line.rstrip("\n").split(SEP)
        full = key if "." in key or not where else f"{where}.{key}"
        given = value_at(data, full)
        out.append(Problem(full, given if given is not MISSING else value, message, allowed or None, hint or None))
    return out


def _key(root: Root, loc: tuple, data: Any = None) -> str:
    parts = [str(x) for x in loc]
    # Drop the union tag pydantic inserts after a union field (model.native.flavor -> model.flavor).
    if len(parts) >= 2 and parts[0] in _unions(root):
        parts.pop(1)
    # ... and after a union nested in a mapping (data.sources.web.bundled.weight -> data.sources.web.weight).
    out, cur = list[str](), data
    for part in parts:
        if isinstance(cur, dict) and part not in cur and part in (v for v in cur.values() if isinstance(v, str)):
            continue
        out.append(part)
        cur = cur.get(part) if isinstance(cur, dict) else None
    return ".".join(out)


NEW_SOURCE = "+data.sources.{name}={{source: bundled|local|hf|chat|preference, weight: 1}}"
"""How an override adds a source to a mixture (the hint of a source name that does not exist)."""


def _no_tag(key: str, value: Any, data: dict) -> Problem:
    """A section of a union without its tag: under data.sources, a source name no source has (an
    override such as `data.sources.nope.weight=0.5` made it)."""
    parent, _, name = key.rpartition(".")
    if parent == "data.sources":
        sources = value_at(data, parent)
        sources = sources if isinstance(sources, dict) else {}
        known = [n for n, s in sources.items() if isinstance(s, dict) and "source" in s]
        return Problem(
            key,
            value,
            f"source {name!r} does not exist (it has no data.sources.{name}.source): the sources are "
            + (", ".join(known) or "none"),
            one_of(known) or "a source defined in the experiment",
            did_you_mean(name, known) or f"a new source names its kind: {NEW_SOURCE.format(name=name)}",
        )
    return Problem(key, value, "names no kind (its tag is missing)", None, None)


def _unions(root: Root) -> set[str]:
    """The root's fields that are discriminated unions (model, checkpoint, platform, ...)."""
    return {name for name, fld in root.model_fields.items() if fld.discriminator is not None}


def value_at(data: Any, key: str) -> Any:
    """The value a dotted key has in plain data, or MISSING."""
    cur = data
    for part in key.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return MISSING
    return cur


def _allowed_for(err: ErrorDetails) -> str | None:
    ctx = err.get("ctx") or {}
    t = err["type"]
    if t == "literal_error":
        return ctx.get("expected")
    if t in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[t]
        bound = next(iter(v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le")), None)
        return f"a number {op} {bound}"
    if t == "union_tag_invalid":
        return ctx.get("expected_tags")
    if t == "finite_number":
        return "a finite number (not inf, -inf or nan)"
    if t.endswith("_parsing") or t.endswith("_type"):
        return t.split("_")[0]
    if t == "string_pattern_mismatch":
        return "letters, digits and . _ = , + -"
    return None


def _value_hint(err: ErrorDetails, value: Any) -> str | None:
    """'did you mean cosine?' for a misspelt choice."""
    if err["type"] == "literal_error" and isinstance(value, str):
        return did_you_mean(value, re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", ""))))
    if err["type"] == "union_tag_invalid" and isinstance(value, str):
        return did_you_mean(value, re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected_tags", ""))))
    return None


def _field_names(root: Root, key: str, data: Any = None) -> list[str]:
    """Valid sibling keys for an unknown key (for 'did you mean'); inside a union, those of the
    variant the data's tag selects (model.backend=hf lists HFModel's keys)."""
    parts = key.split(".")[:-1]
    cur: Any = root
    for part in parts:
        fld = getattr(cur, "model_fields", {}).get(part)
        if fld is None:
            return []
        data = data.get(part) if isinstance(data, dict) else None
        cur = _variant(fld, data)
        if cur is None:
            return []
    names = list(getattr(cur, "model_fields", {}))
    return [".".join([*parts, n]) for n in names]


def _variant(fld: Any, data: Any) -> Any:
    tag = fld.discriminator
    if isinstance(tag, str) and isinstance(data, dict):
        for member in getattr(fld.annotation, "__args__", ()) or ():
            f = getattr(member, "model_fields", {}).get(tag)
            if f is not None and f.default == data.get(tag):
                return member
    return _first_model(fld.annotation)


def _first_model(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        m = _first_model(arg)
        if m is not None:
            return m
    origin = getattr(ann, "__origin__", None)
    if origin is not None:
        return _first_model(origin)
    return None


def _models(ann: Any) -> list[type[BaseModel]]:
    """Every model class an annotation names (each variant of a union)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for arg in getattr(ann, "__args__", ()) or () for m in _models(arg)]


def describe(root: Root, key: str) -> str | None:
    """The description (field docstring) of a dotted key, looking into every variant of a union
    (data.path is a field of data=local only)."""
    current: list[type[BaseModel]] = [root]
    parts = key.split(".")
    i = 0
    while i < len(parts):
        fields = [m.model_fields[parts[i]] for m in current if parts[i] in m.model_fields]
        if not fields:
            return None
        if i == len(parts) - 1:
            desc = next((f.description for f in fields if f.description), None)
            return " ".join(desc.split()) if desc else None
        current = [m for f in fields for m in _models(f.annotation)]
        i += 2 if any(_entry(f) is not None for f in fields) and i + 2 < len(parts) else 1  # data.sources.<name>
    return None


def field_of(root: Root, key: str, data: dict) -> Any:
    """The pydantic field of a dotted key in the variant `data` chose (model.backend=hf: HFModel's
    fields), or None."""
    model: Any = root
    node: Any = data
    parts = key.split(".")
    i = 0
    while i < len(parts):
        fld = model.model_fields.get(parts[i]) if model is not None else None
        if fld is None:
            return None
        if i == len(parts) - 1:
            return fld
        node = node.get(parts[i]) if isinstance(node, dict) else None
        if (entry := _entry(fld)) is not None and i + 2 < len(parts):  # name -> section (data.sources.<name>.<key>)
            i += 1
            node = node.get(parts[i]) if isinstance(node, dict) else None
            model = _variant(entry, node)
        else:
            model = _variant(fld, node)
        i += 1
    return None


def _entry(fld: Any) -> Any:
    """For a mapping whose values are sections (data.sources), its value's field (type and
    discriminator); None for any other field."""
    args = typing.get_args(fld.annotation)
    if typing.get_origin(fld.annotation) is not dict or len(args) != 2:
        return None
    meta = [m for m in getattr(args[1], "__metadata__", ()) if isinstance(m, FieldInfo)]
    tag = next((m.discriminator for m in meta if m.discriminator), None)
    value = typing.get_args(args[1])[0] if meta else args[1]
    return FieldInfo(annotation=value, discriminator=tag) if _first_model(value) is not None else None


def type_name(annotation: Any) -> str:
    """A field's type as a person reads it: int, float, a|b|c, str or null, ..."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner = type_name(args[0])
        metas = [x for m in args[1:] for x in (getattr(m, "metadata", None) or [m])]  # Field(ge=0): its metadata
        bounds = [
            f"{op} {getattr(m, attr)}"
            for m in metas
            for attr, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
            if getattr(m, attr, None) is not None
        ]
        return f"{inner} {' '.join(bounds)}".strip() if bounds else inner
    if origin is Literal:
        return "|".join(str(a) for a in args)
    if args and origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else type_name(a) for a in args)
    if origin in (list, tuple, dict):
        return origin.__name__
    return getattr(annotation, "__name__", str(annotation))
