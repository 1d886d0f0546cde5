"""The first samples of the training data as text, the trained tokens marked: `qwen3exp data show`
and the dry run's plan (`qwen3exp.plan.render`). The samples come from `qwen3exp.data.sample`.

Trained text is green and bold on a colour terminal (`console.colour_allowed`: a TTY, NO_COLOR
unset), and wrapped in `[[` `]]` everywhere else (a pipe, a file, a log); a legend line says which.
Control characters of the data are shown escaped (`errors.printable`), so a sample cannot drive the
terminal. A long sample is cut to a number of lines (a cut inside a trained span closes the mark).
"""

from __future__ import annotations

from pathlib import Path

from qwen3exp.data.chat.render import BadRecord
from qwen3exp.data.mixture_sample import first_samples
from qwen3exp.data.sample import Sample, Samples
from qwen3exp.errors import printable

OPEN, CLOSE = "[[", "]]"
"""The marks around trained text without colour."""
GREEN, RESET = "\x1b[1;32m", "\x1b[0m"
"""The marks around trained text on a colour terminal (green, bold)."""
MAX_LINES = 200
"""Lines of one sample `qwen3exp data show` prints."""
DRY_RUN_LINES = 40
"""Lines of the one sample a dry run prints."""
MAX_CHARS = 20_000
"""Characters of one sample, at most (a document may be one very long line)."""


def legend(colour: bool) -> str:
    shown = f"{GREEN}green bold{RESET}" if colour else f"{OPEN}like this{CLOSE}"
    return f"legend:  {shown} = trained (a label of the loss); unmarked text is context only"


def mark(text: str, trained: bool, colour: bool) -> str:
    if not trained or not text:
        return text
    return f"{GREEN}{text}{RESET}" if colour else f"{OPEN}{text}{CLOSE}"


def _cut(pieces, max_lines: int, max_chars: int) -> tuple[list[tuple[str, bool]], str]:
    """The pieces up to `max_lines` lines and `max_chars` characters, and what was left out, in words."""
    text = "".join(t for t, _ in pieces)
    lines, chars = text.count("\n") + 1, len(text)
    kept: list[tuple[str, bool]] = []
    n_lines, n_chars = 1, 0
    for t, on in pieces:
        end = min(len(t), max_chars - n_chars)
        room = max_lines - n_lines
        newlines = [i for i, c in enumerate(t[:end]) if c == "\n"]
        if len(newlines) > room:
            end = newlines[room]
        kept.append((t[:end], on))
        n_lines, n_chars = n_lines + t[:end].count("\n"), n_chars + end
        if end < len(t):
            left = lines - n_lines if n_lines < lines else 0
            more = f"{left:,} more line(s)" if left else f"{chars - n_chars:,} more character(s)"
            return kept, f"... ({more} of this sample not shown)"
    return kept, ""


def sample_lines(s: Sample, number: str, colour: bool, max_lines: int = MAX_LINES) -> list[str]:
    """One sample: a header line (where it comes from, tokens, trained), then its text."""
    share = f"{s.trained / s.tokens:.1%}" if s.tokens else "-"
    header = f"--- sample {number}: {s.label}: {s.tokens:,} tokens, {s.trained:,} trained ({share})"
    kept, left = _cut(s.pieces, max_lines, MAX_CHARS)
    body = "".join(mark(printable(t, len(t) * 4 + 1), on, colour) for t, on in kept)
    return [
        printable(header),
        *([f"    {printable(s.note)}"] if s.note else []),
        *body.split("\n"),
        *([left] if left else []),
    ]


def show_lines(samples: Samples, colour: bool) -> list[str]:
    """What `qwen3exp data show` prints after its title: what is trained, the legend, the samples,
    the totals and what was skipped."""
    lines = [f"trained: {samples.trained}", legend(colour)]
    n = len(samples.samples)
    for i, s in enumerate(samples.samples):
        lines += sample_lines(s, f"{i + 1} of {n}", colour)
    tokens = sum(s.tokens for s in samples.samples)
    trained = sum(s.trained for s in samples.samples)
    share = f" ({trained / tokens:.1%})" if tokens else ""
    lines.append(f"--- {n} sample(s): {tokens:,} tokens, {trained:,} trained{share}")
    lines += [f"skipped: {printable(s)}" for s in samples.skipped]
    if not samples.samples:
        lines.append("no sample: the first records hold no training sample")
    return lines


def dry_run_lines(exp, folder: str | Path, colour: bool) -> list[str]:
    """The dry run's sample: the first training sample, cut to `DRY_RUN_LINES` lines; a sample that
    cannot be read is said, not raised (the plan's checks passed)."""
    try:
        samples = first_samples(exp, folder, 1)
    except (OSError, ValueError, KeyError, TypeError, BadRecord) as e:
        return [f"sample:     not shown ({printable(str(e), 300)})"]
    if not samples.samples:
        return ["sample:     none among the first records (" + "; ".join(samples.skipped) + ")"]
    return [
        f"sample:     the first training sample ({samples.source}; more: qwen3exp data show -n N [overrides])",
        f"            trained: {samples.trained}",
        "            " + legend(colour),
        *sample_lines(samples.samples[0], "1", colour, DRY_RUN_LINES),
    ]
