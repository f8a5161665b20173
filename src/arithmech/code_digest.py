"""Content digests of exactly the library code a rule's script runs, so that Snakemake re-runs a rule when
that code changes and only then (a rule's params carry its digest; Snakemake re-runs on changed params).

Reachability is by name, read from the source with `ast` (nothing is imported, so the DAG is built without
torch): from the names a script imports from `arithmech`, every top-level function, class or assignment
of the package that those names reference, transitively, including imports inside functions (the lazy
imports of seaborn-using code). A module reached as a whole (`from . import plots`, then `plots.x`) counts
with all its definitions. The digest covers the source of every reached definition plus every top-level
statement of each reached module that is not a definition (imports, constants, code run at import), so an
edit anywhere a job can execute changes it, and an edit to a function no job of the rule reaches does not.
An `if TYPE_CHECKING:` block never runs (its imports name annotations only): it is neither followed nor digested.
Definitions are compared as syntax trees, so comments and reformatting re-run nothing.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

PACKAGE = "arithmech"


class _Module:
    """One parsed module: its top-level definitions by name and the arithmech imports it binds."""

    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path
        self.is_package = path.name == "__init__.py"
        self.source = path.read_text(encoding="utf-8")
        self.tree = ast.parse(self.source, filename=str(path))
        self.defs: dict[str, list[ast.stmt]] = {}  # a name may be bound by several statements
        self.aliases: dict[str, tuple[str, str | None]] = {}  # local name -> (module, name or None = whole)
        self.other: list[ast.stmt] = []  # top-level statements that define nothing by name
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs.setdefault(node.name, []).append(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                for target in names:
                    self.defs.setdefault(target, []).append(node)
                if not names:
                    self.other.append(node)
            elif _type_checking_only(node):  # `if TYPE_CHECKING:` never runs: names for annotations only
                continue
            else:
                self.other.append(node)
                for module, name, local in _imports(node, self.name, self.is_package):
                    self.aliases[local] = (module, name)
        # The Snakefile digests every rule's script in one parse, and the rules share most of the package:
        # what a definition references and a statement's dump are worked out once per parsed file.
        self._references: dict[str | None, list[tuple[str, str | None]]] = {}
        self._dumps: dict[int, bytes] = {}
        # Code run at import counts too; its import statements bind names, followed only where used.
        self._run_at_import = self._walk([n for n in self.other if not isinstance(n, (ast.Import, ast.ImportFrom))])

    def references(self, name: str | None) -> list[tuple[str, str | None]]:
        """(module, name or None) of what the definition `name` (None: the whole module) and the module's
        code run at import reference: its own definitions, the package names it imported, imports inside it."""
        if name not in self._references:
            self._references[name] = self._walk(self.tree.body if name is None else self.defs[name])
        return self._references[name] + self._run_at_import

    def _walk(self, nodes: list[ast.stmt]) -> list[tuple[str, str | None]]:
        found = []
        for node in nodes:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and sub.id in self.defs:
                    found.append((self.name, sub.id))
                elif isinstance(sub, ast.Name) and sub.id in self.aliases:
                    found.append(self.aliases[sub.id])
                elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                    found += [(m, n) for m, n, _ in _imports(sub, self.name, self.is_package)]
        return found

    def dump(self, node: ast.stmt) -> bytes:
        """`node` as the digest reads it: its syntax tree without positions."""
        if id(node) not in self._dumps:
            self._dumps[id(node)] = ast.dump(node, include_attributes=False).encode()
        return self._dumps[id(node)]


def _type_checking_only(node: ast.stmt) -> bool:
    """Whether `node` is an `if TYPE_CHECKING:` block (no else): imports for annotations, never executed."""
    test = node.test if isinstance(node, ast.If) and not node.orelse else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(node: ast.ImportFrom, current: str, is_package: bool = False) -> str | None:
    """The absolute module name an ImportFrom in module `current` refers to (`is_package`: `current` is a
    package's __init__, so `.` is the package itself), or None when it is outside the package."""
    if node.level:
        parts = current.split(".") + ([""] if is_package else [])
        parts = parts[: -node.level] if node.level < len(parts) else []
        base = ".".join(parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return base if base == PACKAGE or base.startswith(PACKAGE + ".") else None


def _imports(node: ast.AST, current: str, is_package: bool = False) -> list[tuple[str, str | None, str]]:
    """(module, imported name or None for the module itself, local name) of the package imports in `node`."""
    found = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                found.append((alias.name, None, alias.asname or alias.name.split(".")[0]))
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(node, current, is_package)
        if base is not None:
            for alias in node.names:
                found.append((base, alias.name, alias.asname or alias.name))
    return found


@lru_cache(maxsize=None)
def _parsed(name: str, path: Path, mtime_ns: int, size: int) -> _Module:
    """A module parsed once per version of its file (the Snakefile asks for every rule's digest)."""
    return _Module(name, path)


class CodeGraph:
    """The package's modules, parsed once, and the definitions reachable from a set of names."""

    def __init__(self, package_dir: str | Path):
        self.package_dir = Path(package_dir)
        if not (self.package_dir / "__init__.py").is_file():
            raise FileNotFoundError(f"{self.package_dir} is not the {PACKAGE} package (no __init__.py)")
        self._modules: dict[str, _Module] = {}

    def module(self, name: str) -> _Module | None:
        """The parsed module `name` (arithmech.x), or None when the package has no such file."""
        if name not in self._modules:
            rel = name.split(".")[1:]
            path = self.package_dir.joinpath(*rel).with_suffix(".py") if rel else self.package_dir / "__init__.py"
            if not path.is_file():
                path = self.package_dir.joinpath(*rel, "__init__.py")
            stat = path.stat() if path.is_file() else None
            self._modules[name] = _parsed(name, path, stat.st_mtime_ns, stat.st_size) if stat else None
        return self._modules[name]

    def reach(self, roots: list[tuple[str, str | None]]) -> dict[str, set[str] | None]:
        """Module -> reached definition names (None: the whole module) from (module, name or None) roots."""
        reached: dict[str, set[str] | None] = {}
        todo = list(roots) + [(PACKAGE, None)]  # the package's __init__ runs on every import
        while todo:
            module_name, name = todo.pop()
            module = self.module(module_name)
            if module is None:  # `from arithmech import plots` names a submodule, not a definition
                continue
            if name is not None and name not in module.defs and name not in module.aliases:
                submodule = f"{module_name}.{name}"
                if self.module(submodule) is not None:
                    todo.append((submodule, None))
                continue
            if module_name not in reached:  # importing a.b.c runs a/__init__ and a/b/__init__ whole
                parts = module_name.split(".")
                todo += [(".".join(parts[:i]), None) for i in range(1, len(parts))]
            done = reached.get(module_name, set())
            if done is None or (name is not None and name in done):
                continue
            if name is None:
                reached[module_name] = None
            else:
                reached[module_name] = done | {name}
                if name in module.aliases:  # a re-exported import: follow it
                    todo.append(module.aliases[name])
                    continue
            todo += module.references(name)
        return reached

    def digest(self, roots: list[tuple[str, str | None]]) -> str:
        """sha256 (hex) of everything reachable from `roots` (see the module docstring), as syntax trees:
        comments, formatting and where a definition sits in its file do not count; docstrings do."""
        h = hashlib.sha256()
        for module_name, names in sorted(self.reach(roots).items()):
            module = self.module(module_name)
            h.update(f"\0module {module_name}\0".encode())
            nodes = module.tree.body if names is None else module.other + [
                node for name in sorted(names) for node in module.defs.get(name, [])
            ]
            for node in nodes:
                h.update(module.dump(node))
        return h.hexdigest()


def script_roots(script: str | Path) -> list[tuple[str, str | None]]:
    """The (module, name) pairs a rule script imports from the package."""
    path = Path(script)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(m, n) for node in ast.walk(tree) for m, n, _ in _imports(node, "__main__")]


def script_digest(script: str | Path, package_dir: str | Path | None = None) -> str:
    """The digest of the package code that `script` runs: 16 hex digits, for a rule's params. The package
    is the one Python imports (`package_dir` None), as the job will."""
    if package_dir is None:
        import arithmech

        package_dir = Path(arithmech.__file__).parent
    roots = script_roots(script)
    if not roots:
        raise ValueError(f"{script} imports nothing from {PACKAGE}: nothing to digest")
    return CodeGraph(package_dir).digest(roots)[:16]
