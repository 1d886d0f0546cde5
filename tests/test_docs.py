"""README.md and docs/: the front page stays a front page, every link lands, the key reference is
what the schema says, and every command shown still works.

Every ```bash block of the README and of docs/*.md runs with `bash -euo pipefail` in a temporary
folder (a user's repository) with this checkout's installed `qwen3exp` on PATH; a block right after
an `<!-- illustration -->` comment is left out (installs, clusters, Trainium, GPUs, downloads). A
page's blocks run in order as one shell session (a `cd` or a file written by one block is there for
the next). The README's tour runs in an empty folder; the docs of `AFTER_TOUR` run in a copy of the
folder it left (`outputs/first`: a 2-step run with a Hugging Face export), every other doc in an
empty folder of its own. A renamed command fails here, naming the page and the line of its block.
The pages run two at a time (`runs`), in the full tier (marked slow).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO
from docs_keys import entries, render
from qwen3exp import cli

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
ILLUSTRATION = "<!-- illustration -->"
AFTER_TOUR = {"reports.md", "huggingface.md"}
"""Docs whose blocks start from the README tour's `outputs/first` (and so need its training)."""
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced blocks and inline code (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not re.match(r"[a-z]+:", t)]


def bash_blocks(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every bash block that is not an illustration."""
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) == "bash" and not text[: m.start()].rstrip().endswith(ILLUSTRATION):
            out.append((text.count("\n", 0, m.start()) + 1, m.group(2)))
    return out


def test_the_readme_is_a_front_page():
    lines = len(README.read_text().splitlines())
    assert lines <= 300, f"README.md has {lines} lines; move a topic into docs/ (at most 300)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_lands(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_every_doc_is_linked_from_the_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(README) if t.partition("#")[0]}
    missing = [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked]
    assert not missing, f"docs not linked from README.md's table: {missing}"


def test_configuration_md_is_what_the_schema_says():
    assert (DOCS / "configuration.md").read_text() == render(), (
        "docs/configuration.md is stale: run .venv/bin/python tests/docs_keys.py > docs/configuration.md"
    )


UNDOCUMENTED: set[str] = set()
"""Keys whose field has no docstring (none: a new key comes with its docstring)."""


def test_every_new_key_has_a_docstring():
    missing = {key for _, key, _, _, doc in entries() if not doc} - UNDOCUMENTED
    assert not missing, (
        f"keys without a docstring in qwen3exp/config/sections/ (their documentation): {sorted(missing)}"
    )


def test_every_command_is_in_the_command_table():
    table = (DOCS / "terminal.md").read_text()
    missing = [c for c in (*cli.COMMANDS, "relaunch") if f"`qwen3exp {c}" not in table]
    assert not missing, f"commands missing from docs/terminal.md's table (## Every command): {missing}"


def run_page(page: Path, cwd: Path, timeout: float = 900) -> None:
    """Run a page's bash blocks in order, as one shell session in `cwd`."""
    script = "\n".join(f"echo '>>> {page.name}:{line}' >&2\n{body}" for line, body in bash_blocks(page))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    where = re.findall(r">>> (\S+)", proc.stderr)
    assert proc.returncode == 0, (
        f"{page.relative_to(REPO)}: the block at {where[-1] if where else '?'} failed (exit {proc.returncode}):\n"
        f"{(proc.stdout + proc.stderr)[-4000:]}"
    )


RUNS = [p for p in PAGES[1:] if bash_blocks(p)]
"""The docs with a bash block to run."""


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> Iterator[dict[str, Future]]:
    """Every selected page's blocks, started at once two at a time (each is mostly one process on one
    core, and this machine has two): README.md first, the docs that need its tour after it."""
    assert (Path(sys.executable).parent / "qwen3exp").exists(), "run the tests with the venv's python"
    runners = ("test_the_readme_tour_runs", "test_every_bash_block_of_a_doc_runs")
    names = {i.callspec.params["page"].name for i in request.session.items if i.originalname in runners}
    tour = tmp_path_factory.mktemp("tour")

    def after_tour(page: Path) -> None:
        futures[README.name].result()
        repo = tmp_path_factory.mktemp(page.stem)
        shutil.copytree(tour, repo, symlinks=True, dirs_exist_ok=True)
        run_page(page, repo)

    pool = ThreadPoolExecutor(max_workers=2)
    futures: dict[str, Future] = {}
    if names & (AFTER_TOUR | {README.name}):
        futures[README.name] = pool.submit(run_page, README, tour)
    for page in RUNS:
        if page.name in names and page.name not in AFTER_TOUR:
            futures[page.name] = pool.submit(run_page, page, tmp_path_factory.mktemp(page.stem))
    for page in RUNS:
        if page.name in names and page.name in AFTER_TOUR:
            futures[page.name] = pool.submit(after_tour, page)
    yield futures
    pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("page", [README], ids=lambda p: p.name)
def test_the_readme_tour_runs(page, runs):
    runs[page.name].result()


@pytest.mark.slow  # the pages that train nothing too: real commands in fresh processes, 5-15 s a page
@pytest.mark.parametrize("page", RUNS, ids=lambda p: p.name)
def test_every_bash_block_of_a_doc_runs(page, runs):
    runs[page.name].result()
