"""The model's files are checked before any worker starts: flavor=auto resolves the architecture
from config.json, an explicit flavor is compared with config.json key by key, and every bad input
is a clear exit-2 error (key, value, what is wrong) with nothing started and no traceback."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import compose, run_cli
from hf_fixtures import TOKENIZER_FILES, write_checkpoint
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.flavors import FLAVORS
from qwen3exp.config.hf_config import arch_from_hf_config, hf_config_from_arch
from qwen3exp.config.hf_tensors import hf_param_shapes
from qwen3exp.config.schema import validate_experiment
from qwen3exp.errors import ConfigError
from qwen3exp.plan import model_files
from qwen3exp.plan.weight_files import read_headers, safetensors_files

# Qwen/Qwen3-4B-Instruct-2507's config.json (architecture keys as published).
QWEN3_4B_INSTRUCT_2507 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "rope_theta": 5000000,
    "rope_scaling": None,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "attention_bias": False,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ck") / "tied", tied=True)


def _folder(path: Path, config: dict | None, tokenizer: bool = True) -> Path:
    path.mkdir(parents=True)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    if tokenizer:
        for name in TOKENIZER_FILES:
            shutil.copy(TOKENIZER_DIR / name, path / name)
    return path


def _refused(tmp_path: Path, *overrides: str) -> str:
    """Run the real command line (a real run, not a dry run); it must stop before any worker."""
    run_dir = tmp_path / "run"
    r = run_cli(*overrides, "training.steps=2", "training.warmup_steps=1", f"hydra.run.dir={run_dir}")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "nothing was started" in r.stderr
    assert not (run_dir / "logs").exists() and not (run_dir / "summary.json").exists()
    return r.stderr


def test_flavor_4b_against_qwen3_4b_instruct_2507_names_rope_theta(tmp_path):
    folder = _folder(tmp_path / "qwen3-4b", QWEN3_4B_INSTRUCT_2507)
    err = _refused(tmp_path, "model.flavor=4B", f"model.hf_assets_path={folder}")
    assert "model.flavor = '4B': rope_theta is 5000000.0" in err and "1000000.0 in flavor 4B" in err
    assert err.count("model.flavor = '4B'") == 1  # every other key agrees
    # flavor=auto takes the checkpoint's numbers (dry run: a 4B model is not trained here).
    exp = validate_experiment(compose("model.flavor=auto", f"model.hf_assets_path={folder}"))
    files = model_files.check(exp)
    assert files.arch.rope_theta == 5e6 and files.arch.n_layers == 36 and files.arch.tied
    assert files.arch == replace(FLAVORS["4B"], rope_theta=5e6, max_seq_len=262144)


def test_dims_not_matching_the_flavor(tmp_path, ckpt):
    err = _refused(tmp_path, "model.flavor=tiny", f"model.hf_assets_path={ckpt}")
    for key in (
        "hidden_size is 96",
        "head_dim is 40",
        "intermediate_size is 160",
        "rope_theta is 5000000.0",
        "rms_norm_eps is 1e-05",
    ):
        assert key in err, key
    # Without a config.json the safetensors themselves are compared with the flavor.
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("model.safetensors", *TOKENIZER_FILES):
        shutil.copy(ckpt / name, bare / name)
    err = _refused(tmp_path / "b", "model.flavor=tiny", f"model.hf_assets_path={bare}", "checkpoint=hf_load")
    assert "tensors with the wrong shape: model.embed_tokens.weight [2048, 96] (the model needs [2048, 128])" in err


def test_missing_folder(tmp_path):
    err = _refused(tmp_path, "model.flavor=auto", f"model.hf_assets_path={tmp_path / 'nope'}")
    assert "model.hf_assets_path" in err and "folder does not exist" in err


@pytest.mark.parametrize("model", ["native", "hf"])
def test_folder_without_config_json(tmp_path, model):
    folder = _folder(tmp_path / "tok", None)
    args = ("model.flavor=auto",) if model == "native" else ("model=hf",)
    err = _refused(tmp_path, *args, f"model.hf_assets_path={folder}")
    assert "model.hf_assets_path" in err and "holds no config.json" in err


@pytest.mark.parametrize("model", ["native", "hf"])
def test_non_qwen3_architecture(tmp_path, model):
    llama = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 2048,
    }
    folder = _folder(tmp_path / "llama", llama)
    args = ("model.flavor=auto",) if model == "native" else ("model=hf",)
    err = _refused(tmp_path, *args, f"model.hf_assets_path={folder}")
    assert "['LlamaForCausalLM'] is not Qwen3" in err and "Qwen3ForCausalLM" in err


@pytest.mark.parametrize("dry_run", [True, False])
def test_config_json_key_of_the_wrong_type_is_refused_by_name(tmp_path, dry_run):
    # `"architectures": 5` crashed the architecture check (exit 70, a traceback), dry run and real.
    folder = _folder(tmp_path / "m", {**json.loads((TOKENIZER_DIR / "config.json").read_text()), "architectures": 5})
    if dry_run:
        r = run_cli("model=hf", f"model.hf_assets_path={folder}", "dry_run=true")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        err = r.stderr
    else:
        err = _refused(tmp_path, "model=hf", f"model.hf_assets_path={folder}")
    assert f"model.hf_assets_path = '{folder}'" in err
    assert "config.json: architectures is 5 (a JSON number), not a list of architecture names" in err


@pytest.mark.parametrize(
    "key, bad",
    [
        ("architectures", "Qwen3ForCausalLM"),
        ("architectures", [5]),
        ("model_type", ["qwen3"]),
        ("tie_word_embeddings", "false"),
        ("attention_bias", 0),
        ("hidden_act", 1),
        ("decoder_sparse_step", "1"),
    ],
)
def test_config_json_keys_read_are_type_checked(key, bad):
    cfg = {**json.loads((TOKENIZER_DIR / "config.json").read_text()), key: bad}
    with pytest.raises(ValueError, match=f"^{key} is ") as e:
        arch_from_hf_config(cfg)
    assert type(e.value).__name__ == "HFConfigError"


def test_tokenizer_vocab_larger_than_model_vocab(tmp_path):
    cfg = hf_config_from_arch(replace(FLAVORS["tiny"], vocab_size=1024))
    folder = _folder(tmp_path / "small-vocab", cfg)
    err = _refused(tmp_path, "model.flavor=auto", f"model.hf_assets_path={folder}")
    assert "token ids up to 2047 but the model's vocab_size is 1024" in err


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_safetensors(tmp_path, ckpt, damage):
    folder = tmp_path / "broken"
    shutil.copytree(ckpt, folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x00" * 64)
    err = _refused(tmp_path, "model.flavor=auto", f"model.hf_assets_path={folder}", "checkpoint=hf_load")
    assert "model.safetensors is corrupt or truncated" in err


def test_index_naming_a_missing_shard(tmp_path, ckpt):
    folder = tmp_path / "sharded"
    shutil.copytree(ckpt, folder)
    names = read_headers([folder / "model.safetensors"])[0]
    index = {"metadata": {}, "weight_map": {n: "model-00001-of-00002.safetensors" for n in names}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    err = _refused(tmp_path, "model=hf", f"model.hf_assets_path={folder}", "checkpoint=hf_load")
    assert "names model-00001-of-00002.safetensors, which does not exist" in err


def test_checkpoint_path_is_checked(tmp_path, ckpt):
    err = _refused(
        tmp_path,
        "model.flavor=auto",
        f"model.hf_assets_path={ckpt}",
        "checkpoint=hf_roundtrip",
        f"checkpoint.path={tmp_path / 'gone'}",
    )
    assert "checkpoint.path" in err and "folder does not exist" in err


def test_hf_param_shapes_match_what_transformers_writes(tmp_path, ckpt):
    """The expected tensor list is exactly what transformers saves (dense tied here, MoE below)."""
    arch = arch_from_hf_config(json.loads((ckpt / "config.json").read_text()))
    files, _ = safetensors_files(ckpt)
    assert read_headers(files)[0] == hf_param_shapes(arch)
    moe = write_checkpoint(
        tmp_path / "moe",
        tied=False,
        tokenizer=False,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
    )
    cfg = json.loads((moe / "config.json").read_text())
    arch = arch_from_hf_config(cfg)
    assert arch.moe is not None and arch.moe.num_experts == 4 and arch.moe.top_k == 2
    assert read_headers(safetensors_files(moe)[0])[0] == hf_param_shapes(arch)


def test_unsupported_qwen3_variants_are_refused():
    base = dict(QWEN3_4B_INSTRUCT_2507)
    for delta, words in (
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE scaling 'yarn'"),
        ({"attention_bias": True}, "attention_bias"),
        (
            {
                "model_type": "qwen3_moe",
                "architectures": ["Qwen3MoeForCausalLM"],
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 64,
                "norm_topk_prob": False,
            },
            "norm_topk_prob=false",
        ),
    ):
        with pytest.raises(Exception, match=words):
            arch_from_hf_config({**base, **delta})


def test_export_config_round_trips_every_flavor():
    for name, arch in FLAVORS.items():
        got = arch_from_hf_config(hf_config_from_arch(arch))
        assert got == arch, name


def test_schema_touches_no_files(tmp_path):
    """Validation alone accepts a folder that does not exist: the files are checked by prepare."""
    exp = validate_experiment(compose("model.flavor=auto", f"model.hf_assets_path={tmp_path / 'later'}"))
    with pytest.raises(ConfigError):
        model_files.check(exp)


WRONG_SHAPES = {
    # file, what it becomes, text the problem holds
    "config_is_a_list": ("config.json", lambda d: [1, 2], "holds a JSON list"),
    "nan_rope_theta": (
        "config.json",
        lambda d: {**d, "rope_parameters": {"rope_theta": float("nan")}},
        "rope_theta is nan, not a finite number > 0",
    ),
    "infinite_norm_eps": ("config.json", lambda d: {**d, "rms_norm_eps": float("inf")}, "rms_norm_eps is inf"),
    "layers_as_text": ("config.json", lambda d: {**d, "num_hidden_layers": "two"}, "not a positive integer"),
    "a_trillion_layers": ("config.json", lambda d: {**d, "num_hidden_layers": 10**12}, "beyond any Qwen3"),
    "tokenizer_is_a_list": ("tokenizer.json", lambda d: [1], "tokenizer files are unreadable"),
    "tokenizer_model_is_text": ("tokenizer.json", lambda d: {**d, "model": "x"}, "tokenizer files are unreadable"),
    "added_tokens_not_a_list": ("tokenizer.json", lambda d: {**d, "added_tokens": 5}, "tokenizer files are unreadable"),
    "decoder_is_a_list": (
        "tokenizer_config.json",
        lambda d: {**d, "added_tokens_decoder": [1]},
        "added_tokens_decoder is a JSON list",
    ),
    "index_is_a_list": ("model.safetensors.index.json", lambda d: [1], "is unreadable"),
    "weight_map_of_numbers": (
        "model.safetensors.index.json",
        lambda d: {"weight_map": {"a": 5}},
        "weight_map is not an object",
    ),
    "index_leaves_the_folder": (
        "model.safetensors.index.json",
        lambda d: {"weight_map": {"a": "../../etc/passwd"}},
        "not a file of the model's folder",
    ),
}


@pytest.mark.parametrize("case", WRONG_SHAPES)
def test_model_files_of_the_wrong_shape_are_problems(tmp_path, ckpt, case):
    """config.json, tokenizer.json, tokenizer_config.json and the safetensors index with the wrong
    shape or types (a NaN rope_theta, 10^12 layers, a list where an object belongs, a file name
    outside the folder): each is a Problem naming model.hf_assets_path, found in well under a second,
    never an exception from deep inside the check."""
    import time

    name, change, said = WRONG_SHAPES[case]
    folder = tmp_path / "model"
    shutil.copytree(ckpt, folder)
    path = folder / name
    path.write_text(json.dumps(change(json.loads(path.read_text()) if path.is_file() else {})))
    exp = validate_experiment(compose("model.flavor=auto", f"model.hf_assets_path={folder}", "checkpoint=hf_load"))
    started = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        model_files.check(exp)
    assert time.perf_counter() - started < 5
    assert any(p.key == "model.hf_assets_path" and said in p.message for p in e.value.problems), e.value.render()
