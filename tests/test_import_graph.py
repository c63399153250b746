"""The library's import graph, read from the source with ``ast``: module-level and function-level
imports alike. It has no cycle, and the solvers, bounds, toolkit and simulator reach no TVM."""

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"tvm_diviml": ROOT / "tvm_diviml", "tvm_diviml.passes": ROOT / "passes"}
TVM_FREE = ("tvm_diviml.solvers", "tvm_diviml.bounds", "tvm_diviml.toolkit", "tvm_diviml.simulator")


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for the library and the passes package installed inside it."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
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
