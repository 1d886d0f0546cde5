"""A mixture seen one source at a time: each source as the one-kind experiment it would be alone.

A mixture composes the kinds, so the plan checks and counts each source with its kind's own code
(`files`, `figures`, `chat.files`, `preference.files`, `text.hf_files`), handing it a view: the
experiment with `data` that source's kind section (the mixture's keys taken off) and `validation`
that source's (its `validation_path`, else the run's validation.fraction of its own records). The
kind's problems name one-kind keys (`data.path`, `validation.path`); `rekeyed` names them as the
user wrote them (`data.sources.<name>.path`, `data.sources.<name>.validation_path`).
"""

from __future__ import annotations

from dataclasses import replace

from qwen3exp.config.sections.data import BundledData, ChatData, HFData, LocalData, PreferenceData
from qwen3exp.config.sections.mixture import MixtureData, Share
from qwen3exp.errors import Problem

KINDS = {c.model_fields["source"].default: c for c in (BundledData, LocalData, HFData, ChatData, PreferenceData)}
"""Each kind's class by its tag (what a source's `source` names)."""


def kind_of(source):
    """The source as its kind alone: the kind's section without the mixture's keys (`Share`)."""
    return KINDS[source.source].model_validate(source.model_dump(exclude=set(Share.model_fields)))


def view(exp, name: str):
    """`exp` as if it read only the source `name` (its kind section, its own validation)."""
    source = exp.data.sources[name]
    validation = exp.validation.model_copy(update={"path": source.validation_path})
    return exp.model_copy(update={"data": kind_of(source), "validation": validation})


def views(exp) -> dict:
    """Source name -> `view`, every source with a weight above 0 (a source at 0 is off: not read,
    not checked beyond its schema); {} for a run that is not a mixture."""
    if not isinstance(exp.data, MixtureData):
        return {}
    return {n: view(exp, n) for n, s in exp.data.sources.items() if s.weight > 0}


def rekeyed(problems: list[Problem], name: str) -> list[Problem]:
    """A kind's problems about the source `name`, named by the mixture's keys."""
    out = []
    for p in problems:
        key, message = p.key, p.message
        if key == "validation.path":
            key = f"data.sources.{name}.validation_path"
        elif key.startswith("data."):
            key = f"data.sources.{name}.{key[len('data.') :]}"
        else:
            message = f"source {name}: {message}"
        out.append(replace(p, key=key, message=message.replace("data.path", f"data.sources.{name}.path")))
    return out
