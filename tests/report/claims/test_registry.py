"""The registry of claims (arithmech.report.claims.registry): the scorecard it builds, every claim's record
(the paper column checked against the paper's text), and a claim added by registering its module."""

from __future__ import annotations

import dataclasses
import re

import pytest

from arithmech.report.claims import (
    common,
    few_key_heads,
    middle_layers,
    mlp_late,
    registry,
)
from claim_tables import (
    CFG,
    discover_summary,
    effects_table,
    key_table,
    probes,
    roles_all,
)
from helpers import ROOT


def test_no_key_head_is_said_in_the_row_and_nothing_fails():
    eff = effects_table({}, {3: (-0.1, -0.12, -0.08)})
    keys = {"addition": key_table(eff, [], [])}
    assert "selected no head" in few_key_heads.score(keys, {"addition": eff}, CFG)[1]["note"]
    middle = middle_layers.score(keys, 4, CFG)
    assert middle[0]["verdict"] == "not measured"
    assert mlp_late.score(keys, {"addition": eff}, CFG)[1]["verdict"] == "not measured"


def test_the_scorecard_without_discovery_or_circuit_arm_says_not_run():
    """The two new claims are in the table, not measured, when their inputs are absent (the workflow wires
    them when the rules run)."""
    eff = effects_table({(2, 1): -0.08}, {3: (-0.1, -0.12, -0.08)})
    tables = common.Tables(
        keys={"addition": key_table(eff, ["L2H1"], ["L3MLP"])}, effects={"addition": eff},
        knockout_items={"addition": None}, transfer_items=None, roles_all={"addition": roles_all(0.7, 0.2)},
        probes={"addition": probes(0.2, 0.05)})
    table = registry.scorecard(tables, CFG, seed=0)
    head = table[table["scope"] == "all"].set_index("claim")
    assert list(head.index) == list(registry.claims())  # every claim once, in order
    assert list(table.columns) == common.COLUMNS and list(table["claim"].drop_duplicates()) == list(head.index)
    assert head.loc["circuit_faithful", "verdict"] == "not measured"
    assert "discover rule did not run" in head.loc["circuit_faithful", "note"]
    assert head.loc["circuit_sufficient", "verdict"] == "not measured"
    assert "discover rule did not run" in head.loc["circuit_sufficient", "note"]
    assert head.loc["sft_circuit_vs_precise", "verdict"] == "not measured"
    with_discovery = registry.scorecard(dataclasses.replace(tables, discover=discover_summary("addition", [{}])),
                                        CFG, seed=0)
    assert with_discovery.set_index(["claim", "scope"]).loc[("circuit_faithful", "all"), "verdict"] == "holds"


PAPER_TEXT = ROOT.parent / "shared" / "paper"  # the paper's text, beside the checkout


def paper_text() -> str:
    """The paper's text as the checks read it: LaTeX's \\% and \\pm as written here, curly quotes straight,
    whitespace collapsed."""
    text = " ".join(p.read_text(encoding="utf-8") for p in sorted(PAPER_TEXT.glob("*.txt")))
    for a, b in (("\\%", "%"), ("\\pm", "+-"), ("’", "'"), ("“", '"'), ("”", '"'), ("–", "-")):
        text = text.replace(a, b)
    return " ".join(text.split())


def numbers(text: str) -> list[str]:
    """Every number of a text with its percent sign, thousands separators dropped: "1,024 heads, 5%" ->
    ["1024", "5%"]."""
    return [n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?%?", text)]


@pytest.mark.skipif(not PAPER_TEXT.is_dir(), reason=f"the paper's text is not at {PAPER_TEXT}")
def test_every_number_of_the_paper_column_is_in_the_papers_text():
    """The scorecard's "paper" column quotes the paper: each of its numbers (with its percent sign) appears in
    the text available here (../shared/paper, whose README lists what is missing, e.g. Table 1), and each quoted
    phrase appears there word for word; a claim whose number is not there says so instead of giving one."""
    text = paper_text()
    in_text = set(numbers(text))
    for claim in registry.claims().values():
        missing = [n for n in numbers(claim.paper) if n not in in_text]
        assert not missing, f"{claim.id}: {missing} of {claim.paper!r} are not in {PAPER_TEXT}"
        for quote in re.findall(r'"([^"]+)"', claim.paper):
            assert quote in text, f"{claim.id}: the quote {quote!r} is not in {PAPER_TEXT}"
    # the check can fail: Table 1's numbers are not in the text
    assert "48.1%" not in in_text and "1000" not in in_text


def test_the_paper_column_says_where_a_number_is_not_available():
    """The claims whose numbers are only in Table 1 or the knockout figures say so."""
    for claim in ("knockout_collapse", "sft_vs_full", "sft_off_target"):
        assert "not available here" in registry.claims()[claim].paper
    assert "no time is given" in registry.claims()["sft_speed"].paper
    assert "Table 1: not available here" in registry.claims()["sft_vs_full"].paper


def test_a_registered_claim_is_in_the_scorecard_and_on_the_findings_page(monkeypatch):
    """Adding a claim is its module and its line in the registry: the example claim module (tests/example_claim.py),
    registered, is the scorecard's last claim with its rows, and the Markdown scorecard and the findings page show
    it; unregistered, it is nowhere."""
    import example_claim
    from arithmech.report.page import findings_html
    from arithmech.report.scorecard import claims_markdown

    eff = effects_table({(2, 1): -0.08}, {3: (-0.1, -0.12, -0.08)})
    tables = common.Tables(
        keys={"addition": key_table(eff, ["L2H1"], ["L3MLP"]), "division": key_table(eff, [], ["L3MLP"])},
        effects={"addition": eff, "division": eff}, knockout_items={"addition": None, "division": None},
        transfer_items=None, roles_all={"addition": roles_all(0.7, 0.2), "division": roles_all(0.7, 0.2)},
        probes={"addition": probes(0.2, 0.05), "division": probes(0.2, 0.05)})
    before = registry.scorecard(tables, CFG, seed=0)
    assert "example_claim" not in set(before["claim"]) and "example_claim" not in registry.claims()
    monkeypatch.setattr(registry, "MODULES", (*registry.MODULES, example_claim))
    table = registry.scorecard(tables, CFG, seed=0)
    assert list(registry.claims())[-1] == "example_claim"
    (row,) = table[table["claim"] == "example_claim"].to_dict("records")
    assert row["verdict"] == "does not hold" and row["value"] == 1 and row["note"] == "addition"
    assert row["statement"] == example_claim.CLAIM.statement and table.iloc[-1]["claim"] == "example_claim"
    assert table.iloc[:-1].equals(before)  # the other claims' rows unchanged
    markdown = claims_markdown(table)
    assert example_claim.CLAIM.statement in markdown and example_claim.RULE in markdown
    page = findings_html(model="tiny", claims=table, keys={}, knockouts={}, figures={}, study=None, comparisons=None,
                         not_run=None, origin="")
    assert "id='claim-example_claim'" in page and "Every operator has a key head" in page
    assert "id='claim-example_claim'" not in findings_html(model="tiny", claims=before, keys={}, knockouts={},
                                                           figures={}, study=None, comparisons=None, not_run=None,
                                                           origin="")
