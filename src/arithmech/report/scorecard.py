"""The claims scorecard for people: the claims table (arithmech.report.verdicts, one row per claim and scope) as a
GitHub Markdown table and as HTML with coloured verdicts. The claims rule writes claims.md and claims.html
with these; the findings page and `make docs` show the same table. Torch-free.

A claim's headline row (scope "all") carries its statement, the paper's number, the rule and the verdict;
its other rows (one operator, one target, ...) follow it, indented, with their own value and verdict.
"""

from __future__ import annotations

import html
from typing import Callable

import pandas as pd

from arithmech.report import display
from arithmech.report.tables import markdown_cell

VERDICTS = ("holds", "partly", "does not hold", "inconclusive", "not measured")
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


def claims_markdown(claims: pd.DataFrame, sub_rows: bool = True, link: Callable[[str], str | None] | None = None) -> str:
    """The scorecard as a GitHub Markdown table: per claim its statement, the paper's number (LLaMA2-7B), what
    was measured on this model (value, interval, n, split; the note in italics), the verdict and the rule
    that decided it. With `sub_rows`, each claim's other scopes follow as indented rows. `link(source)` gives
    the URL of a row's figure or table (None: no link); the claim's statement links to it."""
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
        return f"{VERDICT_MARKS[row['verdict']]} **{row['verdict']}**"

    for head, subs in grouped(claims):
        statement = markdown_cell(head["statement"])
        url = link(_text(head["source"])) if link and _text(head["source"]) else None
        if url:
            statement = f"[{statement}]({url})"
        lines.append(f"| {statement} | {markdown_cell(head['paper'])} | {measured_cell(head)} | "
                     f"{verdict_cell(head)} | {markdown_cell(head['rule'])} |")
        if not sub_rows:
            continue
        for _, row in subs.iterrows():
            rule = markdown_cell(row["rule"]) if _text(row["rule"]) != _text(head["rule"]) else ""
            lines.append(f"| &nbsp;&nbsp;↳ {markdown_cell(row['scope'])} | | {measured_cell(row)} | "
                         f"{verdict_cell(row)} | {rule} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# HTML

SCORECARD_CSS = (
    "table.scorecard{border-collapse:collapse;width:100%;font-size:14px}"
    "table.scorecard th{text-align:left;background:#f6f8fa;border-bottom:2px solid #d0d7de;padding:6px 8px}"
    "table.scorecard td{vertical-align:top;text-align:left;padding:6px 8px;border-bottom:1px solid #e1e4e8}"
    "table.scorecard tr.sub td{font-size:12.5px;color:#444;padding-top:2px;padding-bottom:2px;"
    "border-bottom:1px dotted #eee}"
    "table.scorecard tr.sub td.claim{padding-left:2em}"
    "table.scorecard .value{font-weight:600;white-space:nowrap}"
    "table.scorecard .note{color:#57606a;font-size:12.5px}"
    "table.scorecard .rule{color:#57606a;font-size:12.5px}"
    "table.scorecard .source{font-family:monospace;font-size:12px;color:#57606a}"
    ".verdict{display:inline-block;border-radius:10px;padding:1px 9px;font-weight:600;white-space:nowrap;"
    "font-size:12.5px}"
    + "".join(f".verdict.{cls}{{color:{fg};background:{bg}}}"
              for cls, (fg, bg) in ((v.replace(" ", "-"), c) for v, c in VERDICT_COLOURS.items()))
)


def verdict_badge(verdict: str) -> str:
    return f"<span class='verdict {verdict.replace(' ', '-')}'>{html.escape(verdict)}</span>"


def _measured_html(row) -> str:
    e = html.escape
    value = display.measured(row["value"], row["ci_low"], row["ci_high"], row["unit"], row["n"])
    split = _text(row.get("split"))
    parts = []
    if _text(row["measure"]):
        parts.append(e(_text(row["measure"])) + (":" if value else ""))
    if value:
        parts.append(f"<span class='value'>{e(value)}</span>" + (f" ({e(split)})" if split else ""))
    text = " ".join(parts)
    if _text(row["note"]):
        text += ("<br>" if text else "") + f"<span class='note'>{e(_text(row['note']))}</span>"
    return text


def scorecard_table(claims: pd.DataFrame, link: Callable[[str], tuple[str, str] | None] | None = None) -> str:
    """The scorecard as an HTML <table class='scorecard'> (style: SCORECARD_CSS): headline rows, then each
    claim's other scopes as indented rows; verdicts as coloured badges. `link(source)` gives (href, text) of
    the row's figure or table: a link, or with href None the text alone; None shows the source's path."""
    check_verdicts(claims)
    e = html.escape

    def source_cell(row) -> str:
        source = _text(row["source"])
        href, text = (link(source) if link and source else None) or (None, source)
        if href:
            return f"<a href='{e(href, quote=True)}'>{e(text)}</a>"
        return f"<span class='source'>{e(text)}</span>" if text else ""

    rows = ["<table class='scorecard'><thead><tr><th>Claim</th><th>Paper (LLaMA2-7B)</th>"
            "<th>Measured on this model</th><th>Verdict</th><th>Decided by</th><th>Behind it</th></tr></thead><tbody>"]
    for head, subs in grouped(claims):
        rows.append(
            f"<tr class='claim' id='claim-{e(_text(head['claim']), quote=True)}'>"
            f"<td class='claim'><b>{e(_text(head['statement']))}</b>"
            f"<br><span class='rule'>{e(_text(head['stage']))}</span></td>"
            f"<td>{e(_text(head['paper']))}</td><td>{_measured_html(head)}</td>"
            f"<td>{verdict_badge(head['verdict'])}</td><td class='rule'>{e(_text(head['rule']))}</td>"
            f"<td>{source_cell(head)}</td></tr>"
        )
        for _, row in subs.iterrows():
            rule = _text(row["rule"]) if _text(row["rule"]) != _text(head["rule"]) else ""
            rows.append(
                f"<tr class='sub'><td class='claim'>↳ {e(_text(row['scope']))}</td><td></td>"
                f"<td>{_measured_html(row)}</td><td>{verdict_badge(row['verdict'])}</td>"
                f"<td class='rule'>{e(rule)}</td><td>{source_cell(row)}</td></tr>"
            )
    rows.append("</tbody></table>")
    return "".join(rows)


def verdict_counts(claims: pd.DataFrame) -> str:
    """How the claims came out, headline rows only: "Of 11 claims: 5 hold, 1 does not hold, 2 are inconclusive."."""
    counts = claims.loc[claims["scope"] == HEADLINE, "verdict"].value_counts()
    # (one, several) of each verdict
    words = {"holds": ("holds", "hold"), "partly": ("holds partly", "hold partly"),
             "does not hold": ("does not hold", "do not hold"), "inconclusive": ("is inconclusive", "are inconclusive"),
             "not measured": ("is not measured", "are not measured")}
    parts = [f"{counts[v]} {words[v][int(counts[v] != 1)]}" for v in VERDICTS if v in counts]
    total = int(counts.sum())
    return f"Of {total} claim{'s' if total != 1 else ''}: {', '.join(parts)}."


PAGE_CSS = ("body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px;color:#1f2328;"
            "line-height:1.4}h1{font-size:24px;margin-bottom:4px}h2{font-size:19px;margin-top:28px;"
            "border-bottom:1px solid #d0d7de;padding-bottom:4px}.lead{color:#57606a;max-width:70em}")


def claims_html(claims: pd.DataFrame, title: str = "Claims scorecard") -> str:
    """A standalone HTML page of the scorecard (claims.html)."""
    e = html.escape
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{PAGE_CSS}{SCORECARD_CSS}</style></head><body><h1>{e(title)}</h1>"
            f"<p class='lead'>{e(verdict_counts(claims))}</p>"
            f"{scorecard_table(claims)}</body></html>\n")
