"""Golden test of the conversion: the default experiment's torchtitan Trainer.Config, as JSON.

Regenerate after an intended change with QWEN3EXP_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import compose

GOLDEN = Path(__file__).parent / "golden" / "tiny_native_trainer_config.json"


def _normalise(d, run_dir: str, repo: str):
    if isinstance(d, dict):
        return {k: _normalise(v, run_dir, repo) for k, v in d.items()}
    if isinstance(d, list):
        return [_normalise(v, run_dir, repo) for v in d]
    if isinstance(d, str):
        d = d.replace(run_dir, "<RUN_DIR>").replace(repo, "<REPO>")
        return "<callable>" if " at 0x" in d else d
    return d


def test_default_conversion_matches_golden(tmp_path):
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.launchers.local import prepare
    from qwen3exp.titan.job_config import to_torchtitan

    prep = prepare(validate_experiment(compose("platform=cpu")))
    got = _normalise(
        to_torchtitan(prep.exp, prep.facts, tmp_path).to_dict(),
        str(tmp_path),
        str(Path(__file__).resolve().parent.parent),
    )
    got = json.loads(json.dumps(got))  # tuples -> lists, as stored
    if os.environ.get("QWEN3EXP_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text())


def test_golden_has_the_cpu_decisions():
    g = json.loads(GOLDEN.read_text())
    layer = g["model_spec"]["model"]["layers"][0]
    assert layer["attention"]["rope"]["theta"] == 1e6 and len(g["model_spec"]["model"]["layers"]) == 2
    assert g["training"]["seq_len"] == 256 and g["training"]["steps"] == 30
    assert g["parallelism"]["data_parallel_shard_degree"] == -1
    assert g["metrics"]["jsonl_path"] == "<RUN_DIR>/metrics.jsonl"
    assert g["compile"]["enable"] is False
