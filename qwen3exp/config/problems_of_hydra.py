"""Hydra's and OmegaConf's errors as Problems that name the key, the value and what is allowed."""

from __future__ import annotations

from omegaconf import OmegaConf

from qwen3exp.config.schema import Experiment
from qwen3exp.config.translate import NEW_SOURCE, describe
from qwen3exp.errors import MISSING, Problem, did_you_mean, one_of


def omegaconf_problem(e: Exception) -> Problem:
    """An interpolation that does not resolve (`${nope}`, a cycle, an unset `${oc.env:X}`) or another
    OmegaConf error, as a Problem naming the key."""
    key = getattr(e, "full_key", None) or "(interpolation)"
    msg = str(getattr(e, "msg", None) or e).strip().splitlines()
    text = msg[0] if msg else type(e).__name__
    if "Recursive interpolation" in text:
        text = "the interpolation refers back to itself (a cycle)"
    return Problem(
        str(key),
        _raw_value(e),
        f"cannot resolve: {text}",
        "a value, or ${other.key} / ${oc.env:VAR} / ${oc.env:VAR,default} that resolves",
        "set the missing key or environment variable, or give oc.env a default",
    )


def _raw_value(e: Exception):
    node = getattr(e, "child_node", None)
    try:
        return node._value() if node is not None else MISSING
    except Exception:
        return MISSING


def describe_key(key: str) -> str | None:
    return describe(Experiment, key)


def problems_from_compose_error(e: Exception, parsed: list, base) -> list[Problem]:
    """Name the offending override: an unknown key gets the keys that exist and a 'did you mean'."""
    problems = []
    for ov in parsed:
        key = ov.key_or_group
        if key.startswith("hydra.") or ov.is_add() or base is None:
            continue
        parent_key, _, leaf = key.rpartition(".")
        sections = [str(k) for k in base.keys() if k != "hydra"]
        parent = OmegaConf.select(base, parent_key) if parent_key else base
        if parent_key.startswith("data.sources.") and OmegaConf.is_dict(OmegaConf.select(base, "data.sources")):
            problems.append(_unknown_source(key, ov, [str(k) for k in OmegaConf.select(base, "data.sources")]))
        elif parent is None or not OmegaConf.is_dict(parent):
            top = key.split(".")[0]
            problems.append(
                Problem(
                    key,
                    ov.get_value_element_as_str(),
                    f"unknown section {parent_key or top!r}",
                    one_of(sections),
                    did_you_mean(parent_key or top, sections),
                    source=f"command line {ov.input_line}",
                )
            )
        elif leaf not in parent:
            siblings = [str(k) for k in parent.keys()]
            full = [f"{parent_key}.{s}" if parent_key else s for s in siblings]
            problems.append(
                Problem(
                    key,
                    ov.get_value_element_as_str(),
                    "unknown key",
                    one_of(siblings),
                    did_you_mean(key, full),
                    source=f"command line {ov.input_line}",
                )
            )
    return problems or [_unattributed(e, parsed)]


def _unknown_source(key: str, ov, known: list[str]) -> Problem:
    """An override of a source of data=mix that the experiment does not define (a typo, or a sweep
    over a source name that does not exist), or of a key its source does not set (a source holds
    only the keys its file gives: `+` adds one)."""
    name, value = key.split(".")[2], ov.get_value_element_as_str()
    if name in known:
        why = f"is not set in source {name} (a source holds only the keys its experiment file gives)"
        allowed = "a key of the source's kind, or weight, max_epochs, over_max_epochs, validation_path"
        return Problem(key, value, why, allowed, f"add it with +{key}={value}", source=f"command line {ov.input_line}")
    return Problem(
        key,
        ov.get_value_element_as_str(),
        f"source {name!r} does not exist: the sources are {one_of(known) or 'none'}",
        one_of(f"data.sources.{k}" for k in known) or "a source defined in the experiment",
        did_you_mean(name, known) or f"a new source names its kind: {NEW_SOURCE.format(name=name)}",
        source=f"command line {ov.input_line}",
    )


def _unattributed(e: Exception, parsed: list) -> Problem:
    """A composition error that names no unknown key: Hydra's first line. A `+key=...` of a key that
    exists is attributed to that override (Hydra names it)."""
    msg = str(e)
    first = msg.strip().splitlines()[0] if msg.strip() else type(e).__name__
    for ov in parsed:
        if ov.is_add() and f"already at '{ov.key_or_group}'" in msg:
            value = ov.get_value_element_as_str()
            hint = f"set it without '+': {ov.key_or_group}={value}"
            return Problem(ov.key_or_group, value, first, None, hint, source=f"command line {ov.input_line}")
    return Problem(
        parsed[0].key_or_group if parsed else "(composition)",
        " ".join(o.input_line for o in parsed),
        first,
        source="command line",
    )
