"""Claim transfer: an operator's key heads knocked out hurt other operators, formats and word problems more than
as many layer-matched random heads, and a non-math task no more (`claims.min_difference`)."""

from __future__ import annotations

import pandas as pd

from arithmech import layout
from arithmech.data.arithmetic import FORMATS
from arithmech.report.claims.common import (
    Claim,
    Tables,
    claim_row,
    directional,
    directional_rule,
    headline,
    interval_note,
    non_inferior,
    not_measured,
    paired,
)

CLAIM = Claim("transfer", "validate",
              "The key heads transfer: knocking them out hurts other operators, formats and word problems, "
              "not a non-math task.",
              "\"the key heads/MLPs identified on one dataset are also effective for other datasets\" (introduction)")
MATH_TARGETS = ("operator", *FORMATS, "svamp")

TRANSFER_LABELS = {"operator": "other operators", "multi_digit": "multi-digit operands",
                   "decimal": "decimal operands", "svamp": "SVAMP", "non_math": "non-math control"}


def score(items: pd.DataFrame | None, cfg: dict, seed: int) -> list[dict]:
    """Per target kind: on the items the unablated model gets right, the share that stays right with an operator's
    key heads knocked out minus with as many layer-matched random heads (mean over draws): the transfer table's
    `retained`, pooled over source operators, paired per item. Other operators only (a source operator's own
    pairs are the knockout claim's)."""
    min_diff = cfg["min_difference"]
    hurt_rule = directional_rule("(key - random) retained accuracy", -1, f"{100 * min_diff:g} points")
    keep_rule = (f"holds if the 95% interval of (key - random) retained accuracy lies above -{100 * min_diff:g} "
                 f"points; does not hold if it lies below 0; inconclusive otherwise")
    if items is None or not len(items):
        return not_measured(CLAIM, "no per-item transfer table", rule=hurt_rule)
    intact = items.loc[items["source"] == "none"].set_index(["target", "item"])["correct"]
    knocked = items[items["source"] != "none"]
    knocked = knocked[(knocked["target_kind"] != "operator") | (knocked["target"] != knocked["source"])]
    right = intact.reindex(pd.MultiIndex.from_frame(knocked[["target", "item"]])).to_numpy(dtype=bool)
    subs = []
    for kind in (*MATH_TARGETS, "non_math"):
        of_kind = (knocked["target_kind"] == kind).to_numpy()
        part = knocked[of_kind & right]
        if not of_kind.any():
            continue
        if not len(part):
            subs.append(claim_row(CLAIM, TRANSFER_LABELS[kind], rule=hurt_rule if kind != "non_math" else keep_rule,
                                  note="the unablated model answers none of these items: nothing to lose"))
            continue
        part = part.assign(item_key=part["source"] + "|" + part["target"] + "|" + part["item"].astype(str),
                           cluster=part["target"] + "|" + part["cluster"].astype(str))
        key = part[part["heads"] == "key"].groupby("item_key")["correct"].mean()
        rand = part[part["heads"] == "random"].groupby("item_key")["correct"].mean()
        clusters = part.drop_duplicates("item_key").set_index("item_key")
        res = paired(clusters, key.astype(float), rand.astype(float), cfg, seed)
        lo, hi = res["ci_low"], res["ci_high"]
        if kind == "non_math":
            verdict, rule = non_inferior(pd.Series({"ci_low": lo, "ci_high": hi}), min_diff), keep_rule
        else:
            verdict, rule = directional(lo, hi, direction=-1, min_effect=min_diff), hurt_rule
        label = TRANSFER_LABELS[kind]
        subs.append(claim_row(CLAIM, label,
                              measure="retained accuracy, key minus layer-matched random heads knocked out",
                              value=100 * res["difference"], ci_low=100 * lo, ci_high=100 * hi, unit="points",
                              n=int(res["n_items"]), split="validation" if kind == "operator" else "held-out set",
                              verdict=verdict, rule=rule,
                              note="; ".join(x for x in (
                                  f"{', '.join(dict.fromkeys(part['target']))}: {100 * key.mean():.1f}% of the "
                                  f"items the intact model gets right stay right with the key heads out, "
                                  f"{100 * rand.mean():.1f}% with random heads", interval_note(lo, hi, verdict)) if x),
                              source=layout.TRANSFER_FIGURE))
    return headline(CLAIM, subs, measure="per target, below", source=layout.TRANSFER_FIGURE)


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the transfer rule's per-item table."""
    return score(t.transfer_items, cfg, seed)
