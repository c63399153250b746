"""The library's import graph, read from the source with ``ast``: module-level and function-level
imports alike. It has no cycle, not even between folders; the cost models, solvers, bounds, toolkit and
simulator reach no TVM; and the floors hold, lowest first: the library; the compiler passes and the
frontends; profiling (measuring on this machine); the application; the command line (``cli``, its entry
points, and ``bench``). A module imports its own floor and those below it, never one above."""

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tvm_diviml"
TVM_FREE = ("tvm_diviml.cost", "tvm_diviml.solvers", "tvm_diviml.bounds", "tvm_diviml.toolkit", "tvm_diviml.simulator")
# The floors, lowest first: a module may import its own floor and those below it, never one above.
FLOORS = ("library", "passes", "profiling", "app", "top")


def floor_of(module: str) -> str:
    if module.startswith(("tvm_diviml.cli", "tvm_diviml.bench")) or module in (
        "tvm_diviml.entry",
        "tvm_diviml.__main__",
    ):
        return "top"  # the command line, its entry points and the benchmarks
    if module.startswith("tvm_diviml.app"):
        return "app"
    if module.startswith("tvm_diviml.profiling"):
        return "profiling"
    if module.startswith(("tvm_diviml.passes", "tvm_diviml.frontends")):
        return "passes"
    return "library"


def folder_of(module: str) -> str:
    """A module's folder (``tvm_diviml.cost``), or the module itself for one at the top of the package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else module


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(["tvm_diviml", *parts])] = path
    return found


def imported_names(module: str, path: Path) -> set[str]:
    """Every module ``module`` imports, anywhere in its body, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def import_graph() -> nx.DiGraph:
    files = module_files()
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for module, path in files.items():
        for name in imported_names(module, path):
            if name in files and name != module:
                graph.add_edge(module, name)
            elif name.split(".")[0] == "tvm":
                graph.add_edge(module, "tvm")
    return graph


def test_the_library_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 80  # the walk found the library
    cycles = list(nx.simple_cycles(graph.subgraph(n for n in graph if n != "tvm")))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles[:5])


def test_no_folder_imports_another_that_imports_it_back():
    graph = import_graph()
    folders = nx.DiGraph()
    folders.add_edges_from(
        (folder_of(a), folder_of(b)) for a, b in graph.edges if b != "tvm" and folder_of(a) != folder_of(b)
    )
    assert folders.has_edge("tvm_diviml.solvers", "tvm_diviml.toolkit")  # the check sees folders
    cycles = list(nx.simple_cycles(folders))
    assert not cycles, "folder cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles[:5])


def test_every_module_imports_only_its_own_floor_and_those_below():
    graph = import_graph()
    assert floor_of("tvm_diviml.passes.extract") == "passes" and floor_of("tvm_diviml.app.run") == "app"
    assert floor_of("tvm_diviml.profiling.measured") == "profiling"
    upward = [
        f"{a} ({floor_of(a)}) imports {b} ({floor_of(b)})"
        for a, b in graph.edges
        if b != "tvm" and FLOORS.index(floor_of(b)) > FLOORS.index(floor_of(a))
    ]
    assert not upward, "; ".join(upward)


def test_the_simulator_and_the_problem_reach_no_runtime():
    graph = import_graph()
    for module in ("tvm_diviml.simulator", "tvm_diviml.problem"):
        reached = nx.descendants(graph, module)
        assert not any(name.startswith("tvm_diviml.runtime") for name in reached), module


def test_solvers_bounds_toolkit_and_simulator_reach_no_tvm():
    graph = import_graph()
    assert nx.has_path(graph, "tvm_diviml.passes.extract", "tvm")  # the check can see TVM
    for module in graph:
        if module.startswith(TVM_FREE):
            reached = nx.descendants(graph, module)
            assert "tvm" not in reached, f"{module} reaches TVM: " + " -> ".join(nx.shortest_path(graph, module, "tvm"))


def test_no_private_name_is_imported_across_library_modules():
    private = []
    for module, path in module_files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                private += [
                    f"{module} imports {alias.name} from {node.module or '.'}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    assert not private, "; ".join(private)


def function_level_imports() -> list[tuple[str, int, str]]:
    """(module, line, the import's line with the line above it) of every import of a tvm_diviml module
    made inside a function."""
    found = []
    for module, path in module_files().items():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                in_project = (
                    isinstance(inner, ast.ImportFrom) and (inner.level or (inner.module or "").startswith("tvm_diviml"))
                ) or (isinstance(inner, ast.Import) and any(a.name.startswith("tvm_diviml") for a in inner.names))
                if in_project:
                    found.append((module, inner.lineno, "\n".join(lines[inner.lineno - 2 : inner.lineno])))
    return sorted(set(found))


def test_few_function_level_imports_and_each_says_why():
    """An in-project import inside a function hides a dependency: at most 20, each with a comment
    saying what it keeps out of a lighter import (TVM, torch) or which cycle it breaks."""
    found = function_level_imports()
    assert found, "the walk sees function-level imports"
    assert len(found) <= 20, "\n".join(f"{m}:{n}" for m, n, _ in found)
    silent = [f"{m}:{n}" for m, n, text in found if "#" not in text]
    assert not silent, "function-level imports without a comment saying why: " + ", ".join(silent)


def test_no_function_is_longer_than_80_lines_nor_60_in_the_command_line():
    too_long = []
    for module, path in module_files().items():
        limit = 60 if module.startswith("tvm_diviml.cli") else 80
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    too_long.append(f"{module}.{node.name}: {length} lines (at most {limit})")
    assert not too_long, "; ".join(too_long)
