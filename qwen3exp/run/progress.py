"""What the ranks are doing, for the person watching: phases while they start, and one line per
logged step.

- Phases ("building the model", "loading weights from ...", "compiling", "saving the last-step
  checkpoint", ...) come from the lines rank 0 logs (`PHASES`, matched on torchtitan's message);
  they are live lines: rewritten in place on a terminal, one line each in a file.
- Step lines come from metrics.jsonl, the structured record the metrics rank appends
  (`qwen3exp.titan.metrics`), read as it grows:
  `step 12/30 (40%)  loss 6.8123  val 6.9021  4,816 tok/s  0.97 GiB  elapsed 0:14  ETA 0:21`
  (a preference objective adds `margin +0.0123  reward acc 0.7500` after the loss).
  The ETA is the remaining steps at the pace measured since the first step this launch saw (the
  first step's own time before that); a validation row adds its own line. Only this launch's steps
  are shown: a resumed run's earlier rows (kept in metrics.jsonl up to its checkpoint) are not.
- `Watch` puts them together for the launcher: rank 0's lines through the noise filter, the phases,
  the step lines.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

from qwen3exp.run import console, noise, rundir
from qwen3exp.run.noise import RankLine
from qwen3exp.run.sample_lines import SampleLines

PHASES: tuple[tuple[str, str], ...] = (
    (r"^Building device mesh with parallelism: (?P<a>.*)$", "setting up the device mesh ({a})"),
    (r"^Building (?P<a>\S+) (?P<b>\S+)$", "building the model ({a} {b})"),
    (r"^Compiling ", "compiling with torch.compile (the first steps take longer)"),
    (r"^Loading (?:from )?HF safetensors from [^:]*: (?P<a>.+)$", "loading weights from {a}"),
    (r"^Loading the checkpoint from (?P<a>.+?)\.?$", "loading the checkpoint {a}"),
    (r"^Preparing (?!\S*validation)\S+ dataset from (?P<a>.+)$", "preparing the data ({a})"),
    (r"^Training starts at step (?P<a>\d+)", "training from step {a}"),
    (r"^Building the reference model from (?P<a>.+)$", "building the reference model from {a}"),
    (r"^Precomputing the reference log-probs (?P<a>.+)$", "precomputing the reference log-probs {a}"),
    (r"^Reference log-probs (?P<a>(?:precomputed|read) .+)$", "reference log-probs {a}"),
    (r"^Saving a (?:model only|full) checkpoint .*at last step", "saving the last-step checkpoint"),
    (r"^Saving the checkpoint", "saving a checkpoint"),
    (r"^Training completed", "training completed; the ranks are closing their files"),
)
_PHASES = tuple((re.compile(rx), text) for rx, text in PHASES)


def phase_of(line: RankLine) -> str | None:
    """What a torchtitan INFO line says the ranks are doing now, or None."""
    if line.kind != "titan" or line.level != "INFO":
        return None
    for rx, text in _PHASES:
        if m := rx.search(line.message):
            return text.format(**m.groupdict())
    return None


def is_validation(row: dict) -> bool:
    """A validation's own row in metrics.jsonl: `val_loss` without the training row's `loss`."""
    return "val_loss" in row and "loss" not in row


def clock(seconds: float | None) -> str:
    """0:07, 12:30, 1:02:03; `?` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Reads metrics.jsonl as it grows (`poll`) and says each new row through `say(text, live)`.
    Rows already in the file when it is made (a resumed run's, up to its checkpoint) are not new."""

    def __init__(
        self,
        metrics: Path,
        total_steps: int,
        say: Callable[[str, bool], None],
        *,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(metrics)
        self.total = total_steps
        self.say = say
        self.now = now
        self.started = now()
        self._offset = 0
        self._partial = ""
        self._first: tuple[int, float] | None = None  # (step, when seen) of the first row of this launch
        self.val_loss: float | None = None
        self.last_step: int | None = None
        for row in self.new_rows():  # an earlier launch's rows: only the latest validation loss counts
            if is_validation(row):
                self.val_loss = row["val_loss"]

    def poll(self) -> None:
        for row in self.new_rows():
            self.show(row)

    def new_rows(self) -> list[dict]:
        """The whole rows appended since the last call (a row being written waits for its newline)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []
        self._offset += len(chunk)
        text = self._partial + chunk.decode("utf-8", errors="replace")
        *lines, self._partial = text.split("\n")
        rows = []
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
        return rows

    def show(self, row: dict) -> None:
        """Says one row: a validation's line, or a step's (live)."""
        step = row["step"]
        if is_validation(row):
            self.val_loss = row["val_loss"]
            ppl = row.get("val_perplexity")
            self.say(
                f"qwen3exp: validation at step {step}: loss {_num(row['val_loss'])}"
                + (f", perplexity {ppl:,.1f}" if isinstance(ppl, int | float) else ""),
                False,
            )
            return
        now = self.now()
        if self._first is None:
            self._first = (step, now)
        self.last_step = step
        self.say(self.line(row, now), True)

    def eta(self, step: int, now: float, step_seconds: float | None) -> float | None:
        assert self._first is not None
        first_step, first_seen = self._first
        if step > first_step:
            pace = (now - first_seen) / (step - first_step)
        elif isinstance(step_seconds, int | float):
            pace = float(step_seconds)
        else:
            return None
        return max(0, self.total - step) * pace

    def line(self, row: dict, now: float) -> str:
        step = row["step"]
        parts = [f"step {step}/{self.total} ({100 * step // max(1, self.total)}%)", f"loss {_num(row.get('loss'))}"]
        if self.val_loss is not None:
            parts.append(f"val {_num(self.val_loss)}")
        if isinstance(margin := row.get("reward_margin"), int | float):  # a preference objective's pairs
            parts.append(f"margin {margin:+.4f}  reward acc {_num(row.get('reward_accuracy'))}")
        if isinstance(tps := row.get("tokens_per_second"), int | float):
            parts.append(f"{tps:,.0f} tok/s")
        if isinstance(mem := row.get("memory_gib"), int | float):
            parts.append(f"{mem:.2f} GiB")
        if isinstance(mfu := row.get("mfu"), int | float):
            parts.append(f"MFU {mfu:.1f}%")
        parts.append(f"elapsed {clock(now - self.started)}")
        parts.append(f"ETA {clock(self.eta(step, now, row.get('step_seconds')))}")
        return "qwen3exp: " + "  ".join(parts)


def _num(v) -> str:
    return f"{v:.4f}" if isinstance(v, int | float) else "n/a"


class Watch:
    """What the person watching sees while torchrun runs: rank 0's lines through the noise filter
    (`qwen3exp.run.noise`), the phases they announce and one line per logged step (`Progress`;
    node 0 only: it holds the metrics rank). `stopping()`: true once the launcher has asked the
    ranks to stop; the lines that follow are left out (the filter's rule) and kept in qwen3exp.log
    (torchrun's own output is in no rank's log file)."""

    def __init__(
        self, metrics: Path, total_steps: int, *, verbose: bool, node_rank: int, stopping: Callable[[], bool]
    ) -> None:
        self.log = console.logger("qwen3exp.launch")
        self.ranks = console.logger("qwen3exp.ranks")
        self.filter = noise.RankFilter(verbose=verbose, stopping=stopping)
        self.held = noise.HeldTracebacks(self.filter)  # a traceback shown once complete, unless of a full disk
        self.progress = Progress(metrics, total_steps, self.say) if node_rank == 0 else None
        # eval.samples: the first line of each validation's first answer, after the validation's line.
        self.samples = SampleLines(Path(metrics).parent / rundir.SAMPLES) if node_rank == 0 else None
        self._samples: list[tuple[int, str]] = []  # read, waiting for their validation's line
        self._validated = -1  # the step of the last validation line said
        self._phase: str | None = None

    def say(self, text: str, live: bool) -> None:
        self.log.info(text, extra=console.LIVE if live else None)

    def line(self, raw: str) -> None:
        text = console.strip_ansi(raw.rstrip("\r\n"))
        line = noise.parse(raw)
        phase = phase_of(line)
        if phase is not None and phase != self._phase and not self.filter.stopping():
            self.tick()  # what the rank wrote before this line goes first (the last sample before "completed")
            self._phase = phase
            self.say(f"qwen3exp: {phase}", True)
        if self.filter.shows(line):
            self._relay(*self.held.take(text))
        elif self.filter.stopping() or self.filter.disk_full:
            self.ranks.debug(text)

    def _relay(self, shown: list[str], left_out: list[str]) -> None:
        for text in shown:
            self.ranks.info(text)
        for text in left_out:
            self.ranks.debug(text)

    def tick(self) -> None:
        """Says the new rows, each validation's sample line after it and before the next row.
        samples.jsonl is read first: the metrics rank appends a validation's row to metrics.jsonl
        before its answers, and the next step's row after them, so every sample read here has its
        validation row in metrics.jsonl by the time that file is read."""
        self._relay(*self.held.due())
        if self.progress is None or self.samples is None:
            return
        self._samples += self.samples.poll()
        for row in self.progress.new_rows():
            self._say_samples()
            self.progress.show(row)
            if is_validation(row):
                self._validated = max(self._validated, row["step"])
        self._say_samples()

    def _say_samples(self, every: bool = False) -> None:
        while self._samples and (every or self._samples[0][0] <= self._validated):
            self.say(self._samples.pop(0)[1], False)

    def finish(self) -> None:
        """The last rows; what was left out, in one line (after a stop in qwen3exp.log only: the
        stop's own line is the last one on the console)."""
        self._relay(*self.held.due(end=True))
        self.tick()
        self._say_samples(every=True)
        if (hidden := self.filter.summary()) is not None:
            self.log.log(logging.DEBUG if self.filter.stopping() else logging.INFO, f"qwen3exp: {hidden}")
