"""The claims of the scorecard, in its order: every reader of the list of claims (the claims table, `make docs`)
reads it here. A claim is a module of this package with its record `CLAIM` and its entry `rows(tables, cfg, seed)`
(the claim's rows, headline first, from `common.Tables`): adding one is its module, its test and its line in
MODULES. Torch-free.

Every verdict is decided by a rule written in its row, thresholds from the config's `claims` section; nothing is
re-run (common.py: the verdicts and how they are decided)."""

from __future__ import annotations

import pandas as pd

from arithmech.report.claims import (
    circuit_faithful,
    circuit_sufficient,
    few_key_heads,
    heads_via_mlps,
    key_attention,
    knockout_collapse,
    middle_layers,
    mlp_answer,
    mlp_late,
    sft_circuit_vs_precise,
    sft_off_target,
    sft_speed,
    sft_vs_full,
    sft_vs_random,
    transfer,
)
from arithmech.report.claims.common import COLUMNS, VERDICTS, Claim, Tables

MODULES = (few_key_heads, middle_layers, mlp_late, knockout_collapse, key_attention, mlp_answer, circuit_sufficient,
           heads_via_mlps, circuit_faithful, transfer, sft_vs_full, sft_vs_random, sft_circuit_vs_precise,
           sft_off_target, sft_speed)


def claims() -> dict[str, Claim]:
    """Every claim's record by id, in the scorecard's order."""
    return {m.CLAIM.id: m.CLAIM for m in MODULES}


def scorecard(tables: Tables, cfg: dict, seed: int) -> pd.DataFrame:
    """Every claim's rows (headline first), in the order of MODULES, with the columns COLUMNS."""
    rows = []
    for module in MODULES:
        mine = module.rows(tables, cfg, seed)
        if strays := sorted({r["claim"] for r in mine} - {module.CLAIM.id}):
            raise ValueError(f"the claim {module.CLAIM.id!r} wrote rows of {strays}")
        rows += mine
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["n"] = table["n"].astype("Int64")
    unknown = set(table["verdict"]) - set(VERDICTS)
    if unknown:
        raise ValueError(f"unknown verdicts {sorted(unknown)}")
    return table
