"""From key components to a circuit: how much of the model's behaviour a circuit keeps. Torch-free at import (the
node sets and the statistics; `score_sets` and `teacher_forced_table` run the model).

Faithfulness (Wang et al.). A circuit C is a set of heads and MLPs that is KEPT; every other head and MLP is
ablated. A measure m is taken for the full model M (nothing ablated), the empty circuit (everything ablated) and
each C, on the same validation items, and

    faithfulness(C) = (m(C) - m(empty)) / (m(M) - m(empty)):

1 when C keeps all of the behaviour, 0 when it keeps none. Intervals resample operand pairs (every set on the
same draw, so the ratio stays paired). The verdicts read the teacher-forced protocol (`teacher_forced_table`,
`arithmech.interp.teacher_forcing`); `score_sets` scores greedy answers with END means, for the discover rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from arithmech import stats
from arithmech.interp import protocol
from arithmech.interp.nodes import Head, nodes_text

# The seed offset of the key circuit's layer-matched random draws in the discover rule's scoring (draw d:
# seed * 1000 + KEY_DRAW_OFFSET + d), apart from the discovered circuits' draws.
KEY_DRAW_OFFSET = 700

# measure -> the per-item column it averages
MEASURES = {"full": "full_correct", "logit": "answer_logit", "first": "first_correct"}


@dataclass(frozen=True)
class CircuitSet:
    """One circuit: the heads and MLPs it keeps. curve: model (everything), empty (nothing), key (the key heads),
    top (the top k heads by effect) or random (k heads drawn in the layers of the top k, or of the key heads);
    mlps: which MLPs it keeps (all, key or none); seed: the random draw (-1 otherwise)."""

    curve: str
    mlps: str
    k: int
    seed: int
    heads: tuple[Head, ...]
    mlp_layers: tuple[int, ...]

    def ablated(self, n_layers: int, n_heads: int) -> tuple[list[Head], list[int]]:
        """The heads and MLPs outside the circuit, which mean ablation replaces."""
        kept_h, kept_m = set(self.heads), set(self.mlp_layers)
        heads = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in kept_h]
        return heads, [l for l in range(n_layers) if l not in kept_m]

    def nodes(self) -> str:
        return nodes_text(self.heads, self.mlp_layers)


def key_nodes(key: pd.DataFrame) -> tuple[list[Head], list[int]]:
    """The key heads [(layer, head)] and key MLP layers of a key_components table."""
    heads = key[key["component"] == "head"]
    return ([(int(l), int(h)) for l, h in zip(heads["layer"], heads["head"])],
            [int(l) for l in key.loc[key["component"] == "mlp", "layer"]])


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
        # a set not scored on a measure (all NaN, e.g. not in the END-only decomposition) gets NaN columns
        rows = np.flatnonzero(~np.isnan(matrix).all(1))
        if i_model not in rows or i_empty not in rows:
            raise ValueError(f"faithfulness of {measure!r} needs the model's and the empty set's values")
        point, boot = stats.cluster_resampled_means(matrix[rows].T, clusters, n_boot=n_boot, seed=seed)
        im, ie = int(np.searchsorted(rows, i_model)), int(np.searchsorted(rows, i_empty))
        low, high = stats.percentile_interval(faithfulness(boot, im, ie), confidence)
        for name, v in ((measure, point), (f"faithfulness_{measure}", faithfulness(point[None], im, ie)[0]),
                        (f"faithfulness_{measure}_low", low), (f"faithfulness_{measure}_high", high)):
            table[name] = np.nan
            table.loc[rows, name] = v
    return table


def kept_masks(sets: Sequence[CircuitSet], nodes: Sequence[tuple[int, int]]) -> np.ndarray:
    """Kept masks [len(sets), len(nodes)] of circuit sets over `nodes` (`discovery.all_nodes`: (layer, head),
    then (layer, -1) for the MLPs)."""
    return np.array([[(l, h) in set(s.heads) if h >= 0 else l in set(s.mlp_layers) for l, h in nodes] for s in sets],
                    dtype=bool).reshape(len(sets), len(nodes))


def strict_kinds(sanity: str) -> list[str]:
    """The ablations whose failed teacher-forced sanity check stops a rule: with `circuit.discover.sanity: stop`
    every one (`protocol.KINDS`: the pruning uses one, and the verdicts read both); with `warn` none: a failed check
    is recorded (sanity_<kind>_failed) and makes every verdict row read from that ablation inconclusive, naming it
    (`report.claims.common.failed_checks`)."""
    return list(protocol.KINDS) if sanity == "stop" else []


def teacher_forced_table(lm, scored: pd.DataFrame, pool, sets: Sequence[CircuitSet], *, pool_outputs=None,
                         sanity_draws: int, strict, n_boot: int, seed: int, confidence: float, batch_size: int,
                         positions_sets: Sequence[str] = ("tail", "end"), end_rows: Sequence[int] | None = None,
                         sanity: bool = True, sanity_samples: int | None = None
                         ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every set on the teacher-forced protocol (`teacher_forcing.protocol_scores`: both ablations, END + answer
    positions and END only, every measure) on the pairs `scored`, with values from the identification items
    `pool` (`teacher_forcing.build_items(..., outputs=True)`; pool_outputs: their `tail_outputs`, else computed).
    `sets` holds one 'model' and one 'empty' set; positions_sets: `protocol.POSITIONS` to score (the END-only
    decomposition costs as much again); end_rows: the sets scored END-only (None: all; the others' columns NaN; the
    model and the empty set must be among them for its faithfulness); sanity: False skips the sanity checks (no
    sanity_* columns; for a caller that ran them on the same pairs and pool); sanity_samples: they run on a seeded
    draw of at most this many pairs (`teacher_forcing.protocol_scores`). Returns (table, per_item):
    table: one row per set (in order; `faithfulness_table`'s set columns), columns tf_<kind>_<positions>_<measure>
    (means) and faithfulness_tf_...
    with cluster-bootstrap intervals, tf_n_items (pairs scored), tf_dropped (pairs whose terminator continues the
    number: left out) and the sanity checks' values (sanity_<kind>_<value>, the same on every row);
    per_item: set_index, sample_id and the tf_... values of every set on every scored pair."""
    from arithmech.interp import teacher_forcing as tf
    from arithmech.interp.discovery import all_nodes
    from arithmech.interp.effects import pair_labels

    # outputs: the items' own clean tail outputs from the same forward, for the position-alignment check
    items = tf.build_items(lm, scored, batch_size=batch_size, outputs=sanity)
    masks = kept_masks(sets, all_nodes(lm.n_layers, lm.n_heads))
    values, checks = tf.protocol_scores(lm, items, pool, masks, seed=seed, pool_outputs=pool_outputs,
                                        batch_size=batch_size, sanity_draws=sanity_draws, strict=strict,
                                        positions_sets=positions_sets, end_rows=end_rows, sanity=sanity,
                                        sanity_samples=sanity_samples)
    values = {f"tf_{k}": np.asarray(v, dtype=float) for k, v in values.items()}
    scored_table = faithfulness_table(sets, values, pair_labels(items.table).to_numpy(), n_boot=n_boot, seed=seed,
                                      confidence=confidence)
    table = scored_table.assign(tf_n_items=len(items), tf_dropped=len(items.dropped),
                                **{f"sanity_{k}": v for k, v in checks.items()})
    ids = items.table["sample_id"].to_numpy()
    per_item = pd.DataFrame({"set_index": np.repeat(np.arange(len(sets)), len(ids)),
                             "sample_id": np.tile(ids, len(sets)),
                             **{k: v.reshape(-1) for k, v in values.items()}})
    return table, per_item


TF_COLUMNS = ("tf_", "faithfulness_tf_", "sanity_")  # the prefixes of `teacher_forced_table`'s own columns


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


def faithfulness(means: np.ndarray, i_model: int, i_empty: int) -> np.ndarray:
    """(m(C) - m(empty)) / (m(M) - m(empty)) for every column of means [n_rows, n_sets]; NaN where M = empty."""
    span = means[:, i_model] - means[:, i_empty]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(span[:, None] != 0, (means - means[:, [i_empty]]) / span[:, None], np.nan)


def key_vs_random(items: pd.DataFrame, *, measure: str, mlps: str, n_boot: int, seed: int,
                  confidence: float, curve: str = "key", column: str | None = None) -> dict | None:
    """Faithfulness of the key circuit (or the one circuit of `curve`, e.g. a discovered one) minus the mean
    faithfulness of the layer-matched random circuits of its size (same MLPs), paired on the same items and
    cluster draws. `items`: a per-item table (the discover rule's: curve, mlps, k, seed, sample_id, cluster and
    the MEASURES columns; `column` names another per-item column to use instead of measure's, e.g. a teacher-forced
    one). None
    when the circuit is missing; without random draws (a circuit of more than half the heads has no disjoint random
    circuit of its size) the circuit's own numbers, with NaN for random and the difference and draws 0.
    Returns {difference, ci_low, ci_high, key, key_low, key_high, random, n_items, n_clusters, draws}."""
    column = column or MEASURES[measure]
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
    f_point, f_boot = (faithfulness(m, 0, 1) for m in (point[None], boot))
    k_low, k_high = stats.percentile_interval(f_boot[:, 2:3], confidence)
    out = {"key": float(f_point[0, 2]), "key_low": float(k_low[0]), "key_high": float(k_high[0]),
           "n_items": len(wide), "n_clusters": int(clusters.nunique()), "draws": len(draws)}
    if not draws:
        return out | {"difference": np.nan, "ci_low": np.nan, "ci_high": np.nan, "random": np.nan}
    diff = lambda f: f[:, 2] - f[:, 3:].mean(1)  # noqa: E731
    low, high = stats.percentile_interval(diff(f_boot)[:, None], confidence)
    return out | {"difference": float(diff(f_point)[0]), "ci_low": float(low[0]), "ci_high": float(high[0]),
                  "random": float(f_point[0, 3:].mean())}
