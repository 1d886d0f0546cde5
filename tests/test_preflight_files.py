"""The pre-launch checks that read files or the host, one by one (the command-line battery is
`tests/test_bad_inputs.py`): data files against what the `datasets` loader really accepts, non-finite
numbers in every float field, the divisibility rules torchtitan enforces inside a rank, safetensors
dtypes and values (NaN / Inf, within the scan's byte budget), RoPE scaling per backend, model
folders that ask for remote code, pipeline parallelism, and CPU host memory and cores."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, read_metrics, read_summary, run_cli
from qwen3exp.assets import TOKENIZER_DIR
from qwen3exp.config.flavors import FLAVORS
from qwen3exp.config.hf_config import HF_ROPE_TYPES, arch_from_hf_config
from qwen3exp.config.hf_tensors import hf_param_shapes
from qwen3exp.config.schema import SECTIONS, check_experiment, validate_experiment
from qwen3exp.data import files as data_files, records as data_records
from qwen3exp.errors import ConfigError
from qwen3exp.plan import model_files, weight_values
from qwen3exp.plan.build import make_plan
from qwen3exp.plan.weight_values import nonfinite_tensors
from qwen3exp.platforms import cpu


def _exp(**sections):
    data = {"name": "t", "model": {"backend": "native", "flavor": "tiny"}, **sections}
    return validate_experiment(data)


def _keys(problems) -> list[str]:
    return [p.key for p in problems]


# ============================================================================ data files
# (name, {file name: bytes}, text_field). The loader is `datasets` as qwen3exp.titan.dataset calls it.
DATA_CASES = [
    ("jsonl_ok", {"a.jsonl": b'{"text": "a"}\n{"text": "b"}\n'}, "text"),
    ("jsonl_crlf", {"a.jsonl": b'{"text": "a"}\r\n{"text": "b"}\r\n'}, "text"),
    ("jsonl_leading_space", {"a.jsonl": b'  {"text": "a"}\n{"text": "b"}\n'}, "text"),
    ("jsonl_no_final_newline", {"a.jsonl": b'{"text": "a"}'}, "text"),
    ("jsonl_other_field", {"a.jsonl": b'{"body": "a", "id": 1}\n'}, "body"),
    ("jsonl_blank_line_first_file", {"a.jsonl": b'{"text": "a"}\n\n{"text": "b"}\n'}, "text"),
    ("jsonl_blank_lines_at_end", {"a.jsonl": b'{"text": "a"}\n\n\n'}, "text"),
    (
        "jsonl_blank_line_second_file",
        {"a.jsonl": b'{"text": "a"}\n', "b.jsonl": b'{"text": "a"}\n\n{"text": "b"}\n'},
        "text",
    ),
    ("jsonl_bom_first_file", {"a.jsonl": b'\xef\xbb\xbf{"text": "a"}\n'}, "text"),
    ("jsonl_bom_second_file", {"a.jsonl": b'{"text": "a"}\n', "b.jsonl": b'\xef\xbb\xbf{"text": "b"}\n'}, "text"),
    ("jsonl_duplicate_key", {"a.jsonl": b'{"text": "a", "text": "b"}\n'}, "text"),
    ("jsonl_empty_file", {"a.jsonl": b""}, "text"),
    ("jsonl_empty_first_of_two", {"a.jsonl": b"", "b.jsonl": b'{"text": "a"}\n'}, "text"),
    ("jsonl_missing_field_line_2", {"a.jsonl": b'{"text": "a"}\n{"other": "b"}\n'}, "text"),
    ("jsonl_missing_field_second_file", {"a.jsonl": b'{"text": "a"}\n', "b.jsonl": b'{"other": "b"}\n'}, "text"),
    ("jsonl_wrong_field_name", {"a.jsonl": b'{"txt": "a"}\n'}, "text"),
    ("jsonl_number", {"a.jsonl": b'{"text": "a"}\n{"text": 1}\n'}, "text"),
    ("jsonl_null", {"a.jsonl": b'{"text": "a"}\n{"text": null}\n'}, "text"),
    ("jsonl_list", {"a.jsonl": b'{"text": ["a"]}\n'}, "text"),
    ("jsonl_nan", {"a.jsonl": b'{"text": NaN}\n'}, "text"),
    ("jsonl_empty_string", {"a.jsonl": b'{"text": "a"}\n{"text": ""}\n'}, "text"),
    ("jsonl_two_objects_one_line", {"a.jsonl": b'{"text": "a"} {"text": "b"}\n'}, "text"),
    ("jsonl_invalid", {"a.jsonl": b'{"text": "a"}\n{"text": "b\n'}, "text"),
    ("jsonl_not_utf8", {"a.jsonl": b'{"text": "caf\xe9"}\n'}, "text"),
    ("jsonl_binary", {"a.jsonl": bytes(range(256))}, "text"),
    ("jsonl_array_line", {"a.jsonl": b' [{"text": "a"}]\n'}, "text"),
    ("json_array_of_objects", {"a.json": b'[{"text": "a"}, {"text": "b"}]'}, "text"),
    ("json_array_of_strings", {"a.json": b'["a", "b"]'}, "text"),
    ("json_array_of_numbers", {"a.json": b"[1, 2]"}, "text"),
    ("json_array_missing_field", {"a.json": b'[{"text": "a"}, {"other": "b"}]'}, "text"),
    ("mixed_txt_and_jsonl", {"a.jsonl": b'{"text": "a"}\n', "b.txt": b"hello\n"}, "text"),
    ("txt_ok", {"a.txt": b"hello\n\nworld\n"}, "text"),
    ("txt_bom", {"a.txt": b"\xef\xbb\xbfhello\n"}, "text"),
    ("txt_empty", {"a.txt": b""}, "text"),
    ("txt_not_utf8", {"a.txt": b"hi \xff\xfe there\n"}, "text"),
]
# Refused although `datasets` loads them: nothing to train on, or a binary file.
STRICTER = {
    "txt_whitespace": ({"a.txt": b"  \n\n  \n"}, "holds only whitespace"),
    "txt_nul_bytes": ({"a.txt": b"hi\x00\x00there\n"}, "NUL bytes"),
}


def _write(folder: Path, files: dict[str, bytes]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_bytes(content)
    from qwen3exp.titan.dataset import data_files as loader_files

    return [Path(f) for f in loader_files(folder)]


def _loader_accepts(files: list[Path], field: str, cache: Path) -> bool:
    """What the training loader does with these files: load them as qwen3exp.titan.dataset does,
    then every record's text must be a non-empty string (what the tokenizer is given)."""
    import datasets
    from datasets import load_dataset

    datasets.disable_progress_bars()
    names = [str(f) for f in files]
    try:
        if all(n.endswith(".txt") for n in names):
            ds = load_dataset("text", data_files=names, split="train", sample_by="paragraph", cache_dir=str(cache))
            field = "text"
        else:
            ds = load_dataset("json", data_files=names, split="train", cache_dir=str(cache))
        return all(isinstance(r[field], str) and r[field] for r in ds)
    except Exception:
        return False


@pytest.mark.parametrize("name,files,field", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_data_check_agrees_with_the_loader(tmp_path, name, files, field):
    paths = _write(tmp_path / "data", files)
    problems = data_files.content_problems(str(tmp_path / "data"), paths, field)
    accepted = _loader_accepts(paths, field, tmp_path / "cache")
    assert (not problems) == accepted, (name, accepted, [p.render() for p in problems])
    for p in problems:
        assert p.key in ("data.path", "data.text_field") and p.allowed


@pytest.mark.parametrize("name", sorted(STRICTER))
def test_data_check_refuses_what_is_not_text(tmp_path, name):
    files, words = STRICTER[name]
    paths = _write(tmp_path / "data", files)
    (p,) = data_files.content_problems(str(tmp_path / "data"), paths, "text")
    assert words in p.message and p.key == "data.path"


def test_data_messages_name_file_and_line(tmp_path):
    paths = _write(tmp_path / "data", {"a.jsonl": b'{"text": "a"}\n', "b.jsonl": b'{"text": "a"}\n{"text": 3}\n'})
    (p,) = data_files.content_problems(str(tmp_path / "data"), paths, "text")
    assert p.message == "b.jsonl: line 2: 'text' is a JSON number, not a string"
    # data.path the file itself: named by its name, not the whole path again
    (p,) = data_files.content_problems(str(paths[1]), [paths[1]], "text")
    assert p.message.startswith("b.jsonl: line 2:") and p.value == str(paths[1])


def test_the_wrong_text_field_names_data_text_field(tmp_path):
    paths = _write(tmp_path / "data", {"a.jsonl": b'{"content": "a", "id": 1}\n'})
    (p,) = data_files.content_problems(str(tmp_path / "data"), paths, "contents")
    assert p.key == "data.text_field" and p.value == "contents"
    assert "its keys: content, id" in p.message and p.hint == "did you mean content?"


def test_data_check_is_bounded(tmp_path, monkeypatch):
    # A defect past the first MAX_LINES records is found by the scan of the rest (it would stop every
    # rank mid-training), up to SCAN_BYTES; beyond them nothing is read.
    good = b"".join(b'{"text": "line %d"}\n' % i for i in range(data_records.MAX_LINES))
    paths = _write(tmp_path / "late", {"a.jsonl": good + b"{broken\n"})
    (p,) = data_files.content_problems(str(tmp_path / "late"), paths, "text")
    assert f"line {data_records.MAX_LINES + 1}: not valid JSON" in p.message
    monkeypatch.setattr(data_files, "SCAN_BYTES", len(b'{"text": "line 0"}\n'))
    paths = _write(tmp_path / "later", {"a.jsonl": good + good + b"{broken\n"})
    assert data_files.content_problems(str(tmp_path / "later"), paths, "text") == []
    monkeypatch.undo()
    # A line longer than MAX_LINE_BYTES is refused (its JSON cannot be checked), wherever it is.
    huge = b'{"text": "' + b"x" * (data_records.MAX_LINE_BYTES + 10) + b'"}\n'
    for where, content in (("first", huge), ("late", good + huge)):
        paths = _write(tmp_path / f"huge_{where}", {"a.jsonl": content})
        (p,) = data_files.content_problems(str(tmp_path / f"huge_{where}"), paths, "text")
        assert "is longer than 16 MiB" in p.message, where
    # A first line longer than READ_BYTES is still read whole and checked, and so is the next one.
    long = b'{"text": "' + b"x" * (data_records.READ_BYTES + 10) + b'"}\n'
    paths = _write(tmp_path / "long", {"a.jsonl": long + b'{"text": "ok"}\n'})
    assert data_files.content_problems(str(tmp_path / "long"), paths, "text") == []
    paths = _write(tmp_path / "long_then_bad", {"a.jsonl": long + b'{"text": 5}\n'})
    (p,) = data_files.content_problems(str(tmp_path / "long_then_bad"), paths, "text")
    assert "line 2: 'text' is a JSON number" in p.message
    paths = _write(tmp_path / "long_bad", {"a.jsonl": long[:-3] + b",}\n"})
    (p,) = data_files.content_problems(str(tmp_path / "long_bad"), paths, "text")
    assert "line 1: not valid JSON" in p.message
    # A JSON array longer than READ_BYTES: the elements cut by the end of the read are not errors.
    for cut in (0, 1, 2, 3):  # pretty-printed: the read ends after some line inside an element
        array = (
            b"[\n"
            + b",\n".join(b'{\n  "id": %d,\n  "text": "%s"\n}' % (i, b"x" * (20_000 + cut)) for i in range(60))
            + b"\n]\n"
        )
        paths = _write(tmp_path / f"array{cut}", {"a.json": array})
        assert len(array) > data_records.READ_BYTES
        assert data_files.content_problems(str(tmp_path / f"array{cut}"), paths, "text") == [], cut
    # Only the first MAX_FILES files (in the loader's order) are opened; problems are capped.
    files = {f"f{i:03d}.jsonl": b"" for i in range(data_files.MAX_FILES + 5)}
    paths = _write(tmp_path / "many", files)
    problems = data_files.content_problems(str(tmp_path / "many"), paths, "text")
    assert len(problems) == data_files.MAX_REPORTED
    assert f"and {data_files.MAX_FILES - data_files.MAX_REPORTED} more file(s)" in problems[-1].message
    big = tmp_path / "big"
    _write(big, {f"f{i:03d}.jsonl": good * 200 for i in range(data_files.MAX_FILES + 20)})
    exp = _exp(data={"source": "local", "path": str(big)})
    t0 = time.perf_counter()
    assert data_files.data_problems(exp.data) == []
    assert time.perf_counter() - t0 < 5


# ===================================================================== non-finite numbers
_UNION_TAGS = {
    "model": "backend",
    "platform": "name",
    "data": "source",
    "launcher": "kind",
    "peft": "kind",
    "objective": "kind",
    "eval": "kind",
}


def _float_fields() -> list[tuple[str, dict]]:
    """(dotted key, the section's data) for every float field of every section variant."""
    from typing import get_args

    from pydantic import BaseModel

    def has_float(ann) -> bool:
        return ann is float or any(has_float(a) for a in get_args(ann))

    def models(ann) -> list[type[BaseModel]]:
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return [ann]
        return [m for a in get_args(ann) for m in models(a)]

    out = []
    for section, typ in SECTIONS.items():
        for member in models(typ):
            base = {}
            tag = _UNION_TAGS.get(section)
            if tag:
                base[tag] = member.model_fields[tag].default
            base.update({n: "x" for n, f in member.model_fields.items() if f.is_required()})
            for name, f in member.model_fields.items():
                if has_float(f.annotation):
                    out.append((f"{section}.{name}", base))
    return out


FLOAT_FIELDS = _float_fields()


def test_every_float_field_is_found():
    keys = {k for k, _ in FLOAT_FIELDS}
    assert {
        "training.lr",
        "training.max_norm",
        "training.min_lr_factor",
        "training.weight_decay",
        "platform.memory_per_rank_gib",
        "platform.memory_per_gpu_gib",
        "platform.hbm_per_core_gib",
        "launcher.stop_timeout_s",
    } <= keys


@pytest.mark.parametrize(
    "key,base",
    FLOAT_FIELDS,
    ids=[
        k + ("" if "name" not in b else f"[{b['name']}]") + ("" if "kind" not in b else f"[{b['kind']}]")
        for k, b in FLOAT_FIELDS
    ],
)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_non_finite_numbers_are_refused_in_every_float_field(key, base, bad):
    section, name = key.split(".")
    data = {"name": "t", "model": {"backend": "native", "flavor": "tiny"}}
    data[section] = {**data.get(section, {}), **base, name: bad}
    checked = check_experiment(data)
    hits = [p for p in checked.problems if p.key == key]
    assert hits, [p.render() for p in checked.problems]
    assert hits[0].allowed == "a finite number (not inf, -inf or nan)"
    assert "finite" in hits[0].message


# ====================================================== divisibility torchtitan checks in a rank
@pytest.mark.parametrize(
    "seq,tp,cp,ok",
    [
        (256, 1, 1, True),
        (100, 1, 1, False),
        (264, 1, 1, True),
        (256, 1, 2, True),
        (255, 1, 2, False),
        (264, 1, 2, False),
        (272, 1, 2, True),
        (256, 2, 1, True),
        (256, 2, 2, True),
        (256, 2, 4, True),
        (80, 2, 4, False),
        (64, 8, 2, True),
        (48, 8, 2, False),  # sequence parallelism: tp x 2cp = 32 must divide seq_len
    ],
)
def test_seq_len_against_cp_and_loss_chunks(seq, tp, cp, ok):
    n = max(tp * cp, 1)
    checked = check_experiment(
        {
            "name": "t",
            "model": {"backend": "native", "flavor": "0.6B"},
            "training": {"seq_len": seq},
            "parallelism": {"tp": tp, "cp": cp},
            "launcher": {"kind": "local", "nproc_per_node": n},
        }
    )
    seq_problems = [p for p in checked.problems if p.key == "training.seq_len"]
    assert (not seq_problems) == ok, [p.render() for p in checked.problems]


def test_sequence_parallel_share_needs_tp_to_divide_seq_len(tmp_path):
    # No flavor has 3 (or 6) heads per rank: use config.json (flavor=auto), whose rules model_files applies.
    folder = _model_folder(tmp_path / "h6", num_attention_heads=6, num_key_value_heads=3, head_dim=32)
    exp = _exp(
        model={"backend": "native", "flavor": "auto", "hf_assets_path": str(folder)},
        training={"seq_len": 64},
        parallelism={"tp": 3},
        launcher={"kind": "local", "nproc_per_node": 3},
    )
    with pytest.raises(ConfigError) as e:
        model_files.check(exp)
    (p,) = e.value.problems
    assert p.key == "training.seq_len" and p.allowed.startswith("a multiple of 24")
    assert "sequence parallelism (on with parallelism.tp=3)" in p.message
    assert p.hint == "nearest valid values: training.seq_len=48 or 72"
    # A tp that does not fit the heads is one mistake: no second message about seq_len.
    checked = check_experiment(
        {
            "name": "t",
            "model": {"backend": "native", "flavor": "tiny"},
            "parallelism": {"tp": 3},
            "training": {"seq_len": 64},
        }
    )
    assert "training.seq_len" not in _keys(checked.problems)


def _model_folder(path: Path, *, weights: dict | None = None, **config) -> Path:
    """A copy of the bundled tiny model folder (config.json, tokenizer) with config.json changed."""
    shutil.copytree(TOKENIZER_DIR, path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(config)
    (path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    if weights is not None:
        _write_safetensors(path / "model.safetensors", weights)
    return path


@pytest.mark.parametrize("backend", ["native", "hf"])
def test_heads_not_divisible_by_kv_heads(tmp_path, backend):
    folder = _model_folder(tmp_path / "kv3", num_key_value_heads=3)
    model = (
        {"backend": "native", "flavor": "auto", "hf_assets_path": str(folder)}
        if backend == "native"
        else {"backend": "hf", "hf_model": str(folder)}
    )
    with pytest.raises(ConfigError) as e:
        model_files.check(_exp(model=model))
    p = next(p for p in e.value.problems if "num_key_value_heads" in p.message)
    assert p.key == ("model.hf_assets_path" if backend == "native" else "model.hf_model")
    assert "num_attention_heads (4) is not a multiple of num_key_value_heads (3)" in p.message


@pytest.mark.parametrize("bad", [0, -2, "4", 2.5, None])
def test_config_json_head_counts_must_be_positive_integers(bad):
    cfg = json.loads((TOKENIZER_DIR / "config.json").read_text())
    cfg["num_attention_heads"] = bad
    with pytest.raises(Exception, match="num_attention_heads|lacks") as e:
        arch_from_hf_config({k: v for k, v in cfg.items() if v is not None})
    assert type(e.value).__name__ == "HFConfigError"


# ======================================================================== pipeline parallel
def test_pp_with_tied_embeddings_is_refused_naming_parallelism_pp():
    checked = check_experiment(
        {"name": "t", "model": {"backend": "native", "flavor": "tiny"}, "parallelism": {"pp": 2}}
    )
    (p,) = checked.problems
    assert p.key == "parallelism.pp" and p.allowed == "1 for a model with tied embeddings"
    assert "model=hf" in p.hint and "tiny_moe" in p.hint


def test_pp_on_untied_and_on_hf_models_is_planned():
    exp = _exp(
        model={"backend": "native", "flavor": "tiny_moe"},
        parallelism={"pp": 2},
        platform={"name": "cpu"},
        training={"seq_len": 64},
    )
    plan = make_plan(exp, "/tmp/unused")
    assert plan.mesh.pp == 2
    exp = _exp(model={"backend": "hf"}, parallelism={"pp": 2}, platform={"name": "cpu"}, training={"seq_len": 64})
    assert make_plan(exp, "/tmp/unused").mesh.pp == 2  # the Transformers backend unties the weights


def test_pp_beyond_the_stages_the_model_can_fill():
    checked = check_experiment(
        {
            "name": "t",
            "model": {"backend": "native", "flavor": "tiny_moe"},
            "parallelism": {"pp": 5},
            "launcher": {"kind": "local", "nproc_per_node": 5},
        }
    )
    (p,) = [p for p in checked.problems if p.key == "parallelism.pp"]
    assert p.allowed == "1..4" and "2 layers + embedding + output" in p.message


@pytest.mark.slow
def test_pp_2_trains_on_cpu(tmp_path):
    """parallelism.pp=2 was refused inside torchtitan (CUDA graphs); it now trains, 2 stages on 2 ranks."""
    run = tmp_path / "run"
    r = run_cli(
        "platform=cpu",
        "model.flavor=tiny_moe",
        "parallelism.pp=2",
        "launcher.nproc_per_node=2",
        "training.steps=3",
        "training.warmup_steps=1",
        "training.seq_len=64",
        f"hydra.run.dir={run}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = read_summary(run)
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    losses = [row["loss"] for row in read_metrics(run)]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(2048)) < 1.0 and losses[-1] < losses[0]  # starts near uniform, learns
    config = json.loads((run / "torchtitan_config.json").read_text())
    assert config["training"]["disable_cuda_graphs"] is True


# ================================================================= safetensors dtypes and values
_BITS = {
    "F64": np.uint64,
    "F32": np.uint32,
    "F16": np.uint16,
    "BF16": np.uint16,
    "F8_E4M3": np.uint8,
    "F8_E5M2": np.uint8,
    "I32": np.int32,
    "I64": np.int64,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.uint8,
    "I16": np.int16,
}


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]]) -> None:
    """A safetensors file written byte by byte (numpy has no bfloat16): {name: (dtype, shape, raw)}."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        data = np.ascontiguousarray(raw).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def _tiny_weights(dtype: str = "F32", **damage) -> dict:
    """Every tensor of the tiny flavor as the given dtype, all 0.5 (bf16 0x3f00), with `damage`:
    {tensor name: (flat index, raw bit pattern)}."""
    one = {"F32": 0x3F000000, "F16": 0x3800, "BF16": 0x3F00, "F64": 0x3FE0000000000000}[dtype]
    out = {}
    for name, shape in hf_param_shapes(FLAVORS["tiny"]).items():
        raw = np.full(math.prod(shape), one, dtype=_BITS[dtype])
        if name in damage:
            index, bits = damage[name]
            raw[index] = bits
        out[name] = (dtype, shape, raw)
    return out


NAN_INF = {
    "F32": [0x7FC00000, 0x7F800000, 0xFF800000, 0x7F800001],
    "F16": [0x7E00, 0x7C00, 0xFC00],
    "BF16": [0x7FC0, 0x7F80, 0xFF80],
    "F64": [0x7FF8000000000000, 0x7FF0000000000000, 0xFFF0000000000000],
}
FINITE_EXTREMES = {
    "F32": [0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000000],
    "F16": [0x7BFF, 0xFBFF, 0x0001],
    "BF16": [0x7F7F, 0xFF7F, 0x0001],
    "F64": [0x7FEFFFFFFFFFFFFF, 0x0000000000000001],
}


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16", "F64"])
def test_nan_and_inf_are_found_by_their_bits(tmp_path, dtype):
    name = "model.layers.1.self_attn.k_proj.weight"
    for i, bits in enumerate(NAN_INF[dtype]):
        path = tmp_path / f"bad{i}.safetensors"
        _write_safetensors(path, {name: (dtype, (64, 128), _tiny_weights(dtype, **{name: (4097, bits)})[name][2])})
        entries = list(weight_values.tensor_entries([path]).values())
        assert nonfinite_tensors(entries)[0] == [name], hex(bits)
    path = tmp_path / "finite.safetensors"
    raw = np.array(FINITE_EXTREMES[dtype], dtype=_BITS[dtype])
    _write_safetensors(path, {"x": (dtype, raw.shape, raw)})
    assert nonfinite_tensors(list(weight_values.tensor_entries([path]).values()))[0] == []


def _hf_load(folder: Path, **model):
    return _exp(
        model={"backend": "native", "flavor": "tiny", "hf_assets_path": str(folder), **model},
        checkpoint={"kind": "hf_load"},
    )


def test_nan_weights_behind_a_valid_header_are_refused(tmp_path):
    bad = "model.layers.0.mlp.up_proj.weight"
    folder = _model_folder(tmp_path / "nan", weights=_tiny_weights("BF16", **{bad: (123, 0x7FC0)}))
    with pytest.raises(ConfigError) as e:
        model_files.check(_hf_load(folder))
    (p,) = e.value.problems
    assert p.key == "model.hf_assets_path" and p.allowed == "weights whose values are all finite"
    assert f"tensors holding NaN or Inf values: {bad} (scanned every value)" in p.message
    good = _model_folder(tmp_path / "good", weights=_tiny_weights("BF16"))
    assert model_files.check(_hf_load(good)).weights == good


@pytest.mark.parametrize("dtype", ["I8", "I32", "I64", "U8", "BOOL", "I16"])
def test_integer_weights_are_refused_naming_the_tensors(tmp_path, dtype):
    weights = _tiny_weights("F32")
    for name in ("model.embed_tokens.weight", "model.norm.weight"):
        shape = weights[name][1]
        weights[name] = (dtype, shape, np.ones(math.prod(shape), dtype=_BITS[dtype]))
    folder = _model_folder(tmp_path / "ints", weights=weights)
    with pytest.raises(ConfigError) as e:
        model_files.check(_hf_load(folder))
    (p,) = e.value.problems
    assert p.message == (
        f"tensors with a dtype that is not floating point: model.embed_tokens.weight ({dtype}), "
        f"model.norm.weight ({dtype})"
    )
    assert p.allowed.startswith("safetensors whose weights are F64, F32, F16, BF16")


def test_checkpoint_path_holding_nan_names_checkpoint_path(tmp_path):
    bad = "model.norm.weight"
    weights = _model_folder(tmp_path / "w", weights=_tiny_weights("F32", **{bad: (0, 0x7F800000)}))
    exp = _exp(model={"backend": "native", "flavor": "tiny"}, checkpoint={"kind": "hf_load", "path": str(weights)})
    with pytest.raises(ConfigError) as e:
        model_files.check(exp)
    assert _keys(e.value.problems) == ["checkpoint.path"]


def test_scan_budget_samples_deterministically(tmp_path):
    """Beyond the budget each tensor is read as evenly spaced blocks, first and last included."""
    n = 4 * 2**20  # 16 MiB of float32
    raw = np.zeros(n, dtype=np.uint32)
    path = tmp_path / "big.safetensors"
    _write_safetensors(path, {"w": ("F32", (n,), raw)})
    entries = list(weight_values.tensor_entries([path]).values())
    budget = 2**20
    bad, scanned, total = nonfinite_tensors(entries, budget=budget)
    assert bad == [] and total == 4 * n and scanned <= budget and scanned >= budget // 2
    assert nonfinite_tensors(entries, budget=budget)[1] == scanned  # the same bytes every time
    for index in (0, n - 1):  # the first and the last block are always read
        raw[:] = 0
        raw[index] = 0x7FC00000
        _write_safetensors(path, {"w": ("F32", (n,), raw)})
        assert nonfinite_tensors(entries, budget=budget)[0] == ["w"]
    assert nonfinite_tensors(entries, budget=4 * n)[1] == 4 * n  # within the budget: everything


def test_an_8_gib_checkpoint_is_checked_in_about_a_second(tmp_path):
    """A sparse 8 GiB file with 400 bf16 tensors (the layout of a published 4B checkpoint): the scan
    reads about SCAN_BUDGET_BYTES, not the file."""
    path = tmp_path / "model.safetensors"
    per = 8 * 2**30 // 400 // 2 * 2
    header = {
        f"t{i}": {"dtype": "BF16", "shape": [per // 2], "data_offsets": [i * per, (i + 1) * per]} for i in range(400)
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + 400 * per)
    entries = list(weight_values.tensor_entries([path]).values())
    t0 = time.perf_counter()
    bad, scanned, total = nonfinite_tensors(entries)
    elapsed = time.perf_counter() - t0
    assert bad == [] and total == 400 * per
    assert scanned <= weight_values.SCAN_BUDGET_BYTES + 400 * weight_values.SCAN_BLOCK_BYTES
    assert elapsed < 5, elapsed  # about a second (0.3 s here, cold); slack for a loaded CI host


def test_preflight_imports_no_torch(tmp_path):
    folder = _model_folder(tmp_path / "good", weights=_tiny_weights("BF16"))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"text": "document {i}"}}\n' for i in range(20)))  # 2 held out: one per rank
    script = f"""
import sys
from qwen3exp.config.schema import validate_experiment
from qwen3exp.plan.build import make_plan
exp = validate_experiment({{"name": "t", "dry_run": True, "platform": {{"name": "cpu"}},
    "model": {{"backend": "native", "flavor": "tiny", "hf_assets_path": {str(folder)!r}}},
    "checkpoint": {{"kind": "hf_load"}}, "data": {{"source": "local", "path": {str(data)!r}}}}})
make_plan(exp, "/tmp/unused")
heavy = [m for m in ("torch", "torchtitan", "transformers", "datasets") if m in sys.modules]
print("HEAVY", heavy)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert "HEAVY []" in r.stdout, r.stdout + r.stderr


# ================================================================================== RoPE scaling
def test_hf_rope_types_are_transformers_own():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    assert set(HF_ROPE_TYPES) == {"default", *ROPE_INIT_FUNCTIONS}


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}


@pytest.mark.parametrize(
    "config",
    [
        {"rope_scaling": YARN},
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        {"rope_parameters": {**YARN, "rope_theta": 1e6}},
        # transformers 5 reads rope_scaling over rope_parameters: a default rope_parameters hides nothing
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "rope_scaling": YARN},
    ],
    ids=["rope_scaling", "legacy_type_key", "rope_parameters", "both_keys"],
)
@pytest.mark.parametrize("flavor", ["auto", "tiny"])
def test_rope_scaling_is_refused_for_the_native_model(tmp_path, config, flavor):
    folder = _model_folder(tmp_path / "rope", **config)
    with pytest.raises(ConfigError) as e:
        model_files.check(_exp(model={"backend": "native", "flavor": flavor, "hf_assets_path": str(folder)}))
    (p,) = e.value.problems
    assert p.key == "model.hf_assets_path" and p.value == str(folder)
    key = "rope_scaling" if "rope_scaling" in config else "rope_parameters"
    assert f"{key} asks for RoPE scaling" in p.message and "native Qwen3 cannot represent" in p.message
    assert p.allowed == "for model=native: no rope_scaling, or rope_type 'default'"
    assert p.hint.startswith("model=hf builds it")


def test_rope_scaling_is_accepted_by_model_hf_when_transformers_implements_it(tmp_path):
    folder = _model_folder(tmp_path / "yarn", rope_scaling=YARN)
    files = model_files.check(_exp(model={"backend": "hf", "hf_assets_path": str(folder)}))
    assert files.arch.n_layers == 2
    odd = _model_folder(tmp_path / "odd", rope_scaling={"rope_type": "squeezed", "factor": 2.0})
    for backend in ("native", "hf"):
        model = {"backend": backend, "hf_assets_path": str(odd), **({"flavor": "auto"} if backend == "native" else {})}
        with pytest.raises(ConfigError) as e:
            model_files.check(_exp(model=model))
        (p,) = e.value.problems
        assert "'squeezed'" in p.message
    plain = _model_folder(
        tmp_path / "plain", rope_scaling=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
    )
    model_files.check(_exp(model={"backend": "native", "flavor": "auto", "hf_assets_path": str(plain)}))


# ================================================================================== remote code
def _remote_folder(path: Path) -> Path:
    folder = _model_folder(path, auto_map={"AutoConfig": "configuration_evil.EvilConfig"})
    marker = path.parent / f"{path.name}.ran"
    (folder / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return folder


@pytest.mark.parametrize("where", ["model.hf_assets_path", "model.hf_model", "checkpoint.path"])
def test_a_folder_asking_for_remote_code_is_refused(tmp_path, where):
    remote = _remote_folder(tmp_path / "remote")
    match where:
        case "model.hf_assets_path":
            exp = _exp(model={"backend": "native", "flavor": "tiny", "hf_assets_path": str(remote)})
        case "model.hf_model":
            exp = _exp(model={"backend": "hf", "hf_model": str(remote)})
        case "checkpoint.path":
            _write_safetensors(remote / "model.safetensors", _tiny_weights("F32"))
            exp = _exp(
                model={"backend": "native", "flavor": "tiny"}, checkpoint={"kind": "hf_load", "path": str(remote)}
            )
    with pytest.raises(ConfigError) as e:
        model_files.check(exp)
    p = next(p for p in e.value.problems if "auto_map" in p.message)
    assert p.key == where
    assert "qwen3exp never executes code that ships in a model folder" in p.message
    assert p.allowed.startswith("a model folder whose config.json has no auto_map")
    assert not (tmp_path / "remote.ran").exists()


# ================================================================================ host: memory, cores
def _cpu_plan(monkeypatch, *, available_gib: float | None = None, cores: int = 2, dry_run: bool = False, **platform):
    if available_gib is not None:
        monkeypatch.setattr(cpu, "available_memory", lambda: int(available_gib * 2**30))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    nproc = platform.pop("nproc", 2)
    exp = _exp(
        platform={"name": "cpu", **platform},
        launcher={"kind": "local", "nproc_per_node": nproc},
        training={"seq_len": 64, "local_batch_size": 1},
        dry_run=dry_run,
    )
    return make_plan(exp, "/tmp/unused")


def test_per_process_runtime_times_ranks_must_fit_available_memory(monkeypatch):
    with pytest.raises(ConfigError) as e:
        _cpu_plan(monkeypatch, available_gib=3, cores=64, nproc=8, memory_per_rank_gib=1)
    (p,) = e.value.problems
    assert p.key == "launcher.nproc_per_node" and p.value == 8
    assert "per-process runtime" in p.message and "3.00 GiB available (MemAvailable" in p.message
    assert p.allowed == "at most 2 rank(s) on this host"  # 3 GiB: agent 0.86, launcher and 2 x 0.94 GiB ranks
    _cpu_plan(monkeypatch, available_gib=64, cores=64, nproc=8, memory_per_rank_gib=1)  # fits
    plan = _cpu_plan(monkeypatch, available_gib=3, cores=64, nproc=8, memory_per_rank_gib=1, dry_run=True)
    assert any(w.startswith("A REAL RUN IS REFUSED: launcher.nproc_per_node = 8") for w in plan.warnings)


@pytest.mark.slow  # quick tier: fresh interpreters import torch
def test_the_measured_runtime_per_rank_is_not_below_a_bare_import():
    """RANK_RUNTIME_BYTES was measured (qwen3exp/platforms/cpu.py); a process that only imports
    torch and torchtitan must hold less private memory than that."""
    script = (
        "import torch, torchtitan.trainer\n"
        "print('ANON', next(int(l.split()[1]) * 1024 for l in open('/proc/self/smaps_rollup')"
        " if l.startswith('Anonymous:')))"
    )
    if not Path("/proc/self/smaps_rollup").exists():
        pytest.skip("no /proc/self/smaps_rollup")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    anon = int(next(line for line in r.stdout.splitlines() if line.startswith("ANON")).split()[1])
    assert 100 * 2**20 < anon < cpu.RANK_RUNTIME_BYTES, anon / 2**20


def test_gross_cpu_oversubscription_is_refused(monkeypatch):
    with pytest.raises(ConfigError) as e:
        _cpu_plan(monkeypatch, available_gib=10_000, cores=2, nproc=64)
    (p,) = e.value.problems
    assert p.key == "launcher.nproc_per_node" and p.value == 64
    assert p.allowed == "ranks x threads per rank at most 8 (4 per core)"
    plan = _cpu_plan(monkeypatch, available_gib=10_000, cores=2, nproc=4)  # 2 threads per core: a warning
    assert any("4 ranks share 2 cpu device(s)" in w for w in plan.warnings)
    with pytest.raises(ConfigError) as e:
        _cpu_plan(monkeypatch, available_gib=10_000, cores=2, nproc=1, threads_per_rank=16)
    assert _keys(e.value.problems) == ["platform.threads_per_rank"]
    plan = _cpu_plan(monkeypatch, available_gib=10_000, cores=2, nproc=64, dry_run=True)
    assert any(
        "A REAL RUN IS REFUSED: launcher.nproc_per_node = 64" in w and "threads per core" in w for w in plan.warnings
    )


def test_host_is_not_checked_for_ranks_that_run_elsewhere(monkeypatch):
    from qwen3exp.platforms import host_problems, resolve

    monkeypatch.setattr(cpu, "available_memory", lambda: 2**30)
    exp = _exp(platform={"name": "cpu"}, launcher={"kind": "slurm", "nproc_per_node": 64})
    facts = resolve(exp.platform, nproc_per_node=64)
    assert host_problems(exp, facts, ranks=64, plan_bytes_per_rank=2**20) == []
    exp = _exp(platform={"name": "cpu"}, launcher={"kind": "local", "nproc_per_node": 64})
    assert host_problems(exp, facts, ranks=64, plan_bytes_per_rank=2**20)


def test_dry_run_cli_says_64_ranks_do_not_fit_this_host(tmp_path):
    r = run_cli("platform=cpu", "launcher.nproc_per_node=64", "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr[-2000:]
    cores = len(os.sched_getaffinity(0))
    if 64 > cpu.OVERSUBSCRIPTION_LIMIT * cores:
        assert "A REAL RUN IS REFUSED: launcher.nproc_per_node = 64" in r.stdout + r.stderr


@pytest.mark.parametrize(
    "files,fraction,refused",
    [
        ({"a.jsonl": b'{"text": "a"}\n{"text": "b"}\n'}, 0.9, True),  # 2 of 2 held out
        ({"a.jsonl": b'{"text": "a"}\n'}, 0.1, True),  # one document: no side to spare
        ({"a.txt": b"one\n\ntwo\n\nthree\n"}, 0.5, False),  # 2 of 3 paragraphs: one trains
        ({"a.txt": b"one\n\ntwo\n"}, 0.9, True),
        ({"a.jsonl": b'{"text": "a"}\n{"text": "b"}\n'}, 0.2, False),
    ],
)
def test_a_split_that_leaves_nothing_to_train_is_refused(tmp_path, files, fraction, refused):
    """validation.fraction of too few documents: the ranks would raise it while building their data
    loaders (`held_out`, shared with them); the plan refuses it, naming validation.fraction."""
    from qwen3exp.data.files import document_count, held_out

    _write(tmp_path / "d", files)
    exp = _exp(data={"source": "local", "path": str(tmp_path / "d")}, validation={"fraction": fraction})
    problems = data_files.data_problems(exp.data, exp.validation)
    assert _keys(problems) == (["validation.fraction"] if refused else []), problems
    n = document_count(tmp_path / "d")
    if not refused:
        assert 0 < len(held_out(n, fraction)) < n
