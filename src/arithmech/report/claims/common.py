"""What the claims share (arithmech.report.claims: one module per claim, `registry` lists them): the claim record,
the tables they read, the verdict rules several claims use (directional tests, non-inferiority, combining sub-rows,
degenerate comparisons), the rows they write, the teacher-forced circuit verdict of circuit_sufficient and
circuit_faithful with its thresholds, and the precise-SFT study as the fine-tuning claims read it. Torch-free.

Verdicts: `holds`, `partly`, `does not hold`, `inconclusive` (the interval includes 0 and also a difference that
would matter: too little power; the row gives the difference the test could detect; or a failed sanity check of the
ablation the row reads, named) and `not measured` (the data is absent: the study did not run, the rule selected no
head, ...; or a paired comparison's arms answered every item alike, `IDENTICAL`; the row says why). A claim never
says `does not hold` from an underpowered test: that takes an interval on the wrong side of 0, or one that excludes
every difference that would matter (`claims.min_difference`, `claims.min_cosine`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from arithmech import layout, stats
from arithmech.report import display

VERDICTS = ("holds", "partly", "does not hold", "inconclusive", "not measured")
COLUMNS = ["claim", "scope", "stage", "statement", "paper", "measure", "value", "ci_low", "ci_high", "unit", "n",
           "split", "verdict", "rule", "note", "source"]
# z(0.975) + z(0.8) over z(0.975): the true difference a two-sided 95% test detects with 80% power is about
# 1.43 interval half-widths (z(0.8) is the two-sided 60% quantile).
DETECTABLE_PER_HALF_WIDTH = (stats.normal_quantile(0.95) + stats.normal_quantile(0.60)) / stats.normal_quantile(0.95)


@dataclass(frozen=True)
class Claim:
    """One claim of the paper: where it is tested, what the paper says, and its number for LLaMA2-7B. `timing`: a
    claim measured in wall-clock time, whose value differs between runs and machines (the generated docs leave it
    out, so that a re-run reproduces the docs byte for byte)."""

    id: str
    stage: str
    statement: str
    paper: str
    timing: bool = False


@dataclass(frozen=True)
class Tables:
    """The stages' tables the claims read (`stages.claims.run_claims` reads them from the files; nothing is re-run).
    Per operator unless said: `keys` and `effects` (identify), `knockout_items` (validate, None: no table; item_key
    and cluster unique across operators, `knockout_collapse.read_knockout_items`), `transfer_items` (one table),
    `roles_all` and `probes` (analyze); the study's `study` and `comparisons` (None: it is off), its `train_format`
    and why it could not run (`study_not_run`); `edge_paths` (the edges rule's path cuts), `discover` (the discover
    rule's summary, None: it did not run) and `discover_items` (its per-item tables)."""

    keys: dict[str, pd.DataFrame]
    effects: dict[str, pd.DataFrame]
    knockout_items: dict[str, pd.DataFrame | None]
    transfer_items: pd.DataFrame | None
    roles_all: dict[str, pd.DataFrame]
    probes: dict[str, pd.DataFrame]
    study: pd.DataFrame | None = None
    comparisons: pd.DataFrame | None = None
    train_format: str | None = None
    study_not_run: str | None = None
    edge_paths: dict[str, pd.DataFrame | None] = field(default_factory=dict)
    discover: pd.DataFrame | None = None
    discover_items: dict[str, pd.DataFrame | None] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ verdict rules
def detectable(ci_low: float, ci_high: float) -> float:
    """The true difference a test with this interval detects with 80% power (two-sided, 95%)."""
    return DETECTABLE_PER_HALF_WIDTH * (ci_high - ci_low) / 2


IDENTICAL = "not measured: the arms answered identically (a zero-width interval at 0 has no power to speak of)"


def degenerate(ci_low: float, ci_high: float) -> bool:
    """Whether a paired comparison's interval has zero width at 0: the arms gave the same answer on every item,
    so every resample gives 0 and the interval understates what a difference of a few items could be. Such a
    comparison measured nothing: never a power statement, never a verdict."""
    return abs(float(ci_low)) <= 1e-12 and abs(float(ci_high)) <= 1e-12


def directional(ci_low: float, ci_high: float, *, direction: int, min_effect: float) -> str:
    """Verdict of "the difference has the sign `direction` (+1 or -1)" from its interval: holds when the interval
    excludes 0 on that side; does not hold when it excludes 0 on the other side, or lies inside +-min_effect (no
    difference that matters); inconclusive otherwise (it includes 0 and reaches a difference that matters); not
    measured when the interval is missing or `degenerate`."""
    if any(map(math.isnan, (ci_low, ci_high))) or degenerate(ci_low, ci_high):
        return "not measured"
    low, high = sorted((direction * ci_low, direction * ci_high))
    if low > 0:
        return "holds"
    if high < 0 or (-min_effect < low and high < min_effect):
        return "does not hold"
    return "inconclusive"


def directional_rule(name: str, direction: int, min_effect: str) -> str:
    side = "above" if direction > 0 else "below"
    return (f"holds if the 95% interval of {name} lies {side} 0; does not hold if it lies on the other side of 0 "
            f"or inside +-{min_effect}; inconclusive otherwise")


def combine(verdicts: list[str]) -> str:
    """A headline verdict from its sub-rows' verdicts: all measured ones hold -> holds; none holds and at least
    one does not hold -> does not hold; none measured -> not measured; only inconclusive (and unmeasured) ->
    inconclusive; anything else -> partly."""
    measured = [v for v in verdicts if v != "not measured"]
    if not measured:
        return "not measured"
    if all(v == "holds" for v in measured):
        return "holds"
    if all(v == "inconclusive" for v in measured):
        return "inconclusive"
    if "holds" not in measured and "partly" not in measured and "does not hold" in measured:
        return "does not hold"
    return "partly"


COMBINE_RULE = ("headline: holds if every measured sub-row holds, does not hold if none holds or partly holds "
                "and one does not hold, inconclusive if all are inconclusive, else partly")


# ------------------------------------------------------------------------------------------------ rows
def claim_row(claim: Claim, scope: str = "all", **fields) -> dict:
    """One row of the claims table (COLUMNS) for `claim`: not measured unless `fields` say otherwise."""
    row = {"claim": claim.id, "scope": scope, "stage": claim.stage, "statement": claim.statement,
           "paper": claim.paper, "measure": "", "value": math.nan, "ci_low": math.nan, "ci_high": math.nan,
           "unit": "", "n": None, "split": "", "verdict": "not measured", "rule": "", "note": "", "source": ""}
    return row | fields


def headline(claim: Claim, subs: list[dict], **fields) -> list[dict]:
    """The claim's headline row (verdict combined from `subs`) followed by the sub-rows."""
    verdict = combine([s["verdict"] for s in subs])
    fields.setdefault("rule", COMBINE_RULE)
    counts = pd.Series([s["verdict"] for s in subs]).value_counts()
    summary = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if v in counts)
    fields["note"] = "; ".join(x for x in (fields.get("note", ""), f"sub-rows: {summary}" if subs else "") if x)
    return [claim_row(claim, verdict=verdict, **fields), *subs]


def not_measured(claim: Claim, why: str, **fields) -> list[dict]:
    return [claim_row(claim, note=why, **fields)]


def interval_note(low: float, high: float, verdict: str, unit_scale: float = 100, unit: str = " points") -> str:
    """What an interval says beyond its verdict: IDENTICAL for a `degenerate` one; for an inconclusive one, the
    difference the test detects with 80% power; else nothing."""
    if not any(map(math.isnan, (low, high))) and degenerate(low, high):
        return IDENTICAL
    if verdict != "inconclusive":
        return ""  # two significant digits, like the interval's width it is computed from
    size = display.significant(unit_scale * detectable(low, high), 2)
    return f"too little power: detects about {size}{unit} with 80% power"


def in_percent(value, low, high, sign: bool = False, unit: str = "%") -> str:
    """A fraction and its resampled interval in percent, "-12% [-17, -6]" (`unit` after the value), at the
    interval's precision (display.estimate): digits that differ between CPUs are not printed."""
    return (display.estimate(value, low, high, scale=100, sign=sign, suffix=unit) + " "
            + display.bounds(low, high, scale=100, sign=sign)).strip()


def paired(items: pd.DataFrame, a: pd.Series, b: pd.Series, cfg: dict, seed: int) -> dict:
    """Paired cluster bootstrap of mean(a) - mean(b) over the same items (index-aligned), clusters = items.cluster."""
    joined = pd.concat({"a": a, "b": b}, axis=1).dropna().join(items["cluster"])
    return stats.paired_cluster_bootstrap(joined["a"].to_numpy(float), joined["b"].to_numpy(float),
                                          joined["cluster"].to_numpy(), n_boot=cfg["bootstrap"], seed=seed,
                                          confidence=cfg["confidence"])


def non_inferior(row: pd.Series, margin: float) -> str:
    """Holds if the interval of the difference lies above -margin, does not hold if it lies below 0, not measured
    if it is `degenerate`, else inconclusive."""
    if degenerate(row["ci_low"], row["ci_high"]):
        return "not measured"
    if row["ci_low"] > -margin:
        return "holds"
    return "does not hold" if row["ci_high"] < 0 else "inconclusive"


# ------------------------------------------------------------------------------------------ teacher-forced circuits
DISCOVER_OFF = f"the discover rule did not run (no {layout.DISCOVER_SUMMARY})"


# The teacher-forced verdict (docs/claims.md), fixed before the numbers: enough validation pairs for an interval of
# a few points, the paper-scale circuit share, 80% of the full model's teacher-forced full answers kept (lower end of
# the interval), the answer's log-probability kept within +-20% (overshoot is not free), and a margin over random
# circuits of its size that a random circuit of SmolLM2's size never reaches (0.3), under both ablations.
TF_MIN_PAIRS = 96
TF_LOGPROB_BAND = (0.8, 1.2)
TF_MIN_OVER_RANDOM = 0.3
TF_FAITHFUL_COLUMNS = ("correct", "logprob", "random_diff")


def failed_checks(r, kinds) -> dict[str, str]:
    """Per ablation of `kinds` whose teacher-forced sanity check failed, the failed checks' messages (each names its
    check): from a summary row's tf_<kind>_sanity_failed, or a discover per-item table's sanity_<kind>_failed (the
    same value on every row; None: no table). A failed check of an ablation makes every row read from it
    inconclusive (`SANITY_RULE`)."""
    out = {}
    for k in kinds:
        if isinstance(r, pd.DataFrame):
            column = r.get(f"sanity_{k}_failed")
            failed = column.dropna().iloc[0] if column is not None and column.notna().any() else None
        else:
            failed = None if r is None else r.get(f"tf_{k}_sanity_failed")
        if not display.missing(failed) and str(failed):
            out[k] = str(failed)
    return out


SANITY_RULE = "a failed sanity check of either ablation (circuit.discover.sanity: warn) makes the row inconclusive"


def sanity_note(failed: dict[str, str]) -> str:
    """The first words of a row that a failed sanity check made inconclusive, naming the ablation and the check."""
    return "inconclusive: " + "; ".join(f"the {k} ablation failed a sanity check, so its numbers cannot decide "
                                        f"({msg})" for k, msg in failed.items())


def sanity_headline(failed_by_scope: dict[str, dict[str, str]]) -> str:
    """A claim's headline note naming the sub-rows a failed sanity check made inconclusive ('' when none)."""
    kinds = {k: [scope for scope, failed in failed_by_scope.items() if k in failed]
             for k in dict.fromkeys(k for failed in failed_by_scope.values() for k in failed)}
    return "; ".join(f"the {k} ablation failed a sanity check on {', '.join(scopes)}: those rows are inconclusive"
                     for k, scopes in kinds.items())


def fit_gaps(r: pd.Series, kinds, cfg: dict) -> dict[str, str]:
    """Per ablation whose circuit fits its identification pairs more than `claims.max_fit_gap` better than the
    validation pairs (the discover summary's tf_<kind>_gap, identification minus validation full-answer
    faithfulness; a summary without it: none), the note saying so."""
    out = {}
    for k in kinds:
        gap = r.get(f"tf_{k}_gap")
        if not display.missing(gap) and float(gap) > cfg["max_fit_gap"]:
            out[k] = (f"{k}: fitted {100 * r[f'tf_{k}_correct_identification']:.0f}% on identification, "
                      f"{100 * r[f'tf_{k}_correct']:.0f}% on validation: gap {100 * float(gap):.0f} points above "
                      f"{100 * cfg['max_fit_gap']:g}: the circuit is fitted to its pruning pairs")
    return out


def tf_faithful_verdict(r: pd.Series, kind: str, cfg: dict) -> str:
    """One ablation's verdict on one summary row (`circuit_faithful.tf_faithful_rule`), the pair count and size aside:
    inconclusive where its sanity check failed or its circuit fits the identification pairs more than
    `max_fit_gap` better than the validation pairs (`fit_gaps`)."""
    col = f"tf_{kind}_"
    if any(math.isnan(float(r[col + c])) for c in TF_FAITHFUL_COLUMNS):
        return "not measured"
    if failed_checks(r, [kind]) or fit_gaps(r, [kind], cfg):
        return "inconclusive"  # this ablation's numbers cannot decide
    enough = ("holds" if r[col + "correct_low"] >= cfg["faithful"] else
              "does not hold" if r[col + "correct_high"] < cfg["faithful"] else "inconclusive")
    low, high = TF_LOGPROB_BAND
    kept = "holds" if low <= r[col + "logprob"] <= high else "does not hold"
    if degenerate(r[col + "random_diff_low"], r[col + "random_diff_high"]):
        better = "inconclusive"  # the circuit and its random circuits answered identically: nothing compared
    else:
        better = ("holds" if r[col + "random_diff"] >= TF_MIN_OVER_RANDOM and r[col + "random_diff_low"] > 0 else
                  "does not hold" if r[col + "random_diff_high"] < TF_MIN_OVER_RANDOM else "inconclusive")
    parts = (enough, kept, better)
    if "does not hold" in parts:
        return "does not hold"
    return "holds" if all(p == "holds" for p in parts) else "inconclusive"


def tf_kind_notes(r: pd.Series, per_kind: dict[str, str], compared: str) -> list[str]:
    """Per ablation, the note's part of a teacher-forced row (the circuit_faithful and circuit_sufficient rows):
    its verdict, full-answer and log-probability faithfulness and (`compared` - random)."""
    out = []
    for k, verdict in per_kind.items():
        def est(name: str, **kw) -> str:
            c = f"tf_{k}_{name}"
            return in_percent(r[c], r[c + "_low"], r[c + "_high"], **kw)

        against = (IDENTICAL if degenerate(r[f"tf_{k}_random_diff_low"], r[f"tf_{k}_random_diff_high"])
                   else est("random_diff", sign=True, unit="") + " points")
        out.append(f"{k}: {verdict}; full answers {est('correct')}, log-probability {est('logprob')}, "
                   f"{compared} - random {against}")
    return out


# ------------------------------------------------------------------------------------------------ the study
STUDY_OFF = "the precise-SFT study did not run (study.arms is empty)"


def comparison(comp: pd.DataFrame, a: str, b: str, metric: str) -> pd.Series | None:
    rows = comp[(comp["arm_a"] == a) & (comp["arm_b"] == b) & (comp["metric"] == metric)]
    return rows.iloc[0] if len(rows) else None


def precision_note(study: pd.DataFrame, arms: tuple[str, ...]) -> str:
    """Which precision each arm's chosen run trained in (study.parquet's model_dtype, master_dtype): a bf16
    weight updated in bf16 loses small updates, so arms compare fairly only if their optimizers update the same
    dtype."""
    chosen = study[study["run"] == "chosen"].set_index("arm")
    if not {"model_dtype", "master_dtype"} <= set(chosen.columns):
        return "training precision not recorded"
    present = [arm for arm in arms if arm in chosen.index]
    note = "trained in (model / optimizer): " + ", ".join(
        f"{arm} {chosen.loc[arm, 'model_dtype'] or '?'} / {chosen.loc[arm, 'master_dtype'] or '?'}" for arm in present)
    if len({chosen.loc[arm, "master_dtype"] for arm in present}) > 1:
        note += " (the optimizers updated different dtypes: not a like-for-like comparison)"
    return note


def _p(p: float) -> str:
    """'= 0.042' or '< 0.001' (display.p_value), to follow a 'p'."""
    text = display.p_value(p)
    return text if text.startswith("<") else f"= {text}"


def study_row(claim: Claim, row: pd.Series, verdict: str, rule: str, split: str, source: str, measure: str,
              scope: str = "all", scale: float = 100, unit: str = "points") -> dict:
    note = f"p {_p(row['p_value'])} ({row['test']}), Holm-adjusted p {_p(row['p_holm'])}"
    extra = interval_note(row["ci_low"], row["ci_high"], verdict, scale, "" if unit == "nats" else " points")
    if extra:
        note = f"{extra}; {note}" if extra == IDENTICAL else f"{note}; {extra}"
    return claim_row(claim, scope, measure=measure, value=scale * row["difference"], ci_low=scale * row["ci_low"],
                     ci_high=scale * row["ci_high"], unit=unit, n=int(row["n_items"]), split=split, verdict=verdict,
                     rule=rule, note=note, source=source)


LEARN_RULE = "; inconclusive unless precise's chosen run beats the base model on the trained format"


def precise_full_rule(margin: float) -> str:
    """The non-inferiority rule of a (precise - full) comparison (`non_inferior`), learning asked for."""
    return (f"holds if the 95% interval of (precise - full) exact match lies above -{100 * margin:g} points "
            f"(non-inferior); does not hold if it lies below 0; inconclusive otherwise" + LEARN_RULE)


@dataclass(frozen=True)
class Study:
    """The precise-SFT study as the fine-tuning claims read it (`read_study`): its tables, the test split's name,
    each arm's lr choice (study.parquet's lr_note and measured, `sft.design.select_lr`: an arm whose every lr
    collapsed has no result, and every row that reads an arm carries its grid's flags, an edge or collapsed lrs),
    and the study's first positive control: whether precise SFT learns (its chosen run beats the base model on the
    trained format); without it no exact-match comparison of precise with another arm is read as holding or not."""

    study: pd.DataFrame
    comp: pd.DataFrame
    split: str
    lr_notes: dict[str, str]
    collapsed: list[str]
    learned: bool
    learn_note: str

    def arm_notes(self, *arms: str) -> list[str]:
        return [f"{a}: {self.lr_notes[a]}" for a in arms if self.lr_notes.get(a)]

    def no_result(self, claim: Claim, arms: tuple[str, ...], rule: str | None = None) -> list[dict]:
        """The claim's not-measured row naming the arms of `arms` whose every lr collapsed ([] when none did)."""
        lost = [a for a in arms if a in self.collapsed]
        return not_measured(claim, "; ".join(self.arm_notes(*lost)), **({"rule": rule} if rule else {})) if lost else []

    def needs_learning(self, verdict: str) -> str:
        return verdict if self.learned else "inconclusive"


def read_study(study: pd.DataFrame | None, comp: pd.DataFrame | None, train_format: str | None,
               not_run: str | None = None) -> Study | str:
    """The study (study.parquet, comparisons.parquet) as the fine-tuning claims read it, or why it has nothing to
    read. `not_run`: why the study could not run (its summary's tables are empty)."""
    if study is None or comp is None:
        return STUDY_OFF
    if not_run is not None or study.empty:
        return not_run or "the precise-SFT study scored no model"
    picked = study[study["run"] == "chosen"].set_index("arm")
    lr_notes = picked["lr_note"].fillna("").to_dict() if "lr_note" in picked else {}
    collapsed = [a for a in picked.index if "measured" in picked and not bool(picked.loc[a, "measured"])]
    learns = comparison(comp, "precise", "base", "accuracy")
    learned = learns is not None and bool(learns["ci_low"] > 0)
    learn_note = ("whether precise learns is unknown: the study has no precise - base comparison" if learns is None else
                  f"precise {'learns' if learned else 'does not beat the base model (the arms may not learn)'}: "
                  f"precise - base {100 * learns['difference']:+.1f} points [{100 * learns['ci_low']:+.1f}, "
                  f"{100 * learns['ci_high']:+.1f}] on the trained format")
    return Study(study, comp, f"test ({train_format})", lr_notes, collapsed, learned, learn_note)
