"""The findings page of one model's run, the report's "0. Findings": first the claims scorecard (does the
paper hold on this model?), then the figures behind it, embedded, then the key components, the knockout
against as many random heads and the precise-SFT study. Everything is read from the stages' own tables;
nothing is recomputed. Numbers are formatted for reading (arithmech.report.display). Pure pandas (no torch).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from arithmech import layout
from arithmech.interp import protocol
from arithmech.io import read_parquet_meta
from arithmech.report import display
from arithmech.report.scorecard import PAGE_CSS, SCORECARD_CSS, scorecard_table, verdict_counts


def table_metric(table: pd.DataFrame) -> str:
    """The patching metric a key-component or effects table was aggregated with."""
    return str(table["metric"].iloc[0]) if "metric" in table and len(table) else "relative_logit"


def key_component_rows(key_tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per task: how many heads the rule selected (and their share of all heads), the key heads with
    their effects (strongest first), the key MLPs with theirs, and the rule."""
    rows = []
    for task, key in key_tables.items():
        metric = table_metric(key)

        def listed(part: pd.DataFrame) -> str:
            part = part.sort_values("mean_effect", kind="stable")
            low, high = (part[c] if c in part else [None] * len(part) for c in ("ci_low", "ci_high"))
            return ", ".join(f"{n} {display.effect(e, metric, lo, hi)}"
                             for n, e, lo, hi in zip(part["node"], part["mean_effect"], low, high))

        heads, mlps = key[key["component"] == "head"], key[key["component"] == "mlp"]
        total = int(key["n_heads_total"].iloc[0]) if len(key) else 0
        selected = f"{len(heads)} of {display.count(total)} ({display.share(len(heads) / total)})" if total else \
            str(len(heads))
        rows.append({"task": task, "heads selected": selected, "key heads (effect)": listed(heads) or "none",
                     "key MLPs (effect)": listed(mlps) or "none",
                     "rule (heads)": str(heads["rule"].iloc[0]) if len(heads) and "rule" in heads else ""})
    return pd.DataFrame(rows)


CONTROLS = {"random_heads": "random K", "random_layer_matched": "layer-matched K"}


def knockout_rows(knockout_tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per task and ablated positions: accuracy on the validation pairs with nothing, the top K
    heads, and K random heads drawn uniformly or in the top K's layers (mean [min, max] over the draws)
    knocked out, K = the curve's largest k; first answer token and full greedy answer."""
    rows = []
    for task, whole in knockout_tables.items():
        for positions, table in whole.groupby("positions", sort=False):
            top = table[table["curve"] == "top_heads"]
            K = int(top["k"].max())
            base, knocked = top[top["k"] == 0].iloc[0], top[top["k"] == K].iloc[0]
            row = {"task": task, "positions": positions, "n": display.count(table["n"].iloc[0]), "K": K}
            for col, name in (("accuracy", "first token"), ("full_accuracy", "full answer")):
                row[f"{name}: none"] = display.share(base[col])
                row[f"{name}: top K"] = display.share(knocked[col])
                for curve, label in CONTROLS.items():
                    rand = table.loc[(table["curve"] == curve) & (table["k"] == K), col]
                    row[f"{name}: {label}"] = (f"{display.share(rand.mean())} "
                                               f"{display.interval(rand.min(), rand.max(), display.share)}"
                                               if len(rand) else "")
            rows.append(row)
    return pd.DataFrame(rows)


def study_not_run(study_path) -> str | None:
    """Why the precise-SFT study could not run (no candidate format inside its band), from its table's
    metadata; None when it ran or is off."""
    if study_path is None:
        return None
    meta = read_parquet_meta(study_path)
    return meta.get("reason") if meta.get("ran") is False else None


def _shared_heads(chosen: pd.Series) -> str:
    """"16 (13 shared, Jaccard 0.68)" from a study.parquet row's head-set columns; empty for arms without heads."""
    if pd.isna(chosen.get("n_heads", float("nan"))):
        return ""
    return (f"{int(chosen['n_heads'])} ({int(chosen['overlap_precise'])} shared, "
            f"Jaccard {chosen['jaccard_precise']:.2f})")


def study_rows(study: pd.DataFrame, comparisons: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per arm: test exact match of its chosen run with its interval, mean over all its runs, KL to base,
    trainable parameters, for a head arm its heads and how many of them the precise arm trains too; the precise and
    circuit arms' comparisons on test exact match and KL to base, with intervals and p-values, raw and
    Holm-adjusted)."""
    arms = []
    for arm, part in study.groupby("arm", sort=False):
        chosen = part[part["run"].isin(["chosen", "base"])].iloc[0]
        arms.append({
            "arm": arm, "runs": len(part),
            "exact match (chosen run)":
                f"{display.share(chosen['accuracy'])} "
                f"{display.interval(chosen['accuracy_low'], chosen['accuracy_high'], display.share)}",
            "mean over runs": display.share(part["accuracy"].mean()),
            "KL to base (nats/token)": display.nats(chosen.get("kl_to_base", float("nan"))),
            "trainable parameters": display.count(chosen.get("trainable_params", float("nan"))),
            "heads (shared with precise)": _shared_heads(chosen),
        })
    comp = comparisons[comparisons["metric"].isin(["accuracy", "kl_to_base"])
                       & comparisons["arm_a"].str.startswith(("precise", "circuit"))]
    rows = []
    for c in comp.to_dict("records"):
        # at the precision the resampled interval supports, so a re-run on another CPU prints the same text
        d, lo, hi = c["difference"], c["ci_low"], c["ci_high"]
        if c["metric"] == "accuracy":  # a difference of two shares: percentage points
            diff = display.estimate(100 * d, 100 * lo, 100 * hi, sign=True) + " points"
            ends = display.bounds(100 * lo, 100 * hi, sign=True)
        else:
            diff = display.estimate(d, lo, hi, fallback=display.nats) + " nats"
            ends = display.bounds(lo, hi, fallback=display.nats)
        rows.append({"comparison": f"{c['arm_a']} - {c['arm_b']}",
                     "metric": {"accuracy": "exact match", "kl_to_base": "KL to base"}[c["metric"]],
                     "difference": diff, "interval": ends, "p": display.p_value(c["p_value"]),
                     "p (Holm)": display.p_value(c["p_holm"]), "test": c["test"]})
    columns = ["comparison", "metric", "difference", "interval", "p", "p (Holm)", "test"]
    return pd.DataFrame(arms), pd.DataFrame(rows, columns=columns)


def circuit_sentences(summary: pd.DataFrame) -> str:
    """Sentences on the model's own circuit (the discover rule's summary, chosen targets): the union over operators,
    teacher-forced (tf_<kind>_correct: what pruning and the verdicts read), its full-answer faithfulness under each
    ablation against the paper's key circuit and random circuits of its size, the shared circuit (pruned on every
    operator's pairs together) beside it, then each operator's size and faithfulness; each circuit with its fit gap
    (tf_<kind>_gap: identification minus validation faithfulness, per ablation, in points). One home for these
    sentences: the findings page and `make docs` (docs/results.md, README's block) both print them, every
    faithfulness at its resampled interval's precision so that a re-run on another CPU prints the same text."""
    chosen = summary[summary["chosen"].astype(bool)].sort_values("target").drop_duplicates("task")
    if chosen.empty:
        return "The discover rule chose no circuit: no target's circuit kept enough full answers."
    rows = chosen.set_index("task")
    kinds = list(protocol.KINDS)

    def size(r) -> str:
        return f"{int(r['n_heads'])} heads and {int(r['n_mlps'])} MLPs ({display.share(r['share'])} of the nodes)"

    def kept(r, name) -> str:  # at its resampled interval's precision
        low, high = r.get(name + "_low"), r.get(name + "_high")
        return (display.estimate(r.get(name), low, high, scale=100, suffix="%", fallback=display.share) + " "
                + display.bounds(low, high, scale=100, suffix="%", fallback=display.share)).strip()

    def point(r, name) -> str:  # the estimate alone, at its interval's precision
        return display.estimate(r.get(name), r.get(name + "_low"), r.get(name + "_high"), scale=100, suffix="%",
                                fallback=display.share)

    def per_kind(r, name) -> str:  # one value per ablation: "a under resample ablation and b under mean ablation"
        return " and ".join(f"{kept(r, name.format(k))} under {k} ablation" for k in kinds)

    def gap(r) -> str:  # identification minus validation full-answer faithfulness, per ablation (points)
        values = [r.get(f"tf_{k}_gap") for k in kinds]
        if all(display.missing(v) for v in values):
            return ""
        return ", fit gap " + " / ".join("n/a" if display.missing(v) else f"{100 * float(v):+.0f}" for v in values) \
            + " points"

    # faithfulness, not a share kept: (circuit - every node ablated) / (model - every node ablated) can be < 0
    scale = "(100%: the whole model's full answers, 0%: those with every node ablated)"
    first = ""
    if "union" in rows.index:
        u = rows.loc["union"]
        key = [point(u, f"tf_{k}_key_correct") for k in kinds]
        key = f"the key heads and key MLPs' {' and '.join(key)}, " if all(key) else ""
        diffs = " and ".join(display.estimate(u[f"tf_{k}_random_diff"], u[f"tf_{k}_random_diff_low"],
                                              u[f"tf_{k}_random_diff_high"], scale=100, sign=True) for k in kinds)
        first = (f"Over all operators, the circuit that pruning finds on the identification pairs has {size(u)}; "
                 f"teacher-forced on the validation pairs (END and every answer position ablated; docs/circuit.md), "
                 f"its full-answer faithfulness {scale} is {per_kind(u, 'tf_{}_correct')}, {key}{diffs} points above "
                 f"random circuits of its size{gap(u)}. ")
    if "shared" in rows.index:
        sh = rows.loc["shared"]
        diffs = " and ".join(display.estimate(sh[f"tf_{k}_random_diff"], sh[f"tf_{k}_random_diff_low"],
                                              sh[f"tf_{k}_random_diff_high"], scale=100, sign=True) for k in kinds)
        first += (f"Pruned on every operator's identification pairs together, the shared circuit has {size(sh)}: "
                  f"{per_kind(sh, 'tf_{}_correct')}, {diffs} points above random circuits of its size{gap(sh)}. ")
    per_task = [f"{task}: {int(r['n_heads'])} heads + {int(r['n_mlps'])} MLPs at "
                + " / ".join(point(r, f"tf_{k}_correct") for k in kinds) + gap(r) for task, r in rows.iterrows()
                if task not in ("union", "shared")]
    head = f"Per operator (teacher-forced, {' / '.join(kinds)} ablation), "
    return first + (head + "; ".join(per_task) + "." if per_task else "") + sanity_sentence(rows, kinds)


def sanity_sentence(rows: pd.DataFrame, kinds: list[str]) -> str:
    """" The resample ablation failed its sanity check 'one node ablated' on addition and multiplication: ..." where
    a chosen circuit's row records a failed check of an ablation (tf_<kind>_sanity_failed; with
    circuit.discover.sanity: warn), else ''."""
    import re

    out = []
    for k in kinds:
        column = f"tf_{k}_sanity_failed"
        if column not in rows:
            continue
        failed = {task: msg for task, msg in rows[column].items() if not display.missing(msg) and str(msg)}
        if failed:
            checks = dict.fromkeys(c for msg in failed.values() for c in re.findall(r"'([^']+)' failed", str(msg)))
            named = " and ".join(f"'{c}'" for c in checks) or "a check"
            out.append(f" The {k} ablation failed its sanity check {named} on {', '.join(map(str, failed))}: every "
                       f"row of the scorecard read from it is inconclusive.")
    return "".join(out)


# ---------------------------------------------------------------------------------------------------
# The page

# Where each result's figures and tables sit in the Snakemake report, by the first folder of its path
REPORT_CATEGORIES = {"effects": "1. Identify", "key_components": "1. Identify", "knockout": "2. Validate",
                     "circuit": "2. Validate", "discover": "2. Validate", "analysis": "3. Analyze",
                     "eval": "4. Precise SFT", "finetune": "4. Precise SFT"}


def report_entry(source: str) -> str:
    """Where a result sits in the report: "2. Validate: knockout/transfer.png"."""
    category = REPORT_CATEGORIES.get(source.split("/", 1)[0])
    return f"{category}: {source}" if category else source


def figure_anchor(source: str) -> str:
    return "fig-" + "".join(c if c.isalnum() else "-" for c in source.rsplit(".", 1)[0])


# What each embedded figure shows, for a reader who has not seen the workflow: per figure of arithmech.layout, a
# caption with its wildcards (and `tasks`, the operators) to fill in; the first pattern a figure matches captions it.
FIGURE_CAPTIONS = [
    (layout.EFFECTS_FIGURE, "Patching effect of every head and MLP on the answer logit, {task}: the darker a cell, the "
                            "more the answer logit falls when that node gets its counterfactual value (identify)."),
    (layout.SHARED_FIGURE, "Key components across operators ({tasks}): * marks a key node (identify)."),
    (layout.KNOCKOUT_FIGURE, "Accuracy as the top k heads are knocked out (mean-ablated), against as many random "
                             "heads, {task} (validate). The paper: accuracy collapses with the key heads, not with "
                             "random ones."),
    (layout.DISCOVER_PATH_FIGURE, "Pruning path, {task}: faithfulness against the number of nodes kept as the pruning "
                                  "drops heads and MLPs on the identification pairs, one line per target (discover)."),
    (layout.DISCOVER_CIRCUIT_FIGURE, "The discovered circuit, {task}, on the layer x head grid over the paper's key "
                                     "heads: the key heads it keeps, the heads it adds and the key heads it leaves out "
                                     "(discover)."),
    (layout.STUDY_FIGURE, "Held-out exact match of each precise-SFT study arm after training, with 95% intervals "
                          "(precise SFT against full fine-tuning, LoRA and random heads)."),
]


def figure_caption(source: str, tasks: list[str], captions=FIGURE_CAPTIONS) -> str:
    """The caption of the figure at `source` (a path under the model's results folder), or the path itself."""
    for pattern, caption in captions:
        wildcards = layout.match(pattern, source)
        if wildcards is not None:
            return caption.format(tasks=", ".join(tasks), **wildcards)
    return source


def embedded_png(path) -> str:
    """An <img> carrying the PNG itself, so the page needs no other file."""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f"<img src='data:image/png;base64,{data}' alt='{html.escape(Path(path).name, quote=True)}'>"


def html_table(df: pd.DataFrame) -> str:
    """A table of already formatted cells (strings); numbers left as they are."""
    return df.to_html(index=False, na_rep="", border=0, classes="data", escape=True)


FINDINGS_CSS = (
    "table.data{border-collapse:collapse;font-size:13px;margin:6px 0}"
    "table.data th{background:#f6f8fa;border-bottom:2px solid #d0d7de;padding:4px 8px;text-align:left}"
    "table.data td{border-bottom:1px solid #e1e4e8;padding:3px 8px;text-align:left;vertical-align:top}"
    ".figures{display:flex;flex-wrap:wrap;gap:20px;align-items:flex-start}"
    "figure{margin:0;flex:1 1 560px;max-width:1000px}figure img{width:100%;border:1px solid #e1e4e8}"
    "figcaption{color:#57606a;font-size:13px;max-width:70em}p.note{color:#57606a;font-size:13px;max-width:70em}"
    ".provenance{color:#8c959f;font-size:12px}"
)


def provenance_text(path) -> str:
    """Which model and code a result came from, read from its provenance: "model sha256 b179c952, arithmech
    0.1.0, torch 2.13.0, transformers 5.23.0". No date of the run: the same results give the same text."""
    meta = read_parquet_meta(path)
    parts = []
    checksums = meta.get("model_sha256") or {}
    if isinstance(checksums, str):  # one weight file (the GGUF); a model directory has one per file
        checksums = {"": checksums}
    if checksums:
        parts.append("model sha256 " + " ".join(value[:8] for _, value in sorted(checksums.items())))
    versions = meta.get("versions", {})
    parts += [f"{name} {versions[name]}" for name in ("arithmech", "torch", "transformers") if name in versions]
    return ", ".join(parts)


def findings_html(*, model: str, claims: pd.DataFrame, keys: dict[str, pd.DataFrame],
                  knockouts: dict[str, pd.DataFrame], figures: dict[str, Path], study: pd.DataFrame | None,
                  comparisons: pd.DataFrame | None, not_run: str | None, origin: str,
                  discover: pd.DataFrame | None = None) -> str:
    """The findings page of one model as one HTML document: the claims scorecard, the figures (embedded),
    key components and knockout per task, and the study when it ran (`not_run`: why it could not). `keys` and
    `knockouts` map operator -> table; `figures` maps a PNG's path under the model's results folder (a
    scorecard row's source) to its file; `origin`, the results' provenance (`provenance_text`); `discover`, the
    discover rule's summary (None: it did not run)."""
    tasks = list(keys)
    sources = dict(figures)
    if not_run is not None:  # the study's figure only repeats the reason, given below
        sources.pop(layout.STUDY_FIGURE, None)

    def link(source: str):
        if source in sources:
            return f"#{figure_anchor(source)}", "figure below"
        return None, report_entry(source)

    e = html.escape
    body = [f"<h1>{e(model)}: does the paper hold?</h1>",
            f"<p class='lead'>Zhang et al. (ICML 2024) found the few attention heads and MLPs that do arithmetic in "
            f"LLaMA2-7B and fine-tuned only them. Each line below is one of their claims, checked on {e(model)}. "
            f"{e(verdict_counts(claims))}</p>",
            f"<div id='scorecard'>{scorecard_table(claims, link)}</div>"]
    if discover is not None and len(discover):
        body += ["<h2 id='circuit'>The model's own circuit</h2>",
                 f"<p class='note'>{e(circuit_sentences(discover))}</p>"]
    body.append("<h2 id='figures'>Figures</h2>")
    body.append("<div class='figures'>")
    for source, path in sources.items():
        body.append(f"<figure id='{figure_anchor(source)}'>{embedded_png(path)}"
                    f"<figcaption>{e(figure_caption(source, tasks))} <code>{e(report_entry(source))}</code>"
                    "</figcaption></figure>")
    body.append("</div>")
    sections = [
        ("Key components (identify)", key_component_rows(keys),
         "Heads and MLPs the key-component rule selected by their path-patching effect at END on the answer logit "
         "(relative change of the answer logit when the node gets its counterfactual value; negative = it falls). "
         "Strongest first."),
        ("Knockout (validate)", knockout_rows(knockouts),
         "Accuracy on the operator's validation pairs (operand pairs not used to rank the heads or take the means) "
         "with nothing, the top K heads by effect, or K random heads (uniform, or in the top K's layers; mean "
         "[min, max] over the draws) mean-ablated, at END or at every position (per-template means)."),
    ]
    if not_run is not None:
        sections.append(("Precise SFT study", pd.DataFrame({"reason": [not_run]}),
                         "No study job ran; the measured formats are in finetune/study.md."))
    elif study is not None:
        arms, comp = study_rows(study, comparisons)
        sections += [
            ("Precise SFT study: arms", arms,
             "Greedy full-answer exact match on the held-out test pairs of the trained format, the chosen run's "
             "95% interval resampling operand pairs; KL(base || model) in nats per WikiText-2 token."),
            ("Precise SFT study: the precise and circuit arms against the others", comp,
             "Differences on the same test items (exact match in percentage points, KL in nats), with intervals and "
             "p-values (McNemar where each arm is one model, else the paired cluster bootstrap), Holm-adjusted over "
             "the whole comparison table."),
        ]
    for heading, df, note in sections:
        body += [f"<h2>{e(heading)}</h2>", html_table(df), f"<p class='note'>{e(note)}</p>"]
    body.append(f"<p class='provenance'>Read from results/{e(model)}/" + (f" ({e(origin)})" if origin else "")
                + ".</p>")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(model)}: findings</title>"
            f"<style>{PAGE_CSS}{SCORECARD_CSS}{FINDINGS_CSS}</style></head><body>{''.join(body)}</body></html>\n")
    return page
