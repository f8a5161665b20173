"""arithmech.interp.protocol: the teacher-forced protocol's names have one home, importable without torch (the
scorecard and make docs read its tables on machines that need no model)."""

import re
import subprocess
import sys

from arithmech.interp import protocol
from helpers import ROOT


def test_the_protocol_names_import_without_torch():
    code = "import sys, arithmech.interp.protocol, arithmech.report.claims.registry; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_no_module_spells_the_ablation_kinds_itself():
    spelled = re.compile(r"""\(\s*["']resample["']\s*,\s*["']mean["']\s*\)|\(\s*["']mean["']\s*,\s*["']resample["']""")
    assert spelled.search(repr(protocol.KINDS))  # positive control: the search finds the tuple as written
    files = [p for p in sorted((ROOT / "src/arithmech").rglob("*.py")) if p.name != "protocol.py"]
    files += sorted((ROOT / "workflow/scripts").glob("*.py"))
    found = [str(p.relative_to(ROOT)) for p in files if spelled.search(p.read_text())]
    assert not found, f"the ablation kinds spelled outside arithmech.interp.protocol: {found}"


def test_the_transfers_sets_are_each_operator_then_each_format_then_svamp_and_non_math():
    """One list for rule transfer (tests/stages/test_stages.py checks its table's targets follow it) and the plan."""
    from arithmech.data.arithmetic import FORMATS

    sets = protocol.transfer_sets(["addition", "division"])
    assert sets[:2] == [("operator", "addition"), ("operator", "division")]
    assert sets[2:-2] == [(fmt, task) for fmt in FORMATS for task in ("addition", "division")]
    assert sets[-2:] == [("svamp", None), ("non_math", None)]
