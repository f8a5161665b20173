"""Claim sft_off_target: precise SFT costs less off target than full fine-tuning: a lower KL to the base model on
WikiText-2, and BIG-bench accuracy no worse than full's by more than `claims.non_inferiority`."""

from __future__ import annotations

import pandas as pd

from arithmech import layout
from arithmech.report.claims.common import (
    Claim,
    Tables,
    comparison,
    directional,
    directional_rule,
    headline,
    non_inferior,
    not_measured,
    precise_full_rule,
    read_study,
    study_row,
)

CLAIM = Claim("sft_off_target", "finetune", "Precise SFT costs less off target than full fine-tuning.",
              "\"much less impact on non-mathematical tasks\" (introduction); Table 1: not available here")
OFF_TARGET_METRICS = ("social_iqa", "strategyqa", "qa_wikidata")


def score(study: pd.DataFrame | None, comp: pd.DataFrame | None, train_format: str | None, cfg: dict,
          not_run: str | None = None) -> list[dict]:
    """Per measure, precise - full: KL to the base model per token (lower), each BIG-bench set's accuracy
    (non-inferior). `not_run`: why the study could not run."""
    s = read_study(study, comp, train_format, not_run)
    if isinstance(s, str):
        return not_measured(CLAIM, s)
    margin, source = cfg["non_inferiority"], layout.STUDY_MD
    subs = []
    kl = comparison(comp, "precise", "full", "kl_to_base")
    if kl is not None:
        verdict = directional(kl["ci_low"], kl["ci_high"], direction=-1, min_effect=0.0)
        subs.append(study_row(CLAIM, kl, verdict, directional_rule("(precise - full) KL to base", -1, "0"),
                              "WikiText-2 windows", source, "KL(base || model) per token, precise - full",
                              scope="KL to base", scale=1, unit="nats"))
    for metric in OFF_TARGET_METRICS:
        row = comparison(comp, "precise", "full", metric)
        if row is not None:
            subs.append(study_row(CLAIM, row, non_inferior(row, margin), precise_full_rule(margin),
                                  "BIG-bench items", source, f"{metric} accuracy, precise - full", scope=metric))
    for sub in subs:
        sub["note"] = "; ".join(filter(None, [sub["note"], *s.arm_notes("precise", "full")]))
    return s.no_result(CLAIM, ("precise", "full")) or headline(CLAIM, subs, measure="per measure, below",
                                                               source=source)


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the precise-SFT study's tables."""
    return score(t.study, t.comparisons, t.train_format, cfg, not_run=t.study_not_run)
