"""Markdown tables: `markdown_table` writes the tables of the project's Markdown pages (docs/results.md,
docs/rehearsal.md, the fine-tuning stages' .md files; the claims scorecard writes its own rows with
`markdown_cell`), and the fine-tuning stages' tables are written with it here. Torch-free.

    >>> print(markdown_table(pd.DataFrame({"arm": ["base"], "exact match": ["41.2 [38.0, 44.5]"]})), end="")
    | arm | exact match |
    |---|---|
    | base | 41.2 [38.0, 44.5] |
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from tabulate import DataRow, TableFormat

from arithmech.report import display

# tabulate's "pipe" format with a three-dash rule under every header, as the committed docs have it ("pipe"
# draws the rule as wide as its column); markdown_table's stralign=None leaves the cells unpadded
PIPE = TableFormat(lineabove=None, linebelowheader=lambda widths, aligns: "|" + "---|" * len(widths),
                   linebetweenrows=None, linebelow=None, headerrow=DataRow("|", "|", "|"),
                   datarow=DataRow("|", "|", "|"), padding=1, with_header_hide=None)


def markdown_cell(value) -> str:
    r"""A Markdown table cell: "" for a missing value, whitespace (line breaks too) as single spaces, pipes
    escaped.

        >>> markdown_cell(" a |  b\n"), markdown_cell(float("nan"))
        ('a \\| b', '')
    """
    return " ".join(("" if display.missing(value) else str(value)).split()).replace("|", "\\|")


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub Markdown table of already formatted cells (`markdown_cell` of each header and value), one
    line per row, ending in a line break."""
    cells = pd.DataFrame([[markdown_cell(v) for v in row] for row in df.itertuples(index=False)],
                         columns=[markdown_cell(c) for c in df.columns])
    return cells.to_markdown(index=False, tablefmt=PIPE, disable_numparse=True, stralign=None) + "\n"


# ---------------------------------------------------------------------------------------------------
# The fine-tuning stages' tables


def eval_markdown(summary: pd.DataFrame, scored: list[str]) -> str:
    """The paper's Table 1 (rule summarize_eval's table) in Markdown: per method the accuracy on each set in
    `scored` as 'value [low, high]', WikiText-2 perplexity, trainable parameters, step and train time, peak
    memory."""
    head = ["method", *scored, "WikiText-2 ppl", "trainable params", "s/step", "train s", "peak MB"]
    rows = []
    for r in summary.to_dict("records"):
        cells = [r["method"]]
        cells += [f"{r[d]:.1f} [{r[d + '_low']:.1f}, {r[d + '_high']:.1f}]" for d in scored]
        cells += [f"{r.get('wikitext_ppl', float('nan')):.2f}", f"{r['trainable_params']:,}",
                  f"{r['mean_step_s']:.2f}", f"{r['train_time_s']:.0f}", f"{r['peak_memory_mb']:.0f}"]
        rows.append([str(c) for c in cells])
    return markdown_table(pd.DataFrame(rows, columns=head))


def study_markdown(model: str, table: pd.DataFrame, comp: pd.DataFrame, fmt: str, confidence: float) -> str:
    """The precise-SFT study's page in Markdown (rule study_summary's study.parquet and comparisons.parquet):
    per scored model its exact match on the trained format `fmt` and the other measures, then the arms'
    comparisons."""
    pct = f"{100 * confidence:.0f}%"
    transfer = [c for c in table.columns if c.startswith("transfer_") and not c.endswith(("_low", "_high"))]
    head = ["arm", "run", "lr", f"{fmt} exact match [{pct}]", *[c[len("transfer_"):] for c in transfer],
            "KL to base (nats/token)", "WikiText ppl", "GSM8K NLL", "SVAMP NLL", "social_iqa", "strategyqa",
            "qa_wikidata", "trained params", "s/step"]

    def f(x, spec):
        return "" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)

    models = []
    for r in table.to_dict("records"):
        cells = [r["arm"], r["run"], f(r.get("lr"), ".0e"),
                 f"{100 * r['accuracy']:.1f} [{100 * r['accuracy_low']:.1f}, {100 * r['accuracy_high']:.1f}]"]
        cells += [f(100 * r[c], ".1f") for c in transfer]
        cells += [f(r.get("kl_to_base"), ".4f"), f(r.get("perplexity"), ".2f"), f(r.get("gsm8k_nll"), ".3f"),
                  f(r.get("svamp_nll"), ".3f")]
        cells += [f(100 * r[c], ".1f") if c in r else "" for c in ("social_iqa", "strategyqa", "qa_wikidata")]
        cells += [f"{int(r.get('trainable_params') or 0):,}", f(r.get("mean_step_s"), ".2f")]
        models.append([str(c) for c in cells])
    comparisons = []
    for r in comp.to_dict("records"):
        scale = 100 if r["metric"] in ("accuracy", "social_iqa", "strategyqa", "qa_wikidata") or \
            r["metric"].startswith("transfer_") else 1
        comparisons.append([str(r["arm_a"]), str(r["arm_b"]), str(r["metric"]), f"{scale * r['difference']:+.3g}",
                            f"[{scale * r['ci_low']:+.3g}, {scale * r['ci_high']:+.3g}]", f"{r['p_value']:.3g}",
                            f"{r['p_holm']:.3g}", str(r["test"])])
    comp_head = ["a", "b", "metric", "difference", "interval", "p", "p (Holm)", "test"]
    return (f"# {model}: precise-SFT study, trained on `{fmt}`\n\n"
            + markdown_table(pd.DataFrame(models, columns=head))
            + f"\n## Comparisons (a - b on the same items; {pct} intervals resample operand pairs, items or "
              "windows)\n\n"
            + markdown_table(pd.DataFrame(comparisons, columns=comp_head)))


def format_markdown(formats: pd.DataFrame, choice: dict, *, auto: bool) -> str:
    """The trained format's choice in Markdown: how it was made (`auto`: by measurement, `study.train_format:
    auto`; else named), then every measured format (`formats`: the stage's table of them for reading) with the
    choice rule's `choice` record."""
    low, high = choice["band"]
    how = ("named by `study.train_format`" if not auto
           else "`study.train_format: auto`: the candidate inside `study.base_band` closest to its middle")
    return (f"## The trained format\n\nBase model's greedy exact match on each measured format (validation "
            f"items, the band [{low:g}, {high:g}]); {how}. {choice['reason']}.\n\n"
            + markdown_table(formats.map(str)))


HEAD_SET_COLUMNS = ("n_heads", "overlap_precise", "jaccard_precise")  # `design.head_overlap`, from stats.json


def head_sets_markdown(table: pd.DataFrame, study: dict) -> str:
    """Every head arm's heads against precise's (study.parquet's HEAD_SET_COLUMNS), one line per arm and overlap
    (its runs with the same numbers share a line: seeds train their arm's heads, draws may differ), then which of
    the arms that tell head sets apart (circuit, circuit_disjoint, low_effect) this run left out."""
    rows = table.dropna(subset=["n_heads"]) if "n_heads" in table else table.iloc[:0]
    lines = []
    for (arm, n, both, jac), part in rows.groupby(["arm", *HEAD_SET_COLUMNS], sort=False):
        runs = ", ".join(part["run"])
        lines.append(f"- {arm} ({runs}): {int(n)} heads, {int(both)} of them trained by precise too "
                     f"(Jaccard {jac:.2f})")
    missing = [a for a in ("circuit", "circuit_disjoint", "low_effect") if a not in study.get("arms", [])]
    note = ""
    if missing:
        note = (f"\nThis run has no {', '.join(missing)} arm (`study.arms`); `configs/sft-study.yaml` runs them with "
                "3 seeds each.")
        if "low_effect" in missing:
            note += (" Without low_effect there is no positive control (precise against the weakest heads of its "
                     "layers), so the scorecard reads no \"does not hold\" from the circuit arm.")
        note += "\n"
    return ("## Head sets\n\nEach head arm's heads against the precise arm's (the top `study.heads` heads by patching "
            "effect): how many it trains, how many of them precise trains too, and the Jaccard index.\n\n"
            + "\n".join(lines or ["- no head arm was scored, or its runs predate the record"]) + "\n" + note)


def precision_markdown(table: pd.DataFrame) -> str:
    """The precision each arm trained in (study.parquet's model_dtype and master_dtype) for study.md, one line
    per arm (and per precision, should its runs differ): arms compare fairly only if none lost small updates."""
    trained = table[table["arm"] != "base"]
    lines = [f"- {arm}: model in {model or 'unrecorded'}, optimizer updating {master or 'unrecorded'} tensors"
             for (arm, model, master), _ in trained.groupby(["arm", "model_dtype", "master_dtype"], sort=False)]
    return "## Training precision\n\n" + "\n".join(lines or ["- no arm was trained"]) + "\n"


def selection_markdown(grid: pd.DataFrame, collapse: dict) -> str:
    """Every arm's learning-rate grid for study.md (`design.selection_table`): each grid run's validation exact
    match, distinct greedy answers against the base model's, training loss (first step, highest), whether it
    collapsed (`study.collapse`) and which run was chosen, with the edge flag."""
    cells = [[r["arm"], f"{r['lr']:g}", f"{100 * r['val_accuracy']:.1f}", f"{r['val_distinct']} / {r['base_distinct']}",
              f"{r['loss_first']:.3g} / {r['loss_max']:.3g}", "yes" if r["collapsed"] else "",
              ("yes" + (f", at the grid's {r['edge']} edge" if r["edge"] else "")) if r["chosen"] else "",
              r["collapse_reason"]] for r in grid.to_dict("records")]
    head = ["arm", "lr", "validation exact match %", "distinct answers / base's", "training loss first / highest",
            "collapsed", "chosen", "why collapsed"]
    return ("## Learning-rate grids\n\nEach arm's lr is chosen on the validation split: the highest exact match "
            "among the runs that did not collapse (fewer than "
            f"{collapse['distinct_ratio']:g} x the base model's distinct greedy answers, or a training loss above "
            f"{collapse['loss_spike']:g} x its first step's; `study.collapse`). A chosen lr at the edge of its grid "
            "is flagged: the best may lie beyond it. An arm whose every lr collapsed is not measured.\n\n"
            + markdown_table(pd.DataFrame(cells, columns=head)))


def format_display(formats: pd.DataFrame) -> pd.DataFrame:
    """The measured formats for a reader: exact match with its interval in %, band and choice flags, reason."""
    def share(r):
        if not r["n"]:
            return ""
        return f"{100 * r['exact_match']:.1f} [{100 * r['ci_low']:.1f}, {100 * r['ci_high']:.1f}]"

    return pd.DataFrame({"format": formats["format"], "task": formats["task"],
                         "question": [t.replace("{op}", str(o))
                                      for t, o in zip(formats["template"], formats["operator"])],
                         "a": formats["a"], "b": formats["b"], "n": formats["n"],
                         "base exact match % [interval]": [share(r) for r in formats.to_dict("records")],
                         "in band": formats["in_band"].map({True: "yes", False: ""}),
                         "chosen": formats["chosen"].map({True: "yes", False: ""}), "reason": formats["reason"]})
