"""Claim middle_layers: the key heads sit in the paper's middle band of relative depth (`claims.middle_band`,
`claims.middle_share`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from arithmech import layout
from arithmech.report.claims.common import Claim, Tables, claim_row, not_measured

CLAIM = Claim("middle_layers", "identify", "The key heads sit in the middle layers.",
              "from the 12th layer, mostly layers 12-17 (section 5.1)")


def depth(layer: int, n_layers: int) -> float:
    """Relative depth of a layer: 0 the first, 1 the last."""
    return layer / max(n_layers - 1, 1)


def score(keys: dict[str, pd.DataFrame], n_layers: int, cfg: dict) -> list[dict]:
    low, high = cfg["middle_band"]
    need = cfg["middle_share"]
    rule = (f"depth = layer / (layers - 1); holds if >= {100 * need:g}% of key heads lie at depth "
            f"{low:g}-{high:g}, partly if some do, does not hold if none does")

    def judge(layers: list[int]) -> tuple[str, dict]:
        depths = np.array([depth(l, n_layers) for l in layers])
        inside = float(np.mean((depths >= low) & (depths <= high)))
        verdict = "holds" if inside >= need else ("partly" if inside > 0 else "does not hold")
        return verdict, {"value": 100 * float(np.median(depths)), "unit": "percent", "n": len(layers),
                         "note": f"{100 * inside:.0f}% of key heads in the band; layers {min(layers)}-{max(layers)} "
                                 f"of {n_layers} (depth {depths.min():.2f}-{depths.max():.2f})"}

    subs = []
    for task, key in keys.items():
        layers = [int(l) for l in key.loc[key["component"] == "head", "layer"]]
        if not layers:
            subs.append(claim_row(CLAIM, task, note="the key-head rule selected no head", rule=rule))
            continue
        verdict, fields = judge(layers)
        subs.append(claim_row(CLAIM, task, measure="median relative depth of the key heads",
                              split="identification", verdict=verdict, rule=rule,
                              source=layout.EFFECTS_FIGURE.format(task=task), **fields))
    union = sorted({(int(l), int(h)) for key in keys.values()
                    for l, h in key.loc[key["component"] == "head", ["layer", "head"]].to_numpy()})
    if not union:
        return not_measured(CLAIM, "the key-head rule selected no head on any operator", rule=rule)
    verdict, fields = judge([l for l, _ in union])
    return [claim_row(CLAIM, measure="median relative depth of the key heads of any operator",
                      split="identification", verdict=verdict, rule=rule, source=layout.SHARED_FIGURE, **fields),
            *subs]


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the key heads and the
    model's depth (its layers, from the effects)."""
    return score(t.keys, int(max(int(e["layer"].max()) for e in t.effects.values())) + 1, cfg)
