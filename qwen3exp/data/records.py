"""The first records of one data file, checked as the loader will read them (see `qwen3exp.data.files`).

- every file: not empty, UTF-8;
- .txt (the "text" builder, one document per blank-line separated paragraph): some text that is not
  whitespace, no NUL bytes (a binary file);
- .jsonl / .json (the "json" builder): one JSON object per line holding the text field as a non-empty
  string, or a file that starts with `[` (a JSON array of such objects, or of strings when the field
  is "text"). Like `datasets` 4.7, blank lines and a byte-order mark are refused in the first file
  (its first block is parsed line by line), and accepted in the others (pyarrow skips them).
Bounded: the first `MAX_LINES` lines or `READ_BYTES` of the file (a first line longer than that is
read up to `MAX_LINE_BYTES`), then JSON lines record by record up to a byte budget (`check_rest`).
A check returns None (fine), a message naming the line, or a `Problem` when the text field itself is
wrong rather than the file.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path

from qwen3exp.errors import Problem, did_you_mean
from qwen3exp.units import MIB

MAX_LINES = 100
"""Records (lines, or array elements) checked per file."""
READ_BYTES = 1 * MIB
"""Bytes read per file (after the line that crosses this limit, reading stops)."""
MAX_LINE_BYTES = 16 * MIB
"""The longest line read whole (a longer one is checked for UTF-8 only)."""


def _head(path: Path) -> tuple[bytes, bool]:
    """(the first bytes of the file, whether that is all of it): whole lines up to READ_BYTES, at
    least the first line up to MAX_LINE_BYTES."""
    with open(path, "rb") as f:
        data = f.read(READ_BYTES)
        if len(data) == READ_BYTES:
            if b"\n" not in data:  # one long first line: read it whole, up to the cap
                data += f.readline(MAX_LINE_BYTES - READ_BYTES)
            else:
                data += f.readline(MAX_LINE_BYTES)  # finish the line that crosses the limit
        return data, f.read(1) == b""


def _utf8_error(data: bytes, complete: bool) -> str | None:
    """'line N: ...' when `data` is not UTF-8 (a character cut at the end of a partial read is fine)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(data, final=complete)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return f"line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); is it a binary file?"
    return None


def _readable_head(path: Path) -> tuple[bytes, bool, str | None]:
    """(the file's first bytes, whether that is all of it, what makes it unreadable as text or None)."""
    data, complete = _head(path)
    if not data:
        return data, complete, "the file is empty"
    return data, complete, _utf8_error(data, complete)


def check_text(path: Path) -> str | None:
    """A .txt file of a folder of .txt files: UTF-8 text, no NUL bytes, not only whitespace."""
    data, complete, bad = _readable_head(path)
    if bad:
        return bad
    if b"\x00" in data:
        line = data.count(b"\n", 0, data.index(b"\x00")) + 1
        return f"line {line}: holds NUL bytes; is it a binary file?"
    if complete and not data.strip():
        return "holds only whitespace: no text to train on"
    return None


def check_json(path: Path, field: str, *, first: bool, budget: int) -> str | Problem | None:
    """A JSON lines (or JSON array) file: its head record by record, then up to `budget` bytes more
    (`first`: the first file of the data, where the loader refuses blank lines and a byte-order mark)."""
    data, complete, bad = _readable_head(path)
    if bad:
        return bad
    if data.startswith(b"\xef\xbb\xbf"):
        if first:
            return (
                "line 1: starts with a UTF-8 byte-order mark, which the JSON loader rejects in the first "
                "file; save it as UTF-8 without BOM"
            )
        data = data[3:]
    text = data.decode("utf-8", errors="ignore")  # valid, except maybe a character cut at the end
    if data.startswith(b"["):
        return _check_array(text, complete, field)
    lines = text.split("\n")
    if not complete:
        lines = lines[:-1] or lines  # the last line may be cut short; a single long line is checked as far as read
    records, checked = 0, 0
    for number, line in enumerate(lines, 1):
        if records >= MAX_LINES:
            break
        checked = number
        if not line.strip():
            if number == len(lines) and line == "":
                continue  # the newline that ends the last line
            if first:
                return f"line {number} is blank: the JSON loader rejects blank lines in the first file"
            continue
        if not complete and number == len(lines) and len(data) >= MAX_LINE_BYTES:
            return (
                f"line {number} is longer than {MAX_LINE_BYTES // MIB} MiB: one record that large is refused "
                "(its JSON cannot be checked before the ranks read it)"
            )
        records += 1
        found = _check_record(line, number, field)
        if found is not None:
            return found
    if records == 0:
        return "holds no JSON record (only blank lines)"
    return check_rest(path, checked, field, budget)


def check_rest(path: Path, lines_before: int, field: str, budget: int) -> str | Problem | None:
    """Every record after the first `lines_before` lines, up to `budget` bytes: valid JSON holding
    the text field, no line longer than `MAX_LINE_BYTES` (json.loads without the duplicate-key hook:
    C speed; the head's records are checked for duplicate keys)."""
    with open(path, "rb") as f:
        for _ in range(lines_before):
            f.readline()
        number, read = lines_before, 0
        while read < budget:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return None
            number += 1
            read += len(raw)
            if len(raw) > MAX_LINE_BYTES:
                return (
                    f"line {number} is longer than {MAX_LINE_BYTES // MIB} MiB: one record that large is "
                    "refused (its JSON cannot be checked before the ranks read it)"
                )
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except UnicodeDecodeError:
                return f"line {number}: not UTF-8 text; is it a binary file?"
            except json.JSONDecodeError as e:
                return f"line {number}: not valid JSON ({e.msg} at column {e.colno})"
            found = _check_value(record, f"line {number}", field)
            if found is not None:
                return found if isinstance(found, str) else found.message
    return None


def _check_record(line: str, number: int, field: str) -> str | Problem | None:
    try:
        record = json.loads(line, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        return f"line {number}: key {e.args[0]!r} appears twice in one object, which the JSON loader rejects"
    except json.JSONDecodeError as e:
        what = "two JSON values on one line" if e.msg == "Extra data" else e.msg
        return f"line {number}: not valid JSON ({what} at column {e.colno})"
    return _check_value(record, f"line {number}", field)


def _check_value(record, where: str, field: str) -> str | Problem | None:
    if not isinstance(record, dict):
        return f'{where}: a JSON {_json_type(record)}, not an object {{"{field}": ...}}'
    if field not in record:
        keys = [str(k) for k in record]
        if where in ("line 1", "element 1"):  # the very first record: the field name is the mistake
            return Problem(
                "data.text_field",
                field,
                f"the first record ({where}) has no key {field!r} (its keys: {', '.join(keys) or 'none'})",
                "a key of every record that holds its text",
                did_you_mean(field, keys),
            )
        return f"{where}: has no key {field!r} (its keys: {', '.join(keys) or 'none'})"
    value = record[field]
    if not isinstance(value, str):
        return f"{where}: {field!r} is a JSON {_json_type(value)}, not a string"
    if not value:
        return f"{where}: {field!r} is an empty string"
    return None


def _check_array(text: str, complete: bool, field: str) -> str | Problem | None:
    """A file that starts with '[': the JSON loader reads it whole as a list of objects, or of strings
    (which it names "text"). The elements read so far are checked one by one."""
    decoder = json.JSONDecoder(object_pairs_hook=_no_duplicates)
    pos, n, strings = 1, 0, False
    while n < MAX_LINES:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            return "the JSON array is not closed" if complete else None
        if text[pos] == "]":
            return "holds an empty JSON array" if n == 0 else None
        try:
            element, pos = decoder.raw_decode(text, pos)
        except _DuplicateKey as e:
            return f"element {n + 1}: key {e.args[0]!r} appears twice in one object, which the JSON loader rejects"
        except json.JSONDecodeError as e:
            # An element cut by the end of what was read fails at the end, or as a string that never
            # ends (reported where the string starts); within a file's first bytes neither can happen.
            if not complete and (e.pos >= len(text) - 1 or e.msg.startswith("Unterminated string")):
                return None
            return f"line {e.lineno}: not valid JSON ({e.msg} at column {e.colno})"
        n += 1
        if n == 1 and isinstance(element, str):
            strings = True
            if field != "text":
                return f'is a JSON array of strings, which the loader names "text", but data.text_field is {field!r}'
        if strings:
            if not isinstance(element, str):
                return f"element {n}: a JSON {_json_type(element)} in an array of strings"
            if not element:
                return f"element {n}: an empty string"
            continue
        found = _check_value(element, f"element {n}", field)
        if found is not None:
            return found
    return None


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    # pyarrow's JSON reader refuses "Column(/text) was specified twice"; Python keeps the last value.
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _json_type(value) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "boolean"
        case int() | float():
            return "number"
        case str():
            return "string"
        case list():
            return "array"
        case dict():
            return "object"
    return type(value).__name__
