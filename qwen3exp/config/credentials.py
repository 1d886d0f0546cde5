"""Credentials inside URLs (`scheme://user:password@host`): found and masked in text, and refused
in experiment values.

A value of the experiment is written to the run directory (experiment.yaml, which every rank reads,
Hydra's .hydra/config.yaml, plan.json), printed in the plan, and may name a sweep job's folder: a
password there cannot be redacted without breaking the run. So an experiment value that holds one
is refused (exit 2, the value shown masked); credentials belong in the environment (~/.netrc,
HF_TOKEN, WANDB_API_KEY; `hydra.job.env_set.NAME=...`, whose records are redacted by
`qwen3exp.run.redact.redact_text`, which uses the pattern defined here).
"""

from __future__ import annotations

import re
from typing import Any

from qwen3exp.errors import Problem

URL_USERINFO = re.compile(r"(?P<scheme>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*+\\?://)[^\s/?#]*@")
"""`scheme://user:pw@`, also as Hydra records an override (`https\\://user\\:pw@`); up to the last @
before the host: an unescaped @ in the password must not leave its tail behind. The scheme starts
where no scheme character precedes it and is taken whole (possessive): otherwise a long run of
letters cost the search quadratic time."""
MASK = "***"


def mask_urls(text: str) -> str:
    """`text` with the `user:password@` of every URL replaced by `***@`."""
    return URL_USERINFO.sub(lambda m: m["scheme"] + MASK + "@", text)


def url_credential_problems(data: Any, prefix: str = "") -> list[Problem]:
    """Every string value of the experiment (plain data) that holds URL credentials."""
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in url_credential_problems(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in url_credential_problems(v, f"{prefix}[{i}]")]
    if isinstance(data, str) and URL_USERINFO.search(data):
        return [
            Problem(
                prefix,
                mask_urls(data),
                "holds credentials in a URL (user:password@ or token@); "
                "experiment values are written to the run directory and printed in the plan",
                "a URL without user:password@ or token@ (scheme://host/...)",
                "keep credentials in the environment (~/.netrc, HF_TOKEN, WANDB_API_KEY) or set a variable "
                "of the ranks with hydra.job.env_set.NAME=... (its records are redacted)",
            )
        ]
    return []
