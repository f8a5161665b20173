"""Claim mlp_late: the MLPs before the first key head have almost no effect, later ones large effects
(`claims.mlp_ratio`)."""

from __future__ import annotations

import math

import pandas as pd

from arithmech import layout
from arithmech.interp.nodes import node_label
from arithmech.report import display
from arithmech.report.claims.common import Claim, Tables, claim_row, headline, in_percent

CLAIM = Claim("mlp_late", "identify", "MLPs before the key heads have almost no effect; later MLPs have large effects.",
              "MLPs 0-16 about +-0.0%, from the 17th layer about +-10.0% (section 5.1)")


def score(keys: dict[str, pd.DataFrame], effects: dict[str, pd.DataFrame], cfg: dict) -> list[dict]:
    ratio_needed = cfg["mlp_ratio"]
    rule = (f"split at the first key head's layer; ratio = |strongest later MLP effect| / |strongest earlier one|; "
            f"holds if ratio >= {ratio_needed:g} and the later MLP's interval lies below 0, partly if ratio > 1, "
            f"else does not hold")
    subs = []
    for task, key in keys.items():
        heads = key[key["component"] == "head"]
        if not len(heads):
            subs.append(claim_row(CLAIM, task, rule=rule, note="no key head to split the layers at"))
            continue
        first = int(heads["layer"].min())
        mlps = effects[task][effects[task]["component"] == "mlp"]
        early, late = mlps[mlps["layer"] < first], mlps[mlps["layer"] >= first]
        if not len(early) or not len(late):
            subs.append(claim_row(CLAIM, task, rule=rule, note=f"the first key head is in layer {first}: "
                                                                   "no MLP on one side"))
            continue
        strongest = late.loc[late["mean_effect"].idxmin()]
        early_max = float(early["mean_effect"].abs().max())
        earliest = early.loc[early["mean_effect"].abs().idxmax()]
        early_at = int(earliest["layer"])
        ratio = abs(float(strongest["mean_effect"])) / early_max if early_max > 0 else math.inf
        significant = float(strongest["ci_high"]) < 0
        verdict = ("holds" if ratio >= ratio_needed and significant else "partly" if ratio > 1 else "does not hold")
        subs.append(claim_row(
            CLAIM, task, measure="|strongest later MLP effect| / |strongest earlier MLP effect|", value=ratio,
            unit="ratio", n=int(strongest["n"]), split="identification", verdict=verdict, rule=rule,
            source=layout.EFFECTS_FIGURE.format(task=task),
            note=(f"later: {node_label(strongest['layer'])} "
                  f"{in_percent(strongest['mean_effect'], strongest['ci_low'], strongest['ci_high'])}; earlier: "
                  f"{node_label(early_at)} "
                  f"{display.estimate(early_max, earliest['ci_low'], earliest['ci_high'], scale=100)}% "
                  f"in size (first key head in layer {first})")))
    return headline(CLAIM, subs, measure="per operator, below", split="identification")


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the key heads and the MLPs' effects, per operator."""
    return score(t.keys, t.effects, cfg)
