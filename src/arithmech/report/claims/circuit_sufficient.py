"""Claim circuit_sufficient: the key heads and key MLPs suffice on the teacher-forced protocol: with every other
node ablated they keep most of the model's answers, more than layer-matched random circuits of their size
(the teacher-forced verdict of circuit_faithful, `common.tf_faithful_verdict`, without its size limit)."""

from __future__ import annotations

import pandas as pd

from arithmech import layout
from arithmech.interp import protocol
from arithmech.report.claims.common import (
    DISCOVER_OFF,
    SANITY_RULE,
    TF_LOGPROB_BAND,
    TF_MIN_OVER_RANDOM,
    TF_MIN_PAIRS,
    Claim,
    Tables,
    claim_row,
    failed_checks,
    headline,
    not_measured,
    sanity_headline,
    sanity_note,
    tf_faithful_verdict,
    tf_kind_notes,
)

CLAIM = Claim("circuit_sufficient", "discover",
              "The key heads and key MLPs suffice: with every other head and MLP ablated they keep most of the "
              "model's arithmetic, more than as many random heads in the same layers.",
              "the paper's hypothesis (heads find the operands, MLPs work out the answers); it tests necessity only "
              "(knockout)")


def score(teacher_forced: dict[str, pd.DataFrame | None], cfg: dict, seed: int) -> list[dict]:
    """Per operator, on the teacher-forced protocol: the key circuit (key heads + key MLPs) against the
    layer-matched random circuits of its size (`_tf_sufficient_row`), from `teacher_forced`: per operator the
    discover rule's per-item table, which scores the key circuit and its random draws, or None."""
    subs, failed_by_task = [], {}
    for task, items in teacher_forced.items():
        kinds = [k for k in protocol.KINDS if items is not None and f"tf_{k}_tail_correct" in items]
        if not kinds:
            subs.append(claim_row(CLAIM, task, rule=tf_sufficient_rule(cfg),
                                  note="no teacher-forced scores of the key circuit in the discover rule's items"))
            continue
        subs.append(_tf_sufficient_row(task, items, kinds, cfg, seed))
        failed_by_task[task] = failed_checks(items, kinds)
    return headline(CLAIM, subs, measure="per operator, below", split="validation",
                    note=sanity_headline(failed_by_task))


def tf_sufficient_rule(cfg: dict) -> str:
    return (f"teacher-forced (answer and terminator; nodes outside the key heads + key MLPs ablated at END and every "
            f"answer position): holds if, under both ablations, with at least {TF_MIN_PAIRS} validation pairs, the "
            f"lower end of the 95% interval of its full-answer faithfulness is at least {100 * cfg['faithful']:g}%, "
            f"its log-probability faithfulness lies in [{TF_LOGPROB_BAND[0]:g}, {TF_LOGPROB_BAND[1]:g}], and it keeps "
            f"at least {100 * TF_MIN_OVER_RANDOM:g} points more than layer-matched random circuits of its size "
            f"(interval above 0); does not hold if its faithfulness interval lies below {100 * cfg['faithful']:g}%, "
            f"its log-probability faithfulness lies outside the band, or (key - random) lies below "
            f"{100 * TF_MIN_OVER_RANDOM:g} points; inconclusive otherwise, with fewer pairs, or where the two "
            f"ablations disagree (the discovered circuit's rule, circuit_faithful, without its size limit); "
            f"{SANITY_RULE}")


def _tf_sufficient_row(task: str, items: pd.DataFrame, kinds: list[str], cfg: dict, seed: int) -> dict:
    """One operator's circuit_sufficient row on the teacher-forced protocol: the key circuit (key heads, key MLPs)
    against its layer-matched random circuits, per ablation (`tf_faithful_verdict` on the same columns as the
    discover summary's), from the discover rule's per-item table (`items`)."""
    from arithmech.interp.protocol import key_vs_random

    boot = {"n_boot": cfg["bootstrap"], "seed": seed, "confidence": cfg["confidence"]}
    r, n = {}, 0
    for k in kinds:
        res = {m: key_vs_random(items, mlps="key", column=f"tf_{k}_tail_{m}", **boot)
               for m in ("correct", "logprob")}
        if res["correct"] is None:
            return claim_row(CLAIM, task, rule=tf_sufficient_rule(cfg),
                             note="the key-head rule selected no head")
        for m, x in res.items():
            r |= {f"tf_{k}_{m}": x["key"], f"tf_{k}_{m}_low": x["key_low"], f"tf_{k}_{m}_high": x["key_high"]}
        c = res["correct"]
        r |= {f"tf_{k}_random_diff": c["difference"], f"tf_{k}_random_diff_low": c["ci_low"],
              f"tf_{k}_random_diff_high": c["ci_high"]}
        n = c["n_items"]
    failed = failed_checks(items, kinds)
    r = pd.Series(r | {f"tf_{k}_sanity_failed": msg for k, msg in failed.items()})
    per_kind = {k: tf_faithful_verdict(r, k, cfg) for k in kinds}
    verdict = "inconclusive" if len(set(per_kind.values())) > 1 else next(iter(per_kind.values()))
    # a failed check makes a measured row inconclusive; a row with nothing measured (e.g. a model that answers no
    # item right) stays "not measured", its note naming the check
    if (failed and verdict != "not measured") or (verdict == "holds" and (n < TF_MIN_PAIRS or len(kinds) < 2)):
        verdict = "inconclusive"
    note = [sanity_note(failed)] if failed else []
    note.append(f"{n} validation pairs" + (f", fewer than the {TF_MIN_PAIRS} the rule asks for" if n < TF_MIN_PAIRS
                                           else ""))
    note += tf_kind_notes(r, per_kind, "key")
    main = f"tf_{kinds[0]}_correct"  # as circuit_faithful's headline
    return claim_row(CLAIM, task,
                     measure=f"the key circuit's teacher-forced full-answer faithfulness ({kinds[0]} ablation)",
                     value=100 * r[main], ci_low=100 * r[main + "_low"], ci_high=100 * r[main + "_high"],
                     unit="percent", n=n, split="validation", verdict=verdict, rule=tf_sufficient_rule(cfg),
                     note="; ".join(note), source=layout.DISCOVER_ITEMS.format(task=task))


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the discover rule's per-item tables, per operator."""
    return score(t.discover_items, cfg, seed) if t.discover_items else not_measured(CLAIM, DISCOVER_OFF)
