"""The teacher-forced protocol's torch-free half (docs/circuit.md): the ablation kinds and measures its tables are
keyed by (columns such as `tf_resample_tail_correct`: tail, END and every answer position) and the statistics read
from them, faithfulness with its intervals and a circuit against its random circuits. The code that measures
(arithmech.interp.teacher_forcing) and the code that reads its tables (the scorecard, the findings page, make docs)
take them from here. Also the transfer's target sets, in their order: rule transfer
(arithmech.interp.ablation.transfer_targets) and make plan's cost of it read the one list.

Faithfulness (Wang et al.). A circuit C is a set of heads and MLPs that is KEPT; every other head and MLP is
ablated. A measure m is taken for the full model M (nothing ablated), the empty circuit (everything ablated) and
each C, on the same items, and

    faithfulness(C) = (m(C) - m(empty)) / (m(M) - m(empty)):

1 when C keeps all of the behaviour, 0 when it keeps none. Intervals resample operand pairs (every set on the
same draw, so the ratio stays paired).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from arithmech import stats
from arithmech.interp.nodes import CircuitSet

KINDS = ("resample", "mean")  # how an ablated node gets its value: another item's, or the identification mean
TAIL_MEASURES = ("correct", "logprob", "kl")
PRUNE_MEASURES = ("logprob", "kl")

# measure -> the per-item column `key_vs_random` averages where it is given no column
def transfer_sets(tasks) -> list[tuple[str, str | None]]:
    """(kind, task) of each target set the transfer knocks the key heads out on, in order: every operator's pairs
    ("operator"), every number format of every operator (`data.arithmetic.FORMATS`), SVAMP and the non-math
    control (task None)."""
    from arithmech.data.arithmetic import FORMATS

    return [*(("operator", task) for task in tasks), *((fmt, task) for fmt in FORMATS for task in tasks),
            ("svamp", None), ("non_math", None)]


def faithfulness(m, m_full, m_empty) -> np.ndarray:
    """(m - m(empty)) / (m(M) - m(empty)), elementwise (broadcast); NaN where m(M) = m(empty)."""
    m, full, empty = (np.asarray(x, dtype=float) for x in (m, m_full, m_empty))
    span = full - empty
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(span != 0, (m - empty) / span, np.nan)


def faithfulness_table(sets: Sequence[CircuitSet], values: dict[str, np.ndarray], clusters: Sequence, *, n_boot: int,
                       seed: int, confidence: float) -> pd.DataFrame:
    """One row per set: each measure's mean and faithfulness with a percentile interval from resampling clusters
    (operand pairs), every set and measure on the same draws.

    values: measure -> [n_sets, n_items] per-item values of `sets` (which hold exactly one model and one empty set)
    Columns: curve, mlps, k, seed, n_heads, n_mlps, nodes; per measure m: m (the mean), faithfulness_m,
    faithfulness_m_low, faithfulness_m_high."""
    curves = [s.curve for s in sets]
    if curves.count("model") != 1 or curves.count("empty") != 1:
        raise ValueError("faithfulness needs exactly one 'model' and one 'empty' set")
    i_model, i_empty = curves.index("model"), curves.index("empty")
    table = pd.DataFrame({"curve": curves, "mlps": [s.mlps for s in sets], "k": [s.k for s in sets],
                          "seed": [s.seed for s in sets], "n_heads": [len(s.heads) for s in sets],
                          "n_mlps": [len(s.mlp_layers) for s in sets], "nodes": [s.nodes() for s in sets]})
    for measure, matrix in values.items():
        matrix = np.asarray(matrix, dtype=float)
        # a set with no value of a measure (all NaN) gets NaN columns
        rows = np.flatnonzero(~np.isnan(matrix).all(1))
        if i_model not in rows or i_empty not in rows:
            raise ValueError(f"faithfulness of {measure!r} needs the model's and the empty set's values")
        point, boot = stats.cluster_resampled_means(matrix[rows].T, clusters, n_boot=n_boot, seed=seed)
        im, ie = int(np.searchsorted(rows, i_model)), int(np.searchsorted(rows, i_empty))
        low, high = stats.percentile_interval(faithfulness(boot, boot[:, [im]], boot[:, [ie]]), confidence)
        for name, v in ((measure, point), (f"faithfulness_{measure}", faithfulness(point, point[im], point[ie])),
                        (f"faithfulness_{measure}_low", low), (f"faithfulness_{measure}_high", high)):
            table[name] = np.nan
            table.loc[rows, name] = v
    return table


def strict_kinds(sanity: str) -> list[str]:
    """The ablations whose failed teacher-forced sanity check stops a rule: with `circuit.discover.sanity: stop`
    every one (`KINDS`: the pruning uses one, and the verdicts read both); with `warn` none: a failed check
    is recorded (sanity_<kind>_failed) and makes every verdict row read from that ablation inconclusive, naming it
    (`report.claims.common.failed_checks`)."""
    return list(KINDS) if sanity == "stop" else []


def pooled_values(items: pd.DataFrame, n_sets: int, columns: dict[str, str], *, groups: Sequence[str],
                  by: str = "task") -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The per-item values of `n_sets` sets pooled over `groups` (e.g. operators, column `by`): `items` holds each
    group's per-item table, set-major (every set's items in the same order, as the stages write them); groups may
    score different numbers of items. Returns (name -> [n_sets, items of every group] of column `columns[name]`,
    the items' clusters), the groups in the order given."""
    blocks = [items[items[by] == group] for group in groups]
    for group, block in zip(groups, blocks):
        if len(block) % n_sets:
            raise ValueError(f"{by} {group!r}: {len(block)} rows are not {n_sets} sets of the same items")
    values = {name: np.concatenate([b[column].to_numpy(float).reshape(n_sets, -1) for b in blocks], axis=1)
              for name, column in columns.items()}
    clusters = np.concatenate([b["cluster"].to_numpy().reshape(n_sets, -1)[0] for b in blocks])
    return values, clusters


def with_set_columns(items: pd.DataFrame, n_sets: int, per_item: pd.DataFrame) -> pd.DataFrame:
    """A per-item table of n_sets sets (set-major rows, as the stages write them) with `per_item`'s columns
    (`teacher_forced_table`: set_index, sample_id, ...) merged in; items it does not score get NaN."""
    items = items.assign(set_index=np.repeat(np.arange(n_sets), len(items) // n_sets))
    return items.merge(per_item, on=["set_index", "sample_id"], how="left").drop(columns="set_index")


def key_vs_random(items: pd.DataFrame, *, column: str, mlps: str, n_boot: int, seed: int,
                  confidence: float, curve: str = "key") -> dict | None:
    """Faithfulness of the key circuit (or the one circuit of `curve`, e.g. a discovered one) minus the mean
    faithfulness of the layer-matched random circuits of its size (same MLPs), paired on the same items and cluster
    draws. `items`: a per-item table (the discover rule's: curve, mlps, k, seed, sample_id, cluster and the per-item
    values); `column` names the per-item column it reads (e.g. tf_mean_tail_correct). None when the circuit is missing;
    without random draws (a circuit of more than half the heads has no disjoint random circuit of its size) the
    circuit's own numbers, with NaN for random and the difference and draws 0.
    Returns {difference, ci_low, ci_high, key, key_low, key_high, random, n_items, n_clusters, draws}."""
    key = items[(items["curve"] == curve) & (items["mlps"] == mlps)]
    if not len(key):
        return None
    n_key = int(key["k"].iloc[0])
    picks = {"model": items["curve"] == "model", "empty": items["curve"] == "empty",
             "key": (items["curve"] == curve) & (items["mlps"] == mlps)}
    rand = items[(items["curve"] == "random") & (items["mlps"] == mlps) & (items["k"] == n_key)]
    draws = sorted(rand["seed"].unique())
    wide = pd.concat({name: items[mask].set_index("sample_id")[column] for name, mask in picks.items()}
                     | {f"random{d}": rand[rand["seed"] == d].set_index("sample_id")[column] for d in draws}, axis=1)
    wide = wide.dropna()
    clusters = items.drop_duplicates("sample_id").set_index("sample_id").loc[wide.index, "cluster"]
    point, boot = stats.cluster_resampled_means(wide.to_numpy(float), clusters.to_numpy(), n_boot=n_boot, seed=seed)
    f_point, f_boot = (faithfulness(m, m[:, [0]], m[:, [1]]) for m in (point[None], boot))
    k_low, k_high = stats.percentile_interval(f_boot[:, 2:3], confidence)
    out = {"key": float(f_point[0, 2]), "key_low": float(k_low[0]), "key_high": float(k_high[0]),
           "n_items": len(wide), "n_clusters": int(clusters.nunique()), "draws": len(draws)}
    if not draws:
        return out | {"difference": np.nan, "ci_low": np.nan, "ci_high": np.nan, "random": np.nan}
    diff = lambda f: f[:, 2] - f[:, 3:].mean(1)  # noqa: E731
    low, high = stats.percentile_interval(diff(f_boot)[:, None], confidence)
    return out | {"difference": float(diff(f_point)[0]), "ci_low": float(low[0]), "ci_high": float(high[0]),
                  "random": float(f_point[0, 3:].mean())}


def operator_share(n: int, tasks) -> int:
    """Pairs per operator when a circuit of every operator (the union, the shared circuit) is pruned or scored on `n`
    pairs in all: an equal share of each operator's draw, rounded up. Its verdict reads the pooled row, so it needs
    n pairs in all, not n per operator (four operators' full draws would cost four operators' time)."""
    return -(-int(n) // len(tasks))
