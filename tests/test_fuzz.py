"""Fuzzing the command line: every key of the composed default experiment gets values of the wrong
type, out of range, empty, huge and non-UTF-8 (with raw terminal escapes), alone, next to a model
folder, from a user's config folder (`-cd`) and in a sweep (`-m`), always as a dry run. Each command
must end in exit 2 (or 0 where the value happens to be valid), print no traceback and no raw control
byte, and write nothing.

The rows run in-process through `test_bad_inputs`'s helper processes (one per core).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import compose
from hf_fixtures import write_checkpoint
from test_bad_inputs import WORKERS, _helper

pytestmark = pytest.mark.slow  # quick tier: a table of ~125 commands

SKIPPED = {"dry_run"}
"""The test's own safety: every row is a dry run (a valid value must never start a training)."""


def _leaves(data: dict, prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def values(current) -> dict[str, str]:
    """The substituted values for a key whose default is `current`, each as Hydra reads it."""
    text = isinstance(current, str)
    return {
        "wrong_type": "[1,2]" if text else "zz",
        "out_of_range": "-7",
        "empty": "''",
        "huge": "x" * 100_000 if text else "9" * 5000,
        "non_utf8": "'\udcff\udcfe\x1b[31mred'",
    }


ALL = os.environ.get("QWEN3EXP_FUZZ_ALL") == "1"
"""QWEN3EXP_FUZZ_ALL=1: every kind of value for every key in every variant (about 1,200 commands, a
quarter of an hour on 2 cores). By default (about 125, a minute): two kinds for every second key
alone, one kind for every third key in each other variant; the kinds rotate over the keys, so every
kind meets every type of key."""


def _rows(keys: list[tuple[str, object]], prefix: list[str], per_key: int, every_nth: int, tag: str) -> list:
    rows = []
    kinds = len(values(""))
    for i, (key, current) in enumerate(keys):
        if i % every_nth:
            continue
        chosen = list(values(current).items())
        for j in range(kinds if ALL else per_key):
            kind, value = chosen[(i + 2 * j) % kinds]
            rows.append((f"{tag}:{key}:{kind}", [*prefix, f"{key}={value}", "dry_run=true"]))
    return rows


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> tuple[dict, dict, float]:
    keys = [(k, v) for k, v in _leaves(compose()) if k not in SKIPPED]
    base = tmp_path_factory.mktemp("fuzz")
    folder = write_checkpoint(base / "model", tied=True)
    user = base / "repo" / "conf" / "experiment"
    user.mkdir(parents=True)
    (user / "mine.yaml").write_text("# @package _global_\nname: mine\ntraining:\n  steps: 3\n")
    variants = {  # tag: (arguments before the fuzzed one, kinds per key, every n-th key)
        "plain": ([], 2, 2),
        "model_folder": (["model=hf", f"model.hf_assets_path={folder}"], 1, 3),
        "config_dir": (["-cd", str(base / "repo" / "conf"), "experiment=mine"], 1, 3),
        "sweep": (["-m"], 1, 3),
    }
    rows, where = [], {}
    for tag, (prefix, per_key, every_nth) in variants.items():
        out = base / tag
        for case, argv in _rows(keys, prefix, per_key, 1 if ALL else every_nth, tag):
            n = len(rows)
            where[case] = out / str(n)
            place = f"hydra.sweep.dir={where[case]}" if tag == "sweep" else f"hydra.run.dir={where[case]}"
            rows.append((case, [*argv, place]))
    chunks = [rows[i::WORKERS] for i in range(WORKERS)]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        helpers = [pool.submit(_helper, chunk, tmp_path_factory.mktemp("helper")) for chunk in chunks]
        table = {k: v for h in helpers for k, v in h.result().items()}
    return table, where, time.perf_counter() - started


def test_every_key_with_every_kind_of_bad_value(results):
    table, where, seconds = results
    failures = []
    for case, (code, out, err) in table.items():
        why = []
        if code not in (0, 2):
            why.append(f"exit {code}")
        if "Traceback" in out + err:
            why.append("a traceback")
        if "\x1b" in out + err:
            why.append("a raw escape byte")
        if code == 2 and "configuration error" not in err:
            why.append("no configuration error named")
        if where[case].exists():
            why.append(f"left {sorted(p.name for p in where[case].rglob('*'))[:5]}")
        if why:
            failures.append(f"{case}: {', '.join(why)}\n{(out + err)[-600:]}")
    print(f"fuzz: {len(table)} cases in {seconds:.0f} s")
    assert len(table) >= (1000 if ALL else 120)
    assert not failures, f"{len(failures)} of {len(table)} cases failed:\n" + "\n".join(failures[:10])
