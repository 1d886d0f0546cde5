"""Pre-launch checks that read files: the model folder's config.json, tokenizer and safetensors.

The schema never touches the filesystem; `launch.prepare` calls `check()` before any worker
starts. It resolves the architecture (flavor=auto and model=hf read config.json), checks an
explicit flavor against config.json key by key (Qwen3-4B-Instruct-2507's rope_theta 5e6 against
the 4B flavor's 1e6 is an error, not something to train through), the tokenizer's vocabulary
against the model's, and, when weights are loaded, every safetensors file's header (readable,
not truncated), every tensor the model needs (present, right shape, a floating-point dtype, no
NaN or Inf in its values: `nonfinite_tensors`, within a byte budget). A folder whose config.json
asks for remote code (`auto_map`) is refused: qwen3exp never runs code shipped in a model folder.
Each mistake is one `Problem` naming the key; all of them are reported together. Cheap: JSON,
safetensors headers and a bounded numpy scan of the raw bytes (no torch, no transformers, no
torchtitan).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.flavors import (
    FLAVORS,
    HF_ARCHITECTURES,
    HF_KEYS,
    Arch,
    HFConfigError,
    arch_differences,
    arch_from_hf_config,
    hf_param_shapes,
    read_hf_config,
)
from qwen3exp.config.schema import Experiment, HFLoad, HFRoundtrip, arch_problems
from qwen3exp.errors import ConfigError, Problem, nearby_path
from qwen3exp.units import GIB, MIB

CONFIG_JSON = "config.json"
INDEX_JSON = "model.safetensors.index.json"
NOT_LOCAL = "is neither a local folder nor in the local Hugging Face cache (nothing is downloaded)"
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


def checkpoint_path(exp: Experiment) -> str | None:
    """checkpoint.path of the kinds that load a Hugging Face folder (hf_load, hf_roundtrip; None: the
    model's own folder), None for the others."""
    c = exp.checkpoint
    return c.path if isinstance(c, HFLoad | HFRoundtrip) else None


def weights_folder(exp: Experiment) -> Path | None:
    """The folder loaded at step 0, or None when training starts from random weights."""
    match exp.checkpoint.kind:
        case "hf_load" | "hf_roundtrip":
            path = checkpoint_path(exp)
            return Path(path).expanduser().resolve() if path else assets_folder(exp)
    return None


def hf_model_folder(exp: Experiment) -> tuple[str, Path | None]:
    """model=hf: (what AutoConfig is given, the folder holding its config.json or None if absent)."""
    name = exp.model.hf_model if exp.model.backend == "hf" else None
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
    known = m.arch()  # a native flavor other than auto: no file to read
    if known is not None:
        return known
    if m.backend == "hf":
        name, folder = hf_model_folder(exp)
        if folder is None:  # `check` refuses this before launch, with the same message
            raise ConfigError([Problem("model.hf_model", name, NOT_LOCAL, f"a folder with a Qwen3 {CONFIG_JSON}")])
    else:
        folder = assets_folder(exp)
    arch = arch_from_hf_config(read_hf_config(folder), backend=m.backend)
    if m.backend == "native":
        arch = arch.reduced(n_layers=m.n_layers, num_experts=m.num_experts, top_k=m.top_k)
    return arch


def check(exp: Experiment) -> ModelFiles:
    """Resolve and check the model's files; raise ConfigError naming every problem."""
    problems: list[Problem] = []
    folder = assets_folder(exp)
    key = "model.hf_assets_path"
    if not folder.is_dir():
        raise ConfigError([Problem(key, str(folder),
                                   "is a file, not a folder" if folder.exists() else "folder does not exist",
                                   "a local folder with tokenizer files (and config.json, safetensors)",
                                   nearby_path(folder))])
    problems += remote_code_problems(exp)
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
        wkey = "checkpoint.path" if checkpoint_path(exp) else key
        problems += _weights_problems(wkey, weights, arch, exact=(arch == base))
    if problems:
        raise ConfigError(problems)
    return ModelFiles(arch=arch, source=source, folder=folder, weights=weights)


def _read_config(key: str, value: str, folder: Path | None, problems: list[Problem]) -> dict | None:
    path = folder / CONFIG_JSON if folder is not None else None
    if path is None or not path.is_file():
        problems.append(Problem(key, value, f"holds no {CONFIG_JSON}" if folder else NOT_LOCAL,
                                f"a folder with a Qwen3 {CONFIG_JSON}"))
        return None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.append(Problem(key, value, f"{path} is not valid JSON ({e})"))
        return None
    if not isinstance(cfg, dict):
        problems.append(Problem(key, value, f"{path} holds a JSON {type(cfg).__name__}, not an object",
                                f"a Qwen3 {CONFIG_JSON}"))
        return None
    return cfg


def _arch_of(key: str, value: str, cfg: dict, problems: list[Problem], backend: str) -> Arch | None:
    try:
        return arch_from_hf_config(cfg, backend=backend)
    except HFConfigError as e:
        problems.append(Problem(key, value, f"{CONFIG_JSON}: {e}", e.allowed or ", ".join(HF_ARCHITECTURES), e.hint))
        return None


def remote_code_problems(exp: Experiment) -> list[Problem]:
    """Every model folder the experiment reads (model.hf_assets_path, model.hf_model,
    checkpoint.path) whose config.json has an `auto_map`: the entry through which transformers
    imports and runs Python files shipped in the folder (trust_remote_code). qwen3exp reads model
    folders as data only, so such a folder is refused before anything starts."""
    folders: list[tuple[str, str, Path | None]] = [
        ("model.hf_assets_path", str(assets_folder(exp)), assets_folder(exp))]
    if exp.model.backend == "hf" and exp.model.hf_model is not None:
        name, folder = hf_model_folder(exp)
        folders.append(("model.hf_model", name, folder))
    ckpt = checkpoint_path(exp)
    if weights_folder(exp) is not None and ckpt:
        folders.append(("checkpoint.path", ckpt, weights_folder(exp)))
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
            problems.append(Problem(
                key, value, f"{path} has auto_map = {json.dumps(auto_map)[:200]}, which asks transformers to "
                "import and run Python files shipped in the model folder (trust_remote_code); qwen3exp never "
                "executes code that ships in a model folder",
                f"a model folder whose {CONFIG_JSON} has no auto_map (a model_type transformers ships, e.g. qwen3)",
                "for a plain Qwen3 checkpoint, delete the auto_map entry from config.json"))
    return problems


def _resolve_arch(exp: Experiment, folder: Path, problems: list[Problem]) -> tuple[Arch | None, str]:
    m = exp.model
    key = "model.hf_assets_path"
    if m.backend == "hf":
        name, cfg_folder = hf_model_folder(exp)
        key = "model.hf_model" if m.hf_model is not None else key
        cfg = _read_config(key, name, cfg_folder, problems)
        arch = _arch_of(key, name, cfg, problems, "hf") if cfg is not None else None
        return arch, f"{CONFIG_JSON} of {name}"
    source = f"{CONFIG_JSON} of {folder}"
    if m.flavor == "auto":
        cfg = _read_config(key, str(folder), folder, problems)
        return (_arch_of(key, str(folder), cfg, problems, "native") if cfg is not None else None), source
    flavor = FLAVORS[m.flavor]
    if m.hf_assets_path is not None and (folder / CONFIG_JSON).is_file():
        # An explicit flavor next to a checkpoint's config.json: both must describe one model.
        cfg = _read_config(key, str(folder), folder, problems)
        arch = _arch_of(key, str(folder), cfg, problems, "native") if cfg is not None else None
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


# ------------------------------------------------------------------ safetensors values
# Floating-point safetensors dtypes -> (the unsigned integer of the same width, the exponent bits).
# A value is NaN or Inf exactly when all of its exponent bits are set (IEEE 754; bfloat16 is the top
# half of a float32; float8 e4m3 has no Inf and its NaN is S.1111.111, e5m2 is IEEE-like).
FLOAT_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("<u8", 0x7FF0000000000000), "F32": ("<u4", 0x7F800000), "F16": ("<u2", 0x7C00),
    "BF16": ("<u2", 0x7F80), "F8_E5M2": ("u1", 0x7C), "F8_E4M3": ("u1", 0x7F),
}
SCAN_BUDGET_BYTES = 256 * MIB
"""Bytes of tensor data `nonfinite_tensors` reads: checkpoints up to this size are scanned whole."""
SCAN_BLOCK_BYTES = 64 * 2**10
"""Larger checkpoints: each tensor contributes evenly spaced blocks of this size (at least one)."""
_SLICE = 16 * MIB  # bytes tested at a time, so the scan's temporary arrays stay small


@dataclass(frozen=True)
class TensorEntry:
    name: str
    path: Path
    dtype: str
    start: int
    """Absolute offset of the tensor's first byte in the file."""
    nbytes: int


def tensor_entries(files: list[Path]) -> dict[str, TensorEntry]:
    """Tensor name -> dtype and byte range, from the safetensors headers (8 bytes little-endian
    header length, then a JSON object {name: {dtype, shape, data_offsets: [begin, end]}} whose offsets
    count from the end of the header). Call after `read_headers` accepted the files."""
    out: dict[str, TensorEntry] = {}
    for path in files:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            out[name] = TensorEntry(name, path, info["dtype"], 8 + n + begin, end - begin)
    return out


def _sample(nbytes: int, share: int, itemsize: int) -> list[tuple[int, int]]:
    """(offset, length) ranges of a tensor to read: all of it when `share` covers it, else evenly
    spaced blocks (the first and the last included), aligned to whole elements."""
    block = max(itemsize, SCAN_BLOCK_BYTES // itemsize * itemsize)
    if share >= nbytes or nbytes <= block:
        return [(0, nbytes)]
    k = max(1, share // block)
    last = (nbytes - block) // itemsize
    starts = sorted({(last * i // max(1, k - 1)) * itemsize for i in range(k)})
    return [(a, block) for a in starts]


def nonfinite_tensors(entries: list[TensorEntry], *, budget: int = SCAN_BUDGET_BYTES) -> tuple[list[str], int, int]:
    """(names of the tensors holding NaN or Inf, bytes scanned, bytes in total) for floating-point
    entries, testing exponent bits on the raw bytes with numpy (no torch).

    Budget: when the tensors hold at most `budget` bytes (256 MiB), every value is tested. Beyond,
    each tensor gets a share of the budget proportional to its size, read as evenly spaced 64 KiB
    blocks (always its first and last block, at least one per tensor): the same bytes on every run,
    about `budget` bytes in all, so a published 8 GB checkpoint is checked in about a second. A
    checkpoint that diverged is NaN almost everywhere and is found; a single bad value in a large
    tensor may not be. The blocks are read with seek + readinto rather than a memory map: on a file
    that is not in the page cache, faulting a map in page by page was 25x slower here."""
    import numpy as np

    entries = [e for e in entries if e.dtype in FLOAT_DTYPES and e.nbytes > 0]
    total = sum(e.nbytes for e in entries)
    scanned, bad = 0, []
    buffer = bytearray(min(_SLICE, max((e.nbytes for e in entries), default=0)))
    files: dict[Path, io.FileIO] = {}
    try:
        for e in entries:
            word, mask = FLOAT_DTYPES[e.dtype]
            itemsize = np.dtype(word).itemsize
            share = e.nbytes if total <= budget else budget * e.nbytes // total
            f = files.get(e.path)
            if f is None:
                f = files[e.path] = open(e.path, "rb", buffering=0)
            found = False
            for offset, length in _sample(e.nbytes, share, itemsize):
                for a in range(offset, offset + length, _SLICE):
                    n = min(offset + length, a + _SLICE) - a
                    view = memoryview(buffer)[:n]
                    f.seek(e.start + a)
                    if f.readinto(view) != n:
                        raise ValueError(f"{e.path.name}: tensor {e.name} ends after the end of the file")
                    values = np.frombuffer(view, dtype=word)
                    scanned += n
                    if np.any((values & mask) == mask):
                        found = True
                        break
                if found:
                    break
            if found:
                bad.append(e.name)
    finally:
        for f in files.values():
            f.close()
    return bad, scanned, total


def _listed(names: list[str]) -> str:
    return ", ".join(names[:MAX_LISTED]) + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def _value_problems(key: str, folder: Path, files: list[Path], names: list[str]) -> list[Problem]:
    """The tensors the model loads: a floating-point dtype, and finite values."""
    entries = tensor_entries(files)
    wanted = [entries[n] for n in names if n in entries]
    problems = []
    ints = [f"{e.name} ({e.dtype})" for e in wanted if e.dtype not in FLOAT_DTYPES]
    if ints:
        problems.append(Problem(key, str(folder), f"tensors with a dtype that is not floating point: {_listed(ints)}",
                                f"safetensors whose weights are {', '.join(FLOAT_DTYPES)}",
                                "a quantised or integer checkpoint cannot be loaded as model weights; use the "
                                "unquantised (bf16 / fp32) release"))
    bad, scanned, total = nonfinite_tensors(wanted)
    if bad:
        how = ("every value" if scanned >= total
               else f"a fixed sample of {scanned / MIB:.0f} MiB of {total / GIB:.2f} GiB")
        problems.append(Problem(key, str(folder), f"tensors holding NaN or Inf values: {_listed(bad)} (scanned {how})",
                                "weights whose values are all finite",
                                "the checkpoint is damaged or was saved after training diverged"))
    return problems


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
            msgs.append(f"{what}: {_listed(names)}")
    problems = [Problem(key, str(folder), m,
                        "a folder whose safetensors hold every tensor the model needs, with its shape",
                        hint="the checkpoint does not match the model's dimensions") for m in msgs]
    try:
        problems += _value_problems(key, folder, files, [n for n in need if n in shapes])
    except (OSError, ValueError, KeyError, TypeError) as e:  # a header safetensors accepted but we cannot map
        problems.append(Problem(key, str(folder), f"safetensors data could not be read ({e})",
                                "readable, complete safetensors files"))
    return problems
