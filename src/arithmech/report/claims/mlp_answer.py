"""Claim mlp_answer: the key MLPs' outputs carry the answer more than the operands (cosine with the unembedding,
`claims.min_cosine`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from arithmech import layout, stats
from arithmech.report.claims.common import Claim, Tables, claim_row, directional, directional_rule, headline

CLAIM = Claim("mlp_answer", "analyze", "The MLPs' outputs carry the answer more than the operands.",
              "\"the subsequent MLPs gradually deduce the correct answers\" (introduction)")


def score(probes: dict[str, pd.DataFrame], keys: dict[str, pd.DataFrame], cfg: dict) -> list[dict]:
    """Per operator, at its key MLPs (the paper's vector definitions, items whose answer token is neither operand's
    when there are any): cosine of the MLP output with the answer's unembedding minus the larger of the operands',
    averaged over the key MLPs; interval from the per-target standard errors (unpaired, so conservative)."""
    min_cos = cfg["min_cosine"]
    rule = directional_rule("cos(output, answer) - max(cos(output, operand))", +1, f"{min_cos:g}")
    z = stats.normal_quantile(cfg["confidence"])
    subs = []
    for task, table in probes.items():
        key = keys[task]
        layers = [int(l) for l in key.loc[key["component"] == "mlp", "layer"]]
        if not layers:
            subs.append(claim_row(CLAIM, task, rule=rule, note="no key MLP"))
            continue
        part = table[(table["variant"] == "paper") & (table["vector"] == "output") & table["layer"].isin(layers)]
        subset = "answer_distinct" if (part["subset"] == "answer_distinct").any() else "all"
        part = part[part["subset"] == subset].set_index(["layer", "target"])
        diffs, variances = [], []
        for l in layers:
            operand = max(("a", "b"), key=lambda t: part.loc[(l, t), "mean"])
            c, o = part.loc[(l, "c")], part.loc[(l, operand)]
            diffs.append(c["mean"] - o["mean"])
            variances.append(c["std"] ** 2 / c["n"] + o["std"] ** 2 / o["n"])
        value = float(np.mean(diffs))
        half = z * math.sqrt(sum(variances)) / len(layers)
        lo, hi = value - half, value + half
        verdict = directional(lo, hi, direction=+1, min_effect=min_cos)
        subs.append(claim_row(CLAIM, task, measure="cos(MLP output, answer) - cos(MLP output, nearer operand)",
                              value=value, ci_low=lo, ci_high=hi, unit="cosine", n=int(part["n"].iloc[0]),
                              split="validation", verdict=verdict, rule=rule,
                              note=f"key MLPs {', '.join(f'L{l}' for l in layers)}; items: {subset}",
                              source=layout.PROBES_FIGURE.format(task=task)))
    return headline(CLAIM, subs, measure="per operator, below", split="validation")


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the analysis rule's MLP probes
    and the key components, per operator."""
    return score(t.probes, t.keys, cfg)
