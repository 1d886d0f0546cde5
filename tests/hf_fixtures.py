"""Tiny Hugging Face Qwen3 checkpoints written with `transformers`, and the Hugging Face model's own
loss on a run's first batch (the reference every loaded run is compared with).

The checkpoints use the tokenizer bundled with qwen3exp (vocab 2048) and deliberately non-default
numbers: dims that no flavor has, head_dim != dim / n_heads, rope_theta 5e6, rms_norm_eps 1e-5,
tied and untied embeddings. Weights are drawn with a large std so the logits depend strongly on
every weight, on RoPE and on the document mask (with HF's default 0.02 every model predicts
nearly uniformly and a missing RoPE would hide below the tolerance).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from qwen3exp.assets import TOKENIZER_DIR

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def tiny_config(*, tied: bool, rope_theta: float = 5e6, **overrides):
    """A Qwen3Config (Qwen3MoeConfig when `num_experts` is given)."""
    from transformers import Qwen3Config, Qwen3MoeConfig

    moe = "num_experts" in overrides
    kw = dict(vocab_size=2048, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=40, max_position_embeddings=1024,
              rms_norm_eps=1e-5, tie_word_embeddings=tied, initializer_range=0.2, eos_token_id=0,
              rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
              architectures=["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"])
    kw.update(overrides)
    return (Qwen3MoeConfig if moe else Qwen3Config)(**kw)


def write_checkpoint(folder: Path, *, tied: bool, rope_theta: float = 5e6, seed: int = 0,
                     tokenizer: bool = True, **overrides) -> Path:
    """A complete `from_pretrained` folder: config.json, model.safetensors, tokenizer files."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(tied=tied, rope_theta=rope_theta, **overrides),
                                             dtype=torch.float32)
    with torch.no_grad():  # RMSNorm weights are ones at init; vary them so they are checked too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    if tokenizer:
        for name in TOKENIZER_FILES:
            shutil.copy(TOKENIZER_DIR / name, folder / name)
    return folder


def first_batches(run_dir: Path) -> list[tuple]:
    """(input ids, labels, positions) of step 1 for every data-parallel rank, rebuilt with the run's
    own torchtitan config (tokenizer, dataloader, dp sharding) from its run directory."""
    import yaml

    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.platforms import PlatformFacts
    from qwen3exp.titan.job_config import to_torchtitan

    exp = validate_experiment(yaml.safe_load((run_dir / "experiment.yaml").read_text()))
    facts = PlatformFacts(**json.loads((run_dir / "platform.json").read_text()))
    world = int(json.loads((run_dir / "summary.json").read_text())["world_size"])
    config = to_torchtitan(exp, facts, run_dir)
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    out = []
    for rank in range(world):
        loader = config.dataloader.build(dp_world_size=world, dp_rank=rank, tokenizer=tokenizer,
                                         seq_len=exp.training.seq_len,
                                         local_batch_size=exp.training.local_batch_size)
        inputs, labels = next(iter(loader))
        out.append((inputs["input"], labels, inputs["positions"]))
    return out


def hf_loss(folder: Path, batches: list[tuple]) -> float:
    """The Hugging Face model's mean token loss over the batches, each packed document run on its
    own (so nothing depends on a mask implementation): sum of token losses / number of tokens.

    Computed in a fresh process: once torchtitan's transformers backend has built a model in a
    process, it has replaced `PreTrainedModel._init_weights` process-wide (see
    qwen3exp/titan/hf_model.py), and `from_pretrained` there leaves the rotary buffers wrong; an
    earlier test in the same pytest process would silently change this reference."""
    import os
    import subprocess
    import sys
    import tempfile

    import torch

    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "batches.pt"
        torch.save(batches, saved)
        code = (f"import sys, torch; sys.path.insert(0, {str(here)!r}); from hf_fixtures import hf_loss_here; "
                f"print(repr(hf_loss_here({str(folder)!r}, torch.load({str(saved)!r}))))")
        env = dict(os.environ, PYTHONPATH=str(here.parent), HF_HUB_OFFLINE="1")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return float(r.stdout.strip().splitlines()[-1])


def hf_loss_here(folder, batches: list[tuple]) -> float:
    """`hf_loss` in this process (use only in a process that never built the transformers backend)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, labels, positions in batches:
            for row in range(ids.shape[0]):
                starts = (positions[row] == 0).nonzero().flatten().tolist()
                if not starts or starts[0] != 0:
                    starts = [0, *starts]
                bounds = [*starts, ids.shape[1]]
                for a, b in zip(bounds, bounds[1:], strict=False):
                    logits = model(input_ids=ids[row, a:b][None],
                                   position_ids=positions[row, a:b][None]).logits[0].double()
                    total += F.cross_entropy(logits, labels[row, a:b], reduction="sum").item()
                    count += b - a
    return total / count
