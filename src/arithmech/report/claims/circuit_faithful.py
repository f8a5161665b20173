"""Claim circuit_faithful: the discover rule's smallest faithful circuit is small (`claims.max_circuit_share`)
and keeps the model's answers on held-out pairs on the teacher-forced protocol, better than random circuits
of its size (`common.tf_faithful_verdict`), unless it fits its pruning pairs too well (`claims.max_fit_gap`)."""

from __future__ import annotations

import pandas as pd

from arithmech import layout
from arithmech.interp import protocol
from arithmech.report import display
from arithmech.report.claims.common import (
    DISCOVER_OFF,
    SANITY_RULE,
    TF_FAITHFUL_COLUMNS,
    TF_LOGPROB_BAND,
    TF_MIN_OVER_RANDOM,
    TF_MIN_PAIRS,
    Claim,
    Tables,
    claim_row,
    failed_checks,
    fit_gaps,
    headline,
    not_measured,
    sanity_headline,
    sanity_note,
    tf_faithful_verdict,
    tf_kind_notes,
)

CLAIM = Claim("circuit_faithful", "discover",
              "A small circuit is faithful: the fewest heads and MLPs found by pruning keep the model's answers on "
              "held-out pairs, better than random circuits of their size.",
              "no circuit is searched in the paper (added here); its key heads are \"less than 5% of heads\" "
              "(introduction)")
DISCOVER_COLUMNS = ["task", "target", "chosen", "n_heads", "n_mlps", "share", "tf_n_items"] + [
    f"tf_{k}_{c}{x}" for k in protocol.KINDS for c in TF_FAITHFUL_COLUMNS for x in ("", "_low", "_high")]


def score(summary: pd.DataFrame | None, cfg: dict) -> list[dict]:
    """Per operator, for the union over operators and for the shared circuit (pruned on every operator's
    pairs together; task 'shared') (the discover rule's summary, one row per task and target, with
    the teacher-forced columns DISCOVER_COLUMNS): the chosen target's circuit, by `tf_faithful_rule`. The discover
    rule chooses the smallest target whose circuit keeps enough full answers on the selection pairs; where it chose
    none, the largest target's circuit is scored and the row says so."""
    if summary is None:
        return not_measured(CLAIM, DISCOVER_OFF)
    missing = [c for c in DISCOVER_COLUMNS if c not in summary.columns]
    if missing:
        raise ValueError(f"the discover summary ({layout.DISCOVER_SUMMARY}) lacks the columns {missing}")
    rule = tf_faithful_rule(cfg)
    if summary.empty:
        return not_measured(CLAIM, "the discover rule found no circuit (its summary is empty)", rule=rule)
    kinds = list(protocol.KINDS)
    subs, failed_by_task = [], {}
    for task, rows in summary.groupby("task", sort=False):
        chosen = rows[rows["chosen"].astype(bool)]
        fallback = chosen.empty
        row = (rows.sort_values("target").iloc[-1] if fallback else chosen.sort_values("target").iloc[0])
        subs.append(_tf_faithful_row(str(task), row, fallback or fell_back(row), rule, kinds, cfg))
        failed_by_task[subs[-1]["scope"]] = failed_checks(row, kinds)
    return headline(CLAIM, subs, measure="per operator, their union and their shared circuit, below",
                    split="validation", source=layout.DISCOVER_SUMMARY, note=sanity_headline(failed_by_task))


def tf_faithful_rule(cfg: dict) -> str:
    return (f"teacher-forced (answer and terminator; nodes outside the circuit ablated at END and every answer "
            f"position): holds if, under both ablations, with at least {TF_MIN_PAIRS} validation pairs, the circuit "
            f"has at most {100 * cfg['max_circuit_share']:g}% of the heads and MLPs, the lower end of the 95% interval "
            f"of its full-answer faithfulness is at least {100 * cfg['faithful']:g}%, its log-probability "
            f"faithfulness lies in [{TF_LOGPROB_BAND[0]:g}, {TF_LOGPROB_BAND[1]:g}], and it keeps at least "
            f"{100 * TF_MIN_OVER_RANDOM:g} points more than layer-matched random circuits of its size (interval above "
            f"0); does not hold if it is larger, its faithfulness interval lies below {100 * cfg['faithful']:g}%, its "
            f"log-probability faithfulness lies outside the band, or (circuit - random) lies below "
            f"{100 * TF_MIN_OVER_RANDOM:g} points; inconclusive otherwise, with fewer pairs, or where the two "
            f"ablations disagree; before all of these, inconclusive where the circuit's full-answer faithfulness on "
            f"the identification pairs it was pruned on exceeds the validation pairs' by more than "
            f"{100 * cfg['max_fit_gap']:g} points (under either ablation), and {SANITY_RULE}")


SCOPES = {"union": "union of the operators", "shared": "shared circuit of the operators"}  # the summary's pooled rows


def _tf_faithful_row(task: str, r: pd.Series, fallback: bool, rule: str, kinds: list[str], cfg: dict) -> dict:
    scope = SCOPES.get(task, task)
    size = f"{int(r['n_heads'])} heads + {int(r['n_mlps'])} MLPs ({100 * r['share']:.1f}% of nodes)"
    n = int(r["tf_n_items"])
    per_kind = {k: tf_faithful_verdict(r, k, cfg) for k in kinds}
    failed, gaps = failed_checks(r, kinds), fit_gaps(r, kinds, cfg)
    if set(per_kind.values()) == {"not measured"}:  # nothing to read, whatever the checks said (the note names them)
        verdict = "not measured"
    elif failed or gaps:  # the circuit and its numbers rest on an ablation that failed, or on too few pairs
        verdict = "inconclusive"
    elif r["share"] > cfg["max_circuit_share"]:
        verdict = "does not hold"
    elif len(set(per_kind.values())) > 1:
        verdict = "inconclusive"
    else:
        verdict = next(iter(per_kind.values()))
        if verdict == "holds" and n < TF_MIN_PAIRS:
            verdict = "inconclusive"
    found = ("the union of the operators' chosen circuits" if display.missing(r.get("target"))
             else f"found at target {r['target']:g} of the {r.get('pruned_on', 'pruning measure')}"
             + (" on every operator's identification pairs together" if task == "shared" else ""))
    note = [sanity_note(failed)] if failed else []
    if gaps:
        note.append(("" if failed else "inconclusive: ") + "; ".join(gaps.values()))
    note += [found + (" (no target's circuit kept enough answers on the identification pairs: the largest target's "
                      "is scored)" if fallback else ""),
             size + ("" if r["share"] <= cfg["max_circuit_share"] else
                     f", more than {100 * cfg['max_circuit_share']:g}%")]
    if n < TF_MIN_PAIRS:
        note.append(f"{n} validation pairs, fewer than the {TF_MIN_PAIRS} the rule asks for")
    note += tf_kind_notes(r, per_kind, "circuit")
    flag = r.get("cpr_order_flag")
    if not display.missing(flag) and str(flag):
        note.append(f"pruning order: {flag}")
    main = f"tf_{kinds[0]}_correct"
    if display.missing(r[main]):  # faithfulness undefined (the model answers nothing): the size is what decides
        return claim_row(CLAIM, scope, measure="the discovered circuit's share of all heads and MLPs",
                         value=100 * r["share"], unit="percent", n=n, split="validation", verdict=verdict, rule=rule,
                         note="; ".join(note), source=layout.DISCOVER_SUMMARY)
    return claim_row(CLAIM, scope,
                     measure=f"the discovered circuit's teacher-forced full-answer faithfulness ({kinds[0]} ablation)",
                     value=100 * r[main], ci_low=100 * r[main + "_low"], ci_high=100 * r[main + "_high"],
                     unit="percent", n=n, split="validation", verdict=verdict, rule=rule, note="; ".join(note),
                     source=layout.DISCOVER_SUMMARY)


def fell_back(row) -> bool:
    """Whether the discover rule took its largest target because no target kept `min_full_share` of the full
    answers on the identification pairs (a summary row's `share_reached`; rows without it: no)."""
    reached = row.get("share_reached")
    return not display.missing(reached) and not bool(reached)


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the discover rule's summary."""
    return score(t.discover, cfg)
