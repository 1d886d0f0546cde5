"""Baseline for bench_launcher.py: train the very same Trainer.Config with torchtitan's own trainer
under a bare torchrun, without qwen3exp's launcher (no Hydra, no validation, no run-dir files).

    torchrun --nproc-per-node 2 tests/bench/direct_worker.py SOURCE_RUN_DIR OUT_DIR
"""

import sys
from pathlib import Path

from qwen3exp.platforms import prepare_worker
from qwen3exp.worker.main import load_run

exp, facts = load_run(Path(sys.argv[1]))
prepare_worker(facts)  # the CPU needs it before torchtitan is imported, launcher or not

import torch  # noqa: E402

from qwen3exp.titan.job_config import to_torchtitan  # noqa: E402

out = Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
trainer = to_torchtitan(exp, facts, out).build()
trainer.train()
trainer.close()
torch.distributed.destroy_process_group()
