"""Claim few_key_heads: fewer than 5% of the heads are key heads (`claims.max_key_share`), per operator and for
the heads key for any operator; the paper's own -5% threshold counted beside it."""

from __future__ import annotations

import math

import pandas as pd

from arithmech import layout
from arithmech.report.claims.common import Claim, Tables, claim_row, headline

CLAIM = Claim("few_key_heads", "identify", "Fewer than 5% of the attention heads are key heads for arithmetic.",
              "< 5% of the attention heads (introduction); key heads: a logit change \"exceeding -5%\" (section 5.1)")


def score(keys: dict[str, pd.DataFrame], effects: dict[str, pd.DataFrame], cfg: dict) -> list[dict]:
    subs = []
    for task, key in keys.items():
        heads = key[key["component"] == "head"]
        eff = effects[task]
        n_total = int((eff["component"] == "head").sum())
        paper = int(((eff["component"] == "head") & (eff["mean_effect"] < cfg["paper_threshold"])).sum())
        share = len(heads) / n_total if n_total else math.nan
        verdict = "holds" if 0 < share <= cfg["max_key_share"] else "does not hold"
        note = (f"{len(heads)} of {n_total:,} heads; {paper} pass the paper's "
                f"{100 * cfg['paper_threshold']:g}% threshold")
        if not len(heads):
            note += "; the key-head rule selected no head"
        subs.append(claim_row(CLAIM, task, measure="share of heads that are key", value=100 * share,
                              unit="percent", n=n_total, split="identification", verdict=verdict,
                              rule=f"holds if 0 < share <= {100 * cfg['max_key_share']:g}%", note=note,
                              source=layout.KEY_HTML.format(task=task)))
    union = {n for key in keys.values() for n in key.loc[key["component"] == "head", "node"]}
    n_total = subs[0]["n"] if subs else 0
    return headline(CLAIM, subs, measure="share of heads key for at least one operator",
                    value=100 * len(union) / n_total if n_total else math.nan, unit="percent", n=n_total,
                    split="identification", source=layout.SHARED_FIGURE)


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the key components and the effects, per operator."""
    return score(t.keys, t.effects, cfg)
