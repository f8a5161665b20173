"""The claims scorecard for people: the claims table (arithmech.report.claims, one row per claim and scope) as a
GitHub Markdown table and as HTML with coloured verdicts. The claims rule writes claims.md and claims.html
with these; the findings page and `make docs` show the same table. Torch-free.

A claim's headline row (scope "all") carries its statement, the paper's number, the rule and the verdict;
its other rows (one operator, one target, ...) follow it with their own value and verdict: indented in
Markdown, folded under the claim's line in HTML. Each rule's text is written once per claim.
"""

from __future__ import annotations

import html
from typing import Callable

import pandas as pd

from arithmech.report import display
from arithmech.report.claims.common import COMBINE_RULE, VERDICTS
from arithmech.report.tables import markdown_cell

# Markdown has no colour: a coloured mark before the word does the same work on GitHub
VERDICT_MARKS = {"holds": "🟢", "partly": "🟡", "does not hold": "🔴", "inconclusive": "⚪", "not measured": "▫️"}
# (text, background) of each verdict's badge on the HTML pages
VERDICT_COLOURS = {
    "holds": ("#0f5323", "#c8f0d0"),
    "partly": ("#6b4a00", "#ffe08a"),
    "does not hold": ("#86181d", "#ffc9c9"),
    "inconclusive": ("#3d444d", "#d8dde3"),
    "not measured": ("#6e7781", "#f3f4f6"),
}
HEADLINE = "all"


def _text(value) -> str:
    """A cell's text: "" for a missing value."""
    return "" if display.missing(value) else str(value)


def measured_text(row) -> str:
    """What was measured and its value: "share of heads that are key: 2.2% [1.8, 2.6], n = 270 (identification)"."""
    value = display.measured(row["value"], row["ci_low"], row["ci_high"], row["unit"], row["n"])
    split = _text(row.get("split"))
    if value and split:
        value = f"{value} ({split})"
    measure = _text(row["measure"])
    return f"{measure}: {value}" if measure and value else measure or value


def grouped(claims: pd.DataFrame) -> list[tuple[pd.Series, pd.DataFrame]]:
    """(headline row, its other rows) per claim, in the table's order."""
    out = []
    for claim in claims["claim"].drop_duplicates():
        rows = claims[claims["claim"] == claim]
        head = rows[rows["scope"] == HEADLINE]
        if head.empty:
            raise ValueError(f"claim {claim!r} has no headline row (scope {HEADLINE!r})")
        out.append((head.iloc[0], rows[rows["scope"] != HEADLINE]))
    return out


def check_verdicts(claims: pd.DataFrame) -> None:
    unknown = sorted(set(claims["verdict"]) - set(VERDICTS))
    if unknown:
        raise ValueError(f"unknown verdicts {unknown}; expected one of {list(VERDICTS)}")


# ---------------------------------------------------------------------------------------------------
# Markdown


def claims_markdown(claims: pd.DataFrame, sub_rows: bool = True,
                    link: Callable[[str], str | None] | None = None,
                    mark: Callable[[pd.Series], str] | None = None) -> str:
    """The scorecard as a GitHub Markdown table: per claim its statement, the paper's number (LLaMA2-7B), what
    was measured on this model (value, interval, n, split; the note in italics), the verdict and the rule
    that decided it. With `sub_rows`, each claim's other scopes follow as indented rows. `link(source)` gives
    the URL of a row's figure or table (None: no link); the claim's statement links to it. `mark(row)` gives a
    remark on a row's verdict, in italics under it ("": none)."""
    check_verdicts(claims)
    # rows written here, not by tables.markdown_table: a sub-row's empty paper cell reads "| |" in the committed
    # docs, and markdown_table pads every cell alike ("|  |")
    lines = ["| Claim | Paper (LLaMA2-7B) | Measured on this model | Verdict | Decided by |",
             "|---|---|---|---|---|"]

    def measured_cell(row) -> str:
        note = markdown_cell(row["note"])
        text = markdown_cell(measured_text(row))
        return "<br>".join(t for t in (text, f"*{note}*" if note else "") if t)

    def verdict_cell(row) -> str:
        remark = markdown_cell(mark(row)) if mark else ""
        return f"{VERDICT_MARKS[row['verdict']]} **{row['verdict']}**" + (f"<br>*{remark}*" if remark else "")

    for head, subs in grouped(claims):
        statement = markdown_cell(head["statement"])
        url = link(_text(head["source"])) if link and _text(head["source"]) else None
        if url:
            statement = f"[{statement}]({url})"
        lines.append(f"| {statement} | {markdown_cell(head['paper'])} | {measured_cell(head)} | "
                     f"{verdict_cell(head)} | {markdown_cell(head['rule'])} |")
        if not sub_rows:
            continue
        shown = {_text(head["rule"])}  # each rule's text once per claim
        for _, row in subs.iterrows():
            rule = markdown_cell(row["rule"]) if _text(row["rule"]) not in shown else ""
            shown.add(_text(row["rule"]))
            lines.append(f"| &nbsp;&nbsp;↳ {markdown_cell(row['scope'])} | | {measured_cell(row)} | "
                         f"{verdict_cell(row)} | {rule} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# HTML
#
# One line per claim answers the question on the first screen: the claim, its verdict, the number that decided
# it and the paper's. Each line is a <details> element: a click opens what is behind it (the rule, once; the
# note; the figure or table; the sub-rows). Plain HTML and CSS: no script, so the page works offline and in
# the Snakemake report's viewer alike.

COLUMNS_CSS = "grid-template-columns:14px minmax(0,3.3fr) 112px minmax(0,2.8fr) minmax(0,2.5fr)"
SCORECARD_CSS = (
    f".scorecard .line{{display:grid;{COLUMNS_CSS};column-gap:10px;align-items:start;padding:4px 6px}}"
    ".scorecard .heading{font-weight:600;background:#f6f8fa;border-bottom:2px solid #d0d7de;font-size:14px}"
    ".scorecard details{border-bottom:1px solid #e1e4e8}"
    ".scorecard summary{cursor:pointer;list-style:none;font-size:13.5px;line-height:1.35}"
    ".scorecard summary::-webkit-details-marker{display:none}"
    ".scorecard summary:hover{background:#f6f8fa}"
    ".scorecard .toggle::before{content:'\\25B8';color:#57606a}"
    ".scorecard details[open]>summary .toggle::before{content:'\\25BE'}"
    ".scorecard details[open]>summary{background:#f6f8fa}"
    ".scorecard .stage{color:#8c959f;font-size:12px;font-weight:400}"
    ".scorecard .value{font-weight:600}"
    ".scorecard .measure,.scorecard .paper,.scorecard .parts{color:#57606a;font-size:12.5px}"
    ".scorecard .more{padding:4px 8px 10px 34px;font-size:13px}"
    ".scorecard .more p{margin:4px 0;max-width:90em}"
    ".scorecard .label{font-weight:600;color:#1f2328}"
    ".scorecard .note,.scorecard .rule{color:#57606a}"
    ".scorecard .source{font-family:monospace;font-size:12px;color:#57606a}"
    "table.subrows{border-collapse:collapse;width:100%;font-size:12.5px;margin-top:6px}"
    "table.subrows th{text-align:left;background:#f6f8fa;border-bottom:1px solid #d0d7de;padding:3px 6px}"
    "table.subrows td{vertical-align:top;text-align:left;padding:3px 6px;border-bottom:1px dotted #e1e4e8}"
    ".scorecard-legend{color:#57606a;font-size:12.5px;max-width:90em}"
    ".verdict{display:inline-block;border-radius:10px;padding:1px 9px;font-weight:600;white-space:nowrap;"
    "font-size:12.5px}"
    + "".join(f".verdict.{cls}{{color:{fg};background:{bg}}}"
              for cls, (fg, bg) in ((v.replace(" ", "-"), c) for v, c in VERDICT_COLOURS.items()))
)


def verdict_badge(verdict: str) -> str:
    return f"<span class='verdict {verdict.replace(' ', '-')}'>{html.escape(verdict)}</span>"


def _measured_html(row, with_note: bool = True) -> str:
    """The value (bold) with its interval and n, what it measures and on which split, then the note."""
    e = html.escape
    value = display.measured(row["value"], row["ci_low"], row["ci_high"], row["unit"], row["n"])
    split = _text(row.get("split"))
    parts = []
    if value:
        parts.append(f"<span class='value'>{e(value)}</span>")
    what = _text(row["measure"]) + (f" ({split})" if split and value else "")
    if what:
        parts.append(f"<span class='measure'>{e(what)}</span>")
    if with_note and _text(row["note"]):
        parts.append(f"<span class='note'>{e(_text(row['note']))}</span>")
    return "<br>".join(parts)


def _parts_text(head, subs: pd.DataFrame) -> str:
    """The sub-rows' verdicts in words, named as the headline's measure names them: "per operator: 2 hold,
    2 do not hold"."""
    if subs.empty:
        return ""
    name = _text(head["measure"]).removesuffix(", below") if _text(head["measure"]).endswith(", below") else ""
    return f"{name or f'{len(subs)} parts'}: {verdict_summary(subs['verdict'])}"


def _headline_cell(head, subs: pd.DataFrame) -> str:
    """What decided the claim, on its line: the value where the headline has one (else the sub-rows' verdicts,
    else why nothing was measured)."""
    e = html.escape
    value = display.measured(head["value"], head["ci_low"], head["ci_high"], head["unit"], head["n"])
    parts = _parts_text(head, subs)
    if value:
        text = _measured_html(head, with_note=False)
        return text + (f"<span class='parts'> · {e(parts)}</span>" if parts else "")
    if parts:
        return f"<span class='value'>{e(parts)}</span>"
    return f"<span class='note'>{e(_text(head['note']) or _text(head['measure']))}</span>"


def scorecard_table(claims: pd.DataFrame, link: Callable[[str], tuple[str, str] | None] | None = None) -> str:
    """The scorecard as HTML (style: SCORECARD_CSS): one line per claim (claim, verdict, the number that decided
    it, the paper's), each a <details> that opens on what is behind it: the rule (once per claim), the note,
    the figure or table, and the sub-rows (one operator, target, ...) as a table. Verdicts are coloured badges.
    `link(source)` gives (href, text) of a row's figure or table: a link, or with href None the text alone;
    None shows the source's path."""
    check_verdicts(claims)
    e = html.escape

    def source_cell(row) -> str:
        source = _text(row["source"])
        href, text = (link(source) if link and source else None) or (None, source)
        if href:
            return f"<a href='{e(href, quote=True)}'>{e(text)}</a>"
        return f"<span class='source'>{e(text)}</span>" if text else ""

    out = ["<div class='scorecard'><div class='line heading'><span></span><span>Claim</span><span>Verdict</span>"
           "<span>Measured on this model</span><span>Paper (LLaMA2-7B)</span></div>"]
    combined = False
    for head, subs in grouped(claims):
        claim_rule = _text(head["rule"])
        combined |= claim_rule == COMBINE_RULE  # given once, under the table
        # each distinct rule once: the headline's, then the sub-rows' (lettered when they differ)
        sub_rules = [r for r in dict.fromkeys(_text(r) for r in subs["rule"]) if r and r != claim_rule]
        letters = {r: chr(ord("A") + i) for i, r in enumerate(sub_rules)} if len(sub_rules) > 1 else {}
        more = []
        if claim_rule and claim_rule != COMBINE_RULE:
            more.append(f"<p class='rule'><span class='label'>Decided by:</span> {e(claim_rule)}</p>")
        elif claim_rule:
            more.append("<p class='rule'><span class='label'>Decided by:</span> its parts' verdicts, combined "
                        "(under the table)</p>")
        for rule in sub_rules:
            label = f"Rule {letters[rule]}" if letters else "Each part is decided by"
            more.append(f"<p class='rule'><span class='label'>{label}:</span> {e(rule)}</p>")
        # the sub-rows' verdict counts are on the claim's line already
        note = "; ".join(p for p in _text(head["note"]).split("; ") if not p.startswith("sub-rows: "))
        if note:
            more.append(f"<p class='note'><span class='label'>Note:</span> {e(note)}</p>")
        if _text(head["source"]):
            more.append(f"<p><span class='label'>Behind it:</span> {source_cell(head)}</p>")
        if not subs.empty:
            # a part's figure or table where it is not the claim's own
            sources = [source_cell(row) if _text(row["source"]) != _text(head["source"]) else ""
                       for _, row in subs.iterrows()]
            more.append("<table class='subrows'><thead><tr><th>Part</th><th>Verdict</th>"
                        "<th>Measured on this model</th>" + ("<th>Rule</th>" if letters else "")
                        + ("<th>Behind it</th>" if any(sources) else "") + "</tr></thead><tbody>")
            for (_, row), source in zip(subs.iterrows(), sources):
                rule = f"<td class='rule'>{e(letters.get(_text(row['rule']), ''))}</td>" if letters else ""
                more.append(f"<tr><td>{e(_text(row['scope']))}</td><td>{verdict_badge(row['verdict'])}</td>"
                            f"<td>{_measured_html(row)}</td>{rule}"
                            + (f"<td>{source}</td>" if any(sources) else "") + "</tr>")
            more.append("</tbody></table>")
        out.append(
            f"<details class='claim' id='claim-{e(_text(head['claim']), quote=True)}'>"
            f"<summary class='line'><span class='toggle'></span>"
            f"<span><b>{e(_text(head['statement']))}</b> <span class='stage'>{e(_text(head['stage']))}</span></span>"
            f"<span>{verdict_badge(head['verdict'])}</span><span>{_headline_cell(head, subs)}</span>"
            f"<span class='paper'>{e(_text(head['paper']))}</span></summary>"
            f"<div class='more'>{''.join(more)}</div></details>"
        )
    out.append("</div>")
    legend = ("Click a claim for its rule, its note, the figure or table behind it and its parts (one operator, "
              "target or measure each). Intervals are 95%; n is the number of items behind a value.")
    if combined:
        legend += f" A claim decided by its parts' verdicts {COMBINE_RULE.removeprefix('headline: ')}."
    out.append(f"<p class='scorecard-legend'>{e(legend)}</p>")
    return "".join(out)


# (one, several) of each verdict
VERDICT_WORDS = {"holds": ("holds", "hold"), "partly": ("holds partly", "hold partly"),
                 "does not hold": ("does not hold", "do not hold"),
                 "inconclusive": ("is inconclusive", "are inconclusive"),
                 "not measured": ("is not measured", "are not measured")}
SHORT_WORDS = {"holds": ("holds", "hold"), "partly": ("partly", "partly"),
               "does not hold": ("does not hold", "do not hold"), "inconclusive": ("inconclusive", "inconclusive"),
               "not measured": ("not measured", "not measured")}


def verdict_summary(verdicts, words: dict = SHORT_WORDS) -> str:
    """How many of each verdict, in VERDICTS' order: "2 hold, 1 does not hold, 1 inconclusive"."""
    counts = pd.Series(list(verdicts), dtype=object).value_counts()
    return ", ".join(f"{counts[v]} {words[v][int(counts[v] != 1)]}" for v in VERDICTS if v in counts)


def verdict_counts(claims: pd.DataFrame) -> str:
    """How the claims came out, headline rows only: "Of 11 claims: 5 hold, 1 does not hold, 2 are inconclusive."."""
    verdicts = claims.loc[claims["scope"] == HEADLINE, "verdict"]
    total = len(verdicts)
    return f"Of {total} claim{'s' if total != 1 else ''}: {verdict_summary(verdicts, VERDICT_WORDS)}."


PAGE_CSS = ("body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:16px 24px;color:#1f2328;"
            "line-height:1.4}h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin-top:28px;"
            "border-bottom:1px solid #d0d7de;padding-bottom:4px}.lead{color:#57606a;max-width:80em;margin:4px 0 12px}")


def claims_html(claims: pd.DataFrame, title: str = "Claims scorecard") -> str:
    """A standalone HTML page of the scorecard (claims.html)."""
    e = html.escape
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{PAGE_CSS}{SCORECARD_CSS}</style></head><body><h1>{e(title)}</h1>"
            f"<p class='lead'>{e(verdict_counts(claims))}</p>"
            f"{scorecard_table(claims)}</body></html>\n")
