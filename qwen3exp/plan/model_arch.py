"""The architecture a run trains, from its flavor or its config.json, and the rules on that file.

flavor=auto and model=hf read config.json (`qwen3exp.config.hf_config`); an explicit flavor next to
a checkpoint's config.json is checked against it key by key (Qwen3-4B-Instruct-2507's rope_theta
5e6 against the 4B flavor's 1e6 is an error, not something to train through). A folder whose
config.json asks for remote code (`auto_map`) is refused: qwen3exp never runs code shipped in a
model folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.flavors import FLAVORS, Arch, arch_differences
from qwen3exp.config.hf_config import HF_ARCHITECTURES, HF_KEYS, HFConfigError, arch_from_hf_config
from qwen3exp.errors import Problem
from qwen3exp.plan.model_ref import ModelRef
from qwen3exp.plan.model_sources import Refs, Sections, fetch_hint, folder_of, refs

CONFIG_JSON = "config.json"


def arch_and_source(exp: Sections, r: Refs, problems: list[Problem]) -> tuple[Arch | None, str]:
    """(the architecture, where it came from); None when config.json does not give one (`problems` say why)."""
    m = exp.model
    cfg_ref = r.config(exp)
    folder = folder_of(cfg_ref)
    key, value = (cfg_ref.key, cfg_ref.value) if cfg_ref is not None else ("model.hf_assets_path", str(folder))
    described = cfg_ref.describe() if cfg_ref is not None else str(folder)
    source = f"{CONFIG_JSON} of {described}"
    if m.backend == "hf" or m.flavor == "auto":
        cfg = read_config(key, value, folder, problems, cfg_ref)
        arch = arch_of(key, value, cfg, problems, m.backend) if cfg is not None else None
        return arch, source
    flavor = FLAVORS[m.flavor]
    if m.hf_assets_path is not None and (folder / CONFIG_JSON).is_file():
        # An explicit flavor next to a checkpoint's config.json: both must describe one model.
        cfg = read_config(key, value, folder, problems, cfg_ref)
        arch = arch_of(key, value, cfg, problems, "native") if cfg is not None else None
        if arch is not None:
            for name, mine, theirs in arch_differences(flavor, arch):
                problems.append(
                    Problem(
                        "model.flavor",
                        m.flavor,
                        f"{HF_KEYS.get(name, name)} is {theirs} in {folder / CONFIG_JSON} "
                        f"but {mine} in flavor {m.flavor}",
                        hint="model.flavor=auto takes every value from config.json",
                    )
                )
    return flavor, f"flavor {m.flavor}"


def read_config(
    key: str, value: str, folder: Path, problems: list[Problem], ref: ModelRef | None = None
) -> dict | None:
    path = folder / CONFIG_JSON
    if not path.is_file():
        problems.append(
            Problem(
                key,
                value,
                f"holds no {CONFIG_JSON}" + (f" ({folder})" if ref and ref.is_hub else ""),
                f"a folder with a Qwen3 {CONFIG_JSON}",
                fetch_hint(ref, CONFIG_JSON),
            )
        )
        return None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.append(Problem(key, value, f"{path} is not valid JSON ({e})"))
        return None
    if not isinstance(cfg, dict):
        problems.append(
            Problem(key, value, f"{path} holds a JSON {type(cfg).__name__}, not an object", f"a Qwen3 {CONFIG_JSON}")
        )
        return None
    return cfg


def arch_of(key: str, value: str, cfg: dict, problems: list[Problem], backend: str) -> Arch | None:
    try:
        return arch_from_hf_config(cfg, backend=backend)
    except HFConfigError as e:
        problems.append(Problem(key, value, f"{CONFIG_JSON}: {e}", e.allowed or ", ".join(HF_ARCHITECTURES), e.hint))
        return None


def remote_code_problems(exp: Sections, r: Refs | None = None) -> list[Problem]:
    """Every model folder the experiment reads (model.hf_assets_path, model.hf_model,
    checkpoint.path) whose config.json has an `auto_map`: the entry through which transformers
    imports and runs Python files shipped in the folder (trust_remote_code). qwen3exp reads model
    folders as data only, so such a folder is refused before anything starts."""
    r = r if r is not None else refs(exp)
    folders: list[tuple[str, str, Path | None]] = [
        ("model.hf_assets_path", str(TOKENIZER_DIR), TOKENIZER_DIR)
        if r.assets is None
        else (r.assets.key, r.assets.value, r.assets.folder)
    ]
    for ref in (r.hf_model, r.checkpoint if exp.checkpoint.loads_weights else None):
        if ref is not None:
            folders.append((ref.key, ref.value, ref.folder))
    problems, seen = [], set()
    for key, value, folder in folders:
        path = folder / CONFIG_JSON if folder is not None else None
        if path is None or path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            cfg = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # reported by the architecture check
        auto_map = cfg.get("auto_map") if isinstance(cfg, dict) else None
        if auto_map:
            problems.append(
                Problem(
                    key,
                    value,
                    f"{path} has auto_map = {json.dumps(auto_map)[:200]}, which asks transformers to "
                    "import and run Python files shipped in the model folder (trust_remote_code); qwen3exp never "
                    "executes code that ships in a model folder",
                    f"a model folder whose {CONFIG_JSON} has no auto_map (a model_type transformers ships, e.g. qwen3)",
                    "for a plain Qwen3 checkpoint, delete the auto_map entry from config.json",
                )
            )
    return problems


def hf_moe_problems(exp: Sections, arch: Arch) -> list[Problem]:
    """model=hf trains transformers' own MoE block (torchtitan 0.3.0 never swaps its MoE in, see
    qwen3exp/titan/hf_model.py), which has no tensor- or expert-parallel plan."""
    p = exp.parallelism
    if exp.model.backend != "hf" or arch.moe is None:
        return []
    return [
        Problem(
            f"parallelism.{k}",
            v,
            "model=hf trains transformers' own MoE block (torchtitan 0.3.0's "
            "Transformers backend never swaps its own MoE in), which has no tensor- or expert-parallel "
            "plan",
            "1 for a Qwen3-MoE with model=hf",
            "FSDP (parallelism.dp_shard) works; for tp or ep use the native backend (model=native model.flavor=auto)",
        )
        for k, v in (("tp", p.tp), ("ep", p.ep))
        if v > 1
    ]
