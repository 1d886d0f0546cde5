"""The package is laid out by pipeline stage, and imports point only backwards along the pipeline.

An experiment goes through these stages, in this order (the rank of each package, lowest first):
  0  errors, units, assets   plain helpers and the data shipped with qwen3exp
  1  config                  text (conf/, the command line) -> one validated, frozen `Experiment`
  2  platforms, kernels      the device facts of the chosen platform; the kernels the ranks call
  3  run                     the run directory, claims, identity, processes, provenance, the agent
  4  plan                    what will run (mesh, memory, files, placement, tracking, the torchrun
                             command, the checkpoint verdict against the run directory), checked
                             before launch
  5  analysis                reports, diffs and relaunches of finished runs
  6  titan                   the torchtitan adapter: the ONLY package that imports torchtitan
  7  worker                  a rank's entry point (torchrun starts it)
  8  launchers               local, SLURM and sweeps
  9  cli, api, scaffold, help, __main__, hydra_plugins   the front ends
A module may import a module of its own rank or a lower one, at top level or lazily inside a
function (a lazy import is still a dependency: it runs whenever that code path does). So each stage
can be read, tested and imported without the later ones, and the front end, the config and a dry
run never load torch or torchtitan.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("qwen3exp", "hydra_plugins")
"""The first-party packages whose imports are ranked (hydra_plugins may not exist yet)."""

RANKS: dict[str, int] = {
    "qwen3exp.errors": 0,
    "qwen3exp.units": 0,
    "qwen3exp.assets": 0,
    "qwen3exp.config": 1,
    "qwen3exp.platforms": 2,
    "qwen3exp.kernels": 2,
    "qwen3exp.run": 3,
    "qwen3exp.plan": 4,
    "qwen3exp.analysis": 5,
    "qwen3exp.titan": 6,
    "qwen3exp.worker": 7,
    "qwen3exp.launchers": 8,
    "qwen3exp.cli": 9,
    "qwen3exp.api": 9,
    "qwen3exp.scaffold": 9,
    "qwen3exp.help": 9,
    "qwen3exp.__main__": 9,
    "hydra_plugins": 9,
}
"""A module's rank is that of the longest dotted prefix listed (qwen3exp.plan.memory: qwen3exp.plan)."""
PACKAGE_ROOT = "qwen3exp"
"""qwen3exp/__init__.py (empty) has rank 0 but ranks nothing below it: a new top-level module needs an entry."""

TORCHTITAN_HOME = "qwen3exp.titan"


@dataclass(frozen=True)
class Edge:
    path: str
    """The importing file, relative to the repository."""
    line: int
    source: str
    """The importing module (qwen3exp.plan.memory)."""
    target: str
    """What it imports: a module, or module.name for `from module import name`."""
    type_checking: bool
    """Inside an `if TYPE_CHECKING:` block (never executed)."""


def rank(module: str) -> int | None:
    """The rank of a first-party module (or of a name inside one); None: not in `RANKS`."""
    if module == PACKAGE_ROOT:
        return 0
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = RANKS.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def _files() -> list[Path]:
    return sorted(f for pkg in PACKAGES if (REPO / pkg).is_dir() for f in (REPO / pkg).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines of the bodies of `if TYPE_CHECKING:` blocks (not their else branches)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def _targets(node: ast.AST, package: str) -> list[str]:
    """What one import node imports. `from a.b import c` gives a.b.c (c may be a module or a name in
    a.b; the rank lookup handles both); relative imports are resolved against `package`; a call of
    importlib.import_module / __import__ with a literal string counts as an import of that string."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        return [f"{base}.{alias.name}" if alias.name != "*" else base for alias in node.names]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__"):
            return [node.args[0].value]
    return []


def edges() -> list[Edge]:
    """Every import in every first-party file, wherever it is (top level, functions, classes)."""
    found: list[Edge] = []
    for path in _files():
        tree = ast.parse(path.read_text(), filename=str(path))
        source = _module_name(path)
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        guarded = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.Call)):
                found += [Edge(str(path.relative_to(REPO)), node.lineno, source, target, node.lineno in guarded)
                          for target in _targets(node, package)]
    return sorted(found, key=lambda e: (e.path, e.line, e.target))


def _first_party(module: str) -> bool:
    """qwen3exp, or one of the plugins in this repository's hydra_plugins/ (a namespace package that
    installed plugins such as hydra_plugins.hydra_submitit_launcher share)."""
    parts = module.split(".")
    if parts[0] == "qwen3exp":
        return True
    plugins = REPO / "hydra_plugins"
    return parts[0] == "hydra_plugins" and len(parts) > 1 and plugins.is_dir() and (
        (plugins / parts[1]).is_dir() or (plugins / f"{parts[1]}.py").is_file())


def test_the_rank_table_covers_every_module():
    unranked = sorted({_module_name(p) for p in _files() if rank(_module_name(p)) is None}
                      | {e.target for e in edges() if _first_party(e.target) and rank(e.target) is None})
    assert not unranked, ("modules without a pipeline rank (add them to RANKS in tests/test_layout.py): "
                          + ", ".join(unranked))


def test_imports_point_backwards_along_the_pipeline():
    violations = []
    for e in edges():
        if not _first_party(e.target):
            continue
        # Exempt: an import under `if TYPE_CHECKING:` never runs; it only names a type for an
        # annotation (with `from __future__ import annotations`), so it adds no runtime dependency.
        if e.type_checking:
            continue
        a, b = rank(e.source), rank(e.target)
        if a is not None and b is not None and b > a:
            violations.append(f"{e.path}:{e.line} imports {e.target} (rank {a} -> rank {b})")
    assert not violations, "imports against the pipeline direction:\n" + "\n".join(violations)


def test_only_the_titan_package_imports_torchtitan():
    # TYPE_CHECKING imports count here too: the torchtitan API is version-specific, and every use of
    # it, annotations included, belongs in the one package that changes when torchtitan does.
    outside = [f"{e.path}:{e.line} imports {e.target}" for e in edges()
               if e.target.split(".")[0] == "torchtitan"
               and not (e.source == TORCHTITAN_HOME or e.source.startswith(TORCHTITAN_HOME + "."))]
    assert not outside, f"torchtitan imported outside {TORCHTITAN_HOME}:\n" + "\n".join(outside)


def test_the_front_end_and_the_config_do_not_load_torch():
    """`python -m qwen3exp --help`, composing and validating must stay fast and work without a
    device: importing the CLI and the schema loads neither torch nor torchtitan."""
    code = ("import json, sys\n"
            "import qwen3exp.cli, qwen3exp.config.schema\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchtitan'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not loaded, f"importing qwen3exp.cli and qwen3exp.config.schema loads {', '.join(loaded)}"


def test_the_checker_sees_lazy_relative_and_guarded_imports():
    """The import walk itself: imports inside functions, relative imports and TYPE_CHECKING blocks."""
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n"
                     "    from qwen3exp.cli import main\n"
                     "def f():\n"
                     "    from ..run import rundir\n"
                     "    import importlib; importlib.import_module('qwen3exp.worker.main')\n")
    found = [(t, node.lineno) for node in ast.walk(tree) if isinstance(node, (ast.ImportFrom, ast.Call))
             for t in _targets(node, "qwen3exp.plan")]
    assert ("qwen3exp.cli.main", 3) in found and ("qwen3exp.run.rundir", 5) in found
    assert ("qwen3exp.worker.main", 6) in found
    assert _type_checking_lines(tree) == {3}
    assert rank("qwen3exp.plan.memory.gib") == 4 and rank("qwen3exp.cli.main") == 9 and rank("numpy") is None
    assert rank("qwen3exp") == 0 and rank("qwen3exp.newstage") is None
    assert not _first_party("hydra_plugins.hydra_submitit_launcher.submitit_launcher")
