"""Secrets never land in a run directory: what is recorded from the environment or a command line
goes through `redact_env` / `redact_argv` (provenance.json, command.txt, plan.json's commands, Hydra's
own records of the command line).

They replace with `***` the value of every variable, flag or `key=value` whose name looks like a
secret (see `is_secret_name`) and the `user:password@` of every URL.
"""

from __future__ import annotations

import re
from pathlib import Path

from qwen3exp.config.credentials import mask_urls
from qwen3exp.run import rundir

REDACTED = "***"
SECRET_WORDS = frozenset(
    {
        "TOKEN",
        "KEY",
        "APIKEY",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "PASSPHRASE",
        "CREDENTIAL",
        "CREDS",
        "AUTH",
        "AUTHORIZATION",
        "COOKIE",
        "SESSION",
        "PRIVATE",
    }
)
"""A name is secret when one of its words is one of these (a plural s ignored)."""
SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY")
"""... or when a word ends with one of these (HFTOKEN, DBPASSWORD: written without a separator).
Only words that end no ordinary word are suffixes: KEY would match MONKEY and HOTKEY."""
# NAME=VALUE or NAME: VALUE inside a longer string ("export HF_TOKEN=abc", "{'api_key': 'abc'}",
# "?token=abc&x=1", "Authorization: Bearer abc"); where the value ends: `_secret_end`.
_ASSIGNMENT = re.compile(r"(?<![\w.\-])(?P<name>[A-Za-z_][\w.\-]*+)(?P<sep>[\"']?\s*[=:]\s*)")
"""A name starts where no name character precedes it and is taken whole (possessive): otherwise a
long run of letters (a 100,000-character value) cost the search quadratic time (minutes)."""
_QUOTED = re.compile(r"(?:(?:Bearer|Basic|Token)\s+)?(?:\"[^\"]*\"|'[^']*')", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether a variable, flag or config key name looks like it holds a secret.

    The name is split into words at every character that is not a letter or digit and at
    camelCase boundaries (`wandbApiKey` -> WANDB API KEY); it is secret when a word, upper-cased
    and without a plural s, is in SECRET_WORDS, or a word ends with one of SECRET_SUFFIXES.
    So HF_TOKEN, WANDB_API_KEY, MY_SESSION_TOKEN, hf-token, +wandb_api_key, HFTOKEN are secret;
    MONKEY, KEYBOARD, TOKENIZERS_PARALLELISM, PYTORCH_CUDA_ALLOC_CONF are not."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    for word in re.split(r"[^A-Za-z0-9]+", spaced.upper()):
        if word in SECRET_WORDS or (word.endswith("S") and word[:-1] in SECRET_WORDS):
            return True
        if word.endswith(SECRET_SUFFIXES):
            return True
    return False


def redact_text(text: str) -> str:
    """`text` with URL credentials (`scheme://user:pw@host` -> `scheme://***@host`, also as Hydra
    records an override: `https\\://user\\:pw@host`) and the value of every `NAME=value` /
    `NAME: value` whose NAME looks like a secret replaced by `***`. An unquoted secret value runs to
    the end of the line (a value with spaces or commas, `HF_TOKEN: a b,c` in a YAML record), or to
    `&` / `;` (a URL's query, a shell line), a quote (the string it is in) or, inside `{...}` /
    `[...]`, the next `,`."""
    text = mask_urls(text)
    out, pos = [], 0
    while (m := _ASSIGNMENT.search(text, pos)) is not None:
        out.append(text[pos : m.end()])
        pos = m.end()
        # A name that is no secret is skipped by itself only: its value may hold NAME=value.
        if is_secret_name(m["name"]) and (end := _secret_end(text, pos)) > pos:
            out.append(REDACTED)
            pos = end
    out.append(text[pos:])
    return "".join(out)


def _secret_end(text: str, pos: int) -> int:
    """Where the secret value that starts at `pos` ends (see `redact_text`)."""
    if (quoted := _QUOTED.match(text, pos)) is not None:
        return quoted.end()
    line = text[text.rfind("\n", 0, pos) + 1 : pos]
    flow = line.count("{") + line.count("[") > line.count("}") + line.count("]")
    stops = "\n&;\"'" + (",}]" if flow else "")  # a quote: the end of the string the value is in
    end = pos
    while end < len(text) and text[end] not in stops:
        end += 1
    while end > pos and text[end - 1] in " \t\r":  # keep the layout after the value
        end -= 1
    return end


def redact_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A command line (or a list of Hydra overrides) safe to record: every element through
    `redact_text`, and the element after a flag named like a secret (`--token abc`) replaced."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        out.append(redact_text(arg))
        hide_next = arg.startswith("-") and "=" not in arg and is_secret_name(arg.lstrip("-"))
    return out


HYDRA_RECORDS = ("overrides.yaml", "hydra.yaml")
"""Hydra's own record of the command line in `.hydra/` (config.yaml holds the experiment only)."""


def redact_hydra_record(folder: Path, names: tuple[str, ...] = HYDRA_RECORDS) -> None:
    """Hydra writes the command line's overrides into `.hydra/overrides.yaml` and `hydra.yaml` (and
    a sweep's `multirun.yaml`) before the job starts; rewrite them with secrets redacted."""
    for name in names:
        path = folder / name
        try:
            text = path.read_text()
        except OSError:
            continue
        safe = redact_text(text)
        if safe != text:
            rundir.atomic_write_text(path, safe)


def redact_env(env) -> dict[str, str]:
    """An environment (name -> value) safe to record: the value of every variable named like a secret
    is `***`, every other value goes through `redact_text` (HF_ENDPOINT=https://user:pw@host)."""
    return {name: REDACTED if is_secret_name(name) else redact_text(str(value)) for name, value in env.items()}
