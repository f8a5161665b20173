"""The test suite's own import rule (docs/development.md#tests): no test module imports another, so that none is a
library for others; what test modules share lives in a helper module (tests/helpers.py, tests/slurm/workflow_runs.py,
...) or in a conftest.py fixture. Checked on the syntax trees of every Python file under tests/, helpers included: an
import inside a function counts like one at the top."""

import ast
from pathlib import Path

from helpers import ROOT

TESTS = ROOT / "tests"


def collected_names(tests: Path) -> set[str]:
    """The names pytest imports the test files under tests/ as (it has no packages): test_*.py and conftest.py."""
    return {p.stem for p in tests.rglob("*.py") if p.name.startswith("test_") or p.name == "conftest.py"}


def imports_of(names: set[str], source: str) -> list[str]:
    """The imports in `source` of a module in `names`, wherever it stands in the dotted path (`import test_x`,
    `from a.test_x import y`, `from a import test_x`), as "l.N: module"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            modules = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        hit = next((m for m in modules if names & set(m.split("."))), None)
        if hit is not None:
            found.append(f"l.{node.lineno}: {hit.strip('.')}")
    return found


def test_no_test_module_imports_another():
    names = collected_names(TESTS)
    found = [f"{path.relative_to(ROOT)} {use}" for path in sorted(TESTS.rglob("*.py"))
             for use in imports_of(names, path.read_text())]
    why = "test modules imported (move what they share to a helper module or a fixture)"
    assert not found, why + ":\n" + "\n".join(found)


def test_an_import_of_a_test_module_is_found():
    """The check's positive control: each form of import of a test module is found, a helper module's is not."""
    source = """
from helpers import ROOT
from slurm.workflow_runs import JOB_WAIT_S
from test_slurm import workflow_env


def fixture():
    import conftest
    from . import test_loading
    import tests.workflow.test_slurm_groups as groups
"""
    names = {"test_slurm", "test_loading", "test_slurm_groups", "conftest"}
    assert imports_of(names, source) == [
        "l.4: test_slurm", "l.8: conftest", "l.9: test_loading", "l.10: tests.workflow.test_slurm_groups"]
