"""Claim sft_vs_full: precise SFT of the key heads matches or beats full fine-tuning on the trained format's exact
match (non-inferiority, `claims.non_inferiority`), read only where precise SFT learns."""

from __future__ import annotations

import pandas as pd

from arithmech import layout
from arithmech.report.claims.common import (
    Claim,
    Tables,
    comparison,
    non_inferior,
    not_measured,
    precise_full_rule,
    precision_note,
    read_study,
    study_row,
)

CLAIM = Claim("sft_vs_full", "finetune", "Precise SFT of the key heads matches or beats full fine-tuning on math.",
              "\"not only matches but can surpass\" full-model fine-tuning with \"as few as 32 attention heads\" of "
              "1024 (introduction); Table 1: not available here")


def score(study: pd.DataFrame | None, comp: pd.DataFrame | None, train_format: str | None, cfg: dict,
          not_run: str | None = None) -> list[dict]:
    """(precise - full) exact match on the trained format's test items. `not_run`: why the study could not run."""
    s = read_study(study, comp, train_format, not_run)
    if isinstance(s, str):
        return not_measured(CLAIM, s)
    margin = cfg["non_inferiority"]
    rule = precise_full_rule(margin)
    row = comparison(comp, "precise", "full", "accuracy")
    if lost := s.no_result(CLAIM, ("precise", "full"), rule):
        return lost
    if row is None:
        return not_measured(CLAIM, "the study has no precise and full arms", rule=rule)
    out = study_row(CLAIM, row, s.needs_learning(non_inferior(row, margin)), rule, s.split, layout.STUDY_MD,
                    "exact match, precise - full")
    out["note"] += "; " + "; ".join([s.learn_note, *s.arm_notes("precise", "full"),
                                     precision_note(study, ("precise", "full"))])
    return [out]


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the precise-SFT study's tables."""
    return score(t.study, t.comparisons, t.train_format, cfg, not_run=t.study_not_run)
