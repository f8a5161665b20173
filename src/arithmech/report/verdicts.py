"""The paper's claims, one verdict each on this model: read from the tables the stages write (nothing is re-run),
every verdict decided by a rule written in its row, thresholds from the config's `claims` section. Torch-free.

Verdicts: `holds`, `partly`, `does not hold`, `inconclusive` (the interval includes 0 and also a difference that
would matter: too little power; the row gives the difference the test could detect; or a failed sanity check of the
ablation the row reads, named) and `not measured` (the data is absent: the study did not run, the rule selected no
head, ...; or a paired comparison's arms answered every item alike, `IDENTICAL`; the row says why). A claim never
says `does not hold` from an underpowered test: that takes an interval on the wrong side of 0, or one that excludes
every difference that would matter (`claims.min_difference`, `claims.min_cosine`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from arithmech import layout, stats
from arithmech.data.arithmetic import FORMATS
from arithmech.interp import protocol
from arithmech.interp.nodes import node_label
from arithmech.report import display

VERDICTS = ("holds", "partly", "does not hold", "inconclusive", "not measured")
COLUMNS = ["claim", "scope", "stage", "statement", "paper", "measure", "value", "ci_low", "ci_high", "unit", "n",
           "split", "verdict", "rule", "note", "source"]
# z(0.975) + z(0.8) over z(0.975): the true difference a two-sided 95% test detects with 80% power is about
# 1.43 interval half-widths (z(0.8) is the two-sided 60% quantile).
DETECTABLE_PER_HALF_WIDTH = (stats.normal_quantile(0.95) + stats.normal_quantile(0.60)) / stats.normal_quantile(0.95)
MATH_TARGETS = ("operator", *FORMATS, "svamp")
# Claims measured in wall-clock time: their values differ between runs and machines (the generated docs leave
# them out, so that a re-run reproduces the docs byte for byte).
TIMING_CLAIMS = ("sft_speed",)
ANSWERS = {"full_correct": "full answer", "first_correct": "first token"}


@dataclass(frozen=True)
class Claim:
    """One claim of the paper: where it is tested, what the paper says, and its number for LLaMA2-7B."""

    id: str
    stage: str
    statement: str
    paper: str


CLAIMS = {c.id: c for c in (
    Claim("few_key_heads", "identify", "Fewer than 5% of the attention heads are key heads for arithmetic.",
          "< 5% of the attention heads (introduction); key heads: a logit change \"exceeding -5%\" (section 5.1)"),
    Claim("middle_layers", "identify", "The key heads sit in the middle layers.",
          "from the 12th layer, mostly layers 12-17 (section 5.1)"),
    Claim("mlp_late", "identify", "MLPs before the key heads have almost no effect; later MLPs have large effects.",
          "MLPs 0-16 about +-0.0%, from the 17th layer about +-10.0% (section 5.1)"),
    Claim("knockout_collapse", "validate",
          "Knocking out the key heads collapses accuracy; knocking out as many random heads does not.",
          "\"a decrease of around 70% in accuracy\" with the key heads/MLPs knocked out (introduction); the "
          "knockout figures: not available here"),
    Claim("key_attention", "analyze", "Key heads attend from END to the operands and the operator.",
          "\"These heads particularly attend to the operands and operators\" (introduction)"),
    Claim("mlp_answer", "analyze", "The MLPs' outputs carry the answer more than the operands.",
          "\"the subsequent MLPs gradually deduce the correct answers\" (introduction)"),
    Claim("circuit_sufficient", "discover",
          "The key heads and key MLPs suffice: with every other head and MLP ablated they keep most of the "
          "model's arithmetic, more than as many random heads in the same layers.",
          "the paper's hypothesis (heads find the operands, MLPs work out the answers); it tests necessity only "
          "(knockout)"),
    Claim("heads_via_mlps", "circuit",
          "The key heads act through the MLPs: their effect reaches the answer through later MLPs more than directly.",
          "the hypothesis that heads \"pinpoint arithmetic operands\", \"subsequently engaging MLPs to work out the "
          "answers\" (introduction); no path is measured"),
    Claim("circuit_faithful", "discover",
          "A small circuit is faithful: the fewest heads and MLPs found by pruning keep the model's answers on "
          "held-out pairs, better than random circuits of their size.",
          "no circuit is searched in the paper (added here); its key heads are \"less than 5% of heads\" "
          "(introduction)"),
    Claim("transfer", "validate",
          "The key heads transfer: knocking them out hurts other operators, formats and word problems, "
          "not a non-math task.",
          "\"the key heads/MLPs identified on one dataset are also effective for other datasets\" (introduction)"),
    Claim("sft_vs_full", "finetune", "Precise SFT of the key heads matches or beats full fine-tuning on math.",
          "\"not only matches but can surpass\" full-model fine-tuning with \"as few as 32 attention heads\" of 1024 "
          "(introduction); Table 1: not available here"),
    Claim("sft_vs_random", "finetune", "Precise SFT of the key heads beats fine-tuning as many other heads.",
          "no such control in the paper (added here: as many heads in the same layers)"),
    Claim("sft_circuit_vs_precise", "finetune",
          "Fine-tuning the faithful circuit's heads beats fine-tuning as many key heads.",
          "no such arm in the paper (added here: the discovered circuit's heads, as many as the key heads)"),
    Claim("sft_off_target", "finetune", "Precise SFT costs less off target than full fine-tuning.",
          "\"much less impact on non-mathematical tasks\" (introduction); Table 1: not available here"),
    Claim("sft_speed", "finetune", "A precise-SFT step is faster than a full fine-tuning step.",
          "\"naturally benefits from shorter training times\" (section 4.3); no time is given in the text available "
          "here"),
)}


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


def _row(claim: str, scope: str = "all", **fields) -> dict:
    c = CLAIMS[claim]
    row = {"claim": claim, "scope": scope, "stage": c.stage, "statement": c.statement, "paper": c.paper,
           "measure": "", "value": math.nan, "ci_low": math.nan, "ci_high": math.nan, "unit": "", "n": None,
           "split": "", "verdict": "not measured", "rule": "", "note": "", "source": ""}
    return row | fields


def _headline(claim: str, subs: list[dict], **fields) -> list[dict]:
    """The claim's headline row (verdict combined from `subs`) followed by the sub-rows."""
    verdict = combine([s["verdict"] for s in subs])
    fields.setdefault("rule", COMBINE_RULE)
    counts = pd.Series([s["verdict"] for s in subs]).value_counts()
    summary = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if v in counts)
    fields["note"] = "; ".join(x for x in (fields.get("note", ""), f"sub-rows: {summary}" if subs else "") if x)
    return [_row(claim, verdict=verdict, **fields), *subs]


def _not_measured(claim: str, why: str, **fields) -> list[dict]:
    return [_row(claim, note=why, **fields)]


def _interval_note(low: float, high: float, verdict: str, unit_scale: float = 100, unit: str = " points") -> str:
    """What an interval says beyond its verdict: IDENTICAL for a `degenerate` one; for an inconclusive one, the
    difference the test detects with 80% power; else nothing."""
    if not any(map(math.isnan, (low, high))) and degenerate(low, high):
        return IDENTICAL
    if verdict != "inconclusive":
        return ""  # two significant digits, like the interval's width it is computed from
    size = display.significant(unit_scale * detectable(low, high), 2)
    return f"too little power: detects about {size}{unit} with 80% power"


def _in_percent(value, low, high, sign: bool = False, unit: str = "%") -> str:
    """A fraction and its resampled interval in percent, "-12% [-17, -6]" (`unit` after the value), at the
    interval's precision (display.estimate): digits that differ between CPUs are not printed."""
    return (display.estimate(value, low, high, scale=100, sign=sign, suffix=unit) + " "
            + display.bounds(low, high, scale=100, sign=sign)).strip()


# ------------------------------------------------------------------------------------------------ identify
def depth(layer: int, n_layers: int) -> float:
    """Relative depth of a layer: 0 the first, 1 the last."""
    return layer / max(n_layers - 1, 1)


def few_key_heads(keys: dict[str, pd.DataFrame], effects: dict[str, pd.DataFrame], cfg: dict) -> list[dict]:
    subs = []
    for task, key in keys.items():
        heads = key[key["component"] == "head"]
        eff = effects[task]
        n_total = int((eff["component"] == "head").sum())
        paper = int(((eff["component"] == "head") & (eff["mean_effect"] < cfg["paper_threshold"])).sum())
        share = len(heads) / n_total if n_total else math.nan
        verdict = "holds" if 0 < share <= cfg["max_key_share"] else "does not hold"
        note = (f"{len(heads)} of {n_total:,} heads; {paper} pass the paper's "
                f"{100 * cfg['paper_threshold']:g}% threshold")
        if not len(heads):
            note += "; the key-head rule selected no head"
        subs.append(_row("few_key_heads", task, measure="share of heads that are key", value=100 * share,
                         unit="percent", n=n_total, split="identification", verdict=verdict,
                         rule=f"holds if 0 < share <= {100 * cfg['max_key_share']:g}%", note=note,
                         source=layout.KEY_HTML.format(task=task)))
    union = {n for key in keys.values() for n in key.loc[key["component"] == "head", "node"]}
    n_total = subs[0]["n"] if subs else 0
    return _headline("few_key_heads", subs, measure="share of heads key for at least one operator",
                     value=100 * len(union) / n_total if n_total else math.nan, unit="percent", n=n_total,
                     split="identification", source=layout.SHARED_FIGURE)


def middle_layers(keys: dict[str, pd.DataFrame], n_layers: int, cfg: dict) -> list[dict]:
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
            subs.append(_row("middle_layers", task, note="the key-head rule selected no head", rule=rule))
            continue
        verdict, fields = judge(layers)
        subs.append(_row("middle_layers", task, measure="median relative depth of the key heads",
                         split="identification", verdict=verdict, rule=rule,
                         source=layout.EFFECTS_FIGURE.format(task=task), **fields))
    union = sorted({(int(l), int(h)) for key in keys.values()
                    for l, h in key.loc[key["component"] == "head", ["layer", "head"]].to_numpy()})
    if not union:
        return _not_measured("middle_layers", "the key-head rule selected no head on any operator", rule=rule)
    verdict, fields = judge([l for l, _ in union])
    return [_row("middle_layers", measure="median relative depth of the key heads of any operator",
                 split="identification", verdict=verdict, rule=rule, source=layout.SHARED_FIGURE, **fields),
            *subs]


def mlp_late(keys: dict[str, pd.DataFrame], effects: dict[str, pd.DataFrame], cfg: dict) -> list[dict]:
    ratio_needed = cfg["mlp_ratio"]
    rule = (f"split at the first key head's layer; ratio = |strongest later MLP effect| / |strongest earlier one|; "
            f"holds if ratio >= {ratio_needed:g} and the later MLP's interval lies below 0, partly if ratio > 1, "
            f"else does not hold")
    subs = []
    for task, key in keys.items():
        heads = key[key["component"] == "head"]
        if not len(heads):
            subs.append(_row("mlp_late", task, rule=rule, note="no key head to split the layers at"))
            continue
        first = int(heads["layer"].min())
        mlps = effects[task][effects[task]["component"] == "mlp"]
        early, late = mlps[mlps["layer"] < first], mlps[mlps["layer"] >= first]
        if not len(early) or not len(late):
            subs.append(_row("mlp_late", task, rule=rule, note=f"the first key head is in layer {first}: "
                                                              "no MLP on one side"))
            continue
        strongest = late.loc[late["mean_effect"].idxmin()]
        early_max = float(early["mean_effect"].abs().max())
        earliest = early.loc[early["mean_effect"].abs().idxmax()]
        early_at = int(earliest["layer"])
        ratio = abs(float(strongest["mean_effect"])) / early_max if early_max > 0 else math.inf
        significant = float(strongest["ci_high"]) < 0
        verdict = ("holds" if ratio >= ratio_needed and significant else "partly" if ratio > 1 else "does not hold")
        subs.append(_row(
            "mlp_late", task, measure="|strongest later MLP effect| / |strongest earlier MLP effect|", value=ratio,
            unit="ratio", n=int(strongest["n"]), split="identification", verdict=verdict, rule=rule,
            source=layout.EFFECTS_FIGURE.format(task=task),
            note=(f"later: {node_label(strongest['layer'])} "
                  f"{_in_percent(strongest['mean_effect'], strongest['ci_low'], strongest['ci_high'])}; earlier: "
                  f"{node_label(early_at)} "
                  f"{display.estimate(early_max, earliest['ci_low'], earliest['ci_high'], scale=100)}% "
                  f"in size (first key head in layer {first})")))
    return _headline("mlp_late", subs, measure="per operator, below", split="identification")


# ------------------------------------------------------------------------------------------------ validate
def _paired(items: pd.DataFrame, a: pd.Series, b: pd.Series, cfg: dict, seed: int) -> dict:
    """Paired cluster bootstrap of mean(a) - mean(b) over the same items (index-aligned), clusters = items.cluster."""
    joined = pd.concat({"a": a, "b": b}, axis=1).dropna().join(items["cluster"])
    return stats.paired_cluster_bootstrap(joined["a"].to_numpy(float), joined["b"].to_numpy(float),
                                          joined["cluster"].to_numpy(), n_boot=cfg["bootstrap"], seed=seed,
                                          confidence=cfg["confidence"])


def knockout_collapse(items: dict[str, pd.DataFrame | None], cfg: dict, seed: int) -> list[dict]:
    """Per operator, positions and answer: accuracy with the top K heads knocked out (K = the curve's largest k)
    against K random heads drawn uniformly and K drawn in the same layers (the mean over draws, per item),
    paired over the same validation items, intervals resampling operand pairs. `items`: per operator its
    knockout's per-item table (`stages.validate.knockout_items`) with item_key and cluster unique across
    operators (`read_knockout_items`), or None."""
    min_diff, collapse = cfg["min_difference"], cfg["collapse"]
    rule = (f"holds if top-K accuracy is >= {100 * collapse:g}% lower than with nothing knocked out and the 95% "
            f"intervals of (top K - random K) lie below 0 for both controls; partly if only the controls hold; "
            f"does not hold if an interval lies above 0 or inside +-{100 * min_diff:g} points; else inconclusive")
    subs = []
    for task, per_item in items.items():
        if per_item is None:
            subs.append(_row("knockout_collapse", task, rule=rule, note="no per-item knockout table"))
            continue
        for positions, part in per_item.groupby("positions", sort=False):
            K = int(part.loc[part["curve"] == "top_heads", "k"].max())
            for answer, label in ANSWERS.items():
                subs.append(_knockout_row(task, positions, K, part, answer, label, cfg, seed, rule))
    # the headline: end positions, full answer, every operator's items pooled (clusters = operator and pair)
    pooled = [i for i in items.values() if i is not None]
    if not pooled:
        return _not_measured("knockout_collapse", "no knockout table", rule=rule)
    end = pd.concat(pooled, ignore_index=True).query("positions == 'end'")
    if not len(end):
        return _headline("knockout_collapse", subs)
    K = int(end.loc[end["curve"] == "top_heads", "k"].max())
    head = _knockout_row("all", "end", K, end, "full_correct", "full answer", cfg, seed, rule)
    if head["verdict"] == "not measured":
        return _headline("knockout_collapse", subs, measure="per operator, below", note=head["note"])
    fields = {k: head[k] for k in ("measure", "value", "ci_low", "ci_high", "unit", "n", "split")}
    fields["measure"] = "all operators, END: " + fields["measure"]
    return _headline("knockout_collapse", subs, source=layout.KNOCKOUT_FIGURE.format(task=next(iter(items))), **fields,
                     note=head["note"])


def _knockout_row(task: str, positions: str, K: int, part: pd.DataFrame, answer: str, label: str, cfg: dict,
                  seed: int, rule: str) -> dict:
    """One (operator, positions, answer) row of the knockout claim; `part` holds that positions' per-item rows."""
    def per_item(curve: str, k: int) -> pd.Series:
        rows = part[(part["curve"] == curve) & (part["k"] == k)]
        return rows.groupby("item_key")[answer].mean()  # random controls: the mean over draws

    items = part.drop_duplicates("item_key").set_index("item_key")
    none, top = per_item("top_heads", 0), per_item("top_heads", K)
    scope = f"{task} · {positions} · {label}"
    base_acc, top_acc = float(none.mean()), float(top.mean())
    if base_acc == 0:
        return _row("knockout_collapse", scope, rule=rule, n=len(none), split="validation",
                    note="the model answers none of these items with nothing knocked out: nothing to collapse")
    drop = 1 - top_acc / base_acc
    controls = {}
    for curve, name in (("random_layer_matched", "layer-matched"), ("random_heads", "uniform")):
        rand = per_item(curve, K)
        if len(rand):
            controls[name] = (float(rand.mean()), _paired(items, top.astype(float), rand.astype(float), cfg, seed))
    if "layer-matched" not in controls:
        return _row("knockout_collapse", scope, rule=rule, note=f"no random control at k = {K}")
    # a control the top K answered identically to measured nothing (`degenerate`); the row's own (layer-matched)
    # one decides whether anything was measured
    verdicts = [v for v in (directional(c["ci_low"], c["ci_high"], direction=-1, min_effect=cfg["min_difference"])
                            for _, c in controls.values()) if v != "not measured"]
    lm = controls["layer-matched"][1]
    if degenerate(lm["ci_low"], lm["ci_high"]):
        verdict = "not measured"
    elif all(v == "holds" for v in verdicts):
        verdict = "holds" if drop >= cfg["collapse"] else "partly"
    elif "does not hold" in verdicts and "holds" not in verdicts:
        verdict = "does not hold"
    elif "holds" in verdicts:
        verdict = "partly"
    else:
        verdict = "inconclusive"
    note = (f"accuracy {100 * base_acc:.1f}% -> {100 * top_acc:.1f}% with the top {K} heads "
            f"({100 * drop:.0f}% lower); random: " +
            ", ".join(f"{name} {100 * acc:.1f}% (difference "
                      f"{_in_percent(c['difference'], c['ci_low'], c['ci_high'], sign=True, unit='')})"
                      for name, (acc, c) in controls.items()))
    extra = _interval_note(lm["ci_low"], lm["ci_high"], verdict)
    return _row("knockout_collapse", scope, measure=f"top {K} minus {K} layer-matched random heads, {label}",
                value=100 * lm["difference"], ci_low=100 * lm["ci_low"], ci_high=100 * lm["ci_high"], unit="points",
                n=int(lm["n_items"]), split="validation", verdict=verdict, rule=rule,
                note="; ".join(x for x in (note, extra) if x),
                source=layout.KNOCKOUT_FIGURE.format(task=task) if task != "all" else "")


TRANSFER_LABELS = {"operator": "other operators", "multi_digit": "multi-digit operands",
                   "decimal": "decimal operands", "svamp": "SVAMP", "non_math": "non-math control"}


def transfer(items: pd.DataFrame | None, cfg: dict, seed: int) -> list[dict]:
    """Per target kind: on the items the unablated model gets right, the share that stays right with an operator's
    key heads knocked out minus with as many layer-matched random heads (mean over draws): the transfer table's
    `retained`, pooled over source operators, paired per item. Other operators only (a source operator's own
    pairs are the knockout claim's)."""
    min_diff = cfg["min_difference"]
    hurt_rule = directional_rule("(key - random) retained accuracy", -1, f"{100 * min_diff:g} points")
    keep_rule = (f"holds if the 95% interval of (key - random) retained accuracy lies above -{100 * min_diff:g} "
                 f"points; does not hold if it lies below 0; inconclusive otherwise")
    if items is None or not len(items):
        return _not_measured("transfer", "no per-item transfer table", rule=hurt_rule)
    intact = items.loc[items["source"] == "none"].set_index(["target", "item"])["correct"]
    knocked = items[items["source"] != "none"]
    knocked = knocked[(knocked["target_kind"] != "operator") | (knocked["target"] != knocked["source"])]
    right = intact.reindex(pd.MultiIndex.from_frame(knocked[["target", "item"]])).to_numpy(dtype=bool)
    subs = []
    for kind in (*MATH_TARGETS, "non_math"):
        of_kind = (knocked["target_kind"] == kind).to_numpy()
        part = knocked[of_kind & right]
        if not of_kind.any():
            continue
        if not len(part):
            subs.append(_row("transfer", TRANSFER_LABELS[kind], rule=hurt_rule if kind != "non_math" else keep_rule,
                             note="the unablated model answers none of these items: nothing to lose"))
            continue
        part = part.assign(item_key=part["source"] + "|" + part["target"] + "|" + part["item"].astype(str),
                           cluster=part["target"] + "|" + part["cluster"].astype(str))
        key = part[part["heads"] == "key"].groupby("item_key")["correct"].mean()
        rand = part[part["heads"] == "random"].groupby("item_key")["correct"].mean()
        clusters = part.drop_duplicates("item_key").set_index("item_key")
        res = _paired(clusters, key.astype(float), rand.astype(float), cfg, seed)
        lo, hi = res["ci_low"], res["ci_high"]
        if kind == "non_math":
            verdict, rule = _non_inferior(pd.Series({"ci_low": lo, "ci_high": hi}), min_diff), keep_rule
        else:
            verdict, rule = directional(lo, hi, direction=-1, min_effect=min_diff), hurt_rule
        label = TRANSFER_LABELS[kind]
        subs.append(_row("transfer", label,
                         measure="retained accuracy, key minus layer-matched random heads knocked out",
                         value=100 * res["difference"], ci_low=100 * lo, ci_high=100 * hi, unit="points",
                         n=int(res["n_items"]), split="validation" if kind == "operator" else "held-out set",
                         verdict=verdict, rule=rule,
                         note="; ".join(x for x in (
                             f"{', '.join(dict.fromkeys(part['target']))}: {100 * key.mean():.1f}% of the items the "
                             f"intact model gets right stay right with the key heads out, {100 * rand.mean():.1f}% "
                             "with random heads", _interval_note(lo, hi, verdict)) if x),
                         source=layout.TRANSFER_FIGURE))
    return _headline("transfer", subs, measure="per target, below", source=layout.TRANSFER_FIGURE)


# ------------------------------------------------------------------------------------------------ analyze
OPERAND_ROLES = ("operand_a", "operand_b", "operator")


def key_attention(roles_all: dict[str, pd.DataFrame], cfg: dict, seed: int) -> list[dict]:
    """Per operator: the share of END attention on operands and operator, mean over the analysed heads (the key
    heads) minus mean over every other head, with an interval resampling heads within each group."""
    min_diff = cfg["min_difference"]
    rule = directional_rule("(key - other heads) attention share on operands and operator", +1,
                            f"{100 * min_diff:g} points")
    subs = []
    rng = np.random.default_rng(seed)
    for task, table in roles_all.items():
        share = table[table["role"].isin(OPERAND_ROLES)].groupby(["layer", "head"]).agg(
            share=("attention", "sum"), analysed=("analysed", "first"))
        key, other = share.loc[share["analysed"], "share"].to_numpy(), share.loc[~share["analysed"], "share"].to_numpy()
        if not len(key) or not len(other):
            subs.append(_row("key_attention", task, rule=rule, note="no analysed head, or no other head"))
            continue
        boot = (rng.choice(key, (cfg["bootstrap"], len(key))).mean(1)
                - rng.choice(other, (cfg["bootstrap"], len(other))).mean(1))
        lo, hi = (float(x[0]) for x in stats.percentile_interval(boot[:, None], cfg["confidence"]))
        verdict = directional(lo, hi, direction=+1, min_effect=min_diff)
        how = "key heads" if (table["selection"] == "key").all() else "strongest heads (the rule chose no key head)"
        note = (f"{how}: {100 * key.mean():.1f}% of END attention on operands and operator; the other "
                f"{len(other):,} heads: {100 * other.mean():.1f}%")
        subs.append(_row("key_attention", task,
                         measure=f"attention share on operands and operator, {how} minus other heads",
                         value=100 * (key.mean() - other.mean()), ci_low=100 * lo, ci_high=100 * hi, unit="points",
                         n=len(key), split="validation", verdict=verdict, rule=rule,
                         note="; ".join(x for x in (note, _interval_note(lo, hi, verdict)) if x),
                         source=layout.ROLES_FIGURE.format(task=task)))
    return _headline("key_attention", subs, measure="per operator, below", split="validation")


def mlp_answer(probes: dict[str, pd.DataFrame], keys: dict[str, pd.DataFrame], cfg: dict) -> list[dict]:
    """Per operator, at its key MLPs (the paper's vector definitions, items whose answer token is neither operand's
    when there are any): cosine of the MLP output with the answer's unembedding minus the larger of the operands',
    averaged over the key MLPs; interval from the per-target standard errors (unpaired, so conservative)."""
    min_cos = cfg["min_cosine"]
    rule = directional_rule("cos(output, answer) - max(cos(output, operand))", +1, f"{min_cos:g}")
    z = stats.normal_quantile(cfg["confidence"])
    subs = []
    for task, table in probes.items():
        key = keys[task]
        layers = [int(l) for l in key.loc[key["component"] == "mlp", "layer"]]
        if not layers:
            subs.append(_row("mlp_answer", task, rule=rule, note="no key MLP"))
            continue
        part = table[(table["variant"] == "paper") & (table["vector"] == "output") & table["layer"].isin(layers)]
        subset = "answer_distinct" if (part["subset"] == "answer_distinct").any() else "all"
        part = part[part["subset"] == subset].set_index(["layer", "target"])
        diffs, variances = [], []
        for l in layers:
            operand = max(("a", "b"), key=lambda t: part.loc[(l, t), "mean"])
            c, o = part.loc[(l, "c")], part.loc[(l, operand)]
            diffs.append(c["mean"] - o["mean"])
            variances.append(c["std"] ** 2 / c["n"] + o["std"] ** 2 / o["n"])
        value = float(np.mean(diffs))
        half = z * math.sqrt(sum(variances)) / len(layers)
        lo, hi = value - half, value + half
        verdict = directional(lo, hi, direction=+1, min_effect=min_cos)
        subs.append(_row("mlp_answer", task, measure="cos(MLP output, answer) - cos(MLP output, nearer operand)",
                         value=value, ci_low=lo, ci_high=hi, unit="cosine", n=int(part["n"].iloc[0]),
                         split="validation", verdict=verdict, rule=rule,
                         note=f"key MLPs {', '.join(f'L{l}' for l in layers)}; items: {subset}",
                         source=layout.PROBES_FIGURE.format(task=task)))
    return _headline("mlp_answer", subs, measure="per operator, below", split="validation")


# ------------------------------------------------------------------------------------------------ circuit
def circuit_sufficient(teacher_forced: dict[str, pd.DataFrame | None], cfg: dict, seed: int) -> list[dict]:
    """Per operator, on the teacher-forced protocol: the key circuit (key heads + key MLPs) against the
    layer-matched random circuits of its size (`_tf_sufficient_row`), from `teacher_forced`: per operator the
    discover rule's per-item table, which scores the key circuit and its random draws, or None."""
    subs, failed_by_task = [], {}
    for task, items in teacher_forced.items():
        kinds = [k for k in protocol.KINDS if items is not None and f"tf_{k}_tail_correct" in items]
        if not kinds:
            subs.append(_row("circuit_sufficient", task, rule=tf_sufficient_rule(cfg),
                             note="no teacher-forced scores of the key circuit in the discover rule's items"))
            continue
        subs.append(_tf_sufficient_row(task, items, kinds, cfg, seed))
        failed_by_task[task] = failed_checks(items, kinds)
    return _headline("circuit_sufficient", subs, measure="per operator, below", split="validation",
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
        res = {m: key_vs_random(items, measure="full", mlps="key", column=f"tf_{k}_tail_{m}", **boot)
               for m in ("correct", "logprob")}
        if res["correct"] is None:
            return _row("circuit_sufficient", task, rule=tf_sufficient_rule(cfg),
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
    note += _tf_kind_notes(r, per_kind, "key")
    main = f"tf_{kinds[0]}_correct"  # as circuit_faithful's headline
    return _row("circuit_sufficient", task,
                measure=f"the key circuit's teacher-forced full-answer faithfulness ({kinds[0]} ablation)",
                value=100 * r[main], ci_low=100 * r[main + "_low"], ci_high=100 * r[main + "_high"], unit="percent",
                n=n, split="validation", verdict=verdict, rule=tf_sufficient_rule(cfg), note="; ".join(note),
                source=layout.DISCOVER_ITEMS.format(task=task))


def _cut_shares(rows: pd.DataFrame, cfg: dict, seed: int) -> dict:
    """Paired cluster-bootstrap estimates from one kind's per-item path cuts: the log-probability lost (model - cut)
    with the key heads' edges into the MLPs cut (via), into the logits cut (direct) and both; via, direct and their
    difference as shares of `both` (what the key heads' edges carry in all)."""
    lost = np.column_stack([rows["model"] - rows[c] for c in ("via_mlps", "direct", "both")])
    point, boot = stats.cluster_resampled_means(lost, rows["cluster"].to_numpy(), n_boot=cfg["bootstrap"], seed=seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = np.column_stack([boot[:, 0], boot[:, 1], boot[:, 0] - boot[:, 1]]) / boot[:, [2]]
        share_point = np.array([point[0], point[1], point[0] - point[1]]) / point[2]
    low, high = stats.percentile_interval(shares, cfg["confidence"])
    both_low, both_high = stats.percentile_interval(boot[:, [2]], cfg["confidence"])
    return {"lost": point, "both_low": float(both_low[0]), "both_high": float(both_high[0]), "share": share_point,
            "share_low": low, "share_high": high, "n": len(rows)}


def _cut_verdict(est: dict, min_diff: float) -> str:
    """The key heads' edges must carry something (lost with both cut: interval above 0); then the path through the
    MLPs must carry a share of it (interval above 0, or inside +-min_diff: does not hold) and more than the direct
    path (the same on via - direct)."""
    carried = directional(est["both_low"], est["both_high"], direction=+1, min_effect=0.0)
    if carried != "holds":
        return carried
    via = directional(est["share_low"][0], est["share_high"][0], direction=+1, min_effect=min_diff)
    more = directional(est["share_low"][2], est["share_high"][2], direction=+1, min_effect=min_diff)
    return "holds" if via == more == "holds" else "partly" if via == "holds" else via


def heads_via_mlps(edge_paths: dict[str, pd.DataFrame | None], cfg: dict, seed: int,
                   sanity: dict[str, dict[str, str]] | None = None) -> list[dict]:
    """Per operator, on the teacher-forced protocol (the edges rule's `{task}_edge_paths`: the answer's
    log-probability with the key heads' edges into every later MLP, into the logits, or both cut exactly, per
    validation item, under each ablation): the path through the MLPs must carry a share of what the key heads'
    edges carry and more than the direct path does, with the same verdict under both ablations (else
    inconclusive). `sanity`: per
    operator, the ablations whose sanity check failed in the discover rule (`failed_checks`; the edges rule cuts
    under the same ablations, values from the same identification pairs): their rows are inconclusive."""
    min_diff = cfg["min_difference"]
    rule = ("teacher-forced (answer and terminator), log-probability lost when the key heads' edges are cut exactly: "
            "holds if, under both ablations, cutting all their edges loses log-probability (interval above 0) and the "
            "edges into the MLPs carry a share of it and more than the edges into the logits (95% intervals of both "
            f"shares above 0); partly if only the first share is; does not hold if an interval lies below 0 or inside "
            f"+-{100 * min_diff:g} points; inconclusive otherwise, or where the two ablations disagree; {SANITY_RULE} "
            "(the discover rule's checks, on the same ablations)")
    subs, failed_by_task = [], {}
    for task, paths in edge_paths.items():
        if paths is None or paths.empty:
            subs.append(_row("heads_via_mlps", task, rule=rule, note="no key head, or no path-cut table"))
            continue
        kinds = list(dict.fromkeys(paths["kind"]))
        per_kind = {kind: _cut_shares(paths[paths["kind"] == kind], cfg, seed) for kind in kinds}
        verdicts = {kind: _cut_verdict(est, min_diff) for kind, est in per_kind.items()}
        verdict = next(iter(verdicts.values())) if len(set(verdicts.values())) == 1 else "inconclusive"
        failed = {k: msg for k, msg in (sanity or {}).get(task, {}).items() if k in per_kind}
        if failed:
            verdict, failed_by_task[task] = "inconclusive", failed
        notes = [sanity_note(failed)] if failed else []
        for kind, est in per_kind.items():
            lo, hi = est["share_low"], est["share_high"]
            if degenerate(est["both_low"], est["both_high"]):
                notes.append(f"{kind}: cutting the key heads' edges: {IDENTICAL}")
                continue
            notes.append(f"{kind}: {verdicts[kind]}; all edges cut loses {est['lost'][2]:.3f} nats "
                         f"[{est['both_low']:.3f}, {est['both_high']:.3f}], of which through the MLPs "
                         f"{_in_percent(est['share'][0], lo[0], hi[0])}, "
                         f"direct {_in_percent(est['share'][1], lo[1], hi[1])}")
        main = per_kind[kinds[0]]
        subs.append(_row("heads_via_mlps", task,
                         measure=f"share of the key heads' edge effect through the MLPs ({kinds[0]} ablation)",
                         value=100 * main["share"][0], ci_low=100 * main["share_low"][0],
                         ci_high=100 * main["share_high"][0], unit="percent", n=int(main["n"]), split="validation",
                         verdict=verdict, rule=rule, note="; ".join(notes),
                         source=layout.EDGE_PATHS.format(task=task)))
    return _headline("heads_via_mlps", subs, measure="per operator, below", split="validation",
                     note=sanity_headline(failed_by_task))


# ------------------------------------------------------------------------------------------------ discover
DISCOVER_OFF = f"the discover rule did not run (no {layout.DISCOVER_SUMMARY})"


def circuit_faithful(summary: pd.DataFrame | None, cfg: dict) -> list[dict]:
    """Per operator, for the union over operators and for the shared circuit (pruned on every operator's
    pairs together; task 'shared') (the discover rule's summary, one row per task and target, with
    the teacher-forced columns DISCOVER_COLUMNS): the chosen target's circuit, by `tf_faithful_rule`. The discover
    rule chooses the smallest target whose circuit keeps enough full answers on the selection pairs; where it chose
    none, the largest target's circuit is scored and the row says so."""
    if summary is None:
        return _not_measured("circuit_faithful", DISCOVER_OFF)
    missing = [c for c in DISCOVER_COLUMNS if c not in summary.columns]
    if missing:
        raise ValueError(f"the discover summary ({layout.DISCOVER_SUMMARY}) lacks the columns {missing}")
    rule = tf_faithful_rule(cfg)
    if summary.empty:
        return _not_measured("circuit_faithful", "the discover rule found no circuit (its summary is empty)",
                             rule=rule)
    kinds = list(protocol.KINDS)
    subs, failed_by_task = [], {}
    for task, rows in summary.groupby("task", sort=False):
        chosen = rows[rows["chosen"].astype(bool)]
        fallback = chosen.empty
        row = (rows.sort_values("target").iloc[-1] if fallback else chosen.sort_values("target").iloc[0])
        subs.append(_tf_faithful_row(str(task), row, fallback or fell_back(row), rule, kinds, cfg))
        failed_by_task[subs[-1]["scope"]] = failed_checks(row, kinds)
    return _headline("circuit_faithful", subs, measure="per operator, their union and their shared circuit, below",
                     split="validation", source=layout.DISCOVER_SUMMARY, note=sanity_headline(failed_by_task))


# The teacher-forced verdict (docs/claims.md), fixed before the numbers: enough validation pairs for an interval of
# a few points, the paper-scale circuit share, 80% of the full model's teacher-forced full answers kept (lower end of
# the interval), the answer's log-probability kept within +-20% (overshoot is not free), and a margin over random
# circuits of its size that a random circuit of SmolLM2's size never reaches (0.3), under both ablations.
TF_MIN_PAIRS = 96
TF_LOGPROB_BAND = (0.8, 1.2)
TF_MIN_OVER_RANDOM = 0.3
TF_FAITHFUL_COLUMNS = ("correct", "logprob", "random_diff")
DISCOVER_COLUMNS = ["task", "target", "chosen", "n_heads", "n_mlps", "share", "tf_n_items"] + [
    f"tf_{k}_{c}{x}" for k in protocol.KINDS for c in TF_FAITHFUL_COLUMNS for x in ("", "_low", "_high")]


def tf_faithful_rule(cfg: dict) -> str:
    return (f"teacher-forced (answer and terminator; nodes outside the circuit ablated at END and every answer "
            f"position): holds if, under both ablations, with at least {TF_MIN_PAIRS} validation pairs, the circuit "
            f"has at most {100 * cfg['max_circuit_share']:g}% of the heads and MLPs, the lower end of the 95% interval "
            f"of its full-answer faithfulness is at least {100 * cfg['faithful']:g}%, its log-probability "
            f"faithfulness lies in [{TF_LOGPROB_BAND[0]:g}, {TF_LOGPROB_BAND[1]:g}], and it keeps at least "
            f"{100 * TF_MIN_OVER_RANDOM:g} points more than layer-matched random circuits of its size (interval above "
            f"0); does not hold if it is larger, its faithfulness interval lies below {100 * cfg['faithful']:g}%, its "
            f"log-probability faithfulness lies outside the band, or (circuit - random) lies below "
            f"{100 * TF_MIN_OVER_RANDOM:g} points; inconclusive otherwise, with fewer pairs, or where the two "
            f"ablations disagree; before all of these, inconclusive where the circuit's full-answer faithfulness on "
            f"the identification pairs it was pruned on exceeds the validation pairs' by more than "
            f"{100 * cfg['max_fit_gap']:g} points (under either ablation), and {SANITY_RULE}")


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
    """One ablation's verdict on one summary row (`tf_faithful_rule`), the pair count and size aside:
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


def _tf_kind_notes(r: pd.Series, per_kind: dict[str, str], compared: str) -> list[str]:
    """Per ablation, the note's part of a teacher-forced row (the circuit_faithful and circuit_sufficient rows):
    its verdict, full-answer and log-probability faithfulness and (`compared` - random)."""
    out = []
    for k, verdict in per_kind.items():
        def est(name: str, **kw) -> str:
            c = f"tf_{k}_{name}"
            return _in_percent(r[c], r[c + "_low"], r[c + "_high"], **kw)

        against = (IDENTICAL if degenerate(r[f"tf_{k}_random_diff_low"], r[f"tf_{k}_random_diff_high"])
                   else est("random_diff", sign=True, unit="") + " points")
        out.append(f"{k}: {verdict}; full answers {est('correct')}, log-probability {est('logprob')}, "
                   f"{compared} - random {against}")
    return out


SCOPES = {"union": "union of the operators", "shared": "shared circuit of the operators"}  # the summary's pooled rows


def _tf_faithful_row(task: str, r: pd.Series, fallback: bool, rule: str, kinds: list[str], cfg: dict) -> dict:
    scope = SCOPES.get(task, task)
    size = f"{int(r['n_heads'])} heads + {int(r['n_mlps'])} MLPs ({100 * r['share']:.1f}% of nodes)"
    n = int(r["tf_n_items"])
    per_kind = {k: tf_faithful_verdict(r, k, cfg) for k in kinds}
    failed, gaps = failed_checks(r, kinds), fit_gaps(r, kinds, cfg)
    if set(per_kind.values()) == {"not measured"}:  # nothing to read, whatever the checks said (the note names them)
        verdict = "not measured"
    elif failed or gaps:  # the circuit and its numbers rest on an ablation that failed, or on too few pairs
        verdict = "inconclusive"
    elif r["share"] > cfg["max_circuit_share"]:
        verdict = "does not hold"
    elif len(set(per_kind.values())) > 1:
        verdict = "inconclusive"
    else:
        verdict = next(iter(per_kind.values()))
        if verdict == "holds" and n < TF_MIN_PAIRS:
            verdict = "inconclusive"
    found = ("the union of the operators' chosen circuits" if display.missing(r.get("target"))
             else f"found at target {r['target']:g} of the {r.get('pruned_on', 'pruning measure')}"
             + (" on every operator's identification pairs together" if task == "shared" else ""))
    note = [sanity_note(failed)] if failed else []
    if gaps:
        note.append(("" if failed else "inconclusive: ") + "; ".join(gaps.values()))
    note += [found + (" (no target's circuit kept enough answers on the identification pairs: the largest target's "
                      "is scored)" if fallback else ""),
             size + ("" if r["share"] <= cfg["max_circuit_share"] else
                     f", more than {100 * cfg['max_circuit_share']:g}%")]
    if n < TF_MIN_PAIRS:
        note.append(f"{n} validation pairs, fewer than the {TF_MIN_PAIRS} the rule asks for")
    note += _tf_kind_notes(r, per_kind, "circuit")
    flag = r.get("cpr_order_flag")
    if not display.missing(flag) and str(flag):
        note.append(f"pruning order: {flag}")
    main = f"tf_{kinds[0]}_correct"
    if display.missing(r[main]):  # faithfulness undefined (the model answers nothing): the size is what decides
        return _row("circuit_faithful", scope, measure="the discovered circuit's share of all heads and MLPs",
                    value=100 * r["share"], unit="percent", n=n, split="validation", verdict=verdict, rule=rule,
                    note="; ".join(note), source=layout.DISCOVER_SUMMARY)
    return _row("circuit_faithful", scope,
                measure=f"the discovered circuit's teacher-forced full-answer faithfulness ({kinds[0]} ablation)",
                value=100 * r[main], ci_low=100 * r[main + "_low"], ci_high=100 * r[main + "_high"], unit="percent",
                n=n, split="validation", verdict=verdict, rule=rule, note="; ".join(note),
                source=layout.DISCOVER_SUMMARY)


def fell_back(row) -> bool:
    """Whether the discover rule took its largest target because no target kept `min_full_share` of the full
    answers on the identification pairs (a summary row's `share_reached`; rows without it: no)."""
    reached = row.get("share_reached")
    return not display.missing(reached) and not bool(reached)


# ------------------------------------------------------------------------------------------------ finetune
STUDY_OFF = "the precise-SFT study did not run (study.arms is empty)"


def _comparison(comp: pd.DataFrame, a: str, b: str, metric: str) -> pd.Series | None:
    rows = comp[(comp["arm_a"] == a) & (comp["arm_b"] == b) & (comp["metric"] == metric)]
    return rows.iloc[0] if len(rows) else None


def sft_claims(study: pd.DataFrame | None, comp: pd.DataFrame | None, train_format: str | None, cfg: dict,
               not_run: str | None = None) -> list[dict]:
    """The study's five claims. `not_run`: why the study could not run (its summary's tables are empty)."""
    claims = ("sft_vs_full", "sft_vs_random", "sft_circuit_vs_precise", "sft_off_target", "sft_speed")
    if study is None or comp is None:
        return [r for c in claims for r in _not_measured(c, STUDY_OFF)]
    if not_run is not None or study.empty:
        return [r for c in claims for r in _not_measured(c, not_run or "the precise-SFT study scored no model")]
    margin, min_diff = cfg["non_inferiority"], cfg["min_difference"]
    rows: list[dict] = []
    source = layout.STUDY_MD
    split = f"test ({train_format})"
    # each arm's lr choice (study.parquet's lr_note and measured, `sft.design.select_lr`): an arm whose every lr
    # collapsed has no result, and every row that reads an arm carries its grid's flags (an edge, collapsed lrs)
    picked = study[study["run"] == "chosen"].set_index("arm")
    lr_notes = picked["lr_note"].fillna("").to_dict() if "lr_note" in picked else {}
    collapsed = [a for a in picked.index if "measured" in picked and not bool(picked.loc[a, "measured"])]

    def arm_notes(*arms: str) -> list[str]:
        return [f"{a}: {lr_notes[a]}" for a in arms if lr_notes.get(a)]

    def no_result(claim: str, arms: tuple[str, ...], rule: str | None = None) -> list[dict]:
        lost = [a for a in arms if a in collapsed]
        return _not_measured(claim, "; ".join(arm_notes(*lost)), **({"rule": rule} if rule else {})) if lost else []

    # the study's first positive control: precise SFT learns (its chosen run beats the base model on the trained
    # format); without it no exact-match comparison of precise with another arm is read as holding or not
    learns = _comparison(comp, "precise", "base", "accuracy")
    learned = learns is not None and bool(learns["ci_low"] > 0)
    learn_note = ("whether precise learns is unknown: the study has no precise - base comparison" if learns is None else
                  f"precise {'learns' if learned else 'does not beat the base model (the arms may not learn)'}: "
                  f"precise - base {100 * learns['difference']:+.1f} points [{100 * learns['ci_low']:+.1f}, "
                  f"{100 * learns['ci_high']:+.1f}] on the trained format")
    learn_rule = "; inconclusive unless precise's chosen run beats the base model on the trained format"

    def needs_learning(verdict: str) -> str:
        return verdict if learned else "inconclusive"

    # matches or beats full fine-tuning: non-inferiority on the trained format's exact match
    ni_rule = (f"holds if the 95% interval of (precise - full) exact match lies above -{100 * margin:g} points "
               f"(non-inferior); does not hold if it lies below 0; inconclusive otherwise")
    ni_rule += learn_rule
    row = _comparison(comp, "precise", "full", "accuracy")
    if lost := no_result("sft_vs_full", ("precise", "full"), ni_rule):
        rows += lost
    elif row is None:
        rows += _not_measured("sft_vs_full", "the study has no precise and full arms", rule=ni_rule)
    else:
        verdict = needs_learning(_non_inferior(row, margin))
        rows.append(_study_row("sft_vs_full", row, verdict, ni_rule, split, source, "exact match, precise - full"))
        rows[-1]["note"] += "; " + "; ".join([learn_note, *arm_notes("precise", "full"),
                                               _precision_note(study, ("precise", "full"))])
    row = _comparison(comp, "precise", "random_heads", "accuracy")
    rule = directional_rule("(precise - layer-matched random heads) exact match", +1,
                            f"{100 * min_diff:g} points") + learn_rule
    if lost := no_result("sft_vs_random", ("precise", "random_heads"), rule):
        rows += lost
    elif row is None:
        rows += _not_measured("sft_vs_random", "the study has no precise and random_heads arms", rule=rule)
    else:
        verdict = needs_learning(directional(row["ci_low"], row["ci_high"], direction=+1, min_effect=min_diff))
        rows.append(_study_row("sft_vs_random", row, verdict, rule, split, source,
                               "exact match, precise - layer-matched random heads"))
        rows[-1]["note"] += "; " + "; ".join([learn_note, *arm_notes("precise", "random_heads")])

    # the discovered circuit's heads against the key heads, at the same head count
    row = _comparison(comp, "circuit", "precise", "accuracy")
    rule = (directional_rule("(circuit - precise) exact match", +1, f"{100 * min_diff:g} points")
            + "; " + POSITIVE_CONTROL_RULE + learn_rule)
    if lost := no_result("sft_circuit_vs_precise", ("circuit", "precise"), rule):
        rows += lost
    elif row is None:
        rows += _not_measured("sft_circuit_vs_precise",
                              "the circuit arm did not run (study.arms has no circuit, or no precise)", rule=rule)
    else:
        verdict = directional(row["ci_low"], row["ci_high"], direction=+1, min_effect=min_diff)
        control, control_note = _positive_control(comp)
        if verdict == "does not hold" and not control:
            verdict = "inconclusive"  # an assay that separates no head sets cannot show these two do not differ
        rows.append(_study_row("sft_circuit_vs_precise", row, needs_learning(verdict), rule, split, source,
                               "exact match, circuit - precise (as many heads)"))
        rows[-1]["note"] += "; " + "; ".join([control_note, learn_note, *arm_notes("circuit", "precise"),
                                               *_head_set_notes(study, comp),
                                               _precision_note(study, ("circuit", "precise"))])

    # off target: lower KL to base, non-math accuracy not worse by more than the margin
    subs = []
    kl = _comparison(comp, "precise", "full", "kl_to_base")
    if kl is not None:
        verdict = directional(kl["ci_low"], kl["ci_high"], direction=-1, min_effect=0.0)
        subs.append(_study_row("sft_off_target", kl, verdict,
                               directional_rule("(precise - full) KL to base", -1, "0"), "WikiText-2 windows",
                               source, "KL(base || model) per token, precise - full", scope="KL to base", scale=1,
                               unit="nats"))
    for metric in ("social_iqa", "strategyqa", "qa_wikidata"):
        row = _comparison(comp, "precise", "full", metric)
        if row is not None:
            subs.append(_study_row("sft_off_target", row, _non_inferior(row, margin), ni_rule, "BIG-bench items",
                                   source, f"{metric} accuracy, precise - full", scope=metric))
    for sub in subs:
        sub["note"] = "; ".join(filter(None, [sub["note"], *arm_notes("precise", "full")]))
    rows += no_result("sft_off_target", ("precise", "full")) or _headline("sft_off_target", subs,
                                                                           measure="per measure, below", source=source)

    # step time: full over precise, each arm's chosen run
    speed_rule = (f"holds if full's mean step time / precise's >= {cfg['min_speedup']:g}; partly if > 1; "
                  f"does not hold otherwise")
    chosen = study[study["run"] == "chosen"].set_index("arm")
    if lost := no_result("sft_speed", ("precise", "full"), speed_rule):
        rows += lost
    elif {"precise", "full"} <= set(chosen.index) and "mean_step_s" in chosen:
        ratio = float(chosen.loc["full", "mean_step_s"] / chosen.loc["precise", "mean_step_s"])
        verdict = "holds" if ratio >= cfg["min_speedup"] else "partly" if ratio > 1 else "does not hold"
        rows.append(_row("sft_speed", measure="mean step time, full / precise (chosen runs)", value=ratio,
                         unit="ratio", n=int(chosen.loc["precise", "steps"]), split="training steps",
                         verdict=verdict, rule=speed_rule, source=source,
                         note=(f"full {chosen.loc['full', 'mean_step_s']:.3f} s, precise "
                               f"{chosen.loc['precise', 'mean_step_s']:.3f} s per step; "
                               f"{int(chosen.loc['precise', 'trainable_params']):,} against "
                               f"{int(chosen.loc['full', 'trainable_params']):,} trained parameters")))
    else:
        rows += _not_measured("sft_speed", "the study has no precise and full arms", rule=speed_rule)
    return rows


POSITIVE_CONTROL_RULE = ("a \"does not hold\" stands only if the same study's positive control holds (the 95% "
                         "interval of (precise - low_effect) exact match, the key heads against as many of the "
                         "weakest heads in their layers, lies above 0); without it the row is inconclusive")


def _positive_control(comp: pd.DataFrame) -> tuple[bool, str]:
    """Whether the study separates two head sets that should differ, the key heads (precise) and the negative
    control (low_effect: as many of the weakest heads, in the same layers), with a note saying so."""
    row = _comparison(comp, "precise", "low_effect", "accuracy")
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
    row = _comparison(comp, "circuit_disjoint", "precise", "accuracy")
    if row is not None:
        notes.append(f"circuit_disjoint - precise {100 * row['difference']:+.1f} points "
                     f"[{100 * row['ci_low']:+.1f}, {100 * row['ci_high']:+.1f}]")
    return notes


def _precision_note(study: pd.DataFrame, arms: tuple[str, ...]) -> str:
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


def _non_inferior(row: pd.Series, margin: float) -> str:
    """Holds if the interval of the difference lies above -margin, does not hold if it lies below 0, not measured
    if it is `degenerate`, else inconclusive."""
    if degenerate(row["ci_low"], row["ci_high"]):
        return "not measured"
    if row["ci_low"] > -margin:
        return "holds"
    return "does not hold" if row["ci_high"] < 0 else "inconclusive"


def _study_row(claim: str, row: pd.Series, verdict: str, rule: str, split: str, source: str, measure: str,
               scope: str = "all", scale: float = 100, unit: str = "points") -> dict:
    note = f"p {_p(row['p_value'])} ({row['test']}), Holm-adjusted p {_p(row['p_holm'])}"
    extra = _interval_note(row["ci_low"], row["ci_high"], verdict, scale, "" if unit == "nats" else " points")
    if extra:
        note = f"{extra}; {note}" if extra == IDENTICAL else f"{note}; {extra}"
    return _row(claim, scope, measure=measure, value=scale * row["difference"], ci_low=scale * row["ci_low"],
                ci_high=scale * row["ci_high"], unit=unit, n=int(row["n_items"]), split=split, verdict=verdict,
                rule=rule, note=note, source=source)


# ------------------------------------------------------------------------------------------------ the table
def scorecard(*, keys: dict[str, pd.DataFrame], effects: dict[str, pd.DataFrame],
              knockout_items: dict[str, pd.DataFrame | None], transfer_items: pd.DataFrame | None,
              roles_all: dict[str, pd.DataFrame], probes: dict[str, pd.DataFrame], study: pd.DataFrame | None,
              comparisons: pd.DataFrame | None, train_format: str | None, cfg: dict, seed: int,
              edge_paths: dict[str, pd.DataFrame | None] | None = None, study_not_run: str | None = None,
              discover: pd.DataFrame | None = None,
              discover_items: dict[str, pd.DataFrame | None] | None = None) -> pd.DataFrame:
    """Every claim's rows (headline first), in the order of CLAIMS, with the columns COLUMNS. `discover`: the
    discover rule's summary (None: the rule did not run); `discover_items`: per operator its per-item table (the key
    circuit on the teacher-forced protocol)."""
    n_layers = int(max(int(e["layer"].max()) for e in effects.values())) + 1
    rows = [
        *few_key_heads(keys, effects, cfg),
        *middle_layers(keys, n_layers, cfg),
        *mlp_late(keys, effects, cfg),
        *knockout_collapse(knockout_items, cfg, seed),
        *key_attention(roles_all, cfg, seed),
        *mlp_answer(probes, keys, cfg),
        *transfer(transfer_items, cfg, seed),
        *(circuit_sufficient(discover_items, cfg, seed) if discover_items
          else _not_measured("circuit_sufficient", DISCOVER_OFF)),
        *(heads_via_mlps(edge_paths, cfg, seed,
                         sanity={t: failed_checks(i, protocol.KINDS) for t, i in (discover_items or {}).items()})
          if edge_paths
          else _not_measured("heads_via_mlps", "the edges rule did not run")),
        *circuit_faithful(discover, cfg),
        *sft_claims(study, comparisons, train_format, cfg, not_run=study_not_run),
    ]
    table = pd.DataFrame(rows, columns=COLUMNS)
    order = {c: i for i, c in enumerate(CLAIMS)}
    table = table.sort_values("claim", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
    table["n"] = table["n"].astype("Int64")
    unknown = set(table["verdict"]) - set(VERDICTS)
    if unknown:
        raise ValueError(f"unknown verdicts {sorted(unknown)}")
    return table


def read_knockout_items(path, task: str) -> pd.DataFrame:
    """A knockout's per-item table with item_key and cluster prefixed by the operator (unique when pooled)."""
    items = pd.read_parquet(path)
    return items.assign(item_key=task + ":" + items["sample_id"].astype(str), cluster=task + ":" + items["cluster"])
