#!/usr/bin/env bash
# One call, for the day a GPU is lent (nothing here has run on one yet): tests/bench/bench_memory.py's
# matrix on CUDA. Each row is a real run (platform=cuda, 2 steps), one at a time; the table shows the
# plan's per-rank peak (plan.json memory.peak) against what the ranks measured: summary.json's
# memory_measured_gib (torchtitan's max_memory_reserved, the score's measure) and, from the probe in
# tests/gpu/memprobe (on PYTHONPATH, ranks only), the largest torch.cuda.max_memory_allocated and
# max_memory_reserved over the steps of every rank. The reserved / allocated column is what
# qwen3exp/platforms/cuda.py's RESERVED_FRACTION assumes (0.10); the worst ratio comes last.
#
#   tests/gpu/bench_memory_cuda.sh [PYTHON]     PYTHON: default .venv/bin/python, else python3
# Environment: BENCH_OUT (work folder, default a new temp folder), BENCH_ROWS (comma-separated row
#              names, default all; `python tests/bench/bench_memory.py --list`), BENCH_RANKS
#              (default: every visible GPU; with 1 GPU the dp_shard=2 / tp=2 rows run on 1 rank).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${1:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${BENCH_OUT:-$(mktemp -d -t qwen3exp-cuda-memory-XXXX)}
export PYTHONPATH="$PWD/tests/gpu/memprobe:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
RANKS=${BENCH_RANKS:-$("$PY" -c "import torch; print(torch.cuda.device_count())")}
[ "$RANKS" -ge 1 ] || { echo "no CUDA GPU visible: nothing to measure"; exit 3; }
nvidia-smi -L 2>/dev/null || true

"$PY" tests/bench/bench_memory.py --platform cuda --ranks "$RANKS" --workdir "$OUT" ${BENCH_ROWS:+--rows "$BENCH_ROWS"}
rc=$?

echo "== torch.cuda peaks per row (GiB per rank, the largest rank; $OUT/runs)"
"$PY" - "$OUT/runs" <<'PYEOF'
import json, sys
from pathlib import Path
print(f"{'row':<32} {'plan peak':>9} {'allocated':>9} {'reserved':>9} {'res/alloc':>9} {'plan/res':>8}")
for run in sorted(p for p in Path(sys.argv[1]).iterdir() if p.is_dir()):
    peaks = [json.loads(f.read_text()) for f in (run / "logs").glob("cuda_peak_rank*.json")]
    plan = json.loads((run / "plan.json").read_text())["memory"] if (run / "plan.json").exists() else {}
    if not peaks or "peak" not in plan:
        print(f"{run.name:<32} (no measure: see {run}.log)")
        continue
    alloc = max(p["allocated"] for p in peaks) / 2**30
    res = max(p["reserved"] for p in peaks) / 2**30
    pred = plan["peak"] / 2**30
    print(f"{run.name:<32} {pred:9.3f} {alloc:9.3f} {res:9.3f} {res / alloc:9.3f} {pred / res:8.3f}")
PYEOF
exit $rc
