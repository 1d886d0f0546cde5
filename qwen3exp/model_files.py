"""Pre-launch checks that read files: the model folder's config.json, tokenizer and safetensors.

The schema never touches the filesystem; `launch.prepare` calls `check()` before any worker
starts. It resolves the architecture (flavor=auto and model=hf read config.json), checks an
explicit flavor against config.json key by key (Qwen3-4B-Instruct-2507's rope_theta 5e6 against
the 4B flavor's 1e6 is an error, not something to train through), the tokenizer's vocabulary
against the model's, and, when weights are loaded, every safetensors file's header (readable,
not truncated) and every tensor the model needs (present, right shape). Each mistake is one
`Problem` naming the key; all of them are reported together. Cheap: JSON and safetensors headers
only (no torch, no transformers, no torchtitan).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.errors import ConfigError, Problem, nearby_path
from qwen3exp.flavors import (FLAVORS, HF_ARCHITECTURES, HF_KEYS, Arch, HFConfigError, arch_differences,
                              arch_from_hf_config, hf_param_shapes, read_hf_config)
from qwen3exp.schema import Experiment, arch_problems

CONFIG_JSON = "config.json"
INDEX_JSON = "model.safetensors.index.json"
MAX_LISTED = 5
"""Missing or mis-shaped tensors listed one by one before the rest are counted."""


@dataclass(frozen=True)
class ModelFiles:
    arch: Arch
    """The architecture that is trained (the experiment's reductions applied)."""
    source: str
    """Where the architecture came from: 'flavor tiny' or 'config.json of /path'."""
    folder: Path
    """model.hf_assets_path (or the bundled folder): tokenizer, config.json."""
    weights: Path | None
    """Folder whose safetensors are loaded at step 0 (checkpoint hf_load / hf_roundtrip)."""


def assets_folder(exp: Experiment) -> Path:
    return Path(exp.model.hf_assets_path).expanduser().resolve() if exp.model.hf_assets_path else TOKENIZER_DIR


def weights_folder(exp: Experiment) -> Path | None:
    """The folder loaded at step 0, or None when training starts from random weights."""
    match exp.checkpoint.kind:
        case "hf_load" | "hf_roundtrip":
            path = exp.checkpoint.path
            return Path(path).expanduser().resolve() if path else assets_folder(exp)
    return None


def hf_model_folder(exp: Experiment) -> tuple[str, Path | None]:
    """model=hf: (what AutoConfig is given, the folder holding its config.json or None if absent)."""
    name = exp.model.hf_model
    if name is None:
        folder = assets_folder(exp)
        return str(folder), folder
    local = Path(name).expanduser()
    if local.is_dir():
        return str(local.resolve()), local.resolve()
    # A Hub id: usable offline only when the local Hugging Face cache holds it.
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, CONFIG_JSON)
    except Exception:  # an id that is not even a valid repo name
        cached = None
    return name, (Path(cached).parent if isinstance(cached, str) else None)


def resolve_arch(exp: Experiment) -> Arch:
    """The trained architecture, without the checks (ranks rebuild it after `check` passed)."""
    m = exp.model
    if m.backend == "native" and m.flavor != "auto":
        return m.arch()
    folder = hf_model_folder(exp)[1] if m.backend == "hf" else assets_folder(exp)
    arch = arch_from_hf_config(read_hf_config(folder))
    if m.backend == "native":
        arch = arch.reduced(n_layers=m.n_layers, num_experts=m.num_experts, top_k=m.top_k)
    return arch


def check(exp: Experiment) -> ModelFiles:
    """Resolve and check the model's files; raise ConfigError naming every problem."""
    problems: list[Problem] = []
    folder = assets_folder(exp)
    key = "model.hf_assets_path"
    if not folder.is_dir():
        raise ConfigError([Problem(key, str(folder), "is a file, not a folder" if folder.exists() else "folder does not exist",
                                   "a local folder with tokenizer files (and config.json, safetensors)",
                                   nearby_path(folder))])
    arch, source = _resolve_arch(exp, folder, problems)
    if arch is None:
        raise ConfigError(problems)
    if exp.model.backend == "native" and exp.model.flavor != "auto":
        base = FLAVORS[exp.model.flavor]
    else:
        base = arch
        problems += arch_problems(exp, base, source)
    m = exp.model
    if m.backend == "native":
        arch = base.reduced(n_layers=m.n_layers, num_experts=m.num_experts, top_k=m.top_k)
    problems += _tokenizer_problems(folder, arch)
    weights = weights_folder(exp)
    if weights is not None:
        wkey = "checkpoint.path" if exp.checkpoint.path else key
        problems += _weights_problems(wkey, weights, arch, exact=(arch == base))
    if problems:
        raise ConfigError(problems)
    return ModelFiles(arch=arch, source=source, folder=folder, weights=weights)


def _read_config(key: str, value: str, folder: Path | None, problems: list[Problem]) -> dict | None:
    path = folder / CONFIG_JSON if folder is not None else None
    if path is None or not path.is_file():
        problems.append(Problem(key, value, f"holds no {CONFIG_JSON}" if folder else
                                "is neither a local folder nor in the local Hugging Face cache (nothing is downloaded)",
                                f"a folder with a Qwen3 {CONFIG_JSON}"))
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        problems.append(Problem(key, value, f"{path} is not valid JSON ({e})"))
        return None


def _arch_of(key: str, value: str, cfg: dict, problems: list[Problem]) -> Arch | None:
    try:
        return arch_from_hf_config(cfg)
    except HFConfigError as e:
        problems.append(Problem(key, value, f"{CONFIG_JSON}: {e}", ", ".join(HF_ARCHITECTURES)))
        return None


def _resolve_arch(exp: Experiment, folder: Path, problems: list[Problem]) -> tuple[Arch | None, str]:
    m = exp.model
    key = "model.hf_assets_path"
    if m.backend == "hf":
        name, cfg_folder = hf_model_folder(exp)
        key = "model.hf_model" if m.hf_model is not None else key
        cfg = _read_config(key, name, cfg_folder, problems)
        arch = _arch_of(key, name, cfg, problems) if cfg is not None else None
        return arch, f"{CONFIG_JSON} of {name}"
    source = f"{CONFIG_JSON} of {folder}"
    if m.flavor == "auto":
        cfg = _read_config(key, str(folder), folder, problems)
        return (_arch_of(key, str(folder), cfg, problems) if cfg is not None else None), source
    flavor = FLAVORS[m.flavor]
    if m.hf_assets_path is not None and (folder / CONFIG_JSON).is_file():
        # An explicit flavor next to a checkpoint's config.json: both must describe one model.
        cfg = _read_config(key, str(folder), folder, problems)
        arch = _arch_of(key, str(folder), cfg, problems) if cfg is not None else None
        if arch is not None:
            for name, mine, theirs in arch_differences(flavor, arch):
                problems.append(Problem(
                    "model.flavor", m.flavor,
                    f"{HF_KEYS.get(name, name)} is {theirs} in {folder / CONFIG_JSON} but {mine} in flavor {m.flavor}",
                    hint="model.flavor=auto takes every value from config.json"))
    return flavor, f"flavor {m.flavor}"


def tokenizer_vocab_size(folder: Path) -> int | None:
    """1 + the largest token id the tokenizer files in `folder` can produce (None: no tokenizer)."""
    ids: list[int] = []
    tok = folder / "tokenizer.json"
    if tok.is_file():
        data = json.loads(tok.read_text())
        vocab = data.get("model", {}).get("vocab") or {}
        if isinstance(vocab, dict):
            ids += vocab.values()
        else:  # Unigram: a list of [piece, score]
            ids.append(len(vocab) - 1)
        ids += [t["id"] for t in data.get("added_tokens") or []]
    elif (folder / "vocab.json").is_file():
        ids += json.loads((folder / "vocab.json").read_text()).values()
    else:
        return None
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        ids += [int(i) for i in (json.loads(cfg.read_text()).get("added_tokens_decoder") or {})]
    return max(ids) + 1 if ids else 0


def _tokenizer_problems(folder: Path, arch: Arch) -> list[Problem]:
    key = "model.hf_assets_path"
    try:
        n = tokenizer_vocab_size(folder)
    except (OSError, json.JSONDecodeError, TypeError, KeyError, ValueError) as e:
        return [Problem(key, str(folder), f"tokenizer files are unreadable ({e})")]
    if n is None:
        return [Problem(key, str(folder), "holds no tokenizer",
                        "a folder with tokenizer.json, or vocab.json + merges.txt")]
    if n > arch.vocab_size:
        return [Problem(key, str(folder), f"the tokenizer produces token ids up to {n - 1} but the model's "
                        f"vocab_size is {arch.vocab_size}: ids >= {arch.vocab_size} have no embedding",
                        f"a tokenizer with at most {arch.vocab_size} tokens, or a model with vocab_size >= {n}")]
    return []


def safetensors_files(folder: Path) -> tuple[list[Path], list[str]]:
    """(files, problems): the files the index names (all of them must exist), else every *.safetensors."""
    index = folder / INDEX_JSON
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            return [], [f"{index} is unreadable ({e})"]
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (folder / n).is_file()]
        return [folder / n for n in names if n not in missing], [f"{INDEX_JSON} names {n}, which does not exist"
                                                                 for n in missing]
    return sorted(folder.glob("*.safetensors")), []


def read_headers(files: list[Path]) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Tensor name -> shape over all files, reading only the headers; a corrupt or truncated file
    is a problem (safetensors checks that the header covers the whole file)."""
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    problems = []
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except (SafetensorError, OSError) as e:
            problems.append(f"{path.name} is corrupt or truncated ({e})")
    return shapes, problems


def _weights_problems(key: str, folder: Path, arch: Arch, *, exact: bool) -> list[Problem]:
    if not folder.is_dir():
        return [Problem(key, str(folder), "folder does not exist", "a folder with *.safetensors")]
    files, msgs = safetensors_files(folder)
    if not files and not msgs:
        return [Problem(key, str(folder), "holds no *.safetensors to load", "a folder with *.safetensors")]
    shapes, bad = read_headers(files)
    msgs += bad
    if bad:  # names from a broken file are incomplete; do not add spurious 'missing' lines
        return [Problem(key, str(folder), m, "readable, complete safetensors files") for m in msgs]
    need = hf_param_shapes(arch)
    missing = [n for n in need if n not in shapes]
    wrong = [f"{n} {list(shapes[n])} (the model needs {list(need[n])})"
             for n in need if n in shapes and shapes[n] != need[n]]
    extra = [n for n in shapes if n not in need and not (arch.tied and n == "lm_head.weight")]
    for what, names in (("missing tensors", missing), ("tensors with the wrong shape", wrong),
                        *((("tensors the model does not have", extra),) if exact else ())):
        if names:
            listed = ", ".join(names[:MAX_LISTED]) + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")
            msgs.append(f"{what}: {listed}")
    return [Problem(key, str(folder), m, "a folder whose safetensors hold every tensor the model needs, with its shape",
                    hint="the checkpoint does not match the model's dimensions") for m in msgs]
