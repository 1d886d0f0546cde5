"""Every mistake is caught before launch: a table of bad inputs, each run through the real command
line (`python -m qwen3exp ...`, no dry run) and each required to exit with code 2, name the YAML key
and what is allowed (and where it helps, the file the value came from and the nearest valid value),
print no traceback, start no worker, and leave no directory that looks like a run.

The table runs in-process: `qwen3exp.cli.main(argv)`, the function `python -m qwen3exp` runs, is
called once per row inside a few helper processes (module fixture; each holds its rows, one after
the other, with the file descriptors 1 and 2 of every call captured, and the cwd, environment and
Hydra's global state of a fresh command restored between rows), instead of one interpreter start
per row. A few representative rows (`END_TO_END`) also run as real `python -m qwen3exp`
subprocesses, so that the module entry point, its exit code and "no traceback on stderr" stay
covered end to end. Each row is still its own test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import CONF, REPO, run_cli

TOKENIZER = REPO / "qwen3exp" / "assets" / "tokenizer"


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    key: str
    """The YAML key the message must name (as `key = value`)."""
    allowed: str
    """Text that must appear in the message's `allowed:` line."""
    also: tuple[str, ...] = ()
    """More text the message must hold: the source file, 'did you mean ...', other keys."""
    multirun: bool = False
    absent: tuple[str, ...] = ()
    """Text the message must not hold (the rest of the command line as the value of one key)."""


CASES = [
    # sizes: zero, negative, wrong type
    Case(
        "steps_zero", ("training.steps=0",), "training.steps", "a number > 0", ("from: command line training.steps=0",)
    ),
    Case("steps_negative", ("training.steps=-5",), "training.steps", "a number > 0"),
    Case("seq_len_zero", ("training.seq_len=0",), "training.seq_len", "a number > 0"),
    Case("local_batch_negative", ("training.local_batch_size=-1",), "training.local_batch_size", "a number > 0"),
    Case("lr_zero", ("training.lr=0",), "training.lr", "a number > 0"),
    Case("lr_not_a_number", ("training.lr=fast",), "training.lr", "float"),
    Case("compile_not_bool", ("training.compile=maybe",), "training.compile", "bool"),
    Case("log_freq_zero", ("metrics.log_freq=0",), "metrics.log_freq", "a number > 0"),
    Case("nproc_zero", ("launcher.nproc_per_node=0",), "launcher.nproc_per_node", "a number > 0"),
    Case(
        "memory_negative",
        ("platform=cpu", "platform.memory_per_rank_gib=-1"),
        "platform.memory_per_rank_gib",
        "a number > 0",
    ),
    Case("global_batch_zero", ("training.global_batch_size=0",), "training.global_batch_size", "-1 or an integer > 0"),
    # unknown keys, sections, options, flavors: the nearest valid one
    Case("unknown_key", ("training.step=5",), "training.step", "steps, seq_len", ("did you mean training.steps?",)),
    Case("unknown_section", ("trainin.steps=5",), "trainin.steps", "training, metrics", ("did you mean training?",)),
    Case(
        "unknown_added_key",
        ("+training.stepz=5",),
        "training.stepz",
        "steps, seq_len",
        ("did you mean training.steps?",),
    ),
    Case("unknown_flavor", ("model.flavor=4b",), "model.flavor", "0.6B, 1.7B, 4B", ("did you mean 4B?",)),
    Case("unknown_group_option", ("model=natve",), "model", "native", ("did you mean native?",)),
    Case("unknown_platform", ("platform=gpu",), "platform", "auto, cpu"),
    Case("unknown_experiment", ("experiment=nonexistent",), "experiment", "tiny_native"),
    Case(
        "bad_choice_decay",
        ("training.decay_type=cosin",),
        "training.decay_type",
        "'linear', 'sqrt' or 'cosine'",
        ("did you mean cosine?",),
    ),
    Case("bad_choice_dtype", ("training.dtype=fp16",), "training.dtype", "'float32' or 'bfloat16'"),
    Case(
        "bad_choice_ac",
        ("training.activation_checkpoint=partial",),
        "training.activation_checkpoint",
        "'none', 'selective' or 'full'",
    ),
    Case("bad_name", ("name=bad/name",), "name", "letters, digits"),
    # world size vs degrees, heads, experts, batches, sequence length, layers
    Case(
        "tp_vs_world",
        ("parallelism.tp=3",),
        "parallelism.tp",
        "allowed: 1, 2 (the divisors of 2)",
        ("world size 2 = launcher.nnodes 1 x 2 ranks per node",),
    ),
    Case("pp_vs_world", ("parallelism.pp=3",), "parallelism.pp", "allowed: 1, 2 (the divisors of 2)"),
    Case(
        "dp_shard_vs_world",
        ("parallelism.dp_shard=4",),
        "parallelism.dp_shard",
        "-1 or 2",
        ("nearest valid value: parallelism.dp_shard=2",),
    ),
    Case(
        "tp_vs_kv_heads",
        ("launcher.nproc_per_node=4", "parallelism.tp=4"),
        "parallelism.tp",
        "allowed: 1, 2 (the divisors of 2)",
        ("n_kv_heads (2, flavor tiny)", "nearest valid value: parallelism.tp=2"),
    ),
    Case(
        "tp_vs_heads",
        ("model.flavor=0.6B", "launcher.nproc_per_node=3", "parallelism.tp=3"),
        "parallelism.tp",
        "allowed: 1, 2, 4, 8, 16 (the divisors of 16)",
        ("n_heads (16, flavor 0.6B)",),
    ),
    Case("ep_on_dense", ("parallelism.ep=2",), "parallelism.ep", "allowed: 1", ("needs an MoE model",)),
    Case(
        "global_batch_vs_dp",
        ("training.global_batch_size=20",),
        "training.global_batch_size",
        "-1 or a multiple of 16",
        ("local_batch_size x data-parallel degree = 8 x 2 = 16", "training.global_batch_size=16 or 32"),
    ),
    Case(
        "seq_len_above_max",
        ("training.seq_len=5000",),
        "training.seq_len",
        "1..4096",
        ("maximum sequence length (4096, flavor tiny)",),
    ),
    Case("warmup_above_steps", ("training.warmup_steps=50",), "training.warmup_steps", "0..30"),
    Case("n_layers_above_flavor", ("model.n_layers=10",), "model.n_layers", "1..2"),
    Case("top_k_on_dense", ("model.top_k=4",), "model.top_k", "null for dense models"),
    Case("top_k_above_experts", ("model.flavor=tiny_moe", "model.top_k=16"), "model.top_k", "1..8"),
    Case(
        "flavor_auto_without_config",
        ("model.flavor=auto", "model.hf_assets_path={tmp}/big_tokenizer"),
        "model.hf_assets_path",
        "a folder with a Qwen3 config.json",
        ("holds no config.json",),
    ),
    Case("multinode_without_rendezvous", ("launcher.nnodes=2",), "launcher.rdzv_endpoint", "host:port"),
    Case("node_rank_out_of_range", ("launcher.node_rank=3",), "launcher.node_rank", "0..0"),
    # files: missing paths, wrong kinds, tokenizer larger than the model's vocabulary
    Case(
        "assets_path_missing",
        ("model.hf_assets_path={tmp}/big_tokenizr",),
        "model.hf_assets_path",
        "a local folder, or a Hugging Face Hub id",
        ("folder does not exist", "did you mean"),
    ),
    Case(
        "assets_path_is_file",
        ("model.hf_assets_path={tmp}/corpus.csv",),
        "model.hf_assets_path",
        "a local folder with tokenizer files",
        ("is a file, not a folder",),
    ),
    Case(
        "assets_without_tokenizer",
        ("model.hf_assets_path={tmp}/empty",),
        "model.hf_assets_path",
        "a folder with tokenizer.json",
        ("holds no tokenizer",),
    ),
    Case(
        "tokenizer_vocab_above_model",
        ("model.hf_assets_path={tmp}/big_tokenizer",),
        "model.hf_assets_path",
        "a tokenizer with at most 2048 tokens",
        ("token ids up to 5000 but the model's vocab_size is 2048",),
    ),
    Case(
        "data_path_missing",
        ("data=local", "data.path={tmp}/corpus.jsonx"),
        "data.path",
        "an existing .jsonl",
        ("did you mean",),
    ),
    Case("data_path_unset", ("data=local",), "data.path", "A .jsonl file", ("from: group file conf/data/local.yaml",)),
    Case(
        "data_path_wrong_type",
        ("data=local", "data.path={tmp}/corpus.csv"),
        "data.path",
        "an existing .jsonl",
        ("unsupported file type .csv",),
    ),
    Case(
        "data_folder_empty",
        ("data=local", "data.path={tmp}/empty"),
        "data.path",
        "an existing .jsonl",
        ("holds no data file",),
    ),
    # memory: a plan that does not fit is an error unless dry_run
    Case(
        "model_does_not_fit",
        ("model.flavor=4B",),
        "model.flavor",
        "a plan needing at most",
        ("per rank (parameters", "try: training.activation_checkpoint=full"),
    ),
    Case(
        "budget_too_small",
        ("platform=cpu", "platform.memory_per_rank_gib=0.001"),
        "model.flavor",
        "a plan needing at most",
    ),
    # values that come from files name the file
    Case(
        "bad_value_in_experiment_file",
        ("--config-path", "{tmp}/conf", "experiment=bad"),
        "training.steps",
        "a number > 0",
        ("from: experiment file conf/experiment/bad.yaml",),
    ),
    # an experiment that would run a command if PyYAML constructed its tag: the file is named, the
    # command never runs (test_a_python_tag_in_an_experiment_never_runs)
    Case(
        "experiment_python_tag",
        ("--config-path", "{tmp}/conf", "experiment=evil"),
        "(config file)",
        "no !!python/... tags",
        ("conf/experiment/evil.yaml': holds the YAML tag !!python/object/apply:os.system at line 3",),
    ),
    # a value Hydra cannot parse is named by its key and its own token, not the whole command line
    Case(
        "value_shell_substitution",
        ("name=$(touch${IFS}pwned)",),
        "name",
        "in quotes: key='...'",
        ("name = '$(touch${IFS}pwned)': cannot parse",),
        absent=("hydra.run.dir",),
    ),
    Case(
        "value_of_5000_digits",
        ("training.steps=" + "9" * 5000,),
        "training.steps",
        "an integer of at most 4,300 digits",
        ("cannot parse (a value of 5,000 characters): an integer of 5,000 digits", "99...99"),
        absent=("hydra.run.dir", "9" * 100),
    ),
    # the flags that name config folders and files are blamed for what they name
    Case(
        "config_path_missing",
        ("--config-path", "{tmp}/no_such_conf", "dry_run=true"),
        "--config-path",
        "a folder of config groups",
        ("no_such_conf': folder does not exist",),
        absent=("dry_run =",),
    ),
    Case(
        "config_name_missing",
        ("--config-name", "confg", "dry_run=true"),
        "--config-name",
        "a config of that folder: config",
        ("did you mean config?",),
        absent=("dry_run =",),
    ),
    # Hydra's own answers compose first: an unknown option is refused like a launch's
    Case(
        "info_unknown_option", ("--info", "defaults", "model=natve"), "model", "hf, native", ("did you mean native?",)
    ),
    # several independent mistakes are reported together (an unknown flavor does not hide a bad tp)
    Case(
        "several_at_once",
        ("training.steps=0", "model.flavor=4b", "parallelism.tp=3", "training.decay_type=cosin"),
        "parallelism.tp",
        "allowed: 1, 2 (the divisors of 2)",
        ("4 configuration errors", "training.steps = 0", "model.flavor = '4b'", "training.decay_type = 'cosin'"),
    ),
    Case(
        "experiment_file_without_header",
        ("--config-path", "{tmp}/conf", "experiment=headless"),
        "experiment",
        "# @package _global_",
        ("conf/experiment/headless.yaml",),
    ),
    Case(
        "group_option_with_others",
        ("data=locl", "training.steps=0"),
        "data",
        "bundled, chat, hf, local",
        ("did you mean local?", "2 configuration errors", "training.steps = 0"),
    ),
    Case(
        "bad_sweep_point",
        ("-m", "training.steps=10,0"),
        "training.steps",
        "a number > 0",
        ("sweep point 2/2",),
        multirun=True,
    ),
    # data files that exist but that the loader cannot read: the file and the line are named
    Case(
        "data_file_empty",
        ("data=local", "data.path={tmp}/data/empty.jsonl"),
        "data.path",
        "UTF-8 JSON lines",
        ("empty.jsonl: the file is empty",),
    ),
    Case(
        "data_file_binary",
        ("data=local", "data.path={tmp}/data/binary.txt"),
        "data.path",
        "UTF-8 text files",
        ("binary.txt: line 2: not UTF-8 text (byte 0x80",),
    ),
    Case(
        "data_file_invalid_json",
        ("data=local", "data.path={tmp}/data/broken.jsonl"),
        "data.path",
        "one object per line",
        ("broken.jsonl: line 2: not valid JSON",),
    ),
    Case(
        "data_file_lacks_text_field",
        ("data=local", "data.path={tmp}/data/no_field.jsonl"),
        "data.text_field",
        "a key of every record",
        ("has no key 'text' (its keys: txt)", "did you mean txt?"),
    ),
    Case(
        "data_file_text_not_a_string",
        ("data=local", "data.path={tmp}/data/number.jsonl"),
        "data.path",
        '"text" a non-empty string',
        ("number.jsonl: line 2: 'text' is a JSON number, not a string",),
    ),
    Case(
        "data_file_empty_text",
        ("data=local", "data.path={tmp}/data/empty_text.jsonl"),
        "data.path",
        '"text" a non-empty string',
        ("line 1: 'text' is an empty string",),
    ),
    Case(
        "data_folder_mixes_txt_and_jsonl",
        ("data=local", "data.path={tmp}/data/mixed"),
        "data.path",
        "a folder of .txt files only",
        ("mixes .txt files (b.txt)",),
    ),
    Case(
        "data_txt_only_whitespace",
        ("data=local", "data.path={tmp}/data/blank.txt"),
        "data.path",
        "UTF-8 text files",
        ("holds only whitespace",),
    ),
    # non-finite numbers, in any section
    Case("lr_inf", ("training.lr=inf",), "training.lr", "a finite number", ("from: command line training.lr=inf",)),
    Case("lr_nan", ("training.lr=nan",), "training.lr", "a finite number"),
    Case("max_norm_inf", ("training.max_norm=inf",), "training.max_norm", "a finite number"),
    Case("min_lr_factor_nan", ("training.min_lr_factor=nan",), "training.min_lr_factor", "a finite number"),
    Case("stop_timeout_inf", ("launcher.stop_timeout_s=inf",), "launcher.stop_timeout_s", "a finite number"),
    Case(
        "memory_per_rank_nan",
        ("platform=cpu", "platform.memory_per_rank_gib=nan"),
        "platform.memory_per_rank_gib",
        "a finite number",
    ),
    # what torchtitan divides inside a rank: sequence by cp and the loss chunks, heads by kv heads
    Case(
        "cp_odd_seq_len",
        ("parallelism.cp=2", "training.seq_len=255"),
        "training.seq_len",
        "a multiple of 16",
        ("context parallelism (parallelism.cp=2)", "nearest valid values: training.seq_len=240 or 256"),
    ),
    Case(
        "seq_len_not_loss_chunks", ("training.seq_len=100",), "training.seq_len", "a multiple of 8", ("chunked loss",)
    ),
    Case(
        "heads_not_multiple_of_kv_heads",
        ("model.flavor=auto", "model.hf_assets_path={tmp}/kv3"),
        "model.hf_assets_path",
        "num_attention_heads is a multiple of num_key_value_heads",
        ("num_attention_heads (4) is not a multiple of num_key_value_heads (3)",),
    ),
    # weights behind a valid safetensors header
    Case(
        "weights_integer_dtype",
        ("checkpoint=hf_load", "model.hf_assets_path={tmp}/w_int"),
        "model.hf_assets_path",
        "safetensors whose weights are F64, F32",
        ("model.embed_tokens.weight (I32)",),
    ),
    Case(
        "weights_nan",
        ("checkpoint=hf_load", "model.hf_assets_path={tmp}/w_nan"),
        "model.hf_assets_path",
        "weights whose values are all finite",
        ("NaN or Inf values: model.layers.1.mlp.down_proj.weight",),
    ),
    # RoPE scaling the native model would silently drop; code shipped in a model folder
    Case(
        "rope_scaling_on_native",
        ("model.flavor=auto", "model.hf_assets_path={tmp}/yarn"),
        "model.hf_assets_path",
        "for model=native: no rope_scaling",
        ("RoPE scaling 'yarn'", "model=hf builds it"),
    ),
    Case(
        "rope_scaling_next_to_flavor",
        ("model.flavor=tiny", "model.hf_assets_path={tmp}/yarn"),
        "model.hf_assets_path",
        "for model=native: no rope_scaling",
        ("RoPE scaling 'yarn'",),
    ),
    Case(
        "remote_code_native",
        ("model.hf_assets_path={tmp}/remote",),
        "model.hf_assets_path",
        "has no auto_map",
        ("never executes code that ships in a model folder",),
    ),
    Case(
        "remote_code_hf",
        ("model=hf", "model.hf_assets_path={tmp}/remote"),
        "model.hf_assets_path",
        "has no auto_map",
        ("never executes code that ships in a model folder",),
    ),
    # pipeline parallelism: what torchtitan refuses inside a rank
    Case(
        "pp_with_tied_embeddings",
        ("parallelism.pp=2",),
        "parallelism.pp",
        "1 for a model with tied embeddings",
        ("use model=hf",),
    ),
    Case(
        "pp_more_stages_than_layers",
        ("model.flavor=tiny_moe", "launcher.nproc_per_node=8", "parallelism.pp=8"),
        "parallelism.pp",
        "1..4",
        ("layers + embedding + output",),
    ),
    # this host: memory for the ranks' processes, cores for their threads
    Case(
        "cpu_ranks_exceed_host_memory",
        (
            "platform=cpu",
            "launcher.nproc_per_node=700",  # within the bundled corpus's 729 documents (one per rank)
            "platform.memory_per_rank_gib=1",
            "training.local_batch_size=1",
            "validation.enable=false",  # 700 ranks would also split the bundled corpus too thin (a problem of its own)
        ),
        "launcher.nproc_per_node",
        "rank(s) on this host",
        ("per-process runtime", "MemAvailable"),
    ),
    Case(
        "cpu_threads_oversubscribed",
        ("platform=cpu", "launcher.nproc_per_node=1", "platform.threads_per_rank=1000"),
        "platform.threads_per_rank",
        "ranks x threads per rank at most",
        ("threads per core",),
    ),
    # checkpoint: load, save and export are independent keys; what does not go together is named
    Case("ckpt_dcp_load_without_path", ("checkpoint.load=dcp",), "checkpoint.path", "<run dir>/checkpoint/step-N"),
    Case(
        "ckpt_path_without_load",
        ("checkpoint.path={tmp}/empty",),
        "checkpoint.path",
        "checkpoint.load=hf|dcp",
        ("checkpoint.load=none loads nothing",),
    ),
    Case("ckpt_merge_without_export", ("checkpoint.merge_lora=true",), "checkpoint.merge_lora", "checkpoint.export="),
    Case(
        "ckpt_merge_without_lora",
        ("checkpoint=hf_export", "checkpoint.merge_lora=true"),
        "checkpoint.merge_lora",
        "peft=lora",
    ),
    Case(
        "ckpt_load_dcp_not_a_checkpoint",
        ("checkpoint.load=dcp", "checkpoint.path={tmp}/empty"),
        "checkpoint",
        "a <run dir>/checkpoint/step-N folder a qwen3exp run saved",
        ("not a dcp checkpoint (no .metadata)",),
    ),
    Case(
        "chat_fewer_held_out_than_ranks",
        ("experiment=tiny_sft", "data.path={tmp}/three_chats.jsonl"),
        "validation.fraction",
        "at least 2 held-out conversations (one per rank)",
        ("leaves 1 held-out conversation(s) for 2 data-parallel ranks",),
    ),
    Case(
        "chat_a_rank_with_nothing_that_fits",
        ("experiment=tiny_sft", "data.path={tmp}/odd_too_long.jsonl", "validation.enable=false"),
        "training.seq_len",
        "a seq_len each rank's conversations fit",
        ("leaves data-parallel rank 1 of 2 no training conversation that fits",),
    ),
    Case(
        "ckpt_export_interval_without_interval_export",
        ("checkpoint=hf_export", "checkpoint.export_interval=5"),
        "checkpoint.export_interval",
        "null",
    ),
]


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bad_inputs")
    (tmp / "empty").mkdir()
    (tmp / "corpus.csv").write_text("text\nhello\n")
    chats = (REPO / "qwen3exp" / "assets" / "chat" / "train.jsonl").read_text().splitlines()
    (tmp / "three_chats.jsonl").write_text("\n".join(chats[:3]) + "\n")
    long = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "so " * 400}]})
    (tmp / "odd_too_long.jsonl").write_text("".join(f"{c}\n{long}\n" for c in chats[:4]))
    big = tmp / "big_tokenizer"
    big.mkdir()
    tok = json.loads((TOKENIZER / "tokenizer.json").read_text())
    tok["added_tokens"].append(
        {
            "id": 5000,
            "content": "<|extra|>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    (big / "tokenizer.json").write_text(json.dumps(tok))
    shutil.copytree(CONF, tmp / "conf")
    (tmp / "conf" / "experiment" / "bad.yaml").write_text(
        "# @package _global_\nname: bad\ntraining:\n  steps: 0\n  warmup_steps: 0\n"
    )
    # an experiment file without its package header: Hydra nests its keys under `experiment.`
    (tmp / "conf" / "experiment" / "headless.yaml").write_text("name: headless\ntraining:\n  steps: 5\n")
    (tmp / "conf" / "experiment" / "evil.yaml").write_text(
        f"# @package _global_\nname: evil\nx: !!python/object/apply:os.system ['touch {tmp}/pwned']\n"
    )
    _data_files(tmp / "data")
    _model_folders(tmp)
    return tmp


def _data_files(data: Path) -> None:
    (data / "mixed").mkdir(parents=True)
    (data / "empty.jsonl").write_bytes(b"")
    (data / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (data / "broken.jsonl").write_text('{"text": "fine"}\n{"text": "cut short\n')
    (data / "no_field.jsonl").write_text('{"txt": "hello"}\n')
    (data / "number.jsonl").write_text('{"text": "fine"}\n{"text": 3}\n')
    (data / "empty_text.jsonl").write_text('{"text": ""}\n')
    (data / "blank.txt").write_text("  \n\n \n")
    (data / "mixed" / "a.jsonl").write_text('{"text": "fine"}\n')
    (data / "mixed" / "b.txt").write_text("fine\n")


def _model_folders(tmp: Path) -> None:
    """Copies of the bundled tiny model folder (config.json + tokenizer), each with one defect."""
    import numpy as np
    from safetensors.numpy import save_file

    from qwen3exp.config.flavors import FLAVORS
    from qwen3exp.config.hf_tensors import hf_param_shapes

    def folder(name: str, **config) -> Path:
        path = tmp / name
        shutil.copytree(TOKENIZER, path)
        cfg = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**cfg, **config}))
        return path

    folder("kv3", num_key_value_heads=3)
    folder("yarn", rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})
    folder("remote", auto_map={"AutoConfig": "configuration_evil.EvilConfig"})
    shapes = hf_param_shapes(FLAVORS["tiny"])
    for name, damage in (("w_int", "int"), ("w_nan", "nan")):
        tensors = {n: np.full(shape, 0.01, dtype=np.float32) for n, shape in shapes.items()}
        if damage == "int":
            tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].astype(np.int32)
        else:
            tensors["model.layers.1.mlp.down_proj.weight"][3, 7] = np.nan
        save_file(tensors, str(folder(name) / "model.safetensors"))


END_TO_END = ("steps_zero", "bad_sweep_point", "data_file_binary")
"""Rows that also run as `python -m qwen3exp` subprocesses: a value refused by qwen3exp's launcher,
a refused sweep point (multirun), a data file that the pre-launch checks read."""

WORKERS = max(1, min(4, len(os.sched_getaffinity(0))))
"""Helper processes for the in-process table (as many as this process may use cores, up to 4)."""


def _argv(case: Case, assets: Path, out: Path) -> list[str]:
    args = [a.replace("{tmp}", str(assets)) for a in case.args]
    where = f"hydra.sweep.dir={out}/sweep" if case.multirun else f"hydra.run.dir={out}/run"
    return [*args, where]


def _in_process(requests: Path, replies: Path) -> None:
    """A helper process: run each requested command line through `qwen3exp.cli.main` in this
    process, as `python -m qwen3exp` would in its own (cwd: the repository; the environment of a
    fresh command; Hydra's global state cleared), with file descriptors 1 and 2 redirected to
    files, so that whatever reaches them (print, logging, warnings, a traceback) is captured."""
    import tempfile
    import traceback

    from hydra.core.global_hydra import GlobalHydra

    from qwen3exp import cli

    env = dict(os.environ)
    out = {}
    for case_id, argv in json.loads(requests.read_text()):
        os.chdir(REPO)
        os.environ.clear()
        os.environ.update(env)
        GlobalHydra.instance().clear()
        with (
            tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as o,
            tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as e,
        ):
            _flush()
            saved = [os.dup(1), os.dup(2)]
            os.dup2(o.fileno(), 1)
            os.dup2(e.fileno(), 2)
            try:
                try:
                    code = cli.main(argv)
                except SystemExit as stop:  # as cli.entry turns it into the process's exit code
                    code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                except BaseException:  # noqa: B036 (the test shows it: a traceback on stderr)
                    traceback.print_exc()
                    code = None
                _flush()
            finally:
                for fd, copy in ((1, saved[0]), (2, saved[1])):
                    os.dup2(copy, fd)
                    os.close(copy)
            o.seek(0)
            e.seek(0)
            out[case_id] = (code, o.read(), e.read())
    replies.write_text(json.dumps(out))


def _flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def _helper(rows: list[tuple[str, list[str]]], where: Path) -> dict[str, tuple]:
    """One helper process running `rows` in-process; {case id: (exit code, stdout, stderr)}."""
    requests, replies, log = where / "requests.json", where / "replies.json", where / "helper.log"
    requests.write_text(json.dumps(rows))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env.setdefault("HF_HUB_OFFLINE", "1")  # as run_cli
    code = (
        f"import sys; from pathlib import Path; from test_bad_inputs import _in_process; "
        f"_in_process(Path({str(requests)!r}), Path({str(replies)!r}))"
    )
    with log.open("w") as f:
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=1200
        )
    assert proc.returncode == 0 and replies.is_file(), log.read_text()[-3000:]
    return {k: tuple(v) for k, v in json.loads(replies.read_text()).items()}


@pytest.fixture(scope="module")
def results(assets, tmp_path_factory) -> dict[str, tuple]:
    """{case id: (exit code, stdout, stderr, the folder its run or sweep directory was in)} of the
    in-process table; "python -m ID": the same for the END_TO_END row ID run as a subprocess."""
    outs = {case.id: tmp_path_factory.mktemp(case.id) for case in CASES}
    rows = [(case.id, _argv(case, assets, outs[case.id])) for case in CASES]
    chunks = [rows[i::WORKERS] for i in range(WORKERS)]

    def e2e(case: Case) -> tuple[str, tuple]:
        out = tmp_path_factory.mktemp(f"{case.id}_e2e")
        proc = run_cli(*_argv(case, assets, out), timeout=120, fresh=True)
        return case.id, (proc.returncode, proc.stdout, proc.stderr, out)

    with ThreadPoolExecutor(max_workers=WORKERS + len(END_TO_END)) as pool:
        helpers = [pool.submit(_helper, chunk, tmp_path_factory.mktemp("helper")) for chunk in chunks]
        subprocesses = [pool.submit(e2e, case) for case in CASES if case.id in END_TO_END]
        table = {k: (*v, outs[k]) for h in helpers for k, v in h.result().items()}
        table.update({f"python -m {k}": v for k, v in (f.result() for f in subprocesses)})
    return table


@pytest.mark.slow  # quick tier: a table of ~95 commands
def test_a_python_tag_in_an_experiment_never_runs(assets, results):
    """experiment_python_tag's file would `touch pwned` if anything constructed its tag."""
    assert results["experiment_python_tag"][0] == 2
    assert not (assets / "pwned").exists()


def test_table_is_large_enough():
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)
    assert set(END_TO_END) <= {c.id for c in CASES}


def _check(case: Case, code, stdout: str, stderr: str, out: Path) -> None:
    text = stdout + stderr
    assert code == 2, text
    assert "Traceback" not in text
    assert "configuration error" in stderr
    assert f"  {case.key} = " in stderr, stderr
    allowed = [line for line in stderr.splitlines() if line.strip().startswith("allowed:")]
    assert any(case.allowed in line for line in allowed), stderr
    for more in case.also:
        assert more in stderr, stderr
    for less in case.absent:
        assert less not in stderr, stderr
    # No worker started, nothing that looks like a run: the directories were never created.
    assert "rank(s) on" not in stdout
    assert not (out / "run").exists() and not (out / "sweep").exists(), list(out.rglob("*"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.slow  # quick tier: a table of ~95 commands
def test_bad_input(case: Case, results):
    _check(case, *results[case.id])


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.id in END_TO_END], ids=[c.id for c in CASES if c.id in END_TO_END]
)
@pytest.mark.slow  # quick tier: a table of ~95 commands
def test_bad_input_through_python_m(case: Case, results):
    """The same row through the real command line, `python -m qwen3exp ...` in a subprocess."""
    _check(case, *results[f"python -m {case.id}"])
