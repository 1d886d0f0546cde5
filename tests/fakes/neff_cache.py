"""A FAKE compile for contract tests: store a NEFF the way TorchNeuron's persistent cache does.

torch-neuronx's PersistentCacheBackend (the native stack) keeps each compiled graph under
TORCH_NEURONX_NEFF_CACHE_DIR as `<dir>/<key[0:2]>/<key[2:4]>/<key>.neff`, the key a hash of the graph,
written to a temporary file in the same folder and renamed (atomic for concurrent processes).
This module does only that, with no torch import, so the pytest process may use it (unlike the
fake `torch_neuronx` package beside it).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def compile_into(cache_dir: str | os.PathLike, graph: bytes = b"fake HLO module") -> Path:
    """Put the "NEFF" of `graph` into the cache folder, as a finished compile would; returns its path.
    An entry already there is left as it is (the cache is content-addressed: same graph, same bytes)."""
    key = hashlib.sha256(graph).hexdigest()
    path = Path(cache_dir) / key[:2] / key[2:4] / f"{key}.neff"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(b"NEFF" + graph)
    Path(tmp.name).rename(path)
    return path
