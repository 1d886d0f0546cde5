"""Pre-launch checks that read files: the model's config.json, tokenizer and safetensors.

The schema never touches the filesystem; `launch.prepare` calls `check()` before any worker
starts. Every model reference (`model.hf_assets_path`, `model.hf_model`, `checkpoint.path`) is a
local folder or a Hub id resolved offline from the local Hugging Face cache
(`qwen3exp.plan.model_ref`). Three sources are then named, each from one reference:
- config: the architecture (flavor=auto and model=hf read config.json);
- tokenizer: `model.hf_assets_path`; for model=hf without it, `model.hf_model`'s own folder (the
  model's tokenizer, never the bundled one); the bundled vocab-2048 tokenizer only when no model
  folder is named at all;
- weights: `checkpoint.path`, else the tokenizer's folder (hf_load, hf_roundtrip).
`check()` resolves the architecture, checks an explicit flavor against config.json key by key
(Qwen3-4B-Instruct-2507's rope_theta 5e6 against the 4B flavor's 1e6 is an error, not something to
train through), the tokenizer's vocabulary against the model's (a tokenizer other than the model's
own, or ids without an embedding, is an error), and, when weights are loaded, every safetensors
file's header (readable, not truncated), every tensor the model needs (present, right shape, a
floating-point dtype, no NaN or Inf in its values: `nonfinite_tensors`, within a byte budget). A
folder whose config.json asks for remote code (`auto_map`) is refused: qwen3exp never runs code
shipped in a model folder. Each mistake is one `Problem` naming the key; all of them are reported
together. Cheap: JSON, safetensors headers and a bounded numpy scan of the raw bytes (no torch, no
transformers, no torchtitan; huggingface_hub only for a Hub id).
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
from qwen3exp.config.schema import (
    DcpCheckpoint,
    Experiment,
    HFExport,
    HFLoad,
    HFModel,
    HFRoundtrip,
    Kernels,
    NativeModel,
    NoCheckpoint,
    Parallelism,
    Training,
    arch_problems,
)
from qwen3exp.errors import ConfigError, Problem, nearby_path
from qwen3exp.plan import model_ref
from qwen3exp.plan.model_ref import ModelRef
from qwen3exp.units import GIB, MIB

CONFIG_JSON = "config.json"
INDEX_JSON = "model.safetensors.index.json"
TOKENIZER_PATTERNS = ("tokenizer*", "vocab.json", "merges.txt", "special_tokens_map.json", "chat_template.jinja")
"""The files of a tokenizer (for the `hf download --include` hint)."""
MAX_LISTED = 5
"""Missing or mis-shaped tensors listed one by one before the rest are counted."""
BUNDLED = "the tokenizer bundled with qwen3exp"


@dataclass(frozen=True)
class ModelSections:
    """What the model-file checks read of an experiment: `check` takes this (or the Experiment,
    which has them all). When the experiment as a whole is invalid the command line still runs these
    checks on the sections that validated on their own, so that a mistake elsewhere does not hide a
    wrong model folder: `training` and `kernels` may then be None, and the rules that read them are
    skipped (a bad seq_len or kernel choice is reported by its own section's validation)."""

    model: NativeModel | HFModel
    checkpoint: NoCheckpoint | DcpCheckpoint | HFLoad | HFExport | HFRoundtrip
    parallelism: Parallelism
    training: Training | None = None
    kernels: Kernels | None = None


Sections = Experiment | ModelSections
"""What every function here reads: an Experiment, or the model sections of an invalid one."""


@dataclass(frozen=True)
class Refs:
    """The experiment's model references, resolved (None: the key is not set)."""
    assets: ModelRef | None
    hf_model: ModelRef | None
    checkpoint: ModelRef | None
    problems: tuple[Problem, ...] = ()

    def all(self) -> list[ModelRef]:
        return [r for r in (self.assets, self.hf_model, self.checkpoint) if r is not None]

    def tokenizer(self, exp: Sections) -> ModelRef | None:
        """Where the tokenizer comes from: hf_assets_path, else (model=hf) hf_model, else None (bundled)."""
        if self.assets is not None:
            return self.assets
        return self.hf_model if exp.model.backend == "hf" else None

    def config(self, exp: Sections) -> ModelRef | None:
        """Where config.json comes from (model=hf: hf_model, else hf_assets_path); None: bundled."""
        if exp.model.backend == "hf" and self.hf_model is not None:
            return self.hf_model
        return self.assets

    def weights(self, exp: Sections) -> ModelRef | None:
        """Where the step-0 safetensors come from (checkpoint.path, else the tokenizer's reference)."""
        if not exp.checkpoint.loads_weights:
            return None
        return self.checkpoint if self.checkpoint is not None else self.tokenizer(exp)


def refs(exp: Sections) -> Refs:
    """Resolve every model reference of the experiment (offline); problems name the key."""
    m, c = exp.model, exp.checkpoint
    problems: list[Problem] = []
    out: dict[str, ModelRef | None] = {"assets": None, "hf_model": None, "checkpoint": None}
    given = [("assets", "model.hf_assets_path", m.hf_assets_path, m.revision, "model.revision")]
    if m.backend == "hf":
        given.append(("hf_model", "model.hf_model", m.hf_model, m.revision, "model.revision"))
    if isinstance(c, HFLoad | HFRoundtrip):
        given.append(("checkpoint", "checkpoint.path", c.path, c.revision, "checkpoint.revision"))
    for slot, key, value, revision, revision_key in given:
        if value is None:
            continue
        ref, ps = model_ref.resolve(key, value, revision=revision, revision_key=revision_key)
        out[slot] = ref
        problems += ps
    named = [v for _, _, v, _, _ in given if v is not None]
    if m.revision is not None and not any(model_ref.split(v) and not Path(v).expanduser().exists()
                                          for v in named[:2 if m.backend == "hf" else 1]):
        if not any(p.key == "model.revision" for p in problems):
            problems.append(Problem("model.revision", m.revision, "applies to a Hub id in model.hf_assets_path"
                                    + (" or model.hf_model" if m.backend == "hf" else "") + ", and none is given",
                                    "null, or a Hub id in the model reference"))
    return Refs(out["assets"], out["hf_model"], out["checkpoint"], tuple(problems))


def _folder(ref: ModelRef | None) -> Path:
    """The resolved folder of a reference; the bundled folder for None. Raises ConfigError when it
    does not resolve (`check` has refused that before launch, with the same problem)."""
    if ref is None:
        return TOKENIZER_DIR
    if ref.folder is None:
        _, problems = model_ref.resolve(ref.key, ref.value, revision=ref.revision)
        raise ConfigError(problems or [Problem(ref.key, ref.value, "does not resolve")])
    return ref.folder


@dataclass(frozen=True)
class ModelFiles:
    arch: Arch
    """The architecture that is trained (the experiment's reductions applied)."""
    source: str
    """Where the architecture came from: 'flavor tiny' or 'config.json of /path'."""
    folder: Path
    """The tokenizer's folder (model.hf_assets_path, model=hf's hf_model, or the bundled folder):
    also torchtitan's hf_assets_path and what the export copies its tokenizer files from."""
    weights: Path | None
    """Folder whose safetensors are loaded at step 0 (checkpoint hf_load / hf_roundtrip)."""
    config_folder: Path | None = None
    """The folder whose config.json describes the model (None: an explicit flavor, no config.json)."""
    tokenizer_vocab: int | None = None
    """1 + the largest token id the tokenizer produces."""
    refs: tuple[ModelRef, ...] = ()
    """Every model reference the experiment names, resolved (Hub ids: snapshot and commit)."""
    config_ref: ModelRef | None = None
    """The reference config.json comes from (None: bundled, or an explicit flavor)."""
    tokenizer_ref: ModelRef | None = None
    """The reference the tokenizer comes from (None: bundled)."""
    weights_ref: ModelRef | None = None
    """The reference the weights come from (None: random initialisation)."""

    def sources(self) -> dict:
        """Where config, tokenizer and weights each come from (plan.json, provenance.json)."""
        def entry(folder: Path | None, ref: ModelRef | None, what: str) -> dict | None:
            if folder is None:
                return None
            out: dict = {"folder": str(folder), "what": what}
            if ref is not None:
                out.update({k: v for k, v in ref.as_json().items() if k != "folder"})
            return out

        return {
            "config": entry(self.config_folder, self.config_ref, CONFIG_JSON) or {"folder": None, "what": self.source},
            "tokenizer": entry(self.folder, self.tokenizer_ref,
                               f"{self.tokenizer_vocab} tokens" + ("" if self.tokenizer_ref else f", {BUNDLED}")),
            "weights": entry(self.weights, self.weights_ref, "safetensors loaded at step 0")
            or {"folder": None, "what": "random initialisation"},
        }


def assets_folder(exp: Experiment) -> Path:
    """The tokenizer's folder (torchtitan's hf_assets_path): see `Refs.tokenizer`."""
    return _folder(refs(exp).tokenizer(exp))


def checkpoint_path(exp: Experiment) -> str | None:
    """checkpoint.path of the kinds that load a Hugging Face folder (hf_load, hf_roundtrip; None: the
    model's own folder), None for the others."""
    c = exp.checkpoint
    return c.path if isinstance(c, HFLoad | HFRoundtrip) else None


def weights_folder(exp: Experiment) -> Path | None:
    """The folder loaded at step 0, or None when training starts from random weights."""
    if not exp.checkpoint.loads_weights:
        return None
    return _folder(refs(exp).weights(exp))


def hf_model_folder(exp: Experiment) -> tuple[str, Path | None]:
    """model=hf: (what AutoConfig is given: the resolved folder, the folder holding its config.json
    or None when the reference does not resolve)."""
    r = refs(exp)
    ref = r.config(exp)
    if ref is None:
        return str(TOKENIZER_DIR), TOKENIZER_DIR
    return (str(ref.folder) if ref.folder is not None else ref.value), ref.folder


def resolve_arch(exp: Experiment) -> Arch:
    """The trained architecture, without the checks (ranks rebuild it after `check` passed)."""
    m = exp.model
    known = m.arch()  # a native flavor other than auto: no file to read
    if known is not None:
        return known
    folder = _folder(refs(exp).config(exp))
    arch = arch_from_hf_config(read_hf_config(folder), backend=m.backend)
    if m.backend == "native":
        arch = arch.reduced(n_layers=m.n_layers, num_experts=m.num_experts, top_k=m.top_k)
    return arch


def check(exp: Sections) -> ModelFiles:
    """Resolve and check the model's files; raise ConfigError naming every problem."""
    r = refs(exp)
    problems: list[Problem] = list(r.problems)
    tok_ref, cfg_ref = r.tokenizer(exp), r.config(exp)
    if (tok_ref is not None and tok_ref.folder is None) or (cfg_ref is not None and cfg_ref.folder is None):
        raise ConfigError(problems)  # nothing to read without the model's folder
    folder = _folder(tok_ref)
    if not folder.is_dir():
        key, value = (tok_ref.key, tok_ref.value) if tok_ref else ("model.hf_assets_path", str(folder))
        raise ConfigError(problems + [Problem(key, value, "is a file, not a folder",
                                              "a local folder with tokenizer files (and config.json, safetensors)",
                                              nearby_path(folder))])
    problems += remote_code_problems(exp, r)
    arch, source = _resolve_arch(exp, r, problems)
    if arch is None:
        raise ConfigError(problems)
    if exp.model.backend == "native" and exp.model.flavor != "auto":
        base = FLAVORS[exp.model.flavor]
    else:
        base = arch
        problems += arch_problems(exp.model, exp.training, exp.parallelism, exp.kernels, base, source)
    m = exp.model
    if m.backend == "native":
        arch = base.reduced(n_layers=m.n_layers, num_experts=m.num_experts, top_k=m.top_k)
    problems += _hf_moe_problems(exp, arch)
    w_ref = r.weights(exp)
    weights = None
    if exp.checkpoint.loads_weights and (w_ref is None or w_ref.folder is not None):
        weights = _folder(w_ref)
    vocab, tok_problems = _tokenizer_problems(exp, r, folder, arch, weights)
    problems += tok_problems
    if weights is not None:
        wkey = w_ref.key if w_ref is not None else "model.hf_assets_path"
        problems += _weights_problems(wkey, weights, arch, exact=(arch == base), ref=w_ref)
    if problems:
        raise ConfigError(problems)
    cfg_folder = None if (m.backend == "native" and m.flavor != "auto") else _folder(cfg_ref)
    return ModelFiles(arch=arch, source=source, folder=folder, weights=weights, config_folder=cfg_folder,
                      tokenizer_vocab=vocab, refs=tuple(r.all()), config_ref=cfg_ref if cfg_folder else None,
                      tokenizer_ref=tok_ref, weights_ref=w_ref)


def _hf_moe_problems(exp: Sections, arch: Arch) -> list[Problem]:
    """model=hf trains transformers' own MoE block (torchtitan 0.3.0 never swaps its MoE in, see
    qwen3exp/titan/hf_model.py), which has no tensor- or expert-parallel plan."""
    p = exp.parallelism
    if exp.model.backend != "hf" or arch.moe is None:
        return []
    return [Problem(f"parallelism.{k}", v, "model=hf trains transformers' own MoE block (torchtitan 0.3.0's "
                    "Transformers backend never swaps its own MoE in), which has no tensor- or expert-parallel "
                    "plan", "1 for a Qwen3-MoE with model=hf", "FSDP (parallelism.dp_shard) works; for tp or ep use "
                    "the native backend (model=native model.flavor=auto)")
            for k, v in (("tp", p.tp), ("ep", p.ep)) if v > 1]


def _fetch_hint(ref: ModelRef | None, *patterns: str) -> str | None:
    cmd = ref.fetch_command(*patterns) if ref is not None else None
    return f"fetch it into the Hugging Face cache: {cmd}" if cmd else None


def _read_config(key: str, value: str, folder: Path, problems: list[Problem],
                 ref: ModelRef | None = None) -> dict | None:
    path = folder / CONFIG_JSON
    if not path.is_file():
        problems.append(Problem(key, value, f"holds no {CONFIG_JSON}" + (f" ({folder})" if ref and ref.is_hub else ""),
                                f"a folder with a Qwen3 {CONFIG_JSON}", _fetch_hint(ref, CONFIG_JSON)))
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


def remote_code_problems(exp: Sections, r: Refs | None = None) -> list[Problem]:
    """Every model folder the experiment reads (model.hf_assets_path, model.hf_model,
    checkpoint.path) whose config.json has an `auto_map`: the entry through which transformers
    imports and runs Python files shipped in the folder (trust_remote_code). qwen3exp reads model
    folders as data only, so such a folder is refused before anything starts."""
    r = r if r is not None else refs(exp)
    folders: list[tuple[str, str, Path | None]] = [
        ("model.hf_assets_path", str(TOKENIZER_DIR), TOKENIZER_DIR) if r.assets is None else
        (r.assets.key, r.assets.value, r.assets.folder)]
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
            problems.append(Problem(
                key, value, f"{path} has auto_map = {json.dumps(auto_map)[:200]}, which asks transformers to "
                "import and run Python files shipped in the model folder (trust_remote_code); qwen3exp never "
                "executes code that ships in a model folder",
                f"a model folder whose {CONFIG_JSON} has no auto_map (a model_type transformers ships, e.g. qwen3)",
                "for a plain Qwen3 checkpoint, delete the auto_map entry from config.json"))
    return problems


def _resolve_arch(exp: Sections, r: Refs, problems: list[Problem]) -> tuple[Arch | None, str]:
    m = exp.model
    cfg_ref = r.config(exp)
    folder = _folder(cfg_ref)
    key, value = (cfg_ref.key, cfg_ref.value) if cfg_ref is not None else ("model.hf_assets_path", str(folder))
    described = cfg_ref.describe() if cfg_ref is not None else str(folder)
    source = f"{CONFIG_JSON} of {described}"
    if m.backend == "hf" or m.flavor == "auto":
        cfg = _read_config(key, value, folder, problems, cfg_ref)
        arch = _arch_of(key, value, cfg, problems, m.backend) if cfg is not None else None
        return arch, source
    flavor = FLAVORS[m.flavor]
    if m.hf_assets_path is not None and (folder / CONFIG_JSON).is_file():
        # An explicit flavor next to a checkpoint's config.json: both must describe one model.
        cfg = _read_config(key, value, folder, problems, cfg_ref)
        arch = _arch_of(key, value, cfg, problems, "native") if cfg is not None else None
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
        decoder = json.loads(cfg.read_text()).get("added_tokens_decoder") or {}
        if not isinstance(decoder, dict):  # transformers reads it as {id: token}
            raise TypeError(f"{cfg.name}'s added_tokens_decoder is a JSON {type(decoder).__name__}, not an object")
        ids += [int(i) for i in decoder]
    return max(ids) + 1 if ids else 0


def _tokenizer_problems(exp: Sections, r: Refs, folder: Path, arch: Arch,
                        weights: Path | None) -> tuple[int | None, list[Problem]]:
    """(the tokenizer's vocabulary, problems): the tokenizer exists, its ids fit the model's
    embedding, and it is the model's own: a tokenizer from another folder than the model's config or
    weights must have the same vocabulary as the tokenizer that ships with them, and the bundled
    tokenizer is never used silently for loaded weights of another vocabulary."""
    ref = r.tokenizer(exp)
    key, value = (ref.key, ref.value) if ref is not None else ("model.hf_assets_path", str(folder))
    try:
        n = tokenizer_vocab_size(folder)
    except (OSError, json.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError) as e:
        return None, [Problem(key, value, f"tokenizer files are unreadable ({e})")]
    if n is None:
        return None, [Problem(key, value, "holds no tokenizer" + (f" ({folder})" if ref and ref.is_hub else ""),
                              "a folder with tokenizer.json, or vocab.json + merges.txt",
                              _fetch_hint(ref, *TOKENIZER_PATTERNS))]
    if n > arch.vocab_size:
        return n, [Problem(key, value, f"the tokenizer produces token ids up to {n - 1} but the model's "
                           f"vocab_size is {arch.vocab_size}: ids >= {arch.vocab_size} have no embedding",
                           f"a tokenizer with at most {arch.vocab_size} tokens, or a model with vocab_size >= {n}")]
    problems = []
    # The model's own tokenizer: the one next to its config.json and next to its weights.
    owners = [(o.key, o.value, o.folder) for o in (r.config(exp), r.weights(exp))
              if o is not None and o.folder is not None and o.folder != folder]
    for okey, ovalue, ofolder in dict.fromkeys(owners):
        try:
            own = tokenizer_vocab_size(ofolder)
        except (OSError, json.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError):
            continue
        if own is not None and own != n:
            where = "the bundled tokenizer" if ref is None else f"the tokenizer of {key} = {value!r}"
            problems.append(Problem(
                key, value if ref is not None else None,
                f"{where} has {n} tokens, but the model of {okey} = {ovalue!r} ships its own tokenizer with "
                f"{own} tokens: training would read text with another model's token ids",
                f"the model's own tokenizer ({okey}'s folder, or a copy of it)",
                f"leave {key} unset to use the tokenizer of {okey}" if ref is None or exp.model.backend == "hf"
                else f"set {key} to the folder (or Hub id) of {okey}"))
    if ref is None and weights is not None and not problems and n != arch.vocab_size:
        problems.append(Problem(
            key, None, f"no tokenizer is named: {BUNDLED} has {n} tokens, but the loaded weights of "
            f"{weights} have a vocabulary of {arch.vocab_size}",
            "the model's own tokenizer", "set model.hf_assets_path to the model's folder or Hub id"))
    return n, problems


def safetensors_files(folder: Path) -> tuple[list[Path], list[str]]:
    """(files, problems): the files the index names (all of them must exist), else every *.safetensors."""
    index = folder / INDEX_JSON
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            return [], [f"{index} is unreadable ({type(e).__name__}: {e})"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            return [], [f"{INDEX_JSON}'s weight_map is not an object of tensor name -> file name"]
        names = sorted(set(weight_map.values()))
        # A file name is one entry of the folder: "../x" or "/etc/x" would read outside the model.
        if outside := [n for n in names if Path(n).name != n or n in ("", ".", "..")]:
            return [], [f"{INDEX_JSON} names {outside[0]!r}, which is not a file of the model's folder"]
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


def _weights_problems(key: str, folder: Path, arch: Arch, *, exact: bool, ref: ModelRef | None = None) -> list[Problem]:
    if not folder.is_dir():
        return [Problem(key, str(folder), "folder does not exist", "a folder with *.safetensors")]
    files, msgs = safetensors_files(folder)
    if not files and not msgs:
        return [Problem(key, ref.value if ref else str(folder), "holds no *.safetensors to load"
                        + (f" ({folder})" if ref and ref.is_hub else ""), "a folder with *.safetensors",
                        _fetch_hint(ref, "*.safetensors", INDEX_JSON))]
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
