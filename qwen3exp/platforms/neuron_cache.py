"""The Neuron compile cache: one folder per compiled graph, shared by every run and sweep job.

NOT RUN ON HARDWARE (see `qwen3exp.platforms.neuron`): written against TorchNeuron's documented cache
variable and the layout its source shows, covered by contract tests (tests/test_neuron_cache.py).

Why: the first step compiles every graph (minutes for a 4B model) and TorchNeuron keeps each NEFF in
its persistent cache, TORCH_NEURONX_NEFF_CACHE_DIR (the project's Trainium notes). A cache inside
the run directory starts empty for every run and every sweep job, so each one compiled again.

Where a run's NEFFs go (`platform_env`, then `for_graph` once the plan knows the graph):
1. `platform.compile_cache_dir=PATH`: that folder exactly, not keyed (a folder you already filled,
   or one shared on purpose); `platform.compile_cache_dir=run`: neuron_cache/ in the run directory
   (the old behaviour: nothing shared, every run compiles).
2. Otherwise `<root>/<key>`: root = $QWEN3EXP_NEURON_CACHE, else the TORCH_NEURONX_NEFF_CACHE_DIR of
   the launching shell (Neuron's own variable: where you said NEFFs live), else
   $XDG_CACHE_HOME/qwen3exp/neuron-compile (~/.cache/...). Neuron's documented precedence is the same
   shape: an explicit setting wins over the environment variable, which wins over the default.
   The key (`graph_key`) holds what changes the compiled graph (GRAPH_FIELDS: every schema key is
   classified there, in PLANNED_FIELDS or in INPUT_FIELDS, and a test keeps it so); the folder is named by a short hash
   of its canonical JSON and a launch writes key.json there saying what the hash stands for.

Sharing is what Neuron's cache is built for (torch-neuronx's CompilationCache and
PersistentCacheBackend, native stack; to be added to the notes): each NEFF is stored under a hash
of its graph (`<dir>/ab/cd/<hash>.neff`) by writing a temporary file and renaming it, safe for
processes and nodes sharing the folder (NFS included), and a compile first takes a file lock
(TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR/locks, local disk, default /tmp/local_cache) and looks again,
so concurrent sweep jobs on one node compile a graph once. The cache is content-addressed, so a
folder never serves a wrong graph; the key only decides which runs share a folder and lets the
plan say whether this graph compiled before. qwen3exp never deletes or rewrites a cache entry: it
creates the key folder (exist_ok) and a key.json that does not exist yet, nothing else.
Not `--cache_dir` in NEURON_CC_FLAGS (nor NEURON_COMPILE_CACHE_URL): those belong to the torch-xla
stack's compiler wrapper, neuron_cc_wrapper, which strips them before neuronx-cc runs. TorchNeuron
calls neuronx-cc without that wrapper and its users pass compiler options in NEURON_CC_FLAGS, so an
unknown `--cache_dir` there could fail every compile (not checked on hardware).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path

from qwen3exp.config.sections.platform import NeuronPlatform
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.platforms.variant import PlatformFacts

CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
"""TorchNeuron's persistent NEFF cache folder (the ranks read it)."""
KEY_ENV = "QWEN3EXP_NEURON_CACHE_KEY"
"""The key's hash, set for the ranks beside the folder: the run records which key it used."""
ROOT_ENV = "QWEN3EXP_NEURON_CACHE"
"""The root of the shared cache, when set in the launching shell."""
CC_FLAGS_ENV = "NEURON_CC_FLAGS"
PER_RUN = "run"
"""`platform.compile_cache_dir=run`: the run directory's own cache."""
RUN_DIR_CACHE = "neuron_cache"
KEY_FILE = "key.json"
KEY_VERSION = 4
"""Part of every key: a change of what the key holds starts new folders instead of mixing meanings."""
HASH_CHARS = 12
PACKAGES = ("torch-neuronx", "neuronx-cc")
"""The compiler and the framework whose versions change the NEFFs (read from installed metadata,
without importing them: the launcher never imports torch)."""


def root(environ) -> Path:
    """The shared cache's root (see the module docstring for the order)."""
    for name in (ROOT_ENV, CACHE_ENV):
        if environ.get(name):
            return Path(environ[name]).expanduser().absolute()
    base = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base.absolute() / "qwen3exp" / "neuron-compile"


def platform_env(cfg: NeuronPlatform, environ) -> tuple[dict[str, str], dict[str, str]]:
    """(env, run_dir_env) of the platform alone: the explicit folder, the run's own, or the shared
    root, which `for_graph` turns into the graph's folder."""
    if cfg.compile_cache_dir == PER_RUN:
        return {}, {CACHE_ENV: RUN_DIR_CACHE}
    if cfg.compile_cache_dir is not None:
        return {CACHE_ENV: os.path.abspath(os.path.expanduser(cfg.compile_cache_dir))}, {}
    return {CACHE_ENV: str(root(environ))}, {}


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


GRAPH_FIELDS: dict[str, frozenset[str]] = {
    "model": frozenset({"backend", "attention"}),  # attention `auto`: the platform's kernel
    "training": frozenset(
        {"seq_len", "dtype", "mixed_precision_param", "activation_checkpoint", "compile", "deterministic"}
        | {"weight_decay", "max_norm"}  # the optimizer's constants (the XLA cache's documentation)
    ),
    "kernels": frozenset({"rope", "moe", "overrides"}),  # only while an override is applied
    "peft": frozenset({"kind", "rank", "alpha", "dropout", "targets"}),
    "validation": frozenset({"enable"}),  # a forward-only graph besides the training step
    # the loss, its constants, a reference pass
    "objective": frozenset({"kind", "beta", "gamma", "reference", "reference_logps"}),
}
"""Every schema key that changes a compiled graph and enters the key as its value. Every other key
is in PLANNED_FIELDS or INPUT_FIELDS: tests/test_neuron_cache.py fails for a key in none of them,
so a new key is placed here (or declared an input) when it is added."""
PLANNED_FIELDS: dict[str, frozenset[str]] = {
    "model": frozenset({"flavor", "n_layers", "num_experts", "top_k", "hf_model"}),  # -> the architecture
    "training": frozenset({"local_batch_size"}),  # -> the resolved local batch (`auto`)
    "parallelism": frozenset({"dp_replicate", "dp_shard", "tp", "pp", "cp", "ep"}),  # -> the mesh degrees
    "launcher": frozenset({"nnodes", "nproc_per_node"}),  # -> the mesh degrees
    "platform": frozenset({"lnc", "instance_type", "runtime_env"}),  # -> LNC, device, NEURON_CC_FLAGS
    # -> a dense mask or is_causal (`causal_attention`; a mixture's: all of its sources')
    "data": frozenset({"pack", "cross_document_attention", "sources"}),
}
"""Keys in the key through what the plan resolved them to: the architecture, the local batch, the
mesh and the compiler's facts."""
INPUT_FIELDS: dict[str, frozenset[str]] = {
    "": frozenset({"name", "dry_run", "verbose"}),
    "model": frozenset({"hf_assets_path", "revision"}),  # where tokenizer and weights come from
    "training": frozenset(
        {"steps", "global_batch_size", "lr", "warmup_steps", "decay_type", "min_lr_factor", "seed"}
    ),  # lr and the schedule change every step; accumulation repeats the same step graph
    "checkpoint": frozenset(
        {"load", "path", "revision", "save", "interval", "keep_latest_k", "export", "export_interval"}
        | {"dtype", "max_shard_mb", "merge_lora"}
    ),  # weights are inputs; saving and exporting run outside the compiled step
    "platform": frozenset(
        {"name", "ranks_per_node", "threads_per_rank", "memory_per_rank_gib", "gpus_per_node"}
        | {"memory_per_gpu_gib", "assumed_gpus_per_node", "assumed_memory_gib", "cores_per_node"}
        | {"hbm_per_core_gib", "compile_cache_dir"}
    ),
    "kernels": frozenset({"name"}),
    "data": frozenset(
        {"source", "eos", "path", "text_field", "name", "files", "split", "subset", "streaming"}
        | {"messages_field", "loss_on", "max_len_policy"}
    ),  # batches of seq_len tokens whatever their source; labels and positions are inputs
    "eval": frozenset(
        {"kind", "samples", "sample_tokens", "sample_temperature", "sample_seed", "tasks", "num_fewshot"}
        | {"limit", "include_path", "batch_size"}
    ),  # after training, outside the training graphs
    "launcher": frozenset(
        {"kind", "node_rank", "rdzv_endpoint", "max_restarts", "stop_timeout_s", "rdzv_timeout_s"}
        | {"cpus_per_node", "mem_gb", "gpus_per_node", "partition", "account", "time_limit_min"}
        | {"additional_parameters", "setup", "array_parallelism", "srun", "signal_delay_s", "requeue"}
        | {"max_requeues"}
    ),
    "metrics": frozenset({"log_freq", "tensorboard", "wandb", "wandb_project"}),
    "validation": frozenset({"freq", "steps", "fraction", "path"}),
    "sweep": frozenset({"objective", "direction", "parallel_jobs", "strict_parallel_jobs"}),
}
"""Keys that change no compiled graph (data, weights, schedules, where and when)."""


def _chosen(section, names: frozenset[str]) -> dict:
    """The GRAPH_FIELDS of one section (the ones its variant has), as JSON data."""
    return section.model_dump(mode="json", include={n for n in names if n in type(section).model_fields})


def graph_key(exp, arch, mesh, batches, facts: PlatformFacts, environ) -> dict:
    """What changes the graphs a rank compiles, as plain data: GRAPH_FIELDS as they are (attention
    `auto` resolved by the platform), and what the plan resolved PLANNED_FIELDS to: the architecture,
    the local batch, the mesh degrees and the compiler (LNC, the chip, NEURON_CC_FLAGS and the
    versions of neuronx-cc and torch-neuronx). Not the data, seed, steps or weights: they are inputs."""
    flags = facts.env.get(CC_FLAGS_ENV, environ.get(CC_FLAGS_ENV, ""))
    model = _chosen(exp.model, GRAPH_FIELDS["model"])
    if model["attention"] == "auto":
        model["attention"] = facts.attention
    model["causal_attention"] = exp.data.causal_attention  # SDPA's is_causal, or a dense document mask
    return {
        "key_version": KEY_VERSION,
        "model": model | asdict(arch),
        "training": _chosen(exp.training, GRAPH_FIELDS["training"]) | {"local_batch_size": batches.local_batch_size},
        "mesh": asdict(mesh.degrees),
        "kernels": _chosen(exp.kernels, GRAPH_FIELDS["kernels"]) if exp.kernels.active else None,
        "peft": _chosen(exp.peft, GRAPH_FIELDS["peft"]),
        "validation": _chosen(exp.validation, GRAPH_FIELDS["validation"]),
        "objective": _chosen(exp.objective, GRAPH_FIELDS["objective"]),
        "compiler": {"lnc": facts.lnc, "device": facts.device_name, CC_FLAGS_ENV: " ".join(flags.split())}
        | _versions(),
    }


def key_hash(key: dict) -> str:
    """A short stable hash of the key's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def for_graph(facts: PlatformFacts, exp, arch, mesh, batches, environ=None) -> PlatformFacts:
    """The facts with the graph's own cache folder (`<root>/<hash>`) when the cache is the shared
    default; unchanged otherwise (another platform, an explicit folder, `run`). A launch (not a dry
    run) also creates the folder and its key.json (`claim`)."""
    environ = os.environ if environ is None else environ
    if CACHE_ENV not in facts.env or KEY_ENV in facts.env or _explicit(exp):
        return facts
    key = graph_key(exp, arch, mesh, batches, facts, environ)
    digest = key_hash(key)
    folder = Path(facts.env[CACHE_ENV]) / digest
    if not exp.dry_run:
        claim(folder, digest, key)
    return replace(facts, env={**facts.env, CACHE_ENV: str(folder), KEY_ENV: digest})


def _explicit(exp) -> bool:
    """Whether platform.compile_cache_dir names the folder (platform=auto takes the defaults)."""
    return isinstance(exp.platform, NeuronPlatform) and exp.platform.compile_cache_dir is not None


def claim(folder: Path, digest: str, key: dict) -> None:
    """Create the key folder (exist_ok) and its key.json unless one exists (another run wrote it:
    left as it is). Neuron fills the folder; nothing here deletes or rewrites what is there."""
    text = json.dumps({"hash": digest, "key": key, "what": _WHAT}, indent=2, sort_keys=True) + "\n"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / KEY_FILE, "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        pass
    except OSError as e:
        raise ConfigError(
            [
                Problem(
                    "platform.compile_cache_dir",
                    None,
                    f"the shared Neuron compile cache folder {folder} cannot be created ({e.strerror or e})",
                    "null (the shared cache), a writable folder, or run",
                    f"set {ROOT_ENV} to a writable folder, or platform.compile_cache_dir",
                )
            ]
        ) from e


_WHAT = (
    "qwen3exp's Neuron compile cache for one graph: TorchNeuron keeps its NEFFs here "
    f"(TORCH_NEURONX_NEFF_CACHE_DIR). The folder's name is the first {HASH_CHARS} hex digits of the SHA-256 of "
    "`key` as canonical JSON; runs and sweep jobs with the same key share it."
)


def compiled(folder: Path) -> bool:
    """Whether Neuron has stored a compiled graph (a non-empty .neff) in `folder`: TorchNeuron's
    layout `<folder>/ab/cd/<hash>.neff`, or the torch-xla stack's
    `<folder>/neuronxcc-<version>/MODULE_<hash>/model.neff`. Two levels down at most, stopping at
    the first one found: a cheap check a sweep's dry run makes for every point."""
    return _neff_below(folder, depth=2)


def _neff_below(folder: Path, depth: int) -> bool:
    try:
        entries = list(os.scandir(folder))
    except OSError:  # absent or unreadable: nothing compiled there that this user can reuse
        return False
    for e in entries:
        if e.name.endswith(".neff") and e.is_file() and e.stat().st_size > 0:
            return True
    return depth > 0 and any(e.is_dir(follow_symlinks=False) and _neff_below(Path(e.path), depth - 1) for e in entries)


def plan_lines(plan) -> list[str]:
    """The plan's line about the compile cache: whether this job's graph is already there."""
    f = plan.platform
    if CACHE_ENV in f.run_dir_env:
        return [
            f"compile:    will compile into {plan.run_dir}/{f.run_dir_env[CACHE_ENV]} "
            f"(platform.compile_cache_dir={PER_RUN}: this run's own cache, shared with no other run)"
        ]
    folder = f.env.get(CACHE_ENV)
    if folder is None:
        return []
    digest, done = f.env.get(KEY_ENV), compiled(Path(folder))
    if digest is None:  # one folder for every graph: platform.compile_cache_dir (or a plan made without the key)
        why = "platform.compile_cache_dir, not keyed by graph" if _explicit(plan.exp) else "not keyed by graph"
        if done:
            return [
                f"compile:    cached: {folder} holds compiled graphs ({why}: Neuron reuses this one's if it is there)"
            ]
        return [f"compile:    will compile into {folder} ({why})"]
    if done:
        return [f"compile:    cached: {folder} (key {digest}: a run of this graph compiled there before)"]
    return [
        f"compile:    will compile into {folder} (key {digest}, shared by every run and sweep job of this "
        f"graph; from the first launch on, {KEY_FILE} there says what the key stands for)"
    ]
