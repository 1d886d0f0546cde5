"""An override Hydra's parser refuses, as a Problem that names its own key and its own token (not
the whole command line): `name=$(touch${IFS}pwned)` is `name = '$(touch${IFS}pwned)'`; a value longer
than MAX_SHOWN characters (5,000 digits) is shown by its ends and its length, and an integer beyond
Python's 4,300 digits says so."""

from __future__ import annotations

import re

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from qwen3exp.config import credentials
from qwen3exp.errors import Problem


def unparsable(parser: OverridesParser, overrides: list[str]) -> list[Problem]:
    """Each override Hydra cannot parse, named by its own key and value (not the whole command line)."""
    problems = []
    for o in overrides:
        try:
            parser.parse_overrides([o])
        except (OverrideParseException, ValueError) as e:
            problems.append(parse_problem(o, e))
    return problems


MAX_SHOWN = 80
"""A value Hydra cannot parse is shown up to this long; a longer one by its ends and its length."""


def parse_problem(override: str, e: Exception) -> Problem:
    key, eq, value = override.partition("=")
    token = value if eq and key else override
    lines = [x for x in str(e).strip().splitlines() if not x.startswith(("Error parsing override", "See https://"))]
    first = lines[0] if lines else type(e).__name__
    allowed = (
        "key=value, group=option, +key=value, ~key; a value holding ( ) [ ] { } , = $ or spaces in quotes: key='...'"
    )
    if (limit := re.search(r"Exceeds the limit \((\d+) digits\)", first)) is not None:
        most = int(limit.group(1))
        first = f"an integer of {len(token.strip().lstrip('+-')):,} digits; Python reads integers of at most {most:,}"
        allowed = f"an integer of at most {most:,} digits (the value the key takes)"
    length = f" (a value of {len(token):,} characters)" if len(token) > MAX_SHOWN else ""
    return Problem(
        key.lstrip("+~") if eq and key else "(command line)",
        credentials.mask_urls(_shortened(token)),
        f"cannot parse{length}: " + credentials.mask_urls(first),
        allowed,
        source="command line" + (f" {credentials.mask_urls(_shortened(override))}" if length else ""),
    )


def _shortened(text: str) -> str:
    """`text` up to MAX_SHOWN characters; a longer one as its first and last characters."""
    return text if len(text) <= MAX_SHOWN else f"{text[:40]}...{text[-20:]}"
