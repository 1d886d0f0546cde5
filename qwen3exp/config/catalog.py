"""`qwen3exp ls` and `qwen3exp cp`: the experiments there are, and a packaged one as a start of your own.

- `ls [-cd DIR ...]`: every experiment, the packaged ones (qwen3exp/conf/experiment) and yours
  (DIR/experiment; without -cd, ./conf/experiment when it exists), each with the first line of the
  comment at the top of its file. Only file names and comments are read: no Hydra composition, no
  torch, so it answers at once. A file of yours that a launch would refuse (`config.file_limits`: a
  YAML error, a link that loops, a FIFO, over 1 MiB) is listed as broken, with why.
- `cp NAME [NEW] [-cd DIR]`: the packaged experiment NAME copied to conf/experiment/NEW.yaml (with -cd:
  DIR/experiment/NEW.yaml), its `name:` line set to NEW and every comment kept; then the command that
  plans it. NEW defaults to my_NAME, not NAME: a file of yours with a packaged experiment's name
  comes after the packaged one in Hydra's search path, so Hydra ignores it and every launch with your
  folder is refused (`config.choices.shadowed`). Nothing is overwritten.
Mistakes exit 2 with what is allowed; nothing is written then.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from qwen3exp.config.argv import CONF_DIR
from qwen3exp.config.file_limits import file_problem
from qwen3exp.errors import EXIT_CONFIG_ERROR, nearby_path, printable

PACKAGED = CONF_DIR / "experiment"
DEFAULT_DIR = Path("conf")
"""The user's config folder when no -cd is given (`qwen3exp init` writes it)."""
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
"""An experiment name that is a file name, a Hydra option and a run's `name` (schema: [A-Za-z0-9._=,+-])."""
_NAME_LINE = re.compile(r"^name:[ \t]*[^\s#]*", re.MULTILINE)
"""The top-level `name:` line up to its value's end (a comment after it is kept)."""
_RUN_LINE = re.compile(r"^# (?:python -m )?qwen3exp experiment=.*$", re.MULTILINE)
"""A packaged file's header line that says how to run it."""
_COMMAND_COMMENT = ("python -m qwen3exp", "qwen3exp ", "Run:", "Plan:")
"""Comment lines that show how to run the file rather than say what it is."""
LS_USAGE = "usage: qwen3exp ls [-cd DIR]"
CP_USAGE = "usage: qwen3exp cp NAME [NEW] [-cd DIR]   (NEW defaults to my_NAME)"


class _Refused(Exception):
    """A mistake on the command line of ls or cp: the message, exit 2."""


def description(path: Path) -> str:
    """What the experiment is: the first comment line at the top of its file that is neither
    `# @package` nor a command line (packaged files start with `# python -m qwen3exp experiment=...`,
    then `# Why: ...`), without a `Why:`; else the first comment line; else nothing."""
    comments = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.startswith("#"):
                    break
                text = line.lstrip("#").strip()
                if text and not text.startswith("@package"):
                    comments.append(text)
    except OSError as e:
        return f"(unreadable: {e.strerror})"
    said = [c for c in comments if not c.startswith(_COMMAND_COMMENT)] or comments
    return said[0].removeprefix("Why:").strip() if said else ""


def experiments(folder: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}


def _options(argv: list[str], usage: str) -> tuple[list[str], list[Path]]:
    """The words and the -cd/--config-dir folders of `argv`."""
    words, dirs = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        if flag in ("-cd", "--config-dir"):
            if not eq:
                i += 1
                if i == len(argv):
                    raise _Refused(f"{flag} needs a folder\n{usage}")
                value = argv[i]
            dirs.append(Path(value).expanduser())
        elif arg.startswith("-"):
            raise _Refused(f"unknown option {arg}\n{usage}")
        else:
            words.append(arg)
        i += 1
    return words, dirs


def _is_packaged(folder: Path) -> bool:
    """The packaged experiment folder itself (./conf/experiment in qwen3exp's source tree)."""
    return folder.resolve() == PACKAGED.resolve()


def _cd(folder: Path) -> str:
    return shlex.quote(str(folder))


def ls(argv: list[str]) -> str:
    words, dirs = _options(argv, LS_USAGE)
    if words:
        raise _Refused(f"ls takes no names ({' '.join(words)})\n{LS_USAGE}")
    for d in dirs:
        if not d.is_dir():
            near = nearby_path(d.resolve())
            raise _Refused(f"-cd {d}: no such folder" + (f"; {near}" if near else ""))
    if not dirs and (DEFAULT_DIR / "experiment").is_dir() and not _is_packaged(DEFAULT_DIR / "experiment"):
        dirs = [DEFAULT_DIR]
    packaged = experiments(PACKAGED)
    rows: list[tuple[str, str, str, str | None]] = [(n, "packaged", description(p), None) for n, p in packaged.items()]
    for d in dirs:
        for name, path in experiments(d / "experiment").items():
            if _is_packaged(path.parent):
                continue
            note = None
            if (broken := file_problem(path)) is not None:  # a FIFO is never opened (it would block)
                note = f"broken: {broken.message}; a launch with experiment={name} is refused"
                rows.append((name, "yours (!)", "", note))
                continue
            if name in packaged:
                note = (
                    f"{path} has a packaged experiment's name: Hydra reads the packaged one, and a launch "
                    f"with -cd {_cd(d)} is refused; rename it (e.g. my_{name}.yaml)"
                )
            rows.append((name, "yours" if note is None else "yours (!)", description(path), note))
    width = max(len(r[0]) for r in rows) if rows else 4
    room = max(shutil.get_terminal_size((120, 24)).columns - width - 16, 30)
    lines = [f"experiments: {len(packaged)} packaged ({PACKAGED})"]
    lines += ["  run one: qwen3exp experiment=NAME dry_run=true   copy one: qwen3exp cp NAME [NEW]"]
    for d in dirs:
        lines.append(f"  yours in {d / 'experiment'}: qwen3exp -cd {_cd(d)} experiment=NAME dry_run=true")
    if not dirs:
        why = "is qwen3exp's own: its source tree" if _is_packaged(DEFAULT_DIR / "experiment") else "does not exist"
        lines.append(f"  yours: none ({DEFAULT_DIR / 'experiment'} {why}; -cd DIR for a folder of yours)")
    for name, where, text, note in rows:
        shown = text if len(text) <= room else text[: room - 3] + "..."
        lines.append(f"  {name:<{width}}  {where:<9}  {printable(shown)}")
        if note:
            lines.append(f"  {'':<{width}}  ! {printable(note)}")
    return "\n".join(lines)


def cp(argv: list[str]) -> str:
    """Copy; the lines to print (what was written, the command that plans it)."""
    words, dirs = _options(argv, CP_USAGE)
    if not words or len(words) > 2 or len(dirs) > 1:
        raise _Refused(CP_USAGE)
    packaged = experiments(PACKAGED)
    name = words[0].removesuffix(".yaml")
    if name not in packaged:
        close = difflib.get_close_matches(name, list(packaged), n=1, cutoff=0.6)
        maybe = f"; did you mean {close[0]}?" if close else ""
        raise _Refused(f"no packaged experiment {name!r}{maybe}\n  packaged: {', '.join(packaged)}")
    new = words[1].removesuffix(".yaml") if len(words) > 1 else f"my_{name}"
    if not _NAME.match(new):
        raise _Refused(f"{new!r} is not an experiment name: letters, digits, _ . + - (no /), not starting with . + -")
    if new in packaged:
        raise _Refused(
            f"{new!r} is a packaged experiment's name: Hydra would read the packaged one and refuse your "
            f"folder; choose another name (e.g. qwen3exp cp {name} my_{new})"
        )
    folder = dirs[0] if dirs else DEFAULT_DIR
    target = folder / "experiment" / f"{new}.yaml"
    if _is_packaged(target.parent):
        raise _Refused(
            f"{target.parent} is qwen3exp's packaged experiment folder (this is its source tree); "
            "copy into a folder of your own: qwen3exp cp NAME [NEW] -cd DIR"
        )
    if os.path.lexists(target):
        raise _Refused(f"{target} exists; nothing was written (qwen3exp cp never overwrites: choose another NEW)")
    text, n = _NAME_LINE.subn(f"name: {new}", packaged[name].read_text(encoding="utf-8"), count=1)
    if n == 0:
        text = text.rstrip("\n") + f"\nname: {new}\n"
    # The packaged header's run line would run the packaged experiment, not the copy.
    text = _RUN_LINE.sub(f"# qwen3exp -cd {_cd(folder)} experiment={new}   (copied from {name})", text, count=1)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "x", encoding="utf-8") as f:  # exclusive: never overwrite, even a file just made
            f.write(text)
    except OSError as e:
        raise _Refused(f"nothing written: {e.filename or target}: {e.strerror or type(e).__name__}") from None
    return f"  wrote  {target}  (from packaged {name})\nnext: qwen3exp -cd {_cd(folder)} experiment={new} dry_run=true"


def _run(what, argv: list[str], command: str, usage: str) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{usage}\n\n{__doc__}")
        return 0
    try:
        print(what(argv))
    except _Refused as e:
        print(f"qwen3exp {command}: {printable(str(e))}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return 0


def main_ls(argv: list[str]) -> int:
    return _run(ls, argv, "ls", LS_USAGE)


def main_cp(argv: list[str]) -> int:
    return _run(cp, argv, "cp", CP_USAGE)
