"""Claim sft_vs_random: precise SFT of the key heads beats fine-tuning as many layer-matched random heads on the
trained format's exact match (`claims.min_difference`), read only where precise SFT learns."""

from __future__ import annotations

import pandas as pd

from arithmech import layout
from arithmech.report.claims.common import (
    LEARN_RULE,
    Claim,
    Tables,
    comparison,
    directional,
    directional_rule,
    not_measured,
    read_study,
    study_row,
)

CLAIM = Claim("sft_vs_random", "finetune", "Precise SFT of the key heads beats fine-tuning as many other heads.",
              "no such control in the paper (added here: as many heads in the same layers)")


def score(study: pd.DataFrame | None, comp: pd.DataFrame | None, train_format: str | None, cfg: dict,
          not_run: str | None = None) -> list[dict]:
    """(precise - random_heads) exact match on the trained format's test items. `not_run`: why the study could
    not run."""
    s = read_study(study, comp, train_format, not_run)
    if isinstance(s, str):
        return not_measured(CLAIM, s)
    min_diff = cfg["min_difference"]
    row = comparison(comp, "precise", "random_heads", "accuracy")
    rule = directional_rule("(precise - layer-matched random heads) exact match", +1,
                            f"{100 * min_diff:g} points") + LEARN_RULE
    if lost := s.no_result(CLAIM, ("precise", "random_heads"), rule):
        return lost
    if row is None:
        return not_measured(CLAIM, "the study has no precise and random_heads arms", rule=rule)
    verdict = s.needs_learning(directional(row["ci_low"], row["ci_high"], direction=+1, min_effect=min_diff))
    out = study_row(CLAIM, row, verdict, rule, s.split, layout.STUDY_MD,
                    "exact match, precise - layer-matched random heads")
    out["note"] += "; " + "; ".join([s.learn_note, *s.arm_notes("precise", "random_heads")])
    return [out]


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the precise-SFT study's tables."""
    return score(t.study, t.comparisons, t.train_format, cfg, not_run=t.study_not_run)
