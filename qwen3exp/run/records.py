"""Reading what a run directory or a user hands over (recorded YAML, JSON, JSON lines) as plain data,
with limits checked before anything is parsed.

A recorded file comes from elsewhere (a copied run, a teammate's folder, a download), so it is read
as data and never interpreted:
- only a regular file is read: it is opened with O_NONBLOCK (opening a FIFO then returns at once
  instead of waiting for a writer forever) and checked with fstat (a FIFO, a device, a folder are
  refused); a dangling link is named as one;
- at most `limit` bytes are read (a 50 MB file is refused by its size, before reading);
- YAML is scanned token by token (a flat loop) and refused beyond MAX_YAML_TOKENS tokens or
  MAX_DEPTH levels before a node is composed (composing recurses: a 10,000-deep `[[[...` would
  overflow the stack); the composed node graph is then measured with every alias expanded (a 1 kB
  anchor bomb expands to billions of nodes) and refused beyond MAX_NODES nodes, MAX_DEPTH levels or
  a recursive alias, before anything is constructed; the safe loader builds only plain types;
- JSON is parsed by the standard decoder (no hooks) and walked for depth and size (the readers
  of a run recurse through it: `rundir.flatten`);
- no resolver and no interpolation: a string `${oc.env:X}` is that string.
`Unreadable` says why a file is not read; callers turn it into exit 2 with the path named.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

MAX_YAML_BYTES = 1 << 20
"""A run's recorded YAML (Hydra's config.yaml, experiment.yaml) is a few kB."""
MAX_YAML_TOKENS = 50_000
"""... a few thousand tokens; the cap bounds the composing time of the largest accepted file."""
MAX_JSON_BYTES = 16 << 20
"""summary.json, provenance.json, plan.json: at most a few MB (provenance lists up to 500 files)."""
MAX_NODES = 1_000_000
MAX_DEPTH = 64
"""A recorded experiment nests 3 or 4 levels; JSON from a run at most 6."""
MAX_LINE_BYTES = 64 << 10
"""One metrics.jsonl row is about 300 bytes."""
MAX_JSONL_BYTES = 256 << 20
"""metrics.jsonl of a million logged steps."""
MAX_TEXT_BYTES = 64 << 20
"""Text compared as it is (git.diff)."""


class Unreadable(Exception):
    """A file that exists but is not read as data: `why` says what it is instead."""

    def __init__(self, path: Path, why: str) -> None:
        self.path, self.why = Path(path), why
        super().__init__(f"{path}: {why}")


def _open(path: Path) -> int | None:
    """A descriptor of the regular file at `path`; None when there is no entry at all."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if os.path.islink(path):
            raise Unreadable(path, f"a link to {os.readlink(path)}, which does not exist") from None
        return None
    except OSError as e:
        raise Unreadable(path, _os_why(e)) from None
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        what = {
            stat.S_IFIFO: "a FIFO (named pipe)",
            stat.S_IFDIR: "a folder",
            stat.S_IFCHR: "a device",
            stat.S_IFBLK: "a device",
            stat.S_IFSOCK: "a socket",
        }.get(kind, "not a plain file")
        raise Unreadable(path, f"{what}, not a file")
    return fd


def _os_why(e: OSError) -> str:
    return {
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ELOOP: "a loop of links",
        errno.ENOTDIR: "a part of the path is a file",
    }.get(e.errno or 0, e.strerror or type(e).__name__)


def read_bytes(path: Path, limit: int) -> bytes | None:
    """The file's bytes (None: no such file); Unreadable when it is no regular file or holds more
    than `limit` bytes."""
    fd = _open(path)
    if fd is None:
        return None
    try:
        if (size := os.fstat(fd).st_size) > limit:
            raise Unreadable(path, f"{_size(size)}, more than a recorded file holds (at most {_size(limit)})")
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew while being read
                raise Unreadable(path, f"more than {_size(limit)}")
        return b"".join(chunks)
    except OSError as e:
        raise Unreadable(path, _os_why(e)) from None
    finally:
        os.close(fd)


def read_head(path: Path, n: int) -> bytes:
    """The first `n` bytes of the regular file at `path` (b"" when there is none)."""
    fd = _open(path)
    if fd is None:
        return b""
    try:
        return os.read(fd, n)
    except OSError as e:
        raise Unreadable(path, _os_why(e)) from None
    finally:
        os.close(fd)


def read_text(path: Path, limit: int = MAX_TEXT_BYTES) -> str | None:
    data = read_bytes(path, limit)
    return None if data is None else _decode(path, data)


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Unreadable(path, f"not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})") from None


def load_yaml(path: Path, limit: int = MAX_YAML_BYTES) -> Any:
    """The plain data of a YAML file (None: no such file, or an empty one)."""
    text = read_text(path, limit)
    return None if text is None else parse_yaml(text, path)


def parse_yaml(text: str, path: Path) -> Any:
    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _scan(text, loader_class, path)
        loader = loader_class(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _measure_yaml(node, path)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Unreadable(path, f"not plain YAML: {first}") from None


_OPENS = (
    yaml.BlockMappingStartToken,
    yaml.BlockSequenceStartToken,
    yaml.FlowMappingStartToken,
    yaml.FlowSequenceStartToken,
)
_CLOSES = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)


def _scan(text: str, loader_class, path: Path) -> None:
    depth = 0
    for n, token in enumerate(yaml.scan(text, Loader=loader_class)):
        if n > MAX_YAML_TOKENS:
            raise Unreadable(path, f"more than {MAX_YAML_TOKENS:,} YAML tokens (a recorded file has a few thousand)")
        if isinstance(token, _OPENS):
            depth += 1
            if depth > MAX_DEPTH:
                raise Unreadable(path, f"nested deeper than {MAX_DEPTH} levels")
        elif isinstance(token, _CLOSES):
            depth -= 1


def _measure_yaml(root: yaml.Node, path: Path) -> None:
    """Nodes and depth of the document with every alias expanded, without expanding it: each node
    is visited once (an alias is the node it names), its expanded size and depth memoized."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        kids = _children(node)
        if not done:
            if id(node) in size:
                continue
            if id(node) in open_:
                raise Unreadable(path, "a recursive YAML alias (a node that contains itself)")
            open_.add(id(node))
            stack.append((node, True))
            for kid in kids:
                if id(kid) in open_:
                    raise Unreadable(path, "a recursive YAML alias (a node that contains itself)")
                if id(kid) not in size:
                    stack.append((kid, False))
            continue
        open_.discard(id(node))
        size[id(node)] = 1 + sum(size[id(k)] for k in kids)
        depth[id(node)] = 1 + max((depth[id(k)] for k in kids), default=0)
        if size[id(node)] > MAX_NODES:
            raise Unreadable(path, f"more than {MAX_NODES:,} values once its YAML aliases are expanded (an alias bomb)")
        if depth[id(node)] > MAX_DEPTH:
            raise Unreadable(path, f"nested deeper than {MAX_DEPTH} levels once its YAML aliases are expanded")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """The plain data of a JSON file (None: no such file)."""
    text = read_text(path, limit)
    return None if text is None else parse_json(text, path)


def parse_json(text: str, path: Path) -> Any:
    try:
        data = json.loads(text)
    except RecursionError:
        raise Unreadable(path, f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise Unreadable(path, f"not JSON: {e}") from None
    check_shape(data, path)
    return data


def check_shape(data: Any, path: Path) -> None:
    """Unreadable when parsed data nests deeper than MAX_DEPTH or holds more than MAX_NODES values."""
    stack, count = [(data, 1)], 0
    while stack:
        value, level = stack.pop()
        count += 1
        if level > MAX_DEPTH:
            raise Unreadable(path, f"nested deeper than {MAX_DEPTH} levels")
        if count > MAX_NODES:
            raise Unreadable(path, f"more than {MAX_NODES:,} values")
        if isinstance(value, dict):
            stack.extend((v, level + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, level + 1) for v in value)


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, the line's data or an Unreadable saying why it is none: too long, not UTF-8,
    not JSON, too deep) for each non-blank line of a JSON-lines file; nothing when there is no such
    file. The file as a whole is Unreadable when it is no regular file or holds more than
    MAX_JSONL_BYTES."""
    fd = _open(path)
    if fd is None:
        return
    if (size := os.fstat(fd).st_size) > MAX_JSONL_BYTES:
        os.close(fd)
        raise Unreadable(path, f"{_size(size)}, more than {_size(MAX_JSONL_BYTES)}")
    with os.fdopen(fd, "rb") as f:
        number = 0
        while line := f.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass  # the rest of the long line
                yield number, Unreadable(path, f"a line longer than {_size(MAX_LINE_BYTES)}")
                continue
            if not line.strip():
                continue
            try:
                yield number, parse_json(_decode(path, line), path)
            except Unreadable as e:
                yield number, e


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"
