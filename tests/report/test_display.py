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
    """A value with a resampled interval reads at the interval's precision; without one, at its unit's digits."""
    assert display.measured(-41.3, -55.0, -28.4, "points", 120) == "-41 points [-55, -28], n = 120"
    assert display.measured(-14.0, -25.0, -3.1, "points", 120) == "-14 points [-25, -3], n = 120"
    assert display.measured(4.2, -1.0, 9.6, "points", None) == "+4 points [-1, +10]"
    assert display.measured(2.2, math.nan, math.nan, "percent", 270) == "2.2%, n = 270"
    assert display.measured(12.5, 8.1, 17.0, "percent", 1200) == "12% [8, 17], n = 1,200"
    assert display.measured(2.5, 1.9, 3.1, "percent", 1200) == "2.5% [1.9, 3.1], n = 1,200"
    assert display.measured(-0.01311, -0.015, -0.011, "effect", None) == "-1.3% [-1.5, -1.1]"
    assert display.measured(-0.000955, -0.002459, 0.000549, "nats", 64) == "-0.0010 nats [-0.0025, 0.0005], n = 64"
    assert display.measured(0.0, 0.0, 0.0, "points", 10) == "0.0 points [0.0, 0.0], n = 10"  # no width: unit digits
    assert display.measured(0.00099, math.nan, math.nan, "nats", 64) == "1e-3 nats, n = 64"
    assert display.measured(3.29, math.nan, math.nan, "ratio", pd.NA) == "3.3x"
    assert display.measured(math.nan, math.nan, math.nan, "points", pd.NA) == ""


@pytest.mark.parametrize("low, high, scale, decimals", [
    (-16.57, -5.76, 1, 0), (-4.41, 2.93, 1, 1), (9.84, 12.74, 1, 0), (-0.31, -0.23, 1, 2),
    (-0.0166, -0.0116, 100, 1), (-0.002459, 0.000549, 1, 4), (0.0, 0.1, 1, 2), (150.0, 1500.0, 1, 0),
    (1.0, 1.0, 1, None), (math.nan, 1.0, 1, None), (0.0, math.inf, 1, None),
])
def test_interval_decimals_two_significant_digits_of_width_or_end(low, high, scale, decimals):
    assert display.interval_decimals(low, high, scale) == decimals


def test_estimate_and_bounds_at_the_interval_precision():
    assert display.bounds(-16.57, -5.76) == "[-17, -6]"
    assert display.bounds(-0.0441, 0.0293, scale=100, sign=True) == "[-4.4, +2.9]"
    assert display.estimate(-0.1162, -0.1658, -0.0576, scale=100, sign=True, suffix="%") == "-12%"
    assert display.estimate(-0.0004, -0.005, 0.005, scale=100, sign=True) == "0.0"  # no "+0.0" or "-0.0"
    # a zero width falls back: the default is two significant digits, a given fallback brings its own unit
    assert display.bounds(0.0, 0.0, scale=100) == "[0.0, 0.0]"
    assert display.estimate(0.25, 0.25, 0.25, scale=100, suffix="%", fallback=display.share) == "25.0%"
    assert display.bounds(0.25, 0.25, scale=100, suffix="%", fallback=display.share) == "[25.0%, 25.0%]"
    assert display.bounds(math.nan, 1) == "" and display.estimate(None, 0, 1) == ""


def test_effects_with_intervals():
    assert display.effect(-0.0422, "relative_logit", -0.0612, -0.0266) == "-4.2%"
    assert display.effect_bounds(-0.0612, -0.0266) == "[-6.1%, -2.7%]"
    assert display.effect(-0.0027, low=-0.0031, high=-0.0023) == "-0.27%"
    assert display.effect_bounds(-0.015, -0.011, "prob_change") == "[-1.5, -1.1]"
    assert display.effect(-0.01311, "prob_change", -0.015, -0.011) == "-1.3 points"
    assert display.effect_bounds(-0.01, -0.01) == "[-1.00%, -1.00%]"  # no width: the effect's own digits


@pytest.mark.parametrize("fraction, text", [
    (1.0, "100%"), (0.999, "> 99%"), (0.998, "> 99%"), (0.995, "> 99%"), (0.99, "99%"), (0.904, "90%"),
    (0.5, "50%"), (0.004, "< 1%"), (0.0, "0%"), (math.nan, ""),
])
def test_resampled_share_whole_percent(fraction, text):
    assert display.resampled_share(fraction) == text


@pytest.mark.parametrize("value, text", [
    (0.0123, "0.012"), (0.0131, "0.013"), (-0.000955, "-1e-3"), (-0.00096, "-1e-3"), (0.00099, "1e-3"),
    (5.5e-5, "6e-5"), (0.0, "0"), (-0.5, "-0.50"), (math.nan, ""),
])
def test_nats_small_values_in_scientific_notation(value, text):
    assert display.nats(value) == text


@pytest.mark.parametrize("kind, one, other", [
    # the last digits `make docs` changed between two CPUs (2026-11-25): the same text now on both
    ("share of resamples", display.resampled_share(0.998), display.resampled_share(0.999)),
    ("interval end", display.bounds(-0.16574, -0.0576, scale=100, sign=True),
     display.bounds(-0.16576, -0.0576, scale=100, sign=True)),
    ("interval end", display.bounds(-0.04406, 0.0293, scale=100, sign=True),
     display.bounds(-0.04404, 0.0293, scale=100, sign=True)),
    ("KL difference", display.nats(-0.000954), display.nats(-0.000956)),
    ("KL with interval", display.measured(-0.000954, -0.002459, 0.000549, "nats"),
     display.measured(-0.000956, -0.002459, 0.000549, "nats")),
])
def test_last_digit_noise_between_machines_prints_the_same(kind, one, other):
    assert one == other, kind


def test_markdown_scorecard():
    md = claims_markdown(example_claims())
    lines = md.splitlines()
    assert lines[0].startswith("| Claim | Paper (LLaMA2-7B) |")
    heads = [l for l in lines[2:] if "↳" not in l]
    assert len(heads) == example_claims()["claim"].nunique()  # one row per claim, then its scopes
    assert len(lines) == 2 + len(example_claims())
    assert all(l.replace("\\|", "").count("|") == 6 for l in lines)  # five cells on every line
    assert "🟢 **holds**" in md and "🔴 **does not hold**" in md and "▫️ **not measured**" in md
    assert "-1.3% [-1.5, -1.1], n = 120 (validation)" in md
    assert "n = 1,179,648" in md and "3.3x" in md
    assert "addition \\| end" in md  # a pipe inside a cell is escaped
    assert "*the transfer rule did not run (configs/paper.yaml)*" in md
    short = claims_markdown(example_claims(), sub_rows=False, link=lambda s: f"docs/figures/{s}")
    assert ("↳" not in short
            and "[Fewer than 5% of heads are key heads.](docs/figures/key_components/shared.png)" in short)
    assert "[The key heads transfer" not in short  # no source, no link
    marked = claims_markdown(example_claims(), mark=lambda row: "a | remark" if row["scope"] == "division" else "")
    assert "🟢 **holds**<br>*a \\| remark* |" in marked and marked.count("remark") == 1  # under that verdict only


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


def test_an_interval_end_keeps_its_side_of_zero():
    """Rounding an end to 0 would hide whether the interval crosses 0, which a verdict turns on."""
    assert display.bounds(-0.1, 36.6, sign=True) == "[-0.1, +37]"
    assert display.bounds(0.004, 0.9) == "[0.004, 0.90]"
    assert display.bounds(0.0, 36.6, sign=True) == "[0, +37]"
    assert display.estimate(-0.04, -0.1, 36.6) == "0"  # an estimate reads at the interval's precision
