"""Code digests (arithmech.code_digest): which definitions a rule script reaches, and that an edit changes
the digest of exactly the scripts that can run the edited code."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from arithmech.code_digest import CodeGraph, script_digest, script_roots
from helpers import ROOT

# A small package with every way a name is reached: a module-level import used in a function, a lazy
# import inside a function, a module imported whole (then used by attribute), a helper in the same module,
# a constant, a class, a decorator, and a function nobody reaches.
PACKAGE = {
    "__init__.py": '__version__ = "1"\n',
    "stages.py": """
        from typing import TYPE_CHECKING

        from .core import compute, UNUSED_CONSTANT
        from . import draw

        if TYPE_CHECKING:  # annotations only: never run, so never reached
            from .lazy import later as Later

        SCALE = 2

        def helper(x):
            return compute(x) * SCALE

        def run_compute(x) -> Later:
            return helper(x)

        def run_plot(x):
            from .lazy import later
            return draw.figure(later(x))

        def run_other():
            return UNUSED_CONSTANT
    """,
    "core.py": """
        import math

        UNUSED_CONSTANT = 1

        def decorate(f):
            return f

        @decorate
        def compute(x):
            return Box(math.sqrt(x)).value

        class Box:
            def __init__(self, value):
                self.value = value

        def never_called():
            return 0
    """,
    "draw.py": """
        def figure(x):
            return x

        def other_figure(x):
            return x
    """,
    "lazy.py": """
        def later(x):
            return x
    """,
}


@pytest.fixture
def package(tmp_path) -> Path:
    root = tmp_path / "arithmech"
    root.mkdir()
    for name, text in PACKAGE.items():
        (root / name).write_text(textwrap.dedent(text))
    for script, names in {"compute": "run_compute", "plot": "run_plot", "other": "run_other"}.items():
        (tmp_path / f"{script}.py").write_text(f"from arithmech.stages import {names}\n\n{names}(1)\n")
    return root


def _digests(package: Path) -> dict[str, str]:
    return {s: script_digest(package.parent / f"{s}.py", package) for s in ("compute", "plot", "other")}


def _edit(package: Path, module: str, old: str, new: str) -> None:
    path = package / module
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_reach_follows_names_lazy_imports_and_whole_modules(package):
    graph = CodeGraph(package)
    assert graph.reach([("arithmech.stages", "run_compute")]) == {
        "arithmech": None,
        "arithmech.stages": {"run_compute", "helper", "SCALE"},  # `compute` is core's, imported
        "arithmech.core": {"compute", "decorate", "Box"},
    }
    plot = graph.reach(script_roots(package.parent / "plot.py"))
    assert plot["arithmech.draw"] is None  # `draw.figure`: the module counts whole
    assert plot["arithmech.lazy"] == {"later"}  # imported inside the function
    assert "arithmech.core" not in plot


@pytest.mark.parametrize(
    "module, old, new, changed",
    [
        ("core.py", "return 0", "return 1", set()),  # a function no script reaches
        ("core.py", "math.sqrt(x)", "math.sqrt(x + 1)", {"compute"}),
        ("core.py", "self.value = value", "self.value = -value", {"compute"}),  # a method of a reached class
        ("core.py", "    return f", "    return staticmethod(f)", {"compute"}),  # the decorator
        ("core.py", "UNUSED_CONSTANT = 1", "UNUSED_CONSTANT = 2", {"other"}),
        ("core.py", "import math", "import math\nimport os", {"compute", "other"}),  # import-time code of core
        ("stages.py", "SCALE = 2", "SCALE = 3", {"compute"}),  # a constant counts where it is used
        ("stages.py", "SCALE = 2", "SCALE = 2\nprint(SCALE)", {"compute", "plot", "other"}),  # code run at import
        ("stages.py", "return helper(x)", "return helper(x) + 1", {"compute"}),
        ("draw.py", "def other_figure(x):\n    return x", "def other_figure(x):\n    return -x", {"plot"}),
        ("lazy.py", "return x", "return x * 1", {"plot"}),  # not compute: its annotation's import never runs
        ("stages.py", "from .lazy import later as Later", "from .draw import figure as Later", set()),
        ("__init__.py", '"1"', '"2"', {"compute", "plot", "other"}),
        # comments, blank lines and moving a definition change nothing
        ("core.py", "def never_called():", "# a comment\n\n\ndef never_called():", set()),
        ("core.py", "@decorate\ndef compute(x):\n    return Box(math.sqrt(x)).value\n", "", set()),
    ],
)
def test_an_edit_changes_exactly_the_scripts_that_reach_it(package, module, old, new, changed):
    if old.startswith("@decorate"):  # move compute to the end of the file: same trees, other lines
        _edit(package, module, old, new)
        (package / module).write_text((package / module).read_text() + "\n\n" + old)
        before = None
    else:
        before = _digests(package)
        _edit(package, module, old, new)
    after = _digests(package)
    if before is None:
        (package / module).write_text(textwrap.dedent(PACKAGE[module]))
        before = _digests(package)
    assert {s for s in after if after[s] != before[s]} == changed


def test_script_digest_errors(package, tmp_path):
    (tmp_path / "plain.py").write_text("print(1)\n")
    with pytest.raises(ValueError, match="imports nothing from arithmech"):
        script_digest(tmp_path / "plain.py", package)
    with pytest.raises(FileNotFoundError, match="is not the arithmech package"):
        script_digest(tmp_path / "compute.py", tmp_path)


def test_the_workflow_scripts_reach_what_they_run():
    """On the real package: patching reaches no plotting code, figures reach no model code, and every rule
    script has a digest (what the Snakefile puts in each rule's params)."""
    graph = CodeGraph(ROOT / "src/arithmech")
    scripts = sorted((ROOT / "workflow/scripts").glob("*.py"))
    reached = {s.stem: graph.reach(script_roots(s)) for s in scripts}
    for patching in ("patch_layer", "patch_all_layers"):
        assert ("arithmech.report.plots" not in reached[patching]
                and "direct_logits" in reached[patching]["arithmech.interp.patching"])
    assert "arithmech.report.plots" not in reached["study_train"]
    assert "arithmech.report.plots" not in reached["analyze"]
    for figure in ("plot_effects", "plot_knockout", "plot_transfer", "plot_analysis"):
        assert "arithmech.report.plots" in reached[figure]
        assert not ({"arithmech.model.loading", "arithmech.interp.patching", "arithmech.intervention.hooks"}
                    & set(reached[figure]))
    assert "direct_logits" not in reached["knockout"].get("arithmech.interp.patching", set())
    # one digest per script, equal exactly where two scripts reach the same code (patch_layer and
    # patch_all_layers call one entry point)
    digests = {s.stem: script_digest(s) for s in scripts}
    assert all(digests.values()) and digests["patch_layer"] == digests["patch_all_layers"]
    for a in digests:
        for b in digests:
            assert (digests[a] == digests[b]) == (reached[a] == reached[b]), (a, b)
