"""The layout's rules, checked on the source: small files, each library imported only by its
backend's folder, no import cycle between paraflow's modules."""

import ast
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "paraflow"
MAX_LINES = 300


def modules() -> dict:
    """Dotted module name -> source path, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def top_level_imports(name: str, path: Path) -> set:
    """Modules `name` imports when it is imported: not inside functions, not under TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body + getattr(node, "orelse", []) + [h for h in getattr(node, "handlers", [])])
            elif isinstance(node, ast.ExceptHandler):
                visit(node.body)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)

    visit(tree.body)
    return found


def all_imports(path: Path) -> set:
    """Every module named in an import anywhere in the file (functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("name, path", sorted(modules().items()))
def test_no_file_is_over_the_line_limit(name, path):
    assert len(path.read_text().splitlines()) <= MAX_LINES, f"{path}: split it by concern"


def test_horovod_is_imported_only_in_its_backend_folder():
    outside = [
        str(path)
        for name, path in modules().items()
        if not name.startswith("paraflow.backends.horovod")
        and any(m == "horovod" or m.startswith("horovod.") for m in all_imports(path))
    ]
    assert outside == []


def test_distributed_data_parallel_is_imported_only_by_backends():
    outside = [
        str(path)
        for name, path in modules().items()
        if not name.startswith("paraflow.backends")
        and "DistributedDataParallel" in path.read_text()
        and any("DistributedDataParallel" in m for m in all_imports(path))
    ]
    assert outside == []


def test_tools_are_never_imported_by_a_backend():
    offenders = [
        str(path)
        for name, path in modules().items()
        if name.startswith("paraflow.backends")
        and any(m.startswith("paraflow.tools") for m in top_level_imports(name, path) | all_imports(path))
    ]
    assert offenders == []


def test_no_import_cycle_between_modules():
    known = modules()
    graph = {
        name: {m for m in top_level_imports(name, path) if m in known and m != name} for name, path in known.items()
    }
    # A package's own __init__ importing its children is how packages work, not a cycle.
    for name in graph:
        graph[name] = {m for m in graph[name] if not (m.startswith(name + ".") and known[name].name == "__init__.py")}
    state, cycle = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycle.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycle == [], " -> ".join(cycle[0])
