"""Claim sft_speed: a precise-SFT step is faster than a full fine-tuning step (`claims.min_speedup`), each arm's
chosen run. A wall-clock timing: the generated docs leave its value out (`Claim.timing`)."""

from __future__ import annotations

import pandas as pd

from arithmech import layout
from arithmech.report.claims.common import Claim, Tables, claim_row, not_measured, read_study

CLAIM = Claim("sft_speed", "finetune", "A precise-SFT step is faster than a full fine-tuning step.",
              "\"naturally benefits from shorter training times\" (section 4.3); no time is given in the text "
              "available here", timing=True)


def score(study: pd.DataFrame | None, comp: pd.DataFrame | None, train_format: str | None, cfg: dict,
          not_run: str | None = None) -> list[dict]:
    """Full's mean step time over precise's, each arm's chosen run. `not_run`: why the study could not run."""
    s = read_study(study, comp, train_format, not_run)
    if isinstance(s, str):
        return not_measured(CLAIM, s)
    rule = (f"holds if full's mean step time / precise's >= {cfg['min_speedup']:g}; partly if > 1; "
            f"does not hold otherwise")
    chosen = study[study["run"] == "chosen"].set_index("arm")
    if lost := s.no_result(CLAIM, ("precise", "full"), rule):
        return lost
    if not ({"precise", "full"} <= set(chosen.index) and "mean_step_s" in chosen):
        return not_measured(CLAIM, "the study has no precise and full arms", rule=rule)
    ratio = float(chosen.loc["full", "mean_step_s"] / chosen.loc["precise", "mean_step_s"])
    verdict = "holds" if ratio >= cfg["min_speedup"] else "partly" if ratio > 1 else "does not hold"
    return [claim_row(CLAIM, measure="mean step time, full / precise (chosen runs)", value=ratio, unit="ratio",
                      n=int(chosen.loc["precise", "steps"]), split="training steps", verdict=verdict, rule=rule,
                      source=layout.STUDY_MD,
                      note=(f"full {chosen.loc['full', 'mean_step_s']:.3f} s, precise "
                            f"{chosen.loc['precise', 'mean_step_s']:.3f} s per step; "
                            f"{int(chosen.loc['precise', 'trainable_params']):,} against "
                            f"{int(chosen.loc['full', 'trainable_params']):,} trained parameters"))]


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the precise-SFT study's tables."""
    return score(t.study, t.comparisons, t.train_format, cfg, not_run=t.study_not_run)
