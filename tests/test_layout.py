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
  9  cli, api, scaffold, help, entry, completion(_keys), __main__, hydra_plugins   the front ends
A module may import a module of its own rank or a lower one, at top level or lazily inside a
function (a lazy import is still a dependency: it runs whenever that code path does). So each stage
can be read, tested and imported without the later ones, and the front end, the config and a dry
run never load torch or torchtitan.

Inside that order the code stays small and its dependencies visible (every check lists ALL its
offenders, so a failure is the list of what remains):
- no import cycle between first-party files (the rank table ranks packages, so it cannot see one);
- no product file over `MAX_FILE_LINES` lines, no function over `MAX_FUNCTION_LINES` lines;
- imports at the top of each module: inside a function only a heavy or optional library of
  `LAZY_LIBRARIES`, on a line marked `# lazy: <why>`;
- no comparison or `match` on platform or launcher names outside the variant's own module (the
  rule is spelled out in `test_platform_and_launcher_names_are_compared_only_in_their_own_module`).
Each file is parsed once (`_tree`), so the whole module runs in about two seconds.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.config.schema import Experiment

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
    "qwen3exp.objectives": 2,
    "qwen3exp.run": 3,
    "qwen3exp.plan": 4,
    "qwen3exp.data": 4,
    "qwen3exp.analysis": 5,
    "qwen3exp.titan": 6,
    "qwen3exp.worker": 7,
    "qwen3exp.launchers": 8,
    "qwen3exp.cli": 9,
    "qwen3exp.api": 9,
    "qwen3exp.scaffold": 9,
    "qwen3exp.help": 9,
    "qwen3exp.__main__": 9,
    "qwen3exp.entry": 9,
    "qwen3exp.completion": 9,
    "qwen3exp.completion_keys": 9,
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


@functools.cache
def _files() -> tuple[Path, ...]:
    return tuple(sorted(f for pkg in PACKAGES if (REPO / pkg).is_dir() for f in (REPO / pkg).rglob("*.py")))


@functools.cache
def _source(path: Path) -> str:
    return path.read_text()


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The parsed file: every check walks this one tree (parsing is most of this module's time)."""
    return ast.parse(_source(path), filename=str(path))


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


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
    if (
        isinstance(node, ast.Call)
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__"):
            return [node.args[0].value]
    return []


@functools.cache
def edges() -> tuple[Edge, ...]:
    """Every import in every first-party file, wherever it is (top level, functions, classes)."""
    found: list[Edge] = []
    for path in _files():
        tree = _tree(path)
        source = _module_name(path)
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        guarded = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.Call)):
                found += [
                    Edge(str(path.relative_to(REPO)), node.lineno, source, target, node.lineno in guarded)
                    for target in _targets(node, package)
                ]
    return tuple(sorted(found, key=lambda e: (e.path, e.line, e.target)))


def _first_party(module: str) -> bool:
    """qwen3exp, or one of the plugins in this repository's hydra_plugins/ (a namespace package that
    installed plugins such as hydra_plugins.hydra_submitit_launcher share)."""
    parts = module.split(".")
    if parts[0] == "qwen3exp":
        return True
    plugins = REPO / "hydra_plugins"
    return (
        parts[0] == "hydra_plugins"
        and len(parts) > 1
        and plugins.is_dir()
        and ((plugins / parts[1]).is_dir() or (plugins / f"{parts[1]}.py").is_file())
    )


def test_the_rank_table_covers_every_module():
    unranked = sorted(
        {_module_name(p) for p in _files() if rank(_module_name(p)) is None}
        | {e.target for e in edges() if _first_party(e.target) and rank(e.target) is None}
    )
    assert not unranked, "modules without a pipeline rank (add them to RANKS in tests/test_layout.py): " + ", ".join(
        unranked
    )


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
    outside = [
        f"{e.path}:{e.line} imports {e.target}"
        for e in edges()
        if e.target.split(".")[0] == "torchtitan"
        and not (e.source == TORCHTITAN_HOME or e.source.startswith(TORCHTITAN_HOME + "."))
    ]
    assert not outside, f"torchtitan imported outside {TORCHTITAN_HOME}:\n" + "\n".join(outside)


def test_the_front_end_and_the_config_do_not_load_torch():
    """`python -m qwen3exp --help`, composing and validating must stay fast and work without a
    device: importing the CLI and the schema loads neither torch nor torchtitan."""
    code = (
        "import json, sys\n"
        "import qwen3exp.cli, qwen3exp.config.schema\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchtitan'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not loaded, f"importing qwen3exp.cli and qwen3exp.config.schema loads {', '.join(loaded)}"


def test_the_checker_sees_lazy_relative_and_guarded_imports():
    """The import walk itself: imports inside functions, relative imports and TYPE_CHECKING blocks."""
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from qwen3exp.cli import main\n"
        "def f():\n"
        "    from ..run import rundir\n"
        "    import importlib; importlib.import_module('qwen3exp.worker.main')\n"
    )
    found = [
        (t, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, (ast.ImportFrom, ast.Call))
        for t in _targets(node, "qwen3exp.plan")
    ]
    assert ("qwen3exp.cli.main", 3) in found and ("qwen3exp.run.rundir", 5) in found
    assert ("qwen3exp.worker.main", 6) in found
    assert _type_checking_lines(tree) == {3}
    assert rank("qwen3exp.plan.memory.gib") == 4 and rank("qwen3exp.cli.main") == 9 and rank("numpy") is None
    assert rank("qwen3exp") == 0 and rank("qwen3exp.newstage") is None
    assert not _first_party("hydra_plugins.hydra_submitit_launcher.submitit_launcher")


# --- No import cycle between files ----------------------------------------------------------------


def _modules() -> dict[str, str]:
    """Every first-party module (a package is its __init__.py) -> its file, relative to the repository."""
    return {_module_name(p): _rel(p) for p in _files()}


def resolve_module(target: str, modules: Iterable[str]) -> str | None:
    """The first-party file an import target runs: the longest dotted prefix of `target` that is a
    module. `from qwen3exp.platforms import cpu` (target qwen3exp.platforms.cpu) is cpu.py; `from
    qwen3exp.platforms import resolve` is qwen3exp/platforms/__init__.py; None: not first-party."""
    known = set(modules)
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in known:
            return name
    return None


def import_graph(found: Iterable[Edge], modules: Iterable[str]) -> dict[str, dict[str, list[Edge]]]:
    """module -> the modules it imports -> the import statements that do, from every import wherever
    it is (a lazy import is a dependency too). Left out: `if TYPE_CHECKING:` imports (they never
    run), a module importing itself, and the implicit edge from a module to its parent packages
    (`import a.b.c` runs a/__init__.py too, but every submodule has that edge; only an import that
    names the package, `from a import name` or `import a`, is an edge to a/__init__.py)."""
    known = set(modules)
    graph: dict[str, dict[str, list[Edge]]] = {m: {} for m in sorted(known)}
    for e in found:
        target = resolve_module(e.target, known)
        if e.type_checking or target is None or target == e.source or e.source not in known:
            continue
        graph[e.source].setdefault(target, []).append(e)
    return graph


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit): each component
    sorted, the components sorted. A node named only as a target is a node without edges."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def enter(node: str) -> tuple[str, typing.Iterator[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return node, iter(sorted(graph.get(node, ())))

    for root in sorted(graph):
        if root in index:
            continue
        work = [enter(root)]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    work.append(enter(child))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while not component or component[-1] != node:
                    component.append(stack.pop())
                    on_stack.discard(component[-1])
                components.append(sorted(component))
    return sorted(components)


def import_cycles() -> list[str]:
    """Each import cycle between first-party files (a strongly connected component of more than one
    module) with the import statements inside it."""
    graph = import_graph(edges(), _modules())
    found = []
    for component in strongly_connected(graph):
        if len(component) < 2:
            continue
        members = set(component)
        lines = sorted(
            {
                (e.path, e.line, target)
                for source in component
                for target, imports in graph[source].items()
                if target in members
                for e in imports
            }
        )
        found.append(
            f"  {' <-> '.join(component)} ({len(component)} modules)\n"
            + "\n".join(f"    {path}:{line} imports {target}" for path, line, target in lines)
        )
    return found


def test_no_import_cycle_between_files():
    """A cycle makes the import order matter (a module half-initialised when the other one reads it)
    and hides behind function-level imports; move the shared piece down into a lower module."""
    cycles = import_cycles()
    assert not cycles, f"import cycles between files ({len(cycles)}):\n" + "\n".join(cycles)


def test_the_cycle_finder_on_a_small_graph():
    assert strongly_connected({"a": ["b"], "b": ["a", "c"], "c": ["d"], "d": ["c"], "e": []}) == [
        ["a", "b"],
        ["c", "d"],
        ["e"],
    ]
    assert strongly_connected({"a": ["b"], "b": ["c"], "c": ["a", "d"]}) == [["a", "b", "c"], ["d"]]
    # The package imports its submodule by name; the submodule imports a name from the package.
    modules = ["pkg", "pkg.cpu", "pkg.probe"]
    found = [
        Edge("pkg/__init__.py", 3, "pkg", "pkg.cpu", False),
        Edge("pkg/cpu.py", 5, "pkg.cpu", "pkg.resolve", False),
        Edge("pkg/probe.py", 2, "pkg.probe", "pkg.cpu.facts", True),
        Edge("pkg/cpu.py", 6, "pkg.cpu", "yaml", False),
    ]
    graph = import_graph(found, modules)
    assert graph == {"pkg": {"pkg.cpu": [found[0]]}, "pkg.cpu": {"pkg": [found[1]]}, "pkg.probe": {}}
    assert strongly_connected(graph) == [["pkg", "pkg.cpu"], ["pkg.probe"]]
    assert resolve_module("pkg.probe.x.y", modules) == "pkg.probe" and resolve_module("pkgx", modules) is None


# --- Small files, small functions -----------------------------------------------------------------

MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60

_FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef)


def functions(tree: ast.AST, prefix: str = "") -> typing.Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method with its qualified name (Class.method, outer.inner), nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, _FUNCTION):
            yield f"{prefix}{node.name}", node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """From the `def` line to the last line of the body (decorators excluded, the docstring included)."""
    return (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_product_file_is_over_300_lines():
    long = [f"  {_rel(p)}: {n} lines" for p in _files() if (n := len(_source(p).splitlines())) > MAX_FILE_LINES]
    assert not long, f"files over {MAX_FILE_LINES} lines ({len(long)}):\n" + "\n".join(long)


def test_no_function_is_over_60_lines():
    long = [
        f"  {_rel(p)}:{node.lineno} {name}(): {n} lines"
        for p in _files()
        for name, node in functions(_tree(p))
        if (n := function_lines(node)) > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines ({len(long)}):\n" + "\n".join(long)


def test_function_lengths_are_counted_from_the_def_line():
    tree = ast.parse("@decorator\nclass A:\n    def f(self):\n        def g():\n            pass\n        return g\n")
    assert [(name, function_lines(node)) for name, node in functions(tree)] == [("A.f", 4), ("A.f.g", 2)]


# --- Imports at the top -----------------------------------------------------------------------------

LAZY_LIBRARIES: dict[str, str] = {
    "torch": "a second to import; the front end, the config and a dry run never load it",
    "torch_neuronx": "the Neuron device stack: only on Trainium hosts, registers a device when imported",
    "torchtitan": "pulls in torch; only qwen3exp.titan imports it, on the ranks",
    "spmd_types": "torch's SPMD typing helper used by torchtitan's FSDP: only on the ranks",
    "nkilib": "the NKI kernel library: only on Trainium hosts",
    "transformers": "seconds to import (and torch); only for HF models and their verification",
    "safetensors": "its torch API pulls in torch; only where weights are read or written",
    "huggingface_hub": "network client; only when an HF repository is named",
    "tokenizers": "only when the bundled tokenizer is rebuilt or text is tokenized",
    "datasets": "heavy (pyarrow, pandas); only when an HF data set is loaded on a rank",
    "pyarrow": "a C++ library (0.25 s to import); only to read the first rows of data=hf parquet/arrow files",
    "numpy": "only for the weight scan of a checkpoint's tensors",
    "matplotlib": "slow to import; only when a report draws its plots",
    "qwen3exp.titan": "the torchtitan adapter (its modules import torchtitan at their top): across the torch "
    "boundary, imported where a rank or a kernel-override plan needs torchtitan, after the "
    "platform is prepared",
    "wandb": "optional (the wandb extra): only with metrics.wandb=true",
    "optuna": "optional (the optuna extra): only for hydra/sweeper=optuna searches",
    "submitit": "only for launcher=slurm",
    "hydra_plugins.hydra_submitit_launcher": "submitit behind it: only for launcher=slurm",
    "hydra_plugins.hydra_joblib_launcher": "joblib behind it: only for sweep.parallel_jobs > 1",
    "joblib": "only for sweep.parallel_jobs > 1",
    "qwen3exp.cli": "the launchers, the analysis and Hydra (seconds): qwen3exp.entry answers a shell's TAB "
    "without them and imports the command line for everything else",
    "qwen3exp.config.schema": "pydantic builds every section's model at import (0.4 s): a TAB reads the schema's "
    "keys from a cache (qwen3exp.completion_keys) and imports the schema only to rebuild it",
}
"""The libraries that may be imported inside a function (longest dotted prefix, like `RANKS`), each
with the reason it stays lazy: heavy or optional, across the torch/torchtitan boundary."""
LAZY_MARK = re.compile(r"#\s*lazy:\s*\S")
"""The mark a lazy import's line carries: `import torch  # lazy: <why>`."""


def _lazy_library(target: str) -> str | None:
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAZY_LIBRARIES:
            return ".".join(parts[:n])
    return None


def function_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements inside a function or method body (at any depth), except those under
    `if TYPE_CHECKING:`; in source order."""
    guarded = _type_checking_lines(tree)
    found = {
        (node.lineno, node.col_offset): node
        for fn in ast.walk(tree)
        if isinstance(fn, _FUNCTION)
        for node in ast.walk(fn)
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in guarded
    }
    return [found[k] for k in sorted(found)]


def lazy_import_problem(node: ast.Import | ast.ImportFrom, package: str, lines: list[str]) -> str | None:
    """Why an import inside a function is not allowed there, or None: it must import only libraries
    of `LAZY_LIBRARIES` and carry the `# lazy: <why>` mark on its first or last line."""
    others = [t for t in _targets(node, package) if _lazy_library(t) is None]
    if others:
        packages = sorted({t.split(".")[0] for t in others})
        return f"not a lazy library ({', '.join(packages)}): move it to the top of the module"
    if not any(LAZY_MARK.search(lines[n - 1]) for n in {node.lineno, node.end_lineno or node.lineno}):
        return "no `# lazy: <why>` mark"
    return None


def lazy_import_offenders() -> dict[str, list[str]]:
    """file -> its imports inside functions that are not allowed there, each as `file:line: why`."""
    found: dict[str, list[str]] = {}
    for path in _files():
        source = _module_name(path)
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        lines = _source(path).splitlines()
        for node in function_imports(_tree(path)):
            why = lazy_import_problem(node, package, lines)
            if why:
                text = " ".join(ast.unparse(node).split())
                found.setdefault(_rel(path), []).append(f"    {_rel(path)}:{node.lineno}: {text}  <- {why}")
    return found


def test_imports_are_at_the_top_except_marked_lazy_libraries():
    """A dependency hidden in a function is invisible at the top of the file (and hides cycles);
    only the heavy or optional libraries stay lazy, marked, so that the front end stays light."""
    found = lazy_import_offenders()
    total = sum(len(v) for v in found.values())
    report = [f"  {path}: {len(items)}\n" + "\n".join(items) for path, items in found.items()]
    assert not found, f"imports inside functions ({total} in {len(found)} files):\n" + "\n".join(report)


def test_the_lazy_import_rule():
    code = (
        "from typing import TYPE_CHECKING\n"
        "import yaml\n"
        "def f():\n"
        "    import torch  # lazy: torch stays out of the front end\n"
        "    from torch import nn  # noqa: F401  # lazy: the same\n"
        "    import torch.distributed\n"
        "    import yaml  # lazy: not a lazy library\n"
        "    from . import memory  # lazy: first-party\n"
        "    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import (  # lazy: joblib\n"
        "        JoblibLauncher,\n"
        "    )\n"
        "    if TYPE_CHECKING:\n"
        "        from qwen3exp.plan import build\n"
        "    def g():\n"
        "        import wandb\n"
    )
    tree = ast.parse(code)
    lines = code.splitlines()
    verdicts = [(n.lineno, lazy_import_problem(n, "qwen3exp.plan", lines)) for n in function_imports(tree)]
    assert verdicts == [
        (4, None),
        (5, None),
        (6, "no `# lazy: <why>` mark"),
        (7, "not a lazy library (yaml): move it to the top of the module"),
        (8, "not a lazy library (qwen3exp): move it to the top of the module"),
        (9, None),
        (15, "no `# lazy: <why>` mark"),
    ]


# --- Platform and launcher names are compared only in their own module -------------------------------

VARIANT_PACKAGES = {"platform": "qwen3exp/platforms", "launcher": "qwen3exp/launchers"}
"""The Experiment sections whose variants are one module each, and the package of those modules."""
REGISTRY_FILES = ("__init__.py", "registry.py")
"""The files of a variant package that look variants up (they may name every variant of their family)."""
SCHEMA_FILES = ("qwen3exp/config/schema.py", "qwen3exp/config/sections/")
"""Where the sections themselves are declared (a path ending in / is a folder)."""


@dataclass(frozen=True)
class Family:
    section: str
    """The Experiment field: platform."""
    tag: str
    """Its union's discriminator: name."""
    kinds: tuple[str, ...]
    """The tag's values, one per variant: auto, cpu, cuda, neuron."""
    package: str
    """Where the variants' modules live: qwen3exp/platforms (qwen3exp/platforms/cpu.py)."""


@functools.cache
def families() -> tuple[Family, ...]:
    """The platform and launcher variants, read from the schema's discriminated unions."""
    found = []
    for section, package in VARIANT_PACKAGES.items():
        field = Experiment.model_fields[section]
        tag = field.discriminator
        assert isinstance(tag, str), f"Experiment.{section} is not a union discriminated by a field"
        kinds = tuple(
            v
            for member in typing.get_args(field.annotation)
            for v in typing.get_args(member.model_fields[tag].annotation)
        )
        found.append(Family(section, tag, kinds, package))
    return tuple(found)


def reads_a_variant_tag(expr: ast.expr, fams: Iterable[Family]) -> bool:
    """`expr` reads a platform's or a launcher's tag: an attribute named like a tag (`exp.platform.name`,
    `facts.name`, `x.kind`), a variable named after a tag or a section (`kind`, `name`, `platform`,
    `platform_name`, `launcher_kind`, ...), a subscript by a tag (`cfg["launcher"]["kind"]`), or a
    call given a dotted tag path or getting a tag (`OmegaConf.select(cfg, "launcher.kind")`, `d.get("kind")`)."""
    fams = tuple(fams)
    tags = {f.tag for f in fams}
    if isinstance(expr, ast.Attribute):
        return expr.attr in tags
    if isinstance(expr, ast.Name):
        suffixes = ("", "_name", "_kind", *(f"_{t}" for t in tags))
        return expr.id in tags or any(expr.id == f.section + s for f in fams for s in suffixes)
    if isinstance(expr, ast.Subscript):
        return isinstance(expr.slice, ast.Constant) and expr.slice.value in tags
    if isinstance(expr, ast.Call):
        paths = {f"{f.section}.{f.tag}" for f in fams}
        getter = isinstance(expr.func, ast.Attribute) and expr.func.attr == "get"
        args = [*expr.args, *(k.value for k in expr.keywords)]
        return any(isinstance(a, ast.Constant) and (a.value in paths or (getter and a.value in tags)) for a in args)
    return False


def _kind_literals(expr: ast.expr, kinds: set[str]) -> list[str]:
    """The variant names written as string literals in `expr` (a literal, or a tuple/list/set of them)."""
    elts = expr.elts if isinstance(expr, (ast.Tuple, ast.List, ast.Set)) else [expr]
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in kinds]


_COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def _compared_kinds(node: ast.Compare, fams: tuple[Family, ...], kinds: set[str]) -> list[str]:
    operands = [node.left, *node.comparators]
    found = []
    for op, a, b in zip(node.ops, operands, operands[1:], strict=False):
        if isinstance(op, _COMPARISONS):
            for x, y in ((a, b), (b, a)):
                if reads_a_variant_tag(x, fams):
                    found += _kind_literals(y, kinds)
    return found


def _pattern_kinds(pattern: ast.pattern, position: int | None, kinds: set[str]) -> list[str]:
    """The variant names a case pattern matches, at `position` of a sequence pattern (None: anywhere)."""
    if isinstance(pattern, ast.MatchOr):
        return [k for p in pattern.patterns for k in _pattern_kinds(p, position, kinds)]
    if isinstance(pattern, ast.MatchAs) and pattern.pattern is not None:
        return _pattern_kinds(pattern.pattern, position, kinds)
    if position is not None:
        if isinstance(pattern, ast.MatchSequence) and position < len(pattern.patterns):
            return _pattern_kinds(pattern.patterns[position], None, kinds)
        return []
    return [
        n.value.value
        for n in ast.walk(pattern)
        if isinstance(n, ast.MatchValue) and isinstance(n.value, ast.Constant) and n.value.value in kinds
    ]


def _matched_kinds(node: ast.Match, fams: tuple[Family, ...], kinds: set[str]) -> list[tuple[int, str]]:
    subject = node.subject
    if isinstance(subject, ast.Tuple):
        positions: list[int | None] = [i for i, e in enumerate(subject.elts) if reads_a_variant_tag(e, fams)]
    else:
        positions = [None] if reads_a_variant_tag(subject, fams) else []
    return [
        (case.pattern.lineno, kind)
        for case in node.cases
        for position in positions
        for kind in _pattern_kinds(case.pattern, position, kinds)
    ]


def variant_name_uses(tree: ast.AST, fams: tuple[Family, ...]) -> list[tuple[int, str, str]]:
    """(line, variant name, the statement's text) of each comparison or case that tests a platform's or
    a launcher's tag against a name written as a string."""
    kinds = {k for f in fams for k in f.kinds}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            found += [(node.lineno, k, ast.unparse(node)) for k in _compared_kinds(node, fams, kinds)]
        elif isinstance(node, ast.Match):
            found += [
                (line, k, f"match {ast.unparse(node.subject)}: case {k!r}")
                for line, k in _matched_kinds(node, fams, kinds)
            ]
    return sorted(found)


def may_name(path: str, kind: str, fams: Iterable[Family]) -> bool:
    """May the file at `path` (relative to the repository) compare a tag with `kind`? The schema may
    (every variant); a variant package's registry may (every variant of its family); a variant's own
    module may (its own name only: qwen3exp/platforms/cpu.py names "cpu", not "cuda")."""
    if any(path == s or (s.endswith("/") and path.startswith(s)) for s in SCHEMA_FILES):
        return True
    for f in fams:
        if kind in f.kinds and (
            path in {f"{f.package}/{r}" for r in REGISTRY_FILES} or path == f"{f.package}/{kind}.py"
        ):
            return True
    return False


def test_platform_and_launcher_names_are_compared_only_in_their_own_module():
    """A variant (platform, launcher) is one module, found by its validated type: no other module
    tests a platform's or a launcher's name written as a string.

    The rule (precise, so that it reports no device names): an offender is an `==`, `!=`, `in`,
    `not in`, `is` or `is not` comparison, or a `match` case, between
    - one side that reads a variant's tag (`reads_a_variant_tag`: an attribute named like the
      schema's discriminators, `name` for platforms and `kind` for launchers, such as
      `exp.platform.name`, `facts.name`, `exp.launcher.kind`; a variable named `name`, `kind`,
      `platform`, `launcher`, `platform_name`, `launcher_kind`, ...; a subscript `["kind"]`; a call
      given "launcher.kind" or "platform.name", as `OmegaConf.select(cfg, "launcher.kind")`), and
    - a string literal (or a tuple, list or set of them; in a match, a case value, at the same
      position when the subject is a tuple) that is one of the variant names the schema's Literal
      tags allow (platforms: auto, cpu, cuda, neuron; launchers: local, slurm),
    in a file other than that variant's own module (qwen3exp/platforms/cpu.py for "cpu"), its
    package's registry (qwen3exp/platforms/__init__.py or registry.py; likewise for launchers) and
    the schema (qwen3exp/config/schema.py, qwen3exp/config/sections/).
    Not offenders: `device.type == "cpu"` (a torch device type), `data.source == "local"` (a data
    source), `model.attention == "auto"`, string literals that are not compared (messages), and
    `match` on the section's class (`case CpuPlatform():`), which is the dispatch this asks for."""
    fams = families()
    found = [
        f"  {_rel(p)}:{line}: {text}  ({kind!r})"
        for p in _files()
        for line, kind, text in variant_name_uses(_tree(p), fams)
        if not may_name(_rel(p), kind, fams)
    ]
    assert not found, (
        f"platform or launcher names compared outside their own module ({len(found)}); dispatch on the "
        "validated section's type instead:\n" + "\n".join(found)
    )


def test_the_variant_name_rule():
    fams = families()
    # Read from the schema (a new platform adds its name there): at least today's variants.
    assert [(f.section, f.tag) for f in fams] == [("platform", "name"), ("launcher", "kind")]
    assert {"auto", "cpu", "cuda", "neuron"} <= set(fams[0].kinds) and {"local", "slurm"} <= set(fams[1].kinds)
    code = (
        "a = device.type == 'cpu'\n"
        "b = exp.platform.name == 'cpu'\n"
        "c = kind in ('local', 'slurm', 'other')\n"
        "d = exp.data.source == 'local'\n"
        "e = OmegaConf.select(cfg, 'launcher.kind', default=None) == 'slurm'\n"
        "f = 'neuron' != facts.name\n"
        "g = exp.model.attention == 'auto'\n"
        "h = cfg['platform']['name'] == 'cuda'\n"
        "match exp.data.source:\n"
        "    case 'local':\n"
        "        pass\n"
        "match exp.model.attention, facts.name:\n"
        "    case 'auto', 'flex':\n"
        "        pass\n"
        "    case ('flex', 'neuron') | ('flex', 'cpu'):\n"
        "        pass\n"
        "match platform_name:\n"
        "    case 'cuda' as x:\n"
        "        pass\n"
        "    case CpuPlatform():\n"
        "        pass\n"
    )
    found = [(line, kind) for line, kind, _ in variant_name_uses(ast.parse(code), fams)]
    assert found == [
        (2, "cpu"),
        (3, "local"),
        (3, "slurm"),
        (5, "slurm"),
        (6, "neuron"),
        (8, "cuda"),
        (15, "cpu"),
        (15, "neuron"),
        (18, "cuda"),
    ]
    assert may_name("qwen3exp/platforms/cpu.py", "cpu", fams)
    assert not may_name("qwen3exp/platforms/cpu.py", "cuda", fams)
    assert may_name("qwen3exp/platforms/__init__.py", "neuron", fams)
    assert not may_name("qwen3exp/platforms/__init__.py", "local", fams)
    assert may_name("qwen3exp/launchers/slurm.py", "slurm", fams)
    assert may_name("qwen3exp/config/sections/launcher.py", "slurm", fams)
    assert may_name("qwen3exp/config/schema.py", "auto", fams)
    assert not may_name("qwen3exp/cli.py", "slurm", fams)
    assert not may_name("qwen3exp/run/provenance.py", "cuda", fams)
