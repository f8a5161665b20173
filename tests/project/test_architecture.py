"""The import rule of the package (docs/development.md#the-import-rule): its direction, checked by import-linter
against the contracts in pyproject.toml (strict layers), and no import cycle (within a subpackage too), no private
name used outside its module and no re-exported name, checked here with `ast`."""

import ast
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers import ROOT

PACKAGE = ROOT / "src" / "arithmech"


def test_import_contracts_are_kept():
    """stages and tools -> library subpackages -> base modules, no stage imports another; a broken contract
    prints the offending import chains."""
    lint_imports = Path(sys.executable).parent / "lint-imports"  # pinned in requirements-test.txt
    path = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]  # this checkout's package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run(
        [str(lint_imports), "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    if proc.returncode:
        pytest.fail(proc.stdout + proc.stderr, pytrace=False)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_module(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name of what `from X import ...` imports from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")[: len(module.split(".")) - node.level + is_package]
    return ".".join(base + ([node.module] if node.module else []))


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(path: Path, modules: set[str]) -> list[str]:
    """Private names of other package modules that `path` uses: `from m import _x`, or `m._x` for a module `m`
    bound by an import (module-level or inside a function)."""
    module = module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    bound = {}  # local name -> the package module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "arithmech":
                    continue
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:  # `import arithmech.a.b` binds `arithmech`
                    bound["arithmech"] = "arithmech"
        elif isinstance(node, ast.ImportFrom):
            source = imported_module(node, module, path.name == "__init__.py")
            if source.split(".")[0] != "arithmech" or source == module:
                continue
            for alias in node.names:
                if private(alias.name):
                    found.append(f"{module} (l.{node.lineno}): from {source} import {alias.name}")
                elif f"{source}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            dotted, base = [], node.value
            while isinstance(base, ast.Attribute):
                dotted.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                owner = ".".join([bound[base.id], *dotted])
                if owner in modules and owner != module:
                    found.append(f"{module} (l.{node.lineno}): {owner}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module():
    """A helper used by two modules is public (no leading underscore) and lives in one of them; a module's
    `_name` is its own."""
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in files}
    found = [use for path in files for use in private_uses(path, modules)]
    if found:
        pytest.fail("private names used outside their module:\n" + "\n".join(found), pytrace=False)


def test_module_file_names_are_unique():
    """One home per concept: `git grep`, tracebacks and the docs name a module by its file name alone."""
    names = Counter(path.name for path in PACKAGE.rglob("*.py") if path.name not in ("__init__.py", "__main__.py"))
    shared = sorted(name for name, n in names.items() if n > 1)
    assert not shared, f"file names of more than one module: {shared}"


def test_no_layer_imports_itself():
    """Strict layers: a layer's parts are independent (`|`), never allowed to import each other (`:`), so two
    packages cannot lean on each other in a cycle."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    assert not [layer for layer in layers if ":" in layer], "a layer whose parts may import each other"


def test_no_module_re_exports_a_package_name():
    """One import path per name: a module does not import a package name at module level only to pass it on
    (an unused import silenced with `noqa: F401`); users import it from its home."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.parse("\n".join(lines), filename=str(path)).body:
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("arithmech")):
                if any("noqa: F401" in line for line in lines[node.lineno - 1: node.end_lineno]):
                    found.append(f"{module_name(path)} (l.{node.lineno})")
    assert not found, f"package names re-exported: {found}"


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package modules that `path` imports (module-level or inside a function): for `from m import x`, the
    module m.x where it is one, else m."""
    module = module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = imported_module(node, module, path.name == "__init__.py")
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
        else:
            continue
        found |= {name for name in names if name in modules and name != module}
    return found


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of imports in `graph` (module -> the modules it imports), as the modules along it with the first
    again at the end; [] when there is none."""
    done, path = set(), []

    def visit(module: str) -> list[str]:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return []
        path.append(module)
        for imported in sorted(graph[module]):
            if cycle := visit(imported):
                return cycle
        path.pop()
        done.add(module)
        return []

    return next((cycle for module in sorted(graph) if (cycle := visit(module))), [])


def test_no_modules_import_each_other_in_a_cycle():
    """Within a subpackage too, imports go one way (`a` imports `b` imports `a` is a cycle even where the layers
    allow both): a helper two modules need from each other has one home that both import."""
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in files}
    graph = {module_name(path): imported_modules(path, modules) for path in files}
    cycle = import_cycle(graph)
    assert not cycle, "modules that import each other: " + " -> ".join(cycle)


def test_an_import_cycle_is_found():
    """The cycle check's positive control: a cycle of three modules beside a module with no cycle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert import_cycle(graph) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
