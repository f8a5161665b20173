"""The results layout (arithmech.layout): its path helpers, and that it is the one place naming what the rules write:
no rule, library module or rule script spells a result path itself, and every name it has is one a rule writes."""

import re

import pytest

from arithmech import layout
from helpers import ROOT

RULE_FILES = [ROOT / "Snakefile", *sorted((ROOT / "workflow/rules").glob("*.smk"))]
PATTERNS = {name: value for name, value in vars(layout).items()
            if name.isupper() and isinstance(value, str) and name not in ("RESULTS", "MODEL_DIR", "LOGS",
                                                                          "BENCHMARKS", "STUDY_DIR")}
# A result path spelled out: a stage's directory under results/<model>/ followed by a file or wildcard
RESULT_DIRS = sorted({value.split("/")[0] for value in PATTERNS.values() if "/" in value})
SPELLED_PATH = re.compile(r"""["'](results/[^"']*|(?:%s)/[\w{}.-]+\.(?:parquet|safetensors|png|html|md|json))["']"""
                          % "|".join(map(re.escape, RESULT_DIRS)))


def test_under_fills_the_wildcards_given_and_keeps_the_others():
    assert layout.under(layout.KEY) == "results/{model}/key_components/{task}.parquet"
    assert layout.under(layout.KEY, "m") == "results/m/key_components/{task}.parquet"
    assert layout.under(layout.KEY, task="addition") == "results/{model}/key_components/addition.parquet"
    assert layout.under(layout.STUDY_RUN, "m", arm="lora") == "results/m/finetune/study/runs/lora/{run}"
    assert layout.shared(layout.DATASET, dataset="mmlu") == "results/data/mmlu.parquet"


def test_match_reads_the_wildcards_of_an_instance_and_refuses_others():
    assert layout.match(layout.KNOCKOUT_FIGURE, "knockout/addition.png") == {"task": "addition"}
    assert layout.match(layout.PATCHING_LAYER, "patching/division/layer12.parquet") == {"task": "division",
                                                                                         "layer": "12"}
    assert layout.match(layout.SHARED_FIGURE, "key_components/shared.png") == {}
    assert layout.match(layout.DISCOVER_PATH_FIGURE, "discover/addition_circuit.png") is None
    assert layout.match(layout.EFFECTS_FIGURE, "effects/a/b.png") is None  # a wildcard stays in one component
    assert layout.match(layout.EFFECTS_FIGURE, "effects/addition.png.bak") is None


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_rules_name_their_results_through_the_layout(path):
    """A rule's inputs and outputs come from arithmech.layout; only logs and benchmarks (named after the rule and
    its wildcards) are spelled in the rule files."""
    spelled = [m.group(1) for m in SPELLED_PATH.finditer(path.read_text())
               if not re.match(r"results/(\{\{?model\}?\}/)?(logs|benchmarks)/", m.group(1))]
    assert not spelled, f"{path.name} spells result paths: {spelled}"


def test_the_library_and_rule_scripts_spell_no_result_path():
    """make docs, the page, the scorecard and the rule scripts read paths from arithmech.layout too."""
    files = [p for p in sorted((ROOT / "src/arithmech").rglob("*.py")) if p.name != "layout.py"]
    files += sorted((ROOT / "workflow/scripts").glob("*.py"))
    spelled = {str(p.relative_to(ROOT)): found for p in files
               if (found := [m.group(1) for m in SPELLED_PATH.finditer(p.read_text())])}
    assert not spelled, f"result paths spelled outside arithmech.layout: {spelled}"


def test_every_name_of_the_layout_is_one_a_rule_uses():
    rules = "\n".join(path.read_text() for path in RULE_FILES)
    unused = [name for name in PATTERNS if f"layout.{name}" not in rules]
    assert not unused, f"arithmech.layout names what no rule writes or reads: {unused}"


def test_the_check_finds_a_spelled_path():
    """Positive control: the pattern the tests above search for finds the spellings they forbid."""
    assert SPELLED_PATH.search('x = "knockout/addition.png"')
    assert SPELLED_PATH.search('table="results/{model}/claims.parquet",')
    assert not SPELLED_PATH.search("source=layout.KNOCKOUT_FIGURE")
