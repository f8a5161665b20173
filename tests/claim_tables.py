"""Small tables of the shapes the claims read, whose answers are known (the tests of arithmech.report.claims
share them), and the config they are judged with."""

from __future__ import annotations

import numpy as np
import pandas as pd
import yaml

from arithmech.report.claims import registry, sft_circuit_vs_precise
from helpers import ROOT

CFG = yaml.safe_load((ROOT / "config.yaml").read_text())["claims"] | {"bootstrap": 400}


def effects_table(head_effects: dict[tuple[int, int], float], mlp_effects: dict[int, tuple[float, float, float]],
                  n_layers: int = 4, n_heads: int = 4) -> pd.DataFrame:
    rows = []
    for l in range(n_layers):
        for h in range(n_heads):
            e = head_effects.get((l, h), 0.0)
            rows.append({"node": f"L{l}H{h}", "layer": l, "head": h, "component": "head", "mean_effect": e,
                         "ci_low": e - 0.001, "ci_high": e + 0.001, "n": 50})
        m, lo, hi = mlp_effects.get(l, (0.0, -0.001, 0.001))
        rows.append({"node": f"L{l}MLP", "layer": l, "head": np.nan, "component": "mlp", "mean_effect": m,
                     "ci_low": lo, "ci_high": hi, "n": 50})
    return pd.DataFrame(rows)


def key_table(effects: pd.DataFrame, heads: list[str], mlps: list[str]) -> pd.DataFrame:
    return effects[effects["node"].isin(heads + mlps)].copy()


def knockout_items(task: str, top_acc: float, random_acc: float, n_pairs: int = 40, per_pair: int = 3,
                   K: int = 3, seed: int = 0) -> pd.DataFrame:
    """Per-item knockout rows like stages.validate.knockout_items: nothing knocked out is always right, the top K
    heads are right with probability top_acc, random heads with random_acc (two draws each control)."""
    rng = np.random.default_rng(seed)
    n = n_pairs * per_pair
    sets = [("top_heads", -1, 0, 1.0), ("top_heads", -1, K, top_acc)]
    sets += [(c, s, K, random_acc) for c in ("random_heads", "random_layer_matched") for s in range(2)]
    rows = []
    for curve, s, k, p in sets:
        correct = rng.random(n) < p
        rows.append(pd.DataFrame({"curve": curve, "seed": s, "k": k, "sample_id": np.arange(n),
                                  "cluster": [f"{i // per_pair},1" for i in range(n)], "first_correct": correct,
                                  "full_correct": correct, "positions": "end"}))
    items = pd.concat(rows, ignore_index=True)
    return items.assign(item_key=task + ":" + items["sample_id"].astype(str), cluster=task + ":" + items["cluster"])


def transfer_items(key_acc: dict[str, float], random_acc: dict[str, float], n: int = 80, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    targets = {"operator": "division", "svamp": "SVAMP", "non_math": "qa_wikidata"}
    for kind, target in targets.items():
        for heads, acc in (("none", 1.0), ("key", key_acc[kind]), ("random", random_acc[kind])):
            source = "none" if heads == "none" else "addition"
            rows.append(pd.DataFrame({"source": source, "heads": heads, "seed": 0 if heads == "random" else -1,
                                      "target": target, "target_kind": kind, "item": np.arange(n),
                                      "cluster": [str(i) for i in range(n)], "correct": rng.random(n) < acc}))
    return pd.concat(rows, ignore_index=True)


def roles_all(key_share: float, other_share: float, n_heads: int = 40, n_key: int = 3) -> pd.DataFrame:
    rows = []
    roles = ("operand_a", "operand_b", "operator", "equals", "prefix", "other")
    rng = np.random.default_rng(0)
    for i in range(n_heads):
        analysed = i < n_key
        s = np.clip((key_share if analysed else other_share) + rng.normal(0, 0.02), 0, 1)
        weights = [s / 3] * 3 + [(1 - s) / 3] * 3
        rows += [{"layer": i // 4, "head": i % 4, "role": r, "attention": w, "analysed": analysed,
                  "selection": "key"} for r, w in zip(roles, weights)]
    return pd.DataFrame(rows)


def probes(c: float, a: float, layer: int = 3) -> pd.DataFrame:
    rows = []
    for target, mean in (("a", a), ("b", a - 0.01), ("c", c)):
        rows.append({"variant": "paper", "subset": "all", "layer": layer, "vector": "output", "target": target,
                     "mean": mean, "std": 0.02, "n": 60, "n_texts": 60})
    return pd.DataFrame(rows)


LEARNS = ("precise", "base", "accuracy", 0.3, 0.25, 0.35)  # the study's first positive control: precise learns


def comparisons(rows: list[tuple], learns: bool = True) -> pd.DataFrame:
    """A comparisons table of `rows`, with LEARNS unless `learns` is False."""
    rows = rows + [LEARNS] if learns else rows
    return pd.DataFrame([{"arm_a": a, "arm_b": b, "metric": m, "difference": d, "ci_low": lo, "ci_high": hi,
                          "p_value": 0.01, "p_holm": 0.04, "test": "mcnemar_exact", "n_items": 500}
                         for a, b, m, d, lo, hi in rows])


def study_table(full_s: float, precise_s: float) -> pd.DataFrame:
    return pd.DataFrame([
        {"arm": "precise", "run": "chosen", "mean_step_s": precise_s, "steps": 24, "trainable_params": 1_179_648},
        {"arm": "full", "run": "chosen", "mean_step_s": full_s, "steps": 24, "trainable_params": 134_515_008},
    ])


def study_claims(study: pd.DataFrame | None, comp: pd.DataFrame | None, train_format: str | None, cfg: dict,
                 not_run: str | None = None) -> list[dict]:
    """The rows of every fine-tuning claim of the registry (stage finetune) on one study's tables."""
    return [r for m in registry.MODULES if m.CLAIM.stage == "finetune"
            for r in m.score(study, comp, train_format, cfg, not_run=not_run)]


def circuit_row(study: pd.DataFrame, rows: list[tuple]) -> dict:
    (row,) = sft_circuit_vs_precise.score(study, comparisons(rows), "add2", CFG)
    return row


def circuit_items(key_full: float, random_full: float, n: int = 40) -> pd.DataFrame:
    """A per-item table of the key circuit's sets (the discover rule's layout, before its teacher-forced columns):
    the model right on every item, the empty circuit on none, the key circuit on a share key_full of them, two
    random draws on random_full."""
    rows = []
    for curve, mlps, k, seed, share in [("model", "all", 24, -1, 1.0), ("empty", "none", 0, -1, 0.0),
                                        ("key", "key", 3, -1, key_full), ("random", "key", 3, 0, random_full),
                                        ("random", "key", 3, 1, random_full), ("top", "key", 24, -1, key_full),
                                        ("top", "all", 24, -1, 1.0)]:
        for i in range(n):
            right = float(i < round(share * n))
            rows.append({"curve": curve, "mlps": mlps, "k": k, "seed": seed, "sample_id": i, "cluster": str(i),
                         "first_correct": right, "full_correct": right, "answer_logit": 20 + 10 * right})
    return pd.DataFrame(rows)


def tf_circuit_items(key: float, random: float, n: int = 120, logprob_f: float = 1.0, resample_key: float | None = None,
                     failed: str = "") -> pd.DataFrame:
    """`circuit_items` with the teacher-forced columns of both ablations: the key circuit right on a share `key` of
    the items (`resample_key` under resample ablation), random draws on `random`; the log-probability's
    faithfulness logprob_f for the key circuit (model -1, empty -10 per item); `failed`: resample's failed sanity
    checks."""
    items = circuit_items(key, random, n)
    rank = items["sample_id"].to_numpy()
    share = {"model": 1.0, "empty": 0.0, "random": random, "top": key}
    for kind in ("resample", "mean"):
        mine = {**share, "key": resample_key if kind == "resample" and resample_key is not None else key}
        items[f"tf_{kind}_tail_correct"] = [float(i < round(mine[c] * n)) for c, i in zip(items["curve"], rank)]
        f = {"model": 1.0, "empty": 0.0, "random": random, "top": key, "key": logprob_f}
        items[f"tf_{kind}_tail_logprob"] = [-10 + 9 * f[c] for c in items["curve"]]
        items[f"sanity_{kind}_failed"] = failed if kind == "resample" else ""
    return items


def path_cuts(via: float, direct: float, both: float, *, kinds=("resample", "mean"), n: int = 60,
              noise: float = 0.02, seed: int = 0) -> pd.DataFrame:
    """Per-item path cuts (the edges rule's `{task}_edge_paths`): log-probability lost with the key heads' edges into
    the MLPs (via), into the logits (direct) or both cut, around the given means, per kind."""
    rng = np.random.default_rng(seed)
    rows = []
    for kind in kinds:
        model = rng.normal(-1.0, 0.3, n)
        rows.append(pd.DataFrame({"sample_id": np.arange(n), "cluster": [f"{i},{i}" for i in range(n)], "kind": kind,
                                  "model": model, "via_mlps": model - via - rng.normal(0, noise, n),
                                  "direct": model - direct - rng.normal(0, noise, n),
                                  "both": model - both - rng.normal(0, noise, n)}))
    return pd.concat(rows, ignore_index=True)


def discover_summary(task: str, rows: list[dict]) -> pd.DataFrame:
    """The discover rule's summary (one row per task and target) with the columns the claim reads; each dict
    overrides a faithful, small circuit that beats random ones under both ablations (chosen at target 0.8)."""
    base = {"task": task, "target": 0.8, "chosen": True, "n_heads": 20, "n_mlps": 10, "share": 0.1,
            "pruned_on": "tf_mean_logprob", "draws": 5, **tf_columns()}
    return pd.DataFrame([base | r for r in rows])


def tf_columns(correct=(0.9, 0.85, 0.95), logprob=(1.0, 0.9, 1.1), random_diff=(0.6, 0.5, 0.7),
               kinds=("resample", "mean"), **override) -> dict:
    """The teacher-forced columns of one discover summary row (a circuit that holds under both ablations)."""
    row = {"tf_n_items": 120}
    for kind in kinds:
        for name, (v, lo, hi) in (("correct", correct), ("logprob", logprob), ("random_diff", random_diff)):
            row |= {f"tf_{kind}_{name}": v, f"tf_{kind}_{name}_low": lo, f"tf_{kind}_{name}_high": hi}
    return row | override


FAILED = "sanity check 'one node ablated' failed: the median draw keeps 0.500 of the model's accuracy (needs 0.95)"
