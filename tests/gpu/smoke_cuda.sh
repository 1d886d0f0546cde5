#!/usr/bin/env bash
# One-call CUDA smoke check, prepared for the day a GPU is available (nothing here has run on one yet):
# the tiny CPU-twin experiments (tiny native; tiny HF when that file exists) for a few steps with
# platform=cuda, i.e. torchtitan's defaults: FlexAttention, nccl, one rank per GPU. Prints one line
# per run (status, losses, tokens/s, memory, MFU, attention) and exits non-zero if any run failed.
#
#   tests/gpu/smoke_cuda.sh [PYTHON]     PYTHON: an interpreter with qwen3exp's dependencies
#                                        (default: .venv/bin/python, else python3)
# Environment: SMOKE_OUT (folder for the run directories, default a new temp folder),
#              SMOKE_STEPS (default 5), SMOKE_RANKS (default: every visible GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${1:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${SMOKE_OUT:-$(mktemp -d -t qwen3exp-cuda-smoke-XXXX)}
STEPS=${SMOKE_STEPS:-5}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

echo "== environment"
nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"
"$PY" -c "import torch, torchtitan, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'available', torch.cuda.is_available(), 'gpus', torch.cuda.device_count(),
'| torchtitan', torchtitan.__version__ if hasattr(torchtitan, '__version__') else '?', '| transformers', transformers.__version__)" || exit 3
RANKS=${SMOKE_RANKS:-$("$PY" -c "import torch; print(torch.cuda.device_count())")}
[ "$RANKS" -ge 1 ] || { echo "no CUDA GPU visible: nothing to smoke-test"; exit 3; }

echo "== plan (dry run)"
"$PY" -m qwen3exp experiment=tiny_native platform=cuda dry_run=true launcher.nproc_per_node="$RANKS" || exit 4

failed=0
ran=()
run() {  # run NAME EXPERIMENT [overrides...]
  local name=$1 exp=$2; shift 2
  if [ ! -f "conf/experiment/$exp.yaml" ]; then echo "== $name: SKIPPED (conf/experiment/$exp.yaml not on this branch)"; return; fi
  echo "== $name: experiment=$exp platform=cuda, $RANKS rank(s), $STEPS steps"
  "$PY" -m qwen3exp "experiment=$exp" platform=cuda "launcher.nproc_per_node=$RANKS" "training.steps=$STEPS" \
    training.warmup_steps=1 metrics.tensorboard=false "hydra.run.dir=$OUT/$name" "$@"
  local rc=$?
  echo "   exit code $rc"
  [ "$rc" -eq 0 ] || failed=1
  ran+=("$name")
}
run tiny_native tiny_native
run tiny_hf tiny_hf

echo "== results ($OUT)"
for name in "${ran[@]}"; do
  "$PY" - "$OUT/$name" <<'PYEOF'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
p = json.loads((run / "platform.json").read_text()) if (run / "platform.json").exists() else {}
rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()] if (run / "metrics.jsonl").exists() else []
last = rows[-1] if rows else {}
print(f"{run.name}: status={s.get('status')} steps={s.get('steps_completed')} first_loss={s.get('first_loss')} "
      f"last_loss={s.get('last_loss')} tokens/s={last.get('tokens_per_second')} memory_gib={last.get('memory_gib')} "
      f"mfu={last.get('mfu')} device={p.get('device_name')} attention={p.get('attention')} backend={p.get('dist_backend')}"
      + (f"\n   error: {s.get('error')}" if s.get("error") else ""))
PYEOF
done
exit $failed
