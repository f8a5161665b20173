"""Claim sft_circuit_vs_precise: fine-tuning the discovered circuit's heads beats fine-tuning as many key heads on
the trained format's exact match (`claims.min_difference`), read only where precise SFT learns, and a "does not
hold" only where the study's positive control separates two head sets that should differ."""

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
    precision_note,
    read_study,
    study_row,
)

CLAIM = Claim("sft_circuit_vs_precise", "finetune",
              "Fine-tuning the faithful circuit's heads beats fine-tuning as many key heads.",
              "no such arm in the paper (added here: the discovered circuit's heads, as many as the key heads)")


def score(study: pd.DataFrame | None, comp: pd.DataFrame | None, train_format: str | None, cfg: dict,
          not_run: str | None = None) -> list[dict]:
    """(circuit - precise) exact match on the trained format's test items, the two arms at the same head count.
    `not_run`: why the study could not run."""
    s = read_study(study, comp, train_format, not_run)
    if isinstance(s, str):
        return not_measured(CLAIM, s)
    min_diff = cfg["min_difference"]
    row = comparison(comp, "circuit", "precise", "accuracy")
    rule = (directional_rule("(circuit - precise) exact match", +1, f"{100 * min_diff:g} points")
            + "; " + POSITIVE_CONTROL_RULE + LEARN_RULE)
    if lost := s.no_result(CLAIM, ("circuit", "precise"), rule):
        return lost
    if row is None:
        return not_measured(CLAIM, "the circuit arm did not run (study.arms has no circuit, or no precise)", rule=rule)
    verdict = directional(row["ci_low"], row["ci_high"], direction=+1, min_effect=min_diff)
    control, control_note = _positive_control(comp)
    if verdict == "does not hold" and not control:
        verdict = "inconclusive"  # an assay that separates no head sets cannot show these two do not differ
    out = study_row(CLAIM, row, s.needs_learning(verdict), rule, s.split, layout.STUDY_MD,
                    "exact match, circuit - precise (as many heads)")
    out["note"] += "; " + "; ".join([control_note, s.learn_note, *s.arm_notes("circuit", "precise"),
                                     *_head_set_notes(study, comp), precision_note(study, ("circuit", "precise"))])
    return [out]


POSITIVE_CONTROL_RULE = ("a \"does not hold\" stands only if the same study's positive control holds (the 95% "
                         "interval of (precise - low_effect) exact match, the key heads against as many of the "
                         "weakest heads in their layers, lies above 0); without it the row is inconclusive")


def _positive_control(comp: pd.DataFrame) -> tuple[bool, str]:
    """Whether the study separates two head sets that should differ, the key heads (precise) and the negative
    control (low_effect: as many of the weakest heads, in the same layers), with a note saying so."""
    row = comparison(comp, "precise", "low_effect", "accuracy")
    if row is None:
        return False, "no positive control: the study ran no low_effect arm (negative control) beside precise"
    passed = bool(row["ci_low"] > 0)
    return passed, (f"positive control {'passed' if passed else 'failed'}: precise - low_effect "
                    f"{100 * row['difference']:+.1f} points [{100 * row['ci_low']:+.1f}, {100 * row['ci_high']:+.1f}]")


def _head_set_notes(study: pd.DataFrame, comp: pd.DataFrame) -> list[str]:
    """How far the circuit arms' heads are from precise's (study.parquet's n_heads, overlap_precise,
    jaccard_precise of each arm's chosen run) and how the circuit's heads outside precise's (circuit_disjoint)
    compare with precise."""
    notes = []
    chosen = study[study["run"] == "chosen"].set_index("arm")
    for arm in ("circuit", "circuit_disjoint"):
        if arm in chosen.index and "overlap_precise" in chosen and not pd.isna(chosen.loc[arm, "overlap_precise"]):
            r = chosen.loc[arm]
            notes.append(f"{arm} shares {int(r['overlap_precise'])} of its {int(r['n_heads'])} heads with precise "
                         f"(Jaccard {r['jaccard_precise']:.2f})")
    row = comparison(comp, "circuit_disjoint", "precise", "accuracy")
    if row is not None:
        notes.append(f"circuit_disjoint - precise {100 * row['difference']:+.1f} points "
                     f"[{100 * row['ci_low']:+.1f}, {100 * row['ci_high']:+.1f}]")
    return notes


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the precise-SFT study's tables."""
    return score(t.study, t.comparisons, t.train_format, cfg, not_run=t.study_not_run)
