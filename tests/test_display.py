"""Numbers for people (arithmech.report.display), Markdown tables (arithmech.report.tables) and the claims
scorecard (arithmech.report.scorecard)."""

import math

import pandas as pd
import pytest

from arithmech.report import display
from arithmech.report.scorecard import claims_html, claims_markdown, scorecard_table, verdict_counts
from arithmech.report.tables import markdown_table
from claims_example import example_claims


@pytest.mark.parametrize("p, text", [
    (1.79e-58, "< 0.001"), (0.000999, "< 0.001"), (0.001, "0.0010"), (0.0423, "0.042"), (0.5, "0.50"),
    (0.0999, "0.10"), (1.0, "1.0"), (float("nan"), ""), (None, ""),
])
def test_p_values_two_significant_digits(p, text):
    assert display.p_value(p) == text


def test_percentages_counts_ratios_intervals():
    assert display.percent(12.345) == "12.3%" and display.share(0.125) == "12.5%"
    assert display.share(-0.0001) == "0.0%"  # no "-0.0"
    assert display.points(3.25) == "+3.2 points" and display.points(-41.3) == "-41.3 points"
    assert display.count(1179648) == "1,179,648" and display.count(pd.NA) == ""
    assert display.ratio(3.29) == "3.3x"
    assert display.interval(0.1, 0.25, display.share) == "[10.0%, 25.0%]"
    assert display.interval(math.nan, 1) == ""
    assert display.significant(1234) == "1,200" and display.significant(0.012345, 3) == "0.0123"


def test_effects_in_percent():
    assert display.effect(-0.01311) == "-1.31%"
    assert display.effect(-0.05) == "-5.00%"
    assert display.effect(-0.00004) == "0.00%"
    assert display.effect(-0.01311, "prob_change") == "-1.31 points"
    assert display.effect(-1.2345, "logit_diff") == "-1.23"


def test_measured_value_with_interval_and_n():
    assert display.measured(-41.3, -55.0, -28.4, "points", 120) == "-41.3 points [-55.0, -28.4], n = 120"
    assert display.measured(2.2, math.nan, math.nan, "percent", 270) == "2.2%, n = 270"
    assert display.measured(-0.01311, -0.015, -0.011, "effect", None) == "-1.31% [-1.50, -1.10]"
    assert display.measured(3.29, math.nan, math.nan, "ratio", pd.NA) == "3.3x"
    assert display.measured(math.nan, math.nan, math.nan, "points", pd.NA) == ""


def test_markdown_scorecard():
    md = claims_markdown(example_claims())
    lines = md.splitlines()
    assert lines[0].startswith("| Claim | Paper (LLaMA2-7B) |")
    heads = [l for l in lines[2:] if "↳" not in l]
    assert len(heads) == example_claims()["claim"].nunique()  # one row per claim, then its scopes
    assert len(lines) == 2 + len(example_claims())
    assert all(l.replace("\\|", "").count("|") == 6 for l in lines)  # five cells on every line
    assert "🟢 **holds**" in md and "🔴 **does not hold**" in md and "▫️ **not measured**" in md
    assert "-1.31% [-1.50, -1.10], n = 120 (validation)" in md
    assert "n = 1,179,648" in md and "3.3x" in md
    assert "addition \\| end" in md  # a pipe inside a cell is escaped
    assert "*the transfer rule did not run (configs/paper.yaml)*" in md
    short = claims_markdown(example_claims(), sub_rows=False, link=lambda s: f"docs/figures/{s}")
    assert "↳" not in short and "[Fewer than 5% of heads are key heads.](docs/figures/key_components/shared.png)" in short
    assert "[The key heads transfer" not in short  # no source, no link


def test_html_scorecard_colours_every_verdict():
    claims = example_claims()
    page = claims_html(claims)
    assert page.startswith("<!DOCTYPE html>")
    for verdict in ["holds", "partly", "does-not-hold", "inconclusive", "not-measured"]:
        assert f"class='verdict {verdict}'" in page and f".verdict.{verdict}{{" in page
    assert "Of 9 claims: 4 hold, 2 hold partly, 1 does not hold, 1 is inconclusive, 1 is not measured." in page
    table = scorecard_table(claims, link=lambda s: ("#fig-x", "figure") if s.endswith(".png") else None)
    assert "<a href='#fig-x'>figure</a>" in table and "<span class='source'>finetune/study.md</span>" in table
    assert "id='claim-knockout_collapse'" in table


def test_bad_verdicts_and_missing_headline_fail():
    claims = example_claims()
    with pytest.raises(ValueError, match="unknown verdicts"):
        claims_markdown(claims.assign(verdict="maybe"))
    with pytest.raises(ValueError, match="headline"):
        claims_markdown(claims[claims["scope"] != "all"])
    assert verdict_counts(claims[claims["claim"] == "transfer"]) == "Of 1 claim: 1 is not measured."


def test_markdown_table_keeps_cells_as_formatted():
    """Unpadded cells and a three-dash rule per column, as the committed docs have them; a cell's line breaks
    become spaces and its pipes are escaped, a missing value is an empty cell."""
    df = pd.DataFrame({"task": ["addition", None], "b | c": ["12.5% [10.1, 14.9]", " two\n lines "]})
    assert markdown_table(df) == ("| task | b \\| c |\n|---|---|\n| addition | 12.5% [10.1, 14.9] |\n"
                                  "|  | two lines |\n")
    assert markdown_table(df.iloc[:0]) == "| task | b \\| c |\n|---|---|\n"
