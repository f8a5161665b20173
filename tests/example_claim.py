"""A claim module as one is added to arithmech.report.claims (its record, its rule's text, its verdict `score`
and the registry's entry `rows`), for the test that registers it and finds it in the scorecard and on the findings
page (tests/report/claims/test_registry.py). Its claim is made up: how many operators have a key head."""

from __future__ import annotations

import pandas as pd

from arithmech.report.claims.common import Claim, Tables, claim_row

CLAIM = Claim("example_claim", "identify", "Every operator has a key head (an example claim).",
              "a made-up example, not the paper's")
RULE = "holds if every operator's key-head rule selected a head, else does not hold"


def score(keys: dict[str, pd.DataFrame]) -> list[dict]:
    with_head = [task for task, key in keys.items() if (key["component"] == "head").any()]
    verdict = "holds" if len(with_head) == len(keys) else "does not hold"
    return [claim_row(CLAIM, measure="operators with a key head", value=len(with_head), unit="count", n=len(keys),
                      split="identification", verdict=verdict, rule=RULE, note=", ".join(with_head))]


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    return score(t.keys)
