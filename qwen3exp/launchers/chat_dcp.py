"""The `qwen3exp chat` command (`qwen3exp.analysis.chat`) with the conversion of a DCP checkpoint
into a Hugging Face folder, for a run that has no export: like `exports`, this side of the ranks
uses qwen3exp.titan (torchtitan's Qwen3 state dict adapter, the export's config and tokenizer
files), which the analysis layer cannot import.

The conversion reads the model's tensors alone from the checkpoint in this one process (no process
group; the optimizer's, the data loader's and the train state's entries are left unread), maps
them to Hugging Face names with the adapter the run trained with (`qwen3exp.titan.model`), writes
them as float32 `model.safetensors`, and completes the folder as an export is completed
(`hf_export.complete`: config.json from the run's architecture, the tokenizer files and chat
template, generation_config.json). `chat` verified the checkpoint's signatures before this reads it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from qwen3exp.analysis import chat
from qwen3exp.config.schema import parse_experiment
from qwen3exp.errors import ConfigError
from qwen3exp.plan.model_files import assets_folder, resolve_arch

NOT_MODEL = ("optimizer.", "lr_scheduler", "train_state.", "dataloader.")
"""The entries of a torchtitan DCP checkpoint that are not the model's tensors (prefixes)."""


def main(argv: list[str] | None = None) -> int:
    return chat.main(argv, convert=hf_folder_from_dcp)


def hf_folder_from_dcp(step_dir: Path, experiment: dict, out: Path) -> None:
    """Write the model of the DCP checkpoint `step_dir` (a model=native run's, `experiment` its
    resolved experiment) as a Hugging Face folder `out`; raises chat.Refused when the run's model
    cannot be rebuilt here (its model folder is gone, ...)."""
    from safetensors.torch import save_file  # lazy: pulls in torch; only for a run without an export
    from torch.distributed.checkpoint import FileSystemReader  # lazy: the same
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # lazy: the same
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys  # lazy: the same

    from qwen3exp.titan import hf_export  # lazy: the export's config and tokenizer files
    from qwen3exp.titan.model import qwen3_model_config, qwen3_state_dict_adapter  # lazy: imports torchtitan

    try:
        exp = parse_experiment(experiment)
        arch, assets = resolve_arch(exp), assets_folder(exp)
    except (ConfigError, OSError, ValueError) as e:
        raise chat.Refused(f"{step_dir}: the run's model cannot be rebuilt here ({type(e).__name__}: {e})") from None
    reader = FileSystemReader(str(step_dir))
    entries = reader.read_metadata().state_dict_metadata
    keys = {k for k, v in entries.items() if isinstance(v, TensorStorageMetadata) and not k.startswith(NOT_MODEL)}
    with warnings.catch_warnings():  # "torch.distributed is unavailable ...": one process is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is unavailable", category=UserWarning)
        state = _load_state_dict_from_keys(keys, storage_reader=reader)
    adapter = qwen3_state_dict_adapter()(qwen3_model_config(arch, attention="sdpa"), None)
    hf_state = {k: v.float().contiguous() for k, v in adapter.to_hf(state).items()}
    save_file(hf_state, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf_export.complete(out, arch=arch, assets=assets, config_source=assets, dtype="float32")
