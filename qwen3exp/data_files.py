"""Pre-launch checks of the data an experiment reads (the model's files: `qwen3exp.model_files`):
the path exists and holds at least one text file the dataset loader reads. Cheap: no `datasets`
import, no file is opened.
"""

from __future__ import annotations

from pathlib import Path

from qwen3exp.errors import Problem, nearby_path


def data_problems(data) -> list[Problem]:
    """data.path exists and holds at least one readable text file."""
    from qwen3exp.titan.dataset import SUFFIXES  # plain constants; no torchtitan import

    match data.source:
        case "bundled":
            return []
        case "local":
            path = Path(data.path)
            allowed = f"an existing {' / '.join(SUFFIXES)} file or a folder holding such files"
            if not path.exists():
                return [Problem("data.path", data.path, "does not exist", allowed, nearby_path(path))]
            if path.is_file() and path.suffix not in SUFFIXES:
                return [Problem("data.path", data.path, f"unsupported file type {path.suffix or '(none)'}", allowed)]
            if path.is_dir() and next((f for f in path.rglob("*") if f.suffix in SUFFIXES and f.is_file()), None) is None:
                return [Problem("data.path", data.path, "the folder holds no data file", allowed)]
    return []
