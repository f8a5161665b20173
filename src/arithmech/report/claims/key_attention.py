"""Claim key_attention: the key heads attend from END to the operands and the operator more than the other
heads do."""

from __future__ import annotations

import numpy as np
import pandas as pd

from arithmech import layout, stats
from arithmech.report.claims.common import (
    Claim,
    Tables,
    claim_row,
    directional,
    directional_rule,
    headline,
    interval_note,
)

CLAIM = Claim("key_attention", "analyze", "Key heads attend from END to the operands and the operator.",
              "\"These heads particularly attend to the operands and operators\" (introduction)")
OPERAND_ROLES = ("operand_a", "operand_b", "operator")


def score(roles_all: dict[str, pd.DataFrame], cfg: dict, seed: int) -> list[dict]:
    """Per operator: the share of END attention on operands and operator, mean over the analysed heads (the key
    heads) minus mean over every other head, with an interval resampling heads within each group."""
    min_diff = cfg["min_difference"]
    rule = directional_rule("(key - other heads) attention share on operands and operator", +1,
                            f"{100 * min_diff:g} points")
    subs = []
    rng = np.random.default_rng(seed)
    for task, table in roles_all.items():
        share = table[table["role"].isin(OPERAND_ROLES)].groupby(["layer", "head"]).agg(
            share=("attention", "sum"), analysed=("analysed", "first"))
        key, other = share.loc[share["analysed"], "share"].to_numpy(), share.loc[~share["analysed"], "share"].to_numpy()
        if not len(key) or not len(other):
            subs.append(claim_row(CLAIM, task, rule=rule, note="no analysed head, or no other head"))
            continue
        boot = (rng.choice(key, (cfg["bootstrap"], len(key))).mean(1)
                - rng.choice(other, (cfg["bootstrap"], len(other))).mean(1))
        lo, hi = (float(x[0]) for x in stats.percentile_interval(boot[:, None], cfg["confidence"]))
        verdict = directional(lo, hi, direction=+1, min_effect=min_diff)
        how = "key heads" if (table["selection"] == "key").all() else "strongest heads (the rule chose no key head)"
        note = (f"{how}: {100 * key.mean():.1f}% of END attention on operands and operator; the other "
                f"{len(other):,} heads: {100 * other.mean():.1f}%")
        subs.append(claim_row(CLAIM, task,
                              measure=f"attention share on operands and operator, {how} minus other heads",
                              value=100 * (key.mean() - other.mean()), ci_low=100 * lo, ci_high=100 * hi, unit="points",
                              n=len(key), split="validation", verdict=verdict, rule=rule,
                              note="; ".join(x for x in (note, interval_note(lo, hi, verdict)) if x),
                              source=layout.ROLES_FIGURE.format(task=task)))
    return headline(CLAIM, subs, measure="per operator, below", split="validation")


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the analysis rule's attention roles of every head, per operator."""
    return score(t.roles_all, cfg, seed)
