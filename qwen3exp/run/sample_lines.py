"""The console's line for eval.samples: at each validation, the first line of the first prompt's
answer, `qwen3exp: sample at step 5: <that line>`.

Read from samples.jsonl as the metrics rank appends it (`qwen3exp.titan.metrics`), the way the
step lines are read from metrics.jsonl (`qwen3exp.run.progress`, whose `Watch` puts each line
after its validation's and before the next step's). Records already in the file when the launch
starts (a resumed run's) are not new. The whole answers are in samples.jsonl, TensorBoard and W&B.
"""

from __future__ import annotations

import json
from pathlib import Path

from qwen3exp.errors import printable

LINE_MAX = 160
"""The longest first line shown, in characters (the rest is in samples.jsonl)."""


def first_line(text: str) -> str:
    """The first line of `text` that is not blank, stripped and made printable; an answer with no
    such line as its Python repr (`'\\n\\n'`: a model that writes only newlines shows it)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return printable(line if line else repr(text), LINE_MAX)


class SampleLines:
    """The line for the first record of each new step in samples.jsonl (`poll`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._offset = self.path.stat().st_size
        except OSError:
            self._offset = 0
        self._partial = ""
        self._step: int | None = None

    def poll(self) -> list[tuple[int, str]]:
        """(step, line) for each step first seen since the last call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk.decode("utf-8", errors="replace")).split("\n")
        said = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or not isinstance(record.get("step"), int) or record["step"] == self._step:
                continue
            self._step = record["step"]
            said.append(
                (self._step, f"qwen3exp: sample at step {self._step}: {first_line(str(record.get('text', '')))}")
            )
        return said
