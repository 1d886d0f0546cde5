"""The safetensors a run loads at step 0: the files, their headers, every tensor the model needs.

A folder's safetensors (the index's files, else every *.safetensors) must be readable and complete,
hold every tensor of the architecture with its shape (`qwen3exp.config.hf_tensors`), in a
floating-point dtype, with finite values (`qwen3exp.plan.weight_values`). Each mistake is one
`Problem` naming the key the folder came from.
"""

from __future__ import annotations

import json
from pathlib import Path

from qwen3exp.config.flavors import Arch
from qwen3exp.config.hf_tensors import hf_param_shapes
from qwen3exp.errors import Problem
from qwen3exp.plan.model_ref import ModelRef
from qwen3exp.plan.model_sources import fetch_hint
from qwen3exp.plan.weight_values import FLOAT_DTYPES, nonfinite_tensors, tensor_entries
from qwen3exp.units import GIB, MIB

INDEX_JSON = "model.safetensors.index.json"
MAX_LISTED = 5
"""Missing or mis-shaped tensors listed one by one before the rest are counted."""


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
        return [folder / n for n in names if n not in missing], [
            f"{INDEX_JSON} names {n}, which does not exist" for n in missing
        ]
    return sorted(folder.glob("*.safetensors")), []


def read_headers(files: list[Path]) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Tensor name -> shape over all files, reading only the headers; a corrupt or truncated file
    is a problem (safetensors checks that the header covers the whole file)."""
    from safetensors import SafetensorError, safe_open  # lazy: only when weights are loaded

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


def _listed(names: list[str]) -> str:
    return ", ".join(names[:MAX_LISTED]) + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def _value_problems(key: str, folder: Path, files: list[Path], names: list[str]) -> list[Problem]:
    """The tensors the model loads: a floating-point dtype, and finite values."""
    entries = tensor_entries(files)
    wanted = [entries[n] for n in names if n in entries]
    problems = []
    ints = [f"{e.name} ({e.dtype})" for e in wanted if e.dtype not in FLOAT_DTYPES]
    if ints:
        problems.append(
            Problem(
                key,
                str(folder),
                f"tensors with a dtype that is not floating point: {_listed(ints)}",
                f"safetensors whose weights are {', '.join(FLOAT_DTYPES)}",
                "a quantised or integer checkpoint cannot be loaded as model weights; use the "
                "unquantised (bf16 / fp32) release",
            )
        )
    bad, scanned, total = nonfinite_tensors(wanted)
    if bad:
        how = (
            "every value" if scanned >= total else f"a fixed sample of {scanned / MIB:.0f} MiB of {total / GIB:.2f} GiB"
        )
        problems.append(
            Problem(
                key,
                str(folder),
                f"tensors holding NaN or Inf values: {_listed(bad)} (scanned {how})",
                "weights whose values are all finite",
                "the checkpoint is damaged or was saved after training diverged",
            )
        )
    return problems


def weights_problems(key: str, folder: Path, arch: Arch, *, exact: bool, ref: ModelRef | None = None) -> list[Problem]:
    """The folder's safetensors hold every tensor `arch` needs (`exact`: and no other), readable and finite."""
    if not folder.is_dir():
        return [Problem(key, str(folder), "folder does not exist", "a folder with *.safetensors")]
    files, msgs = safetensors_files(folder)
    if not files and not msgs:
        return [
            Problem(
                key,
                ref.value if ref else str(folder),
                "holds no *.safetensors to load" + (f" ({folder})" if ref and ref.is_hub else ""),
                "a folder with *.safetensors",
                fetch_hint(ref, "*.safetensors", INDEX_JSON),
            )
        ]
    shapes, bad = read_headers(files)
    msgs += bad
    if bad:  # names from a broken file are incomplete; do not add spurious 'missing' lines
        return [Problem(key, str(folder), m, "readable, complete safetensors files") for m in msgs]
    need = hf_param_shapes(arch)
    missing = [n for n in need if n not in shapes]
    wrong = [
        f"{n} {list(shapes[n])} (the model needs {list(need[n])})" for n in need if n in shapes and shapes[n] != need[n]
    ]
    extra = [n for n in shapes if n not in need and not (arch.tied and n == "lm_head.weight")]
    for what, names in (
        ("missing tensors", missing),
        ("tensors with the wrong shape", wrong),
        *((("tensors the model does not have", extra),) if exact else ()),
    ):
        if names:
            msgs.append(f"{what}: {_listed(names)}")
    problems = [
        Problem(
            key,
            str(folder),
            m,
            "a folder whose safetensors hold every tensor the model needs, with its shape",
            hint="the checkpoint does not match the model's dimensions",
        )
        for m in msgs
    ]
    try:
        problems += _value_problems(key, folder, files, [n for n in need if n in shapes])
    except (OSError, ValueError, KeyError, TypeError) as e:  # a header safetensors accepted but we cannot map
        problems.append(
            Problem(
                key, str(folder), f"safetensors data could not be read ({e})", "readable, complete safetensors files"
            )
        )
    return problems
