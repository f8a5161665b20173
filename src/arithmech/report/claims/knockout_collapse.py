"""Claim knockout_collapse: knocking out the key heads collapses accuracy (`claims.collapse`), knocking out as
many random heads (uniform, and in the same layers) does not; paired over the validation items."""

from __future__ import annotations

import pandas as pd

from arithmech import layout
from arithmech.report.claims.common import (
    Claim,
    Tables,
    claim_row,
    degenerate,
    directional,
    headline,
    in_percent,
    interval_note,
    not_measured,
    paired,
)

CLAIM = Claim("knockout_collapse", "validate",
              "Knocking out the key heads collapses accuracy; knocking out as many random heads does not.",
              "\"a decrease of around 70% in accuracy\" with the key heads/MLPs knocked out (introduction); the "
              "knockout figures: not available here")
ANSWERS = {"full_correct": "full answer", "first_correct": "first token"}


def score(items: dict[str, pd.DataFrame | None], cfg: dict, seed: int) -> list[dict]:
    """Per operator, positions and answer: accuracy with the top K heads knocked out (K = the curve's largest k)
    against K random heads drawn uniformly and K drawn in the same layers (the mean over draws, per item),
    paired over the same validation items, intervals resampling operand pairs. `items`: per operator its
    knockout's per-item table (`stages.validate.knockout_items`) with item_key and cluster unique across
    operators (`read_knockout_items`), or None."""
    min_diff, collapse = cfg["min_difference"], cfg["collapse"]
    rule = (f"holds if top-K accuracy is >= {100 * collapse:g}% lower than with nothing knocked out and the 95% "
            f"intervals of (top K - random K) lie below 0 for both controls; partly if only the controls hold; "
            f"does not hold if an interval lies above 0 or inside +-{100 * min_diff:g} points; else inconclusive")
    subs = []
    for task, per_item in items.items():
        if per_item is None:
            subs.append(claim_row(CLAIM, task, rule=rule, note="no per-item knockout table"))
            continue
        for positions, part in per_item.groupby("positions", sort=False):
            K = int(part.loc[part["curve"] == "top_heads", "k"].max())
            for answer, label in ANSWERS.items():
                subs.append(_knockout_row(task, positions, K, part, answer, label, cfg, seed, rule))
    # the headline: end positions, full answer, every operator's items pooled (clusters = operator and pair)
    pooled = [i for i in items.values() if i is not None]
    if not pooled:
        return not_measured(CLAIM, "no knockout table", rule=rule)
    end = pd.concat(pooled, ignore_index=True).query("positions == 'end'")
    if not len(end):
        return headline(CLAIM, subs)
    K = int(end.loc[end["curve"] == "top_heads", "k"].max())
    head = _knockout_row("all", "end", K, end, "full_correct", "full answer", cfg, seed, rule)
    if head["verdict"] == "not measured":
        return headline(CLAIM, subs, measure="per operator, below", note=head["note"])
    fields = {k: head[k] for k in ("measure", "value", "ci_low", "ci_high", "unit", "n", "split")}
    fields["measure"] = "all operators, END: " + fields["measure"]
    return headline(CLAIM, subs, source=layout.KNOCKOUT_FIGURE.format(task=next(iter(items))), **fields,
                    note=head["note"])


def _knockout_row(task: str, positions: str, K: int, part: pd.DataFrame, answer: str, label: str, cfg: dict,
                  seed: int, rule: str) -> dict:
    """One (operator, positions, answer) row of the knockout claim; `part` holds that positions' per-item rows."""
    def per_item(curve: str, k: int) -> pd.Series:
        rows = part[(part["curve"] == curve) & (part["k"] == k)]
        return rows.groupby("item_key")[answer].mean()  # random controls: the mean over draws

    items = part.drop_duplicates("item_key").set_index("item_key")
    none, top = per_item("top_heads", 0), per_item("top_heads", K)
    scope = f"{task} · {positions} · {label}"
    base_acc, top_acc = float(none.mean()), float(top.mean())
    if base_acc == 0:
        return claim_row(CLAIM, scope, rule=rule, n=len(none), split="validation",
                         note="the model answers none of these items with nothing knocked out: nothing to collapse")
    drop = 1 - top_acc / base_acc
    controls = {}
    for curve, name in (("random_layer_matched", "layer-matched"), ("random_heads", "uniform")):
        rand = per_item(curve, K)
        if len(rand):
            controls[name] = (float(rand.mean()), paired(items, top.astype(float), rand.astype(float), cfg, seed))
    if "layer-matched" not in controls:
        return claim_row(CLAIM, scope, rule=rule, note=f"no random control at k = {K}")
    # a control the top K answered identically to measured nothing (`degenerate`); the row's own (layer-matched)
    # one decides whether anything was measured
    verdicts = [v for v in (directional(c["ci_low"], c["ci_high"], direction=-1, min_effect=cfg["min_difference"])
                            for _, c in controls.values()) if v != "not measured"]
    lm = controls["layer-matched"][1]
    if degenerate(lm["ci_low"], lm["ci_high"]):
        verdict = "not measured"
    elif all(v == "holds" for v in verdicts):
        verdict = "holds" if drop >= cfg["collapse"] else "partly"
    elif "does not hold" in verdicts and "holds" not in verdicts:
        verdict = "does not hold"
    elif "holds" in verdicts:
        verdict = "partly"
    else:
        verdict = "inconclusive"
    note = (f"accuracy {100 * base_acc:.1f}% -> {100 * top_acc:.1f}% with the top {K} heads "
            f"({100 * drop:.0f}% lower); random: " +
            ", ".join(f"{name} {100 * acc:.1f}% (difference "
                      f"{in_percent(c['difference'], c['ci_low'], c['ci_high'], sign=True, unit='')})"
                      for name, (acc, c) in controls.items()))
    extra = interval_note(lm["ci_low"], lm["ci_high"], verdict)
    return claim_row(CLAIM, scope, measure=f"top {K} minus {K} layer-matched random heads, {label}",
                     value=100 * lm["difference"], ci_low=100 * lm["ci_low"], ci_high=100 * lm["ci_high"],
                     unit="points", n=int(lm["n_items"]), split="validation", verdict=verdict, rule=rule,
                     note="; ".join(x for x in (note, extra) if x),
                     source=layout.KNOCKOUT_FIGURE.format(task=task) if task != "all" else "")


def read_knockout_items(path, task: str) -> pd.DataFrame:
    """A knockout's per-item table with item_key and cluster prefixed by the operator (unique when pooled)."""
    items = pd.read_parquet(path)
    return items.assign(item_key=task + ":" + items["sample_id"].astype(str), cluster=task + ":" + items["cluster"])


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the knockouts' per-item tables."""
    return score(t.knockout_items, cfg, seed)
