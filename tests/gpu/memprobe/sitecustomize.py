"""CUDA memory probe for tests/gpu/bench_memory_cuda.sh: on PYTHONPATH, in each qwen3exp rank only
(RANK set; the hook checks the command, which Python fills in after this import), it records after
every optimizer step the largest `torch.cuda.max_memory_allocated()` and `max_memory_reserved()`
seen so far (torchtitan resets the peaks every logged step, after the optimizer step),
in `<run dir>/logs/cuda_peak_rank<R>.json`."""

import json
import os
import sys

if os.environ.get("RANK") is not None:
    import torch  # lazy: only in a rank (the launcher and the agent never import this branch)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _peak = {"allocated": 0, "reserved": 0}

    def _record(optimizer, args, kwargs) -> None:
        if not torch.cuda.is_available() or "qwen3exp" not in sys.argv[0]:
            return
        _peak["allocated"] = max(_peak["allocated"], torch.cuda.max_memory_allocated())
        _peak["reserved"] = max(_peak["reserved"], torch.cuda.max_memory_reserved())
        logs = os.path.join(sys.argv[-1], "logs")
        if os.path.isdir(logs):
            with open(os.path.join(logs, f"cuda_peak_rank{os.environ['RANK']}.json"), "w") as f:
                json.dump(_peak, f)

    register_optimizer_step_post_hook(_record)
