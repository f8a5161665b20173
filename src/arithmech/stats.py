"""Statistics of the results: Wilson intervals for an accuracy, paired comparisons of arms, cluster bootstraps.

A base module (numpy at import), below `interp`, `sft` and `report`, which all use it.

  * `accuracy_interval`: an accuracy and its Wilson score interval (the paper's Table 1).

Every arm (training method) of the fine-tuning study is evaluated on THE SAME test items, so arms are
compared item by item (paired), which removes the item-difficulty variance that two independent samples
would carry. What is computed:

  * `mcnemar_exact`: the exact McNemar test for two paired binary outcomes (one model per arm). Only the
    discordant items count (a right & b wrong: n10; a wrong & b right: n01); under "no difference" n10 is
    Bin(n10 + n01, 1/2), and the two-sided p-value is the exact binomial tail, not the chi-square
    approximation, which is poor when few items are discordant.
  * `ratio_estimate`: a mean, or a ratio of sums (e.g. per-chunk summed KL over per-chunk token counts).
  * `cluster_bootstrap` / `paired_cluster_bootstrap`: percentile intervals that resample CLUSTERS of items
    with replacement. Arithmetic items that share an operand pair are correlated (a model that cannot do
    37 + 58 tends to fail every template of it), so resampling single items would treat correlated items as
    independent evidence and give intervals that are too narrow. For a paired difference the same cluster
    draw is used for both arms, which keeps the pairing inside the bootstrap. The paired bootstrap also
    gives a two-sided p-value from where 0 falls in the bootstrap distribution of the difference.
  * `draw_cluster_counts`: the cluster draws of every resampling here, and of the identification's bootstrap
    (`interp.effects.bootstrap`, through `cluster_resampled_means`).
  * `compare`: one comparison row (difference, interval, p-value and which test gave it).
  * `holm`: Holm-Bonferroni adjustment over a family of comparisons.
  * `normal_quantile`: the two-sided standard normal quantile of a confidence level (normal-theory intervals).

The textbook parts come from statsmodels (Wilson interval, exact McNemar test, Holm's adjustment), imported
inside the functions that use them (importing it takes about a second). What no library does is written here:
the cluster bootstrap (resampling operand pairs, with a ratio of sums and one draw shared by paired arms) and
its p-value; its percentile intervals are numpy's quantiles of the replicates.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


# --------------------------------------------------------------------------------------------------- helpers
def _as_1d_float(values, name: str) -> np.ndarray:
    """`values` as a float array [n]; ValueError if it is not one-dimensional or holds NaNs."""
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    n_nan = int(np.isnan(arr).sum())
    if n_nan:
        raise ValueError(f"{name} holds {n_nan} NaN value(s) of {arr.size}; align the items before comparing")
    return arr


def _check_lengths(**arrays: np.ndarray) -> int:
    """The common length of the named arrays; ValueError naming every length when they differ."""
    lengths = {name: len(arr) for name, arr in arrays.items()}
    if len(set(lengths.values())) != 1:
        listed = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise ValueError(f"length mismatch: {listed}")
    n = next(iter(lengths.values()))
    if n == 0:
        raise ValueError("no items")
    return n


def _as_binary(values, name: str) -> np.ndarray:
    """`values` (bool or 0/1) as a bool array [n]; ValueError for anything else."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype != bool and not _is_binary(arr):
        raise ValueError(f"{name} must hold only booleans or 0/1 values")
    return arr.astype(bool)


def _is_binary(values) -> bool:
    """True when every value is 0 or 1 (bools included)."""
    arr = np.asarray(values)
    return bool(np.isin(arr, (0, 1)).all())


def _cluster_sums(values: np.ndarray, weights: np.ndarray, clusters) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster sums of values and weights, each [n_clusters] (clusters: any labels, [n_items])."""
    _, index = np.unique(np.asarray(clusters), return_inverse=True)
    index = index.reshape(-1)
    n_clusters = int(index.max()) + 1
    return (np.bincount(index, weights=values, minlength=n_clusters),
            np.bincount(index, weights=weights, minlength=n_clusters))


def draw_cluster_counts(n_clusters: int, n_boot: int, seed: int, sampler: str = "indices") -> np.ndarray:
    """How often each cluster is drawn in each bootstrap replicate, [n_boot, n_clusters]: each replicate draws
    n_clusters clusters with replacement (each row sums to n_clusters).

    The two samplers draw from the same distribution but give different counts for one seed: "indices" draws
    the cluster ids (this module's intervals, and through them the circuit's and the study's), "multinomial"
    the counts at once (the identification's bootstrap, `interp.effects.bootstrap`); each caller keeps its
    own so that its results stay as they are.

        >>> draw_cluster_counts(3, 2, seed=0).sum(1).tolist()
        [3, 3]
    """
    rng = np.random.default_rng(seed)
    if sampler == "multinomial":
        return rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot)
    if sampler != "indices":
        raise ValueError(f"sampler must be 'indices' or 'multinomial', got {sampler!r}")
    drawn = rng.integers(0, n_clusters, size=(n_boot, n_clusters))  # cluster ids, one row per replicate
    flat = (drawn + np.arange(n_boot)[:, None] * n_clusters).ravel()
    return np.bincount(flat, minlength=n_boot * n_clusters).reshape(n_boot, n_clusters)


def _boot_ratios(counts: np.ndarray, sum_values: np.ndarray, sum_weights: np.ndarray) -> np.ndarray:
    """Ratio estimate on every bootstrap replicate, [n_boot]; NaN where the drawn weights sum to 0."""
    num = counts @ sum_values
    den = counts @ sum_weights
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1.0), np.nan)


def _percentile_interval(boot: np.ndarray, confidence: float) -> tuple[float, float]:
    """Two-sided percentile interval of the bootstrap replicates [n_boot] (NaN replicates dropped)."""
    low, high = percentile_interval(np.asarray(boot, dtype=float)[:, None], confidence)
    return float(low[0]), float(high[0])


def _check_confidence(confidence: float) -> None:
    """ValueError unless 0 < confidence < 1."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")


def _prepare_weights(weights, n: int) -> np.ndarray:
    """Per-item weights [n] (all ones when None)."""
    if weights is None:
        return np.ones(n)
    w = _as_1d_float(weights, "weights")
    _check_lengths(values=np.empty(n), weights=w)
    return w


# ------------------------------------------------------------------------------------------------ public API
def normal_quantile(confidence: float) -> float:
    """z such that a standard normal lies in [-z, z] with probability `confidence` (1.96 for 0.95)."""
    _check_confidence(confidence)
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def accuracy_interval(correct, confidence: float = 0.95) -> tuple[float, float, float]:
    """(accuracy, low, high): the share of True in `correct` and its Wilson score interval at `confidence`
    (statsmodels' `proportion_confint`, method "wilson"). NaNs for an empty input."""
    from statsmodels.stats.proportion import proportion_confint

    correct = np.asarray(correct, dtype=bool).ravel()
    n = len(correct)
    _check_confidence(confidence)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    low, high = proportion_confint(int(correct.sum()), n, alpha=1 - confidence, method="wilson")
    accuracy = float(correct.mean())
    # the interval holds the estimate: at 0 or n right the Wilson bound is the estimate itself, and 1 - 0.95 in
    # floating point leaves it 5.6e-17 off, which an error bar reads as a negative length
    return accuracy, min(float(low), accuracy), max(float(high), accuracy)


def mcnemar_exact(correct_a, correct_b) -> dict:
    """Exact two-sided McNemar test for paired binary outcomes.

    correct_a, correct_b: bool (or 0/1) arrays [n], the same items in the same order.
    Returns {"n", "n10" (a right & b wrong), "n01" (a wrong & b right), "p_value"}, where
    p = min(1, 2 * P(X <= min(n10, n01))) with X ~ Bin(n10 + n01, 1/2), and p = 1 without discordant pairs
    (statsmodels' `mcnemar`, exact=True). The items are treated as independent.
    """
    from statsmodels.stats.contingency_tables import mcnemar

    a = _as_binary(correct_a, "correct_a")
    b = _as_binary(correct_b, "correct_b")
    if len(a) != len(b):
        raise ValueError(f"length mismatch: correct_a has {len(a)} items, correct_b has {len(b)}")
    n10 = int(np.sum(a & ~b))
    n01 = int(np.sum(~a & b))
    p = float(mcnemar([[0, n10], [n01, 0]], exact=True).pvalue)  # only the discordant cells count
    return {"n": int(len(a)), "n10": n10, "n01": n01, "p_value": p}


def ratio_estimate(values, weights=None) -> float:
    """sum(values) / sum(weights), or mean(values) when weights is None.

    values, weights: arrays [n] (e.g. per-chunk summed KL and per-chunk token counts).
    """
    v = np.asarray(values, dtype=float)
    if weights is None:
        return float(v.mean())
    return float(v.sum() / np.asarray(weights, dtype=float).sum())


def cluster_bootstrap(values, clusters, *, weights=None, n_boot: int = 2000, seed: int = 0,
                      confidence: float = 0.95) -> dict:
    """`ratio_estimate(values, weights)` with a percentile interval from resampling clusters.

    values: [n_items]; clusters: labels [n_items] (items sharing a label are resampled together; a cluster
    drawn twice counts twice); weights: [n_items] or None. Each replicate draws n_clusters clusters with
    replacement; per-cluster sums are computed once, so a replicate is one matrix-vector product.
    Returns {"estimate", "ci_low", "ci_high", "n_items", "n_clusters"}.
    """
    v = _as_1d_float(values, "values")
    n = _check_lengths(values=v, clusters=np.asarray(clusters).reshape(-1))
    w = _prepare_weights(weights, n)
    sum_v, sum_w = _cluster_sums(v, w, clusters)
    counts = draw_cluster_counts(len(sum_v), n_boot, seed)
    low, high = _percentile_interval(_boot_ratios(counts, sum_v, sum_w), confidence)
    return {"estimate": ratio_estimate(v, None if weights is None else w), "ci_low": low, "ci_high": high,
            "n_items": n, "n_clusters": len(sum_v)}


def cluster_resampled_means(values, clusters, *, n_boot: int = 2000, seed: int = 0,
                            sampler: str = "indices") -> tuple[np.ndarray, np.ndarray]:
    """Column means of `values` [n_items, n_columns] and their cluster-bootstrap replicates [n_boot, n_columns]:
    each replicate draws n_clusters clusters with replacement (`draw_cluster_counts` with `sampler`; one draw
    serves every column, so statistics that combine columns, e.g. ratios of differences, stay paired). NaN
    values are not allowed (align first)."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 2:
        raise ValueError(f"values must be [n_items, n_columns]; got shape {v.shape}")
    if np.isnan(v).any():
        raise ValueError("values hold NaN: align the items of every column first")
    labels = np.asarray(clusters).reshape(-1)
    _check_lengths(values=v[:, 0], clusters=labels)
    _, index = np.unique(labels, return_inverse=True)
    n_clusters = int(index.max()) + 1
    sums = np.zeros((n_clusters, v.shape[1]))
    np.add.at(sums, index, v)  # [n_clusters, n_columns]
    sizes = np.bincount(index, minlength=n_clusters).astype(float)
    counts = draw_cluster_counts(n_clusters, n_boot, seed, sampler)  # [n_boot, n_clusters]
    return v.mean(0), (counts @ sums) / (counts @ sizes)[:, None]


def percentile_interval(boot: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Per column, the two-sided percentile interval of bootstrap replicates [n_boot, ...] (NaN replicates
    dropped; NaN where every replicate is NaN)."""
    _check_confidence(confidence)
    alpha = 1.0 - confidence
    boot = np.asarray(boot, dtype=float)
    out = np.full((2, *boot.shape[1:]), np.nan)
    some = ~np.isnan(boot).all(0)
    if some.any():
        out[:, some] = np.nanquantile(boot[:, some], [alpha / 2, 1 - alpha / 2], axis=0)
    return out[0], out[1]


def paired_cluster_bootstrap(values_a, values_b, clusters, *, weights=None, n_boot: int = 2000, seed: int = 0,
                             confidence: float = 0.95) -> dict:
    """Paired difference estimate(a) - estimate(b) on the same items, with a cluster-bootstrap interval.

    values_a, values_b: per-item values of two arms [n_items] (0/1 correctness, or averages over seeds),
    the same items in the same order; clusters: labels [n_items]; weights: [n_items] or None (shared).
    One cluster draw per replicate serves both arms. Two-sided p-value from the replicates d* [n_boot]:
    p = min(1, 2 * (min(#{d* <= 0}, #{d* >= 0}) + 1) / (n_boot + 1)), never 0.
    NaN in either arm raises ValueError (align the items first).
    Returns {"difference", "ci_low", "ci_high", "p_value", "n_items", "n_clusters"}.
    """
    a = _as_1d_float(values_a, "values_a")
    b = _as_1d_float(values_b, "values_b")
    n = _check_lengths(values_a=a, values_b=b, clusters=np.asarray(clusters).reshape(-1))
    w = _prepare_weights(weights, n)
    sum_a, sum_w = _cluster_sums(a, w, clusters)
    sum_b, _ = _cluster_sums(b, w, clusters)
    counts = draw_cluster_counts(len(sum_w), n_boot, seed)
    diffs = _boot_ratios(counts, sum_a, sum_w) - _boot_ratios(counts, sum_b, sum_w)
    low, high = _percentile_interval(diffs, confidence)
    valid = diffs[~np.isnan(diffs)]
    tail = min(int(np.sum(valid <= 0)), int(np.sum(valid >= 0)))
    p = min(1.0, 2.0 * (tail + 1) / (len(valid) + 1))
    w_est = None if weights is None else w
    return {"difference": ratio_estimate(a, w_est) - ratio_estimate(b, w_est), "ci_low": low, "ci_high": high,
            "p_value": p, "n_items": n, "n_clusters": len(sum_w)}


def compare(values_a, values_b, clusters, *, binary: bool, weights=None, n_boot: int = 2000, seed: int = 0,
            confidence: float = 0.95) -> dict:
    """One comparison row of arm a against arm b on the same items.

    values_a, values_b: [n_items]; clusters: labels [n_items]; weights: [n_items] or None.
    The difference and interval come from `paired_cluster_bootstrap`. The p-value comes from
    `mcnemar_exact` when `binary` is True and both arms hold only 0/1 values (one model per arm), else from
    the paired cluster bootstrap. Note: McNemar treats the items as independent (it ignores the clustering),
    whereas the interval resamples clusters; with strongly clustered items the McNemar p can be too small.
    Returns {"difference", "ci_low", "ci_high", "p_value", "test" ("mcnemar_exact" or
    "paired_cluster_bootstrap"), "n10", "n01" (NaN unless McNemar was used), "estimate_a", "estimate_b",
    "n_items", "n_clusters"}.
    """
    row = paired_cluster_bootstrap(values_a, values_b, clusters, weights=weights, n_boot=n_boot, seed=seed,
                                   confidence=confidence)
    row["test"], row["n10"], row["n01"] = "paired_cluster_bootstrap", math.nan, math.nan
    if binary and _is_binary(values_a) and _is_binary(values_b):
        mc = mcnemar_exact(values_a, values_b)
        row.update(test="mcnemar_exact", p_value=mc["p_value"], n10=mc["n10"], n01=mc["n01"])
    row["estimate_a"] = ratio_estimate(values_a, weights)
    row["estimate_b"] = ratio_estimate(values_b, weights)
    return row


def holm(p_values) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values [k], in the input order; monotone, capped at 1, NaNs passed through
    (statsmodels' `multipletests`, method "holm", over the m finite p-values).

    With the m finite p-values sorted ascending, p_(i) (i = 0..m-1) is adjusted to
    max_{j <= i} min(1, (m - j) * p_(j)).
    """
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p_values, dtype=float).reshape(-1)
    out = np.full(p.shape, np.nan)
    finite = ~np.isnan(p)
    if finite.any():
        out[finite] = multipletests(p[finite], method="holm")[1]
    return out
