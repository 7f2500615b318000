"""The layout's rules: import-linter's contracts (.importlinter) hold, and they catch a new cycle."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "paraflow"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed: make install")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the package under `root`, with the project's contracts."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(ROOT / ".importlinter")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(PACKAGE, tmp_path / "paraflow", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "paraflow"


def test_the_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    "module, line, contract",
    [
        # a function-local import closing a cycle inside core/ (core.backend imports core.options)
        (
            "core/options.py",
            "def _cycle():\n    from .backend import Backend  # noqa\n",
            "No import cycles between sibling modules",
        ),
        # under TYPE_CHECKING, reliability importing core: reliability is below core
        (
            "reliability/collective_check.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..core.backend import Backend\n",
            "Each layer imports only the layers below it",
        ),
        (
            "training/object_collectives.py",
            "def _hvd():\n    import horovod.torch  # noqa\n",
            "Only paraflow.backends.horovod imports horovod",
        ),
    ],
)
def test_a_new_cycle_or_upward_import_breaks_a_contract(tmp_path, module, line, contract):
    package = copy_of_the_package(tmp_path)
    path = package / module
    path.write_text(path.read_text() + "\n\n" + line)
    ast.parse(path.read_text())  # still valid Python
    result = lint_imports(tmp_path)
    assert result.returncode != 0 and f"{contract} BROKEN" in result.stdout, result.stdout[-3000:]


def test_distributed_data_parallel_is_imported_only_by_backends():
    def imports_ddp(path: Path) -> bool:
        return any(
            isinstance(node, ast.ImportFrom) and any(a.name == "DistributedDataParallel" for a in node.names)
            for node in ast.walk(ast.parse(path.read_text()))
        )

    assert [str(p) for p in PACKAGE.rglob("*.py") if "backends" not in p.parts and imports_ddp(p)] == []


def launcher_name_comparisons(root: Path) -> list[str]:
    """Comparisons (==, !=, in) against a registered launcher's name or program, outside the launcher
    package: each is a fact about a launcher that belongs on its Launcher object."""
    from paraflow.environment.launchers import registered_launchers

    names = {x.name for x in registered_launchers()} | {x.tool for x in registered_launchers() if x.tool}
    names -= {"python"}  # also the name of other things ("python" in a checkpoint's RNG states)
    found = []
    for path in sorted(root.rglob("*.py")):
        if "launchers" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            constants = {
                c.value
                for side in sides
                for c in ([side] if not isinstance(side, (ast.Tuple, ast.List, ast.Set)) else side.elts)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            }
            if constants & names:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_code_outside_the_launcher_modules_compares_launcher_names():
    assert launcher_name_comparisons(PACKAGE) == []


def test_the_launcher_name_check_finds_a_comparison(tmp_path):
    package = copy_of_the_package(tmp_path)
    (package / "core" / "stray.py").write_text('def f(env):\n    return env.launcher == "torchrun"\n')
    assert launcher_name_comparisons(package) == ["core/stray.py:2"]


#: The benchmark stays a part of paraflow, not the larger half of it: a feature it gains is paid
#: for by merging or by one it drops.
BENCH_MAX_LINES = 5000


def test_the_benchmark_stays_within_its_line_budget():
    lines = sum(len(path.read_text().splitlines()) for path in (PACKAGE / "bench").rglob("*.py"))
    assert lines <= BENCH_MAX_LINES, (
        f"paraflow/bench is {lines} lines, over its budget of {BENCH_MAX_LINES}: merge or drop something"
    )
