"""`make docs`: the numbers of README's scorecard block and of docs/results.md, generated from one model's
results/ so that no number is typed by hand. Running it twice on the same results writes the same bytes (no
date of the run, figures copied only when they differ, sorted outputs), so after a default run
`git status` shows whether the committed docs still say what the workflow finds.

README's two other generated blocks: the run time of `make run` (`run_time_text`: the last complete run that
results/run_record.json knows, written by `make run` (arithmech.tools.run_record), kept in docs/run_record.json when
it is newer than the one there; a timing, so it is the one block a re-run on another machine changes) and the
paper plan's jobs and GPU hours (`plan_text`: `make plan`'s default configuration, computed from the checkout),
whose whole output is docs/plan.md's block (`plan_output`). docs/performance.md's blocks: the last complete run of
each configuration in the run history, docs/run_history.csv, which `make run` adds a row to (`history_table`), and
the job time per rule of README's run, from its kept record (`rules_table`).

Budget sensitivity: `--budget-run NAME=RESULTS` keeps the claims of a run of a larger configuration
(configs/NAME.yaml, `BUDGET_STAGES`) in docs/claims/budget/<model>/NAME.csv; docs/results.md sets each verdict of the
stages it enlarges beside the kept run's (`budget_section`), and both scorecards mark a verdict that differs
(`budget_mark`).

    python -m arithmech.tools.docs_results [--model NAME] [--config config.yaml] [--results results]
        [--budget-run NAME=RESULTS ...]

Torch-free: reads Parquet tables and copies PNGs.
"""

from __future__ import annotations

import argparse
import csv
import filecmp
import json
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pandas as pd
import yaml

from arithmech import layout
from arithmech.interp import protocol
from arithmech.io import atomic_path
from arithmech.report import display
from arithmech.report.claims.circuit_faithful import fell_back
from arithmech.report.claims.registry import claims as registered_claims
from arithmech.report.page import (
    FIGURE_CAPTIONS,
    circuit_sentences,
    figure_caption,
    key_component_rows,
    knockout_rows,
    provenance_text,
    study_not_run,
    study_rows,
    table_metric,
)
from arithmech.report.scorecard import HEADLINE, VERDICT_MARKS, claims_markdown, measured_text, verdict_counts
from arithmech.report.tables import markdown_cell, markdown_table
from arithmech.tools.run_record import (
    HISTORY,
    HISTORY_COLUMNS,
    RECORD,
    duration_text,
    history_row,
    last_complete,
    machine_text,
    read_record,
)

BEGIN = "<!-- BEGIN GENERATED: scorecard (make docs) -->"
END = "<!-- END GENERATED: scorecard -->"
RUN_TIME_MARKERS = ("<!-- BEGIN GENERATED: run time (make docs) -->", "<!-- END GENERATED: run time -->")
PLAN_MARKERS = ("<!-- BEGIN GENERATED: plan (make docs) -->", "<!-- END GENERATED: plan -->")
PLAN_OUTPUT_MARKERS = ("<!-- BEGIN GENERATED: plan output (make docs) -->", "<!-- END GENERATED: plan output -->")
KEPT_RECORD = Path("docs") / "run_record.json"  # the record README's run time and the job time per rule come from
PERFORMANCE_PAGE = Path("docs") / "performance.md"  # its block: the last complete run of each configuration
HISTORY_MARKERS = ("<!-- BEGIN GENERATED: run history (make docs) -->", "<!-- END GENERATED: run history -->")
RULES_MARKERS = ("<!-- BEGIN GENERATED: job time per rule (make docs) -->", "<!-- END GENERATED: job time per rule -->")
# The rules under 1% of the job time share one row of the per-rule table: no speed-up of one of them moves the run
FOLDED_SHARE = 0.01
DISCOVERY_RULES = ("discover", "discover_shared", "discover_union")  # the circuit discovery, whose share is given
STUDY_PREFIX = "study_"  # the study's rules, by their names: its share is given too
KEPT_CLAIMS = Path("docs") / "claims"  # every model's headline claims, committed: the cross-model table's source
MODELS_PAGE = Path("docs") / "models.md"  # the paper's claims side by side across models
MODELS_MARKERS = ("<!-- BEGIN GENERATED: claims across models (make docs) -->",
                  "<!-- END GENERATED: claims across models -->")
KEPT_CLAIM_COLUMNS = ["claim", "scope", "statement", "paper", "measure", "value", "ci_low", "ci_high", "unit", "n",
                      "split", "verdict", "note"]
PLAN_CONFIGS = ["configs/paper.yaml", "configs/llama2-7b.yaml"]  # make plan's default (the Makefile's CONFIGS)


class MissingResults(FileNotFoundError):
    """A table or figure `make docs` needs is not in results/."""


def require(path: Path) -> Path:
    if not Path(path).is_file():
        raise MissingResults(f"make docs: {path} is missing; run the workflow for this model first (make run)")
    return Path(path)


def replace_block(text: str, block: str, where: str = "README.md", markers: tuple[str, str] = (BEGIN, END)) -> str:
    """`text` with what lies between the `markers` (BEGIN and END lines) replaced by `block` (markers kept)."""
    begin, end_marker = markers
    start, end = text.find(begin), text.find(end_marker)
    if start < 0 or end < 0 or end < start:
        raise ValueError(f"{where} has no generated block: put the lines\n{begin}\n{end_marker}\n"
                         "where the generated text goes")
    return text[: start + len(begin)] + "\n" + block.rstrip("\n") + "\n" + text[end:]


def write_if_changed(path: Path, text: str) -> None:
    """Write `text` unless the file already holds it (its time stamp then stays as it is)."""
    path = Path(path)
    if path.is_file() and path.read_text() == text:
        return
    with atomic_path(path) as tmp:
        tmp.write_text(text)


# ---------------------------------------------------------------------------------------------------
# The figures: copied from results/{model}/ into docs/figures/, named after their path there


def figure_name(source: str) -> str:
    """docs/figures/ file name of a result path: knockout/addition.png -> knockout_addition.png."""
    return source.replace("/", "_")


def figure_sources(root: Path, tasks: list[str]) -> list[str]:
    """The figures results.md shows, those of them the run wrote, in the page's order."""
    per_task = lambda *patterns: [p.format(task=t) for p in patterns for t in tasks]  # noqa: E731
    first_task = lambda *patterns: [p.format(task=tasks[0]) for p in patterns] if tasks else []  # noqa: E731
    wanted = per_task(layout.EFFECTS_FIGURE) + [layout.SHARED_FIGURE]
    wanted += per_task(layout.KNOCKOUT_FIGURE) + [layout.TRANSFER_FIGURE]
    wanted += first_task(layout.DISCOVER_PATH_FIGURE, layout.DISCOVER_CIRCUIT_FIGURE)
    wanted += per_task(layout.ROLES_FIGURE, layout.PROBES_FIGURE)
    wanted += [layout.STUDY_FIGURE, layout.STUDY_CURVES_FIGURE, layout.EVAL_SUMMARY_FIGURE]
    return [s for s in wanted if (root / s).is_file()]


def copy_figures(root: Path, sources: list[str], figures_dir: Path) -> None:
    """Copy each figure unless an identical copy is there; remove the PNGs no result names any more."""
    figures_dir.mkdir(parents=True, exist_ok=True)
    names = {figure_name(s) for s in sources}
    for stale in sorted(figures_dir.glob("*.png")):
        if stale.name not in names:
            stale.unlink()
    for source in sources:
        target = figures_dir / figure_name(source)
        if not (target.is_file() and filecmp.cmp(root / source, target, shallow=False)):
            with atomic_path(target) as tmp:
                shutil.copyfile(root / source, tmp)


# ---------------------------------------------------------------------------------------------------
# docs/results.md, section by section


def key_heads_table(key: pd.DataFrame) -> pd.DataFrame:
    """One operator's key heads and MLPs, strongest first: effect with its 95% interval (at the interval's
    precision) and how often the rule selects the node across bootstrap resamples (whole percent)."""
    metric = table_metric(key)
    rows = []
    for part in (key[key["component"] == "head"], key[key["component"] == "mlp"]):
        for r in part.sort_values("mean_effect", kind="stable").to_dict("records"):
            rows.append({
                "node": r["node"], "layer": r["layer"],
                "effect": display.effect(r["mean_effect"], metric, r.get("ci_low"), r.get("ci_high")),
                "95% interval": display.effect_bounds(r.get("ci_low"), r.get("ci_high"), metric),
                "selected in resamples": display.resampled_share(r.get("stability")),
            })
    return pd.DataFrame(rows, columns=["node", "layer", "effect", "95% interval", "selected in resamples"])


def transfer_table(transfer: pd.DataFrame, tasks: list[str]) -> pd.DataFrame:
    """Per target: accuracy with nothing knocked out, then per source operator its key heads knocked out
    against as many layer-matched random heads (mean over draws)."""
    rows = []
    for target, part in transfer.groupby("target", sort=False):
        row = {"target": target, "n": display.count(part["n"].iloc[0]),
               "nothing knocked out": display.share(part["base_accuracy"].iloc[0])}
        for source in tasks:
            key = part.loc[(part["source"] == source) & (part["heads"] == "key"), "accuracy"]
            rand = part.loc[(part["source"] == source) & (part["heads"] == "random"), "accuracy"]
            row[f"{source} key / random"] = (f"{display.share(key.mean())} / {display.share(rand.mean())}"
                                             if len(key) else "")
        rows.append(row)
    return pd.DataFrame(rows)


def roles_table(roles: pd.DataFrame) -> pd.DataFrame:
    """Per analysed head (rank order): its attention from END on each token role (shares of 1)."""
    order = list(dict.fromkeys(roles["role"]))
    wide = roles.pivot_table(index=["rank", "node"], columns="role", values="attention", sort=True)
    out = wide.reset_index()[["node"]]
    for role in order:
        out[role.replace("_", " ")] = [display.share(v) for v in wide[role]]
    return out


def probes_table(probes: pd.DataFrame) -> pd.DataFrame:
    """The MLP outputs at END against the unembedding of A, B, the answer C and random tokens (the paper's
    vectors, all texts): the highest layer-mean cosine of each target and its layer, and the mean over the
    last third of the layers."""
    part = probes[(probes["variant"] == "paper") & (probes["subset"] == "all") & (probes["vector"] == "output")]
    layers = sorted(part["layer"].unique())
    late = set(layers[len(layers) - max(1, len(layers) // 3):])
    rows = []
    names = {"a": "operand A", "b": "operand B", "c": "answer C", "random": "random tokens"}
    for target, name in names.items():
        t = part[part["target"] == target]
        if t.empty:
            continue
        peak = t.loc[t["mean"].idxmax()]
        rows.append({"target": name, "highest cosine": display.number(peak["mean"], 3), "at layer": int(peak["layer"]),
                     f"mean, layers {min(late)}-{max(late)}":
                         display.number(t.loc[t["layer"].isin(late), "mean"].mean(), 3)})
    return pd.DataFrame(rows)


def knockout_long(wide: pd.DataFrame) -> pd.DataFrame:
    """findings.knockout_rows with one row per scored answer (first token, full answer): narrow enough for
    a Markdown page."""
    rows = []
    for r in wide.to_dict("records"):
        for answer in ("first token", "full answer"):
            rows.append({"task": r["task"], "positions": r["positions"], "n": r["n"], "K": r["K"], "answer": answer,
                         **{label: r[f"{answer}: {label}"]
                            for label in ("none", "top K", "random K", "layer-matched K")}})
    return pd.DataFrame(rows)


# The findings page's captions
CAPTIONS = FIGURE_CAPTIONS


def caption(source: str, tasks: list[str]) -> str:
    return figure_caption(source, tasks, CAPTIONS)


def image(source: str, tasks: list[str], prefix: str) -> str:
    return f"![{source}]({prefix}{figure_name(source)})\n\n*{caption(source, tasks)}*\n"


def _faithful(value, low, high) -> str:
    """A faithfulness (a fraction) with its resampled interval, in percent at the interval's precision."""
    return (display.estimate(value, low, high, scale=100, suffix="%", fallback=display.share) + " "
            + display.bounds(low, high, scale=100, suffix="%", fallback=display.share)).strip()


def read_discover(root: Path, tasks: list[str]) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(the discover rule's summary, every validation table it wrote: one per operator and the union's), or None
    when the rule has not run on these results (an older results tree). A missing validation table only leaves
    the overlap with the key heads empty."""
    if not (root / layout.DISCOVER_SUMMARY).is_file():
        return None
    paths = [root / layout.DISCOVER_VALIDATION.format(task=t) for t in tasks] + [root / layout.UNION_VALIDATION]
    frames = [pd.read_parquet(p) for p in paths if p.is_file()]
    return pd.read_parquet(root / layout.DISCOVER_SUMMARY), (pd.concat(frames, ignore_index=True) if frames else None)


def head_labels(nodes) -> list[str]:
    """The heads of a circuit's node list ("L0H1 L2MLP" -> ["L0H1"])."""
    return [] if display.missing(nodes) else [n for n in str(nodes).split() if not n.endswith("MLP")]


def key_overlap(validation: pd.DataFrame | None, task: str) -> str:
    """Which of the key heads the chosen circuit of `task` ("union": the union over operators against the union of
    the key heads) keeps, and how many heads it adds; "" without its validation table."""
    if validation is None:
        return ""
    rows = validation[validation["task"] == task]
    found = rows[(rows["curve"] == "discovered") & rows["chosen"].astype(bool)]
    key = rows[rows["curve"] == "key"]
    if not len(found) or not len(key):
        return ""
    heads, key_heads = head_labels(found["nodes"].iloc[0]), head_labels(key["nodes"].iloc[0])
    kept = [h for h in key_heads if h in set(heads)]
    added = len(heads) - len(kept)
    return (f"{len(kept)} of {len(key_heads)} key heads" + (f" ({', '.join(kept)})" if kept else "")
            + f"; {added} added")


def discover_table(summary: pd.DataFrame, validation: pd.DataFrame | None) -> pd.DataFrame:
    """Per operator (its chosen target) and the union over operators: the discovered circuit's size and its
    teacher-forced validation faithfulness under each ablation (full answers, log-probability), against the key
    circuit and layer-matched random circuits of its size (the paired difference in full-answer faithfulness), with
    95% intervals at their precision, and its overlap with the key heads."""
    chosen = summary[summary["chosen"].astype(bool)].sort_values("target").drop_duplicates("task")
    order = [t for t in chosen["task"] if t not in ("union", "shared")] + [t for t in chosen["task"] if t == "union"]
    rows = []
    for task in order:
        r = chosen[chosen["task"] == task].iloc[0]
        row = {"operator": "all (union)" if task == "union" else task,
               "target": "each operator's" if task == "union" else display.significant(r["target"], 2),
               "pairs": display.count(r["tf_n_items"]),
               "size": f"{int(r['n_heads'])} heads + {int(r['n_mlps'])} MLPs ({display.share(r['share'])})"}
        for name, column in (("full answer", "correct"), ("log-probability", "logprob"),
                             ("key circuit, full answer", "key_correct")):
            for kind in protocol.KINDS:
                c = f"tf_{kind}_{column}"
                row[f"{name} ({kind})"] = _faithful(r[c], r[f"{c}_low"], r[f"{c}_high"])
        for kind in protocol.KINDS:
            c = f"tf_{kind}_random_diff"
            row[f"circuit - random ({kind})"] = (
                display.estimate(r[c], r[f"{c}_low"], r[f"{c}_high"], scale=100, sign=True,
                                 fallback=lambda v: display.number(v, 1, sign=True))  # the unit follows once
                + " points " + display.bounds(r[f"{c}_low"], r[f"{c}_high"], scale=100, sign=True)).strip()
        row["key heads kept"] = key_overlap(validation, task)
        rows.append(row)
    return pd.DataFrame(rows)


def discover_targets_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per operator and target: the circuit's size, the teacher-forced full-answer faithfulness it keeps on the
    validation pairs under each ablation, and which target the rule chose (on the selection pairs) and which it would
    choose on the validation pairs (reported only)."""
    rows = []
    operators = summary[~summary["task"].isin(["union", "shared"])]
    for r in operators.sort_values(["task", "target"], kind="stable").to_dict("records"):
        rows.append({"operator": r["task"], "target": display.significant(r["target"], 2),
                     "size": f"{int(r['n_heads'])} heads + {int(r['n_mlps'])} MLPs ({display.share(r['share'])})",
                     **{f"full answer ({k})": _faithful(r[f"tf_{k}_correct"], r[f"tf_{k}_correct_low"],
                                                        r[f"tf_{k}_correct_high"]) for k in protocol.KINDS},
                     "chosen": ("" if not r["chosen"] else "yes (the largest: none kept enough)" if fell_back(r)
                                else "yes"),
                     "smallest keeping the share on validation": (
                         "none" if display.missing(r.get("smallest_target_validation"))
                         else display.significant(r["smallest_target_validation"], 2))})
    return pd.DataFrame(rows)


def discover_section(root: Path, tasks: list[str], figure) -> list[str]:
    """docs/results.md's section on the model's own circuit (the discover and discover_union rules), or a line
    saying the rule has not run on these results."""
    out = ["## The model's own circuit (discover)\n"]
    found = read_discover(root, tasks)
    if found is None:
        return out + [f"The discover rule has not run on these results (no `{layout.DISCOVER_SUMMARY}`): run the "
                      "workflow again (`make run`) to find the model's own circuit.\n"]
    summary, validation = found
    measure = summary["pruned_on"].dropna()
    out += [circuit_sentences(summary) + "\n",
            "Per operator, the smallest set of heads and MLPs that keeps the target share of "
            + (f"the pruning measure (`{measure.iloc[0]}`)" if len(measure) else "the pruning measure")
            + ", teacher-forced with every other node ablated at END and every answer position, found by greedy "
            "pruning on the identification pairs; the target is the smallest whose circuit keeps enough of the full "
            "answers on held-out identification pairs (none doing so, the largest). Scored teacher-forced on the "
            "validation pairs under both ablations (the union over operators: pooled), full-answer and "
            "log-probability faithfulness, 95% intervals resampling operand pairs; the key circuit: the key heads "
            "and key MLPs; circuit - random: the paired difference in full-answer faithfulness from layer-matched "
            "random heads of the circuit's size with its MLPs (mean over draws).\n",
            markdown_table(discover_table(summary, validation)),
            "Every target's circuit:\n", markdown_table(discover_targets_table(summary))]
    if tasks:
        out += figure(layout.DISCOVER_PATH_FIGURE.format(task=tasks[0]))
        out += figure(layout.DISCOVER_CIRCUIT_FIGURE.format(task=tasks[0]))
    return out


def read_claims(root: Path, model: str) -> pd.DataFrame:
    """The scorecard as the docs show it: a timing's value, interval and note (seconds per step) differ between
    runs and machines, so they are left out here and the row points to the run's own claims.md."""
    claims = pd.read_parquet(require(root / layout.CLAIMS))
    timing = [c.id for c in registered_claims().values() if c.timing]
    timed = claims["claim"].isin(timing) & (claims["verdict"] != "not measured")
    claims.loc[timed, ["value", "ci_low", "ci_high"]] = float("nan")
    claims.loc[timed, "note"] = (f"a wall-clock timing, different on every run and machine: the ratio is in "
                                 f"{layout.under(layout.CLAIMS_MD, model)} of your run")
    return claims


def results_markdown(root: Path, model: str, tasks: list[str], figures: list[str], prefix: str = "figures/",
                     budget: tuple[list[dict], dict[str, pd.DataFrame]] | None = None) -> str:
    """docs/results.md: every table of the default run a reader needs, numbers formatted for reading; the
    figures are linked as `prefix` + their docs/figures/ name. With `budget` (`budget_rows` and the larger runs
    kept): the scorecard marks the verdicts that depend on the run's size, and a section compares them."""
    claims = read_claims(root, model)
    keys = {t: pd.read_parquet(require(root / layout.KEY.format(task=t))) for t in tasks}
    knockouts = {t: pd.read_parquet(require(root / layout.KNOCKOUT.format(task=t))) for t in tasks}
    shown = set(figures)

    def link(source: str) -> str | None:
        return f"{prefix}{figure_name(source)}" if source in shown else None

    def figure(source: str) -> list[str]:
        return [image(source, tasks, prefix)] if source in shown else []

    origin = provenance_text(root / layout.KNOCKOUT.format(task=tasks[0]))
    out = [f"# Results of the default run: {model}\n",
           f"Generated by `make docs` from `results/{model}/` ({origin}); do not edit by hand: after `make run`, "
           "`make docs` rewrites this page and README's scorecard.\n",
           "## Scorecard\n", f"{verdict_counts(claims)} Each claim is the paper's (Zhang et al., ICML 2024, "
           "on LLaMA2-7B); the rule in its row decided the verdict, and each sub-row is one part of the claim "
           "(an operator, a target, a position set).\n",
           claims_markdown(claims, sub_rows=True, link=link, mark=budget_mark(budget[0]) if budget else None)]
    if budget is not None:
        out += budget_section(claims, *budget, model)

    out += ["## Key components (identify)\n",
            "Heads and MLPs selected by their path-patching effect at END on the answer logit (the relative change "
            "of the answer logit when the node gets its counterfactual value; negative: it falls), with 95% "
            "intervals from resampling operand pairs.\n", markdown_table(key_component_rows(keys))]
    out += figure(layout.SHARED_FIGURE)
    for task in tasks:
        nodes = key_heads_table(keys[task])
        out += [f"### {task}\n", markdown_table(nodes) if len(nodes) else "No head or MLP passed the rule.\n"]
        out += figure(layout.EFFECTS_FIGURE.format(task=task))

    out += ["## Knockout (validate)\n",
            "Accuracy on each operator's validation pairs with nothing, the top K heads, or K random heads "
            "(uniform, or in the top K's layers; mean [min, max] over the draws) mean-ablated, at END (`end`) or "
            "at every position (`all`); first answer token and full greedy answer.\n",
            markdown_table(knockout_long(knockout_rows(knockouts)))]
    for task in tasks:
        out += figure(layout.KNOCKOUT_FIGURE.format(task=task))

    transfer_path = root / layout.TRANSFER
    if transfer_path.is_file():
        out += ["## Transfer of the key heads (validate)\n",
                "Full-answer accuracy on each target with one operator's key heads knocked out, against as many "
                "layer-matched random heads (key / random). The paper: other operators, formats and word problems "
                "suffer, the non-math control does not.\n",
                markdown_table(transfer_table(pd.read_parquet(transfer_path), tasks))]
        out += figure(layout.TRANSFER_FIGURE)

    out += discover_section(root, tasks, figure)

    analysis = [(t, root / layout.ROLES.format(task=t), root / layout.PROBES.format(task=t)) for t in tasks]
    if any(r.is_file() or p.is_file() for _, r, p in analysis):
        out += ["## Attention and MLP probes (analyze)\n",
                "Where each analysed head looks from END (share of its attention on each token role, mean over "
                "validation prompts), and how much the MLP outputs at END point to the unembedding of the operands "
                "and of the answer (cosine).\n"]
        for task, roles_path, probes_path in analysis:
            out.append(f"### {task}\n")
            if roles_path.is_file():
                out.append(markdown_table(roles_table(pd.read_parquet(roles_path))))
                out += figure(layout.ROLES_FIGURE.format(task=task))
            if probes_path.is_file():
                out.append(markdown_table(probes_table(pd.read_parquet(probes_path))))
                out += figure(layout.PROBES_FIGURE.format(task=task))

    study_path, comp_path = root / layout.STUDY, root / layout.COMPARISONS
    out.append("## Precise SFT study (finetune)\n")
    not_run = study_not_run(study_path) if study_path.is_file() else None
    if not_run is not None:
        out.append(f"{not_run} The measured formats are in `{layout.under(layout.STUDY_MD, model)}`.\n")
    elif study_path.is_file():
        arms, comp = study_rows(pd.read_parquet(study_path), pd.read_parquet(require(comp_path)))
        out += ["Greedy full-answer exact match on the held-out test pairs of the trained format (the chosen run's "
                "95% interval resamples operand pairs), KL(base || model) in nats per WikiText-2 token, and the "
                "parameters each arm trains.\n", markdown_table(arms),
                "The precise arm against the others, on the same test items (exact match in percentage points, KL "
                "in nats), with intervals and p-values (McNemar where each arm is one model, else the paired "
                "cluster bootstrap), Holm-adjusted over the whole comparison table.\n", markdown_table(comp)]
        out += figure(layout.STUDY_FIGURE) + figure(layout.STUDY_CURVES_FIGURE)
    else:
        out.append("The study did not run in this configuration (`study.arms` is empty).\n")
    out += figure(layout.EVAL_SUMMARY_FIGURE)
    return "\n".join(out)


def scorecard_block(root: Path, model: str, tasks: list[str], figures: list[str], prefix: str = "docs/figures/",
                    compared: list[dict] | None = None) -> str:
    """README's generated block: the scorecard's headline rows, each claim linking to its figure (with `compared`,
    `budget_rows`: a verdict that depends on the run's size marked), and where the numbers come from."""
    claims = read_claims(root, model)
    shown = set(figures)

    def link(source: str) -> str | None:
        return f"{prefix}{figure_name(source)}" if source in shown else None

    origin = provenance_text(root / layout.KNOCKOUT.format(task=tasks[0]))
    return (claims_markdown(claims, sub_rows=False, link=link, mark=budget_mark(compared) if compared else None)
            + f"\n{verdict_counts(claims)} Model `{model}` ({origin}); generated by `make docs` from "
              f"`results/{model}/`.\n"
            + own_circuit_block(root, tasks, link))


def own_circuit_block(root: Path, tasks: list[str], link) -> str:
    """README's two sentences on the model's own circuit (`page.circuit_sentences`, the findings page's) with
    links to its figures; "" when the discover rule has not run."""
    found = read_discover(root, tasks)
    if found is None:
        return ""
    names = [(layout.DISCOVER_PATH_FIGURE, "the pruning path"),
             (layout.DISCOVER_CIRCUIT_FIGURE, "the circuit over the key heads"),
             (layout.STUDY_FIGURE, "the study")]
    figures = [f"[{name}]({link(source.format(task=tasks[0]))})" for source, name in names
               if tasks and link(source.format(task=tasks[0]))]
    return (f"\nThe model's own circuit (discover): {circuit_sentences(found[0])}"
            + (f" Figures: {', '.join(figures)}." if figures else "") + "\n")


# ---------------------------------------------------------------------------------------------------
# README's numbers that a command produces: the run time of `make run` and the paper plan


def headline_run(results_record: Path, kept_record: Path) -> dict | None:
    """The record README's run time comes from: the last complete run `results_record` knows (a partial re-run
    keeps it, `run_record.last_complete`) when it started after the one in `kept_record` (which `make_docs` then
    replaces with it), else `kept_record`'s; None when neither has one."""
    found, kept = last_complete(read_record(results_record)), read_record(kept_record)
    if found is not None and (kept is None or _started(found) > _started(kept)):
        return found
    return kept


def _started(record: dict) -> str:
    return record.get("started") or record["date"]  # ISO 8601 text: in time order


def run_time_text(record: dict | None, kept_record: str = str(KEPT_RECORD)) -> str:
    """README's sentence on the run time of `make run`, from its record (`headline_run`); without one it says
    that the time has not been measured on this checkout."""
    if record is None:
        return paragraph("**`make run`**: its run time has not been measured on this checkout. `make run` writes it "
                         f"to `{RECORD}` when it ends, and `make docs` puts a complete run's time here.")
    build = [f"arithmech {record['arithmech']}" if record.get("arithmech") else "",
             f"commit {record['commit'][:10]}" + (" with local changes" if record.get("dirty") else "")
             if record.get("commit") else ""]
    return paragraph(
        f"**`make run`** took {duration_text(record['seconds'])} for its {record['jobs_run']} jobs (every job of the "
        f"workflow) on {record['date']}: `{record['command']}` once `.venv` was set up, on "
        f"{machine_text(record['machine'])}" + "".join(f"; {b}" for b in build if b) + f". Record: "
        f"[{kept_record}]({kept_record}), {record['recorded_by']}; earlier runs: "
        "[docs/performance.md](docs/performance.md).")


def read_history(path: Path) -> list[dict]:
    """The run history's rows (docs/run_history.csv, `run_record.HISTORY_COLUMNS`), oldest first; none when there
    is no file yet. A file whose header or `every_job` values are not the history's is an error naming it."""
    if not Path(path).is_file():
        return []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames != HISTORY_COLUMNS:
            raise ValueError(f"{path}: its columns are {reader.fieldnames}, not the run history's {HISTORY_COLUMNS}")
        rows = list(reader)
    for number, row in enumerate(rows, start=2):
        if row["every_job"] not in ("true", "false") or not row["wall_s"] or not row["configuration"]:
            raise ValueError(f"{path}, line {number}: every_job must be true or false, and wall_s and configuration "
                             "are needed")
    return rows


def history_table(rows: list[dict], headline: dict | None = None) -> str:
    """docs/performance.md's block: the last complete run (`every_job`) of each configuration in `rows`
    (`read_history`; config.yaml first, then by name), and the run README's run time comes from (`headline`, its
    record) marked, or added as a row of its own when it is not one of them."""
    last = {row["configuration"]: row for row in rows if row["every_job"] == "true"}
    shown = [last[c] for c in sorted(last, key=lambda c: (c != "config.yaml", c))]
    readme = None
    if headline is not None:
        mine = {k: str(v) for k, v in history_row(headline).items()}  # as the CSV reads
        same = ("date", "commit", "configuration", "jobs")
        match = [row for row in rows if all(row[k] == mine[k] for k in same)
                 and float(row["wall_s"]) == float(mine["wall_s"])]
        readme = match[-1] if match else mine
        if not any(row is readme for row in shown):
            shown.append(readme)
    if not shown:
        return "No complete run is recorded yet: `make run` adds its row when it ends.\n"
    lines = ["| configuration | date | commit | machine | jobs | wall time | job time | note |",
             "|---|---|---|---|---|---|---|---|"]
    for row in shown:
        gpus = "no GPU" if row["gpus"] in ("", "none") else row["gpus"]
        machine = ", ".join(p for p in [row["machine"], f"{row['cores']} cores" if row["cores"] else "", gpus] if p)
        jobs = row["jobs"] + (f" of {row['workflow_jobs']}" if row["workflow_jobs"] not in ("", row["jobs"]) else "")
        job_time = duration_text(float(row["job_s"])) if row["job_s"] else ""
        label = f"`{row['configuration']}`" + (" (README's run time)" if row is readme else "")
        cells = [label, row["date"], row["commit"], machine, jobs, duration_text(float(row["wall_s"])), job_time,
                 row["note"]]
        lines.append("| " + " | ".join(markdown_cell(c) for c in cells) + " |")
    return "\n".join(lines) + f"\n\nGenerated by `make docs` from `{HISTORY.as_posix()}` ({len(rows)} runs).\n"


def rules_table(record: dict | None) -> str:
    """docs/performance.md's block on where a run's time goes: the job time of each rule of the run README's time
    comes from (`record`, its `rules`: `run_record.rule_seconds`), longest first, the rules under `FOLDED_SHARE` of
    the job time in one row, and the circuit discovery's and the study's shares of it; one line when the record has
    no job time per rule."""
    if record is None:
        return "No complete run is recorded yet: `make run` records its job time per rule when it ends.\n"
    rules, which = record.get("rules"), f"`{KEPT_RECORD.as_posix()}`, commit {(record.get('commit') or '')[:7]}"
    if not rules:
        return paragraph(f"The record of README's run ({which}, {record['date']}) holds no job time per rule: the "
                         "table comes with the next complete run that `make docs` keeps.")
    if unknown := [rule for rule, r in rules.items() if r["seconds"] is None]:
        return paragraph(f"The record of README's run ({which}, {record['date']}) has no job time for "
                         f"{_listed(f'`{rule}`' for rule in unknown)} (a benchmark file without its seconds): no "
                         "table.")
    total = sum(r["seconds"] for r in rules.values())
    order = sorted(rules, key=lambda rule: (-rules[rule]["seconds"], rule))
    small = [rule for rule in order if rules[rule]["seconds"] < FOLDED_SHARE * total]
    small = small if len(small) > 1 else []  # a row of its own for a lone small rule
    jobs = sum(r["jobs"] for r in rules.values())
    out = [paragraph(
        f"Job time per rule of README's run ({which}, {record['date']}, `{record['command']}` on "
        f"{machine_text(record['machine'])}), from the Snakemake benchmark files it wrote: {display.count(total)} s "
        f"of job time in {jobs} jobs, {total / record['seconds']:.2f} jobs at a time.")]
    lines = ["| rule | jobs | job time | per job |", "|---|---|---|---|"]
    for rule in order:
        if rule not in small:
            r = rules[rule]
            lines.append(f"| `{rule}` | {r['jobs']} | {display.count(r['seconds'])} s | "
                         f"{_per_job(r['min'], r['max']) if r['jobs'] > 1 else ''} |")
    if small:
        folded = [rules[rule] for rule in small]
        lines.append(f"| the {len(small)} rules under {FOLDED_SHARE:.0%} of the job time each: "
                     f"{', '.join(f'`{rule}`' for rule in sorted(small))} | {sum(r['jobs'] for r in folded)} | "
                     f"{display.count(sum(r['seconds'] for r in folded))} s | "
                     f"{_per_job(min(r['min'] for r in folded), max(r['max'] for r in folded))} |")
    out.append("\n".join(lines) + "\n")
    parts = []
    for name, group in (("the circuit discovery", [r for r in DISCOVERY_RULES if r in rules]),
                        ("the study", [r for r in order if r.startswith(STUDY_PREFIX)])):
        if group:
            seconds = sum(rules[r]["seconds"] for r in group)
            parts.append(f"{name} ({', '.join(f'`{r}`' for r in group)}) {'' if parts else 'takes '}"
                         f"{display.count(seconds)} s ({display.share(seconds / total, 0)})")
    if parts:
        out.append(paragraph(f"Of the job time, {_listed(parts)}."))
    return "\n".join(out)


def _per_job(shortest: float, longest: float) -> str:
    """A rule's shortest and longest job: "132-268 s", or "40 s" when they round alike."""
    low, high = display.count(shortest), display.count(longest)
    return f"{low} s" if low == high else f"{low}-{high} s"


def plan_text(report: dict) -> str:
    """README's sentence on the paper plan: the totals of `make plan`'s report (`arithmech.tools.plan.plan`) for
    its default configuration, `PLAN_CONFIGS`."""
    total, throughput = report["totals"], report["throughput"]
    return paragraph(
        f"For `{' '.join(PLAN_CONFIGS)}`, `make plan` gives {total['jobs']} jobs, {total['gpu_jobs']} of them on a "
        f"GPU, and {total['gpu_hours']:.2f} GPU hours at an assumed {throughput['tflops']:g} TFLOP/s; its largest "
        f"job needs {total['gpu_gb']:.1f} GB of GPU memory and {total['host_gb']:.1f} GB of host memory (computed "
        "from this checkout by `make docs`).")


def plan_output(report: dict) -> str:
    """docs/plan.md's block: what `make plan` prints for `PLAN_CONFIGS`, as a text block (`render_text`), the
    configuration files named as make plan names them, however the report was computed."""
    from arithmech.tools.plan import render_text

    return "```text\n" + render_text({**report, "config_files": ["config.yaml", *PLAN_CONFIGS]}) + "```\n"


def paragraph(text: str) -> str:
    """`text` wrapped as README's own paragraphs are (lines of at most 115 characters), with its newline; a
    `code span` stays on one line, so that a command reads as one."""
    kept = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), text)
    return textwrap.fill(kept, width=115, break_long_words=False, break_on_hyphens=False).replace("\0", " ") + "\n"


def relative_folder(folder, start) -> str:
    """`folder` as seen from `start`, with a trailing slash: "figures/"."""
    return Path(os.path.relpath(Path(folder).resolve(), Path(start).resolve())).as_posix() + "/"


def make_docs(*, results_dir, model: str, tasks: list[str], readme, out_md, figures_dir, kept_record=None,
              plan_report: Callable[[], dict] | None = None, plan_page=None, kept_claims=None,
              models_page=None, history=None, performance_page=None, kept_budget=None,
              budget_runs: dict[str, Path] | None = None) -> None:
    """Fill README's scorecard block and write docs/results.md and docs/figures/ from results/{model}/. With
    `kept_record` (docs/run_record.json): README's run-time block (`headline_run`, `run_time_text`); with
    `plan_report` (called once: `make plan`'s report of `PLAN_CONFIGS`): its plan block (`plan_text`), and with
    `plan_page` (docs/plan.md) that page's block of the whole plan (`plan_output`); with `kept_claims` (docs/claims/)
    and `models_page` (docs/models.md): every model's headline claims kept (`keep_claims`) and the page's table of
    the claims across models (`claims_across_models`); with `history` (docs/run_history.csv) and `performance_page`
    (docs/performance.md): that page's table of the last complete run per configuration (`history_table`) and of
    the job time per rule of README's run (`rules_table`); with
    `kept_budget` (docs/claims/budget/): the larger runs kept for this model, those of `budget_runs` (configuration
    name -> its results folder) kept anew, compared with the default run (`budget_rows`) on the page and marked in
    both scorecards."""
    root = Path(results_dir) / model
    require(root / layout.CLAIMS)
    if budget_runs and kept_budget is None:
        raise ValueError("larger runs are kept in kept_budget: give it with budget_runs")
    readme = Path(readme)
    text = require(readme).read_text()
    figures = figure_sources(root, tasks)
    new_runs, budget = {}, None
    if kept_budget is not None:
        new_runs = {name: budget_claims(name, folder, model) for name, folder in (budget_runs or {}).items()}
        runs = kept_budget_runs(Path(kept_budget) / model) | new_runs
        runs = {name: runs[name] for name in BUDGET_STAGES if name in runs}
        budget = (budget_rows(read_claims(root, model), runs), runs)
    # figure links relative to the file that shows them
    page = results_markdown(root, model, tasks, figures, relative_folder(figures_dir, Path(out_md).parent), budget)
    block = scorecard_block(root, model, tasks, figures, relative_folder(figures_dir, readme.parent),
                            budget[0] if budget else None)
    text = replace_block(text, block, str(readme))
    record = None
    if kept_record is not None:
        record = headline_run(Path(results_dir) / RECORD.name, Path(kept_record))
        link = Path(os.path.relpath(Path(kept_record).resolve(), readme.parent.resolve())).as_posix()
        text = replace_block(text, run_time_text(record, link), str(readme), RUN_TIME_MARKERS)
    plan_page_text = None
    if plan_report is not None:
        report = plan_report()
        text = replace_block(text, plan_text(report), str(readme), PLAN_MARKERS)
        if plan_page is not None:
            plan_page_text = replace_block(Path(plan_page).read_text(), plan_output(report), str(plan_page),
                                           PLAN_OUTPUT_MARKERS)
    models_text = None
    if kept_claims is not None and models_page is not None:
        keep_claims(results_dir, kept_claims)
        models_text = replace_block(require(Path(models_page)).read_text(), claims_across_models(kept_claims, model),
                                    str(models_page), MODELS_MARKERS)
    performance_text = None
    if history is not None and performance_page is not None:
        headline = record if kept_record is not None else None
        performance_text = replace_block(require(Path(performance_page)).read_text(),
                                         history_table(read_history(Path(history)), headline),
                                         str(performance_page), HISTORY_MARKERS)
        performance_text = replace_block(performance_text, rules_table(headline), str(performance_page),
                                         RULES_MARKERS)
    # everything computed: now written, README's run time together with the record it comes from
    copy_figures(root, figures, Path(figures_dir))
    for name, frame in new_runs.items():
        write_if_changed(Path(kept_budget) / model / f"{name}.csv", kept_csv(frame))
    write_if_changed(Path(out_md), page)
    if record is not None:
        write_if_changed(Path(kept_record), json.dumps(record, indent=2, sort_keys=True) + "\n")
    write_if_changed(readme, text)
    if plan_page_text is not None:
        write_if_changed(Path(plan_page), plan_page_text)
    if models_text is not None:
        write_if_changed(Path(models_page), models_text)
    if performance_text is not None:
        write_if_changed(Path(performance_page), performance_text)


def keep_claims(results_dir, kept_dir) -> list[str]:
    """Each results/<model>/claims.parquet (every claim and scope, `KEPT_CLAIM_COLUMNS`, and the results'
    provenance) into kept_dir/<model>.csv, written only when it differs; a model whose results are not here keeps
    its last file, so one machine's `make docs` does not drop another model's column. Returns the models kept."""
    kept = []
    for path in sorted(Path(results_dir).glob(f"*/{layout.CLAIMS}")):
        write_if_changed(Path(kept_dir) / f"{path.parent.name}.csv", kept_csv(kept_frame(path.parent)))
        kept.append(path.parent.name)
    return kept


def kept_frame(root: Path) -> pd.DataFrame:
    """A model's claims table (`layout.CLAIMS` under `root`) as docs/claims/ keeps it: `KEPT_CLAIM_COLUMNS` as the
    docs show them (`read_claims`: no wall-clock timing, so a re-run keeps the same bytes) and the results'
    provenance (`origin`)."""
    return read_claims(root, root.name)[KEPT_CLAIM_COLUMNS].assign(origin=provenance_text(root / layout.CLAIMS))


def kept_csv(frame: pd.DataFrame) -> str:
    return frame.to_csv(index=False, float_format="%.10g")


def read_kept(path: Path) -> pd.DataFrame:
    """A kept claims file (`kept_frame`) as it was written: empty cells missing, every other text as it is."""
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def claims_across_models(kept_dir, first: str) -> str:
    """The paper's claims side by side across models (docs/models.md's block): a row per claim (the order of
    `first`'s scorecard, then any other model's further claims), a column per model kept in `kept_dir` (`first`
    first): its verdict and the number that decided it, or, where the headline is decided by its parts (per
    operator, ...), each part's verdict. No rule differs between models: each cell is that model's own scorecard."""
    kept = {p.stem: read_kept(p) for p in sorted(Path(kept_dir).glob("*.csv"))}
    parts = {m: t[t["scope"] != HEADLINE] for m, t in kept.items()}
    tables = {m: t[t["scope"] == HEADLINE] for m, t in kept.items()}
    if not tables:
        return "No model's claims are kept yet: run the workflow (`make run`), then `make docs`.\n"
    models = sorted(tables, key=lambda m: (m != first, m))
    order = list(dict.fromkeys(c for m in models for c in tables[m]["claim"]))
    lines = ["| Claim | Paper (LLaMA2-7B) | " + " | ".join(f"`{m}`" for m in models) + " |",
             "|---|---|" + "---|" * len(models)]
    by_claim = {m: tables[m].set_index("claim") for m in models}
    for claim in order:
        rows = {m: by_claim[m].loc[claim] for m in models if claim in by_claim[m].index}
        some = next(iter(rows.values()))
        cells = []
        for m in models:
            if m not in rows:
                cells.append("not in this model's scorecard")
                continue
            r = rows[m]
            measured = markdown_cell(measured_text(r)) if not display.missing(r["value"]) else ""
            if not measured:  # decided by its parts: each part's verdict
                mine = parts[m][parts[m]["claim"] == claim]
                measured = ", ".join(f"{markdown_cell(p['scope'])} {VERDICT_MARKS[p['verdict']]}"
                                     for _, p in mine.iterrows())
            cells.append(f"{VERDICT_MARKS[r['verdict']]} **{r['verdict']}**" + (f"<br>{measured}" if measured else ""))
        lines.append(f"| {markdown_cell(some['statement'])} | {markdown_cell(some['paper'])} | " + " | ".join(cells)
                     + " |")
    origins = [f"`{m}`: {tables[m]['origin'].iloc[0]}" for m in models if len(tables[m])]
    counts = [f"`{m}`: {verdict_counts(tables[m].assign(scope=HEADLINE))}" for m in models]
    return ("\n".join(lines) + "\n\n" + " ".join(counts) + "\n\nGenerated by `make docs` from each model's "
            f"`results/<model>/claims.parquet` (kept in `{KEPT_CLAIMS.as_posix()}/`): " + "; ".join(origins) + ".\n")


# ---------------------------------------------------------------------------------------------------
# Budget sensitivity: each verdict of the default run beside the same verdict from a run of a larger configuration

KEPT_BUDGET = KEPT_CLAIMS / "budget"  # <model>/<configuration>.csv: a larger run's claims, committed
# The rows each larger configuration (configs/<name>.yaml, merged over config.yaml) speaks for: the stages whose
# settings it enlarges. circuit-full enlarges the `circuit` section alone (the discover and edges rules), sft-study
# the `study` section (the finetune stage's study); the rest of such a run is the default run's own settings, so its
# other rows say nothing about the budget.
BUDGET_STAGES = {"circuit-full": ("discover", "circuit"), "sft-study": ("finetune",)}
DEPENDS, STANDS, NOT_KEPT, ABSENT = ("depends on the run's size", "stands", "no larger run kept",
                                     "not in the larger run")


def budget_run(text: str) -> tuple[str, Path]:
    """`--budget-run NAME=RESULTS` as (NAME, RESULTS): NAME one of `BUDGET_STAGES`, RESULTS the results folder of
    its run (holding <model>/claims.parquet)."""
    name, sep, folder = text.partition("=")
    if not sep or not folder:
        raise ValueError(f"--budget-run {text!r}: expected NAME=RESULTS, NAME the larger configuration's name "
                         f"({', '.join(BUDGET_STAGES)}) and RESULTS its run's results folder")
    if name not in BUDGET_STAGES:
        raise ValueError(f"--budget-run {text!r}: {name!r} is no larger configuration make docs compares; known: "
                         f"{', '.join(BUDGET_STAGES)} (BUDGET_STAGES in arithmech.tools.docs_results)")
    return name, Path(folder)


def budget_claims(name: str, results_dir, model: str) -> pd.DataFrame:
    """The claims of `model` from the run of the larger configuration `name` (`--budget-run name=results_dir`), as
    docs/claims/budget/ keeps them (`kept_frame`); a missing folder or claims table is an error naming both."""
    root = Path(results_dir) / model
    if not Path(results_dir).is_dir():
        raise MissingResults(f"--budget-run {name}={results_dir}: {results_dir} is not a folder")
    if not (root / layout.CLAIMS).is_file():
        raise MissingResults(f"--budget-run {name}={results_dir}: {root / layout.CLAIMS} is missing; run "
                             f"configs/{name}.yaml for {model} to its end first")
    return kept_frame(root)


def kept_budget_runs(model_dir: Path) -> dict[str, pd.DataFrame]:
    """The larger runs kept for one model (kept_dir/<model>/<name>.csv), in `BUDGET_STAGES`' order."""
    return {n: read_kept(p) for n in BUDGET_STAGES if (p := Path(model_dir) / f"{n}.csv").is_file()}


def budget_rows(claims: pd.DataFrame, runs: dict[str, pd.DataFrame]) -> list[dict]:
    """Per row of the default run's claims whose stage a larger configuration enlarges (`BUDGET_STAGES`), in the
    scorecard's order: the row, its configuration, that run's row of the same claim and scope (None where that run
    is not kept or lacks it) and the budget: DEPENDS where the verdicts differ, STANDS where they agree, NOT_KEPT,
    or ABSENT."""
    config_of = {stage: name for name, stages in BUDGET_STAGES.items() for stage in stages}
    larger = {name: {(r["claim"], r["scope"]): r for _, r in run.iterrows()} for name, run in runs.items()}
    out = []
    for _, row in claims[claims["stage"].isin(config_of)].iterrows():
        name = config_of[row["stage"]]
        other = larger[name].get((row["claim"], row["scope"])) if name in larger else None
        if name not in larger:
            budget = NOT_KEPT
        elif other is None:
            budget = ABSENT
        else:
            budget = STANDS if other["verdict"] == row["verdict"] else DEPENDS
        out.append({"row": row, "config": name, "larger": other, "budget": budget})
    return out


def _sizes(row, other) -> str:
    """The sizes behind two rows' verdicts: "n 120 -> 1,000"; "" where neither row has one."""
    if display.missing(row["n"]) and display.missing(other["n"]):
        return ""
    return f"n {display.count(row['n']) or 'not given'} -> {display.count(other['n']) or 'not given'}"


def budget_mark(compared: list[dict]) -> Callable[[pd.Series], str]:
    """The scorecard's remark on a verdict that depends on the run's size (`budget_rows`), with the sizes that
    decide it: on a part, its own; on a headline, its own and its parts' ("depends on the run's size: addition
    n 120 -> 1,000 (configs/circuit-full.yaml)")."""
    depends = [c for c in compared if c["budget"] == DEPENDS]

    def mark(row: pd.Series) -> str:
        mine = [c for c in depends if c["row"]["claim"] == row["claim"]
                and (row["scope"] == HEADLINE or c["row"]["scope"] == row["scope"])]
        if not mine:
            return ""
        # a part's sizes named by its scope on the headline's row
        sizes = [" ".join(p for p in (c["row"]["scope"] if c["row"]["scope"] != row["scope"] else "",
                                      _sizes(c["row"], c["larger"])) if p) for c in mine]
        sizes = [s for s in sizes if s]
        return DEPENDS + (f": {', '.join(sizes)}" if sizes else "") + f" (configs/{mine[0]['config']}.yaml)"

    return mark


def _listed(words) -> str:
    """Words as a sentence lists them: "a", "a and b", "a, b and c"."""
    words = list(words)
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def _rows(n: int) -> str:
    return f"{n} row has" if n == 1 else f"{n} rows have"


def budget_section(claims: pd.DataFrame, compared: list[dict], runs: dict[str, pd.DataFrame], model: str) -> list[str]:
    """docs/results.md's section on budget sensitivity: per row of `budget_rows`, the default run's verdict and
    value beside each kept larger run's, the budget, and how many verdicts depend on the run's size."""
    kept_dir = (KEPT_BUDGET / model).as_posix()
    enlarged = ", ".join(f"`configs/{name}.yaml` for the {_listed(stages)} claims"
                         for name, stages in BUDGET_STAGES.items())
    others = [s for s in dict.fromkeys(claims["stage"]) if s not in {s for v in BUDGET_STAGES.values() for s in v}]
    out = ["## Budget sensitivity\n",
           "Each verdict of a stage that a larger configuration enlarges, beside the same verdict from a run of that "
           f"configuration: {enlarged}."
           + (f" The {_listed(others)} claims are not here: no larger configuration changes their settings."
              if others else "")
           + " Budget: *depends on the run's size* where the two verdicts differ (the scorecard marks the claim, "
           "with the sizes), *stands* where they agree, *no larger run kept* where that configuration's run is not "
           f"kept in `{kept_dir}/`. A larger run: its configuration merged over config.yaml in a clone of its own "
           "(`.venv/bin/snakemake --cores 2 --configfile configs/circuit-full.yaml`), then `make docs "
           "DOCS_ARGS=\"--budget-run circuit-full=CLONE/results\"` keeps its claims there.\n"]
    compared_rows = [c for c in compared if c["budget"] in (DEPENDS, STANDS)]
    depends = sum(c["budget"] == DEPENDS for c in compared_rows)
    count = (f"{depends} of {len(compared_rows)} verdicts depend on the run's size." if compared_rows
             else "No verdict is compared: no larger run is kept.")
    for name in BUDGET_STAGES:
        if n := sum(c["config"] == name and c["budget"] == NOT_KEPT for c in compared):
            count += f" {_rows(n)} no larger run kept (`configs/{name}.yaml`)."
    if absent := sum(c["budget"] == ABSENT for c in compared):
        count += f" {_rows(absent)} no row in their larger run's claims."
    out.append(count + "\n")

    def cell(row) -> str:
        measured = markdown_cell(display.measured(row["value"], row["ci_low"], row["ci_high"], row["unit"], row["n"]))
        return f"{VERDICT_MARKS[row['verdict']]} **{row['verdict']}**" + (f"<br>{measured}" if measured else "")

    header = ["Claim", "default run", *(f"`{n}`" for n in runs), "budget"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in compared:
        row = c["row"]
        label = (markdown_cell(row["statement"]) if row["scope"] == HEADLINE
                 else f"&nbsp;&nbsp;↳ {markdown_cell(row['scope'])}")
        others = [cell(c["larger"]) if name == c["config"] and c["larger"] is not None else "" for name in runs]
        budget = f"**{DEPENDS}**" if c["budget"] == DEPENDS else c["budget"]
        lines.append(f"| {label} | {cell(row)} | " + "".join(f"{o} | " for o in others) + f"{budget} |")
    out.append("\n".join(lines) + "\n")
    if runs:
        out.append("Larger runs kept: " + "; ".join(f"`{kept_dir}/{n}.csv` ({run['origin'].iloc[0]})"
                                                    for n, run in runs.items() if len(run)) + ".\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config.yaml", help="the run's config: its run.models[0] and run.tasks")
    parser.add_argument("--model", help="the model to document (default: the config's first model)")
    parser.add_argument("--results", default="results")
    parser.add_argument("--readme", default="README.md")
    parser.add_argument("--out", default="docs/results.md")
    parser.add_argument("--figures", default="docs/figures")
    parser.add_argument("--plan-page", default="docs/plan.md", help="the page with the whole plan's block")
    parser.add_argument("--kept-claims", default=str(KEPT_CLAIMS),
                        help="where every model's headline claims are kept (from RESULTS/*/claims.parquet)")
    parser.add_argument("--models-page", default=str(MODELS_PAGE), help="the page of the claims across models")
    parser.add_argument("--kept-budget", default=str(KEPT_BUDGET),
                        help="where the larger runs' claims are kept, per model (the budget-sensitivity table)")
    parser.add_argument("--budget-run", action="append", default=[], metavar="NAME=RESULTS",
                        help="keep the claims of a run of configs/NAME.yaml (" + ", ".join(BUDGET_STAGES)
                        + ") from RESULTS/<model>/claims.parquet; repeatable")
    parser.add_argument("--run-record", default=str(KEPT_RECORD),
                        help="the kept record of README's run time (updated from RESULTS/run_record.json)")
    parser.add_argument("--history", default=str(HISTORY), help="the run history (make run adds a row to it)")
    parser.add_argument("--performance-page", default=str(PERFORMANCE_PAGE),
                        help="the page with the blocks of the last complete run per configuration and of the "
                        "job time per rule")
    args = parser.parse_args(argv)
    config = yaml.safe_load(Path(args.config).read_text())
    model = args.model or config["run"]["models"][0]

    def paper_plan() -> dict:
        from arithmech.tools.plan import plan

        return plan(PLAN_CONFIGS, root=Path.cwd())

    from arithmech.tools.plan import PlanError

    try:
        budget_runs = dict(budget_run(text) for text in args.budget_run)
        make_docs(results_dir=args.results, model=model, tasks=list(config["run"]["tasks"]), readme=args.readme,
                  out_md=args.out, figures_dir=args.figures, kept_record=args.run_record, plan_report=paper_plan,
                  plan_page=args.plan_page, kept_claims=args.kept_claims, models_page=args.models_page,
                  history=args.history, performance_page=args.performance_page, kept_budget=args.kept_budget,
                  budget_runs=budget_runs)
    except (MissingResults, ValueError, PlanError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"make docs: {args.readme} (scorecard, run time and plan blocks), {args.out} and {args.figures}/ from "
          f"{args.results}/{model}; the plan's block in {args.plan_page}; the claims across models in "
          f"{args.models_page}; the last complete run per configuration and the job time per rule in "
          f"{args.performance_page}; the larger runs kept in {args.kept_budget}/{model}/")
    record = read_record(Path(args.results) / RECORD.name)
    if record is not None and not record.get("from_scratch"):
        print(f"{args.results}/{RECORD.name} is a partial run ({record['jobs_run']} jobs): README's run time is the "
              "last complete run's", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
