"""`qwen3exp init [DIR]`: a minimal repository of experiments (like `tune cp` / `axolotl fetch`).

Writes, into DIR (default: the current directory), only files that do not exist yet:
- `conf/experiment/my_experiment.yaml`: one experiment that trains the tiny model on CPU,
- `conf/data/my_data.yaml` + `data/sample.jsonl`: an option of a packaged group of your own and the
  JSON-lines file it reads (replace it with your corpus),
- `.gitignore` (outputs/, multirun/) and a short `README.md` with the commands.
Nothing is overwritten: an existing file is left as it is and reported.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from qwen3exp.assets import CORPUS_DIR
from qwen3exp.errors import EXIT_CONFIG_ERROR, printable

EXPERIMENT = """\
# @package _global_
# Run:  qwen3exp -cd conf experiment=my_experiment
# Plan: qwen3exp -cd conf experiment=my_experiment dry_run=true
defaults:
  - override /data: my_data
  - override /platform: cpu

name: my_experiment
training:
  steps: 20
  warmup_steps: 2
  seq_len: 128
  local_batch_size: 4
"""

DATA = """\
# Your own option of the packaged `data` group: data=my_data. Paths are relative to where you run.
source: local
path: data/sample.jsonl
text_field: text
"""

GITIGNORE = """\
outputs/
multirun/
"""

README = """\
# Experiments

Qwen3 training experiments run with qwen3exp (installed with pip). Every file under
`conf/` adds to qwen3exp's packaged config groups (`model`, `parallelism`, `kernels`, `checkpoint`,
`platform`, `data`, `launcher`, `experiment`): a new option of a group, or a new experiment.

```bash
qwen3exp -cd conf experiment=my_experiment dry_run=true   # the plan; starts nothing
qwen3exp -cd conf experiment=my_experiment                # train (CPU, a minute)
qwen3exp -cd conf -m experiment=my_experiment training.lr=1e-3,3e-3   # a sweep
```

Runs land in `outputs/` (git-ignored); each run's `provenance.json` records this repository's commit.
"""


def _sample_lines() -> str:
    """A few hundred lines of the corpus qwen3exp ships, so the experiment trains on real text."""
    rows = []
    for line in (CORPUS_DIR / "train.jsonl").read_text().splitlines()[:300]:
        text = json.loads(line).get("text")
        if isinstance(text, str) and text.strip():
            rows.append(json.dumps({"text": text}))
    return "\n".join(rows) + "\n"


def init(target: Path) -> list[tuple[Path, bool]]:
    """Write the scaffold; returns (path, written) for every file (False: it existed, left alone).
    An OSError (a read-only folder, a file where a folder goes, a full disk) is raised after what
    this call wrote is removed again."""
    files = {
        Path("conf/experiment/my_experiment.yaml"): EXPERIMENT,
        Path("conf/data/my_data.yaml"): DATA,
        Path("data/sample.jsonl"): None,
        Path(".gitignore"): GITIGNORE,
        Path("README.md"): README,
    }
    out: list[tuple[Path, bool]] = []
    made: list[Path] = []  # files and folders this call created, in order
    try:
        for rel, text in files.items():
            path = target / rel
            if os.path.lexists(path):  # a file, a link (dangling or not), a FIFO: never replaced
                out.append((path, False))
                continue
            _make_parents(path.parent, made)
            with open(path, "x") as f:  # exclusive: never overwrite, even if it appeared meanwhile
                made.append(path)
                f.write(text if text is not None else _sample_lines())
            out.append((path, True))
    except OSError:
        for p in reversed(made):
            try:
                p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
            except OSError:
                pass
        raise
    return out


def _make_parents(folder: Path, made: list[Path]) -> None:
    """Create `folder` and its missing parents, outermost first, each added to `made` once created."""
    missing = []
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    for d in reversed(missing):
        d.mkdir()
        made.append(d)


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    options = [a for a in argv if a.startswith("-")]
    if len(argv) > 1 or options:
        what = f"unknown option {options[0]}" if options else "one folder at most"
        print(f"qwen3exp init: {printable(what)}\nusage: qwen3exp init [DIR]", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    target = Path(argv[0] if argv else ".")
    if os.path.lexists(target) and not target.is_dir():
        what = "a link to a missing folder" if target.is_symlink() and not target.exists() else "not a folder"
        print(f"qwen3exp init: {printable(str(target))} is {what}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    try:
        results = init(target)
    except OSError as e:
        why = e.strerror or type(e).__name__
        print(f"qwen3exp init: nothing written: {printable(str(e.filename or target))}: {why}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    for path, written in results:
        print(f"  {'wrote' if written else 'kept (exists)'}  {path}")
    where = "" if target == Path(".") else f"cd {target} && "
    print(f"next: {where}qwen3exp -cd conf experiment=my_experiment dry_run=true")
    return 0
