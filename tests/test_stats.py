"""Paired statistics: exact McNemar, ratio estimates, cluster bootstrap, paired comparisons, Holm, and the
textbook parts against a second library (scipy) or exact arithmetic."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest
from scipy import stats as scipy_stats

from arithmech.stats import (
    accuracy_interval,
    cluster_bootstrap,
    compare,
    holm,
    mcnemar_exact,
    normal_quantile,
    paired_cluster_bootstrap,
    percentile_interval,
    ratio_estimate,
)
from helpers import ROOT


def _paired_outcomes(n10: int, n01: int, n11: int = 0, n00: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Bool arrays a, b [n] with the requested cell counts (shuffled with a fixed seed)."""
    a = np.array([1] * n10 + [0] * n01 + [1] * n11 + [0] * n00, dtype=bool)
    b = np.array([0] * n10 + [1] * n01 + [1] * n11 + [0] * n00, dtype=bool)
    perm = np.random.default_rng(1).permutation(len(a))
    return a[perm], b[perm]


# ------------------------------------------------------------------------------------------------ McNemar
def test_mcnemar_hand_computed():
    a, b = _paired_outcomes(8, 2, n11=30, n00=5)
    out = mcnemar_exact(a, b)
    assert (out["n"], out["n10"], out["n01"]) == (45, 8, 2)
    expected = 2 * sum(math.comb(10, k) for k in range(3)) / 2**10
    assert expected == 0.109375
    assert out["p_value"] == pytest.approx(0.109375, rel=1e-12)
    # n10=5, n01=0: p = 2 / 2^5
    assert mcnemar_exact(*_paired_outcomes(5, 0))["p_value"] == pytest.approx(2 / 32, rel=1e-12)


def test_mcnemar_symmetric_and_identical_arms():
    a, b = _paired_outcomes(13, 4, n11=20, n00=9)
    ab, ba = mcnemar_exact(a, b), mcnemar_exact(b, a)
    assert (ab["n10"], ab["n01"]) == (ba["n01"], ba["n10"])
    assert ab["p_value"] == ba["p_value"]
    assert mcnemar_exact(a, a)["p_value"] == 1.0
    assert mcnemar_exact(*_paired_outcomes(7, 7))["p_value"] == 1.0  # balanced discordance: capped at 1
    assert mcnemar_exact(a.astype(int), b.astype(int)) == ab  # 0/1 ints work too


def test_mcnemar_large_n_matches_normal_approximation():
    out = mcnemar_exact(*_paired_outcomes(600, 500, n11=3000, n00=1000))
    z = (600 - 500) / math.sqrt(1100)
    normal_p = 2 * (1 - NormalDist().cdf(z))
    assert math.isfinite(out["p_value"]) and 0 < out["p_value"] < 0.01
    assert normal_p / 1.5 < out["p_value"] < normal_p * 1.5


def test_mcnemar_p_is_the_exact_binomial_tail_at_any_size():
    """p = 2 * P(X <= k), X ~ Bin(m, 1/2), summed in exact rationals, to 1e-13 relative: also past 1000
    discordant pairs, where a tail summed in log space is off by up to ~6e-12."""
    for m, k in [(1, 0), (10, 2), (999, 430), (1000, 500), (1001, 480), (1200, 550), (2000, 900), (5000, 2400)]:
        exact = min(Fraction(1), Fraction(2 * sum(math.comb(m, j) for j in range(k + 1)), 2**m))
        out = mcnemar_exact(*_paired_outcomes(k, m - k, n11=3))
        assert out["p_value"] == pytest.approx(float(exact), rel=1e-13, abs=0), (m, k)


def test_mcnemar_length_mismatch():
    with pytest.raises(ValueError, match=r"5.*4"):
        mcnemar_exact(np.ones(5, bool), np.ones(4, bool))
    with pytest.raises(ValueError):
        mcnemar_exact([0.5, 1.0], [1.0, 0.0])


# ------------------------------------------------------------------------------------------ Wilson, z
def test_accuracy_interval_is_scipys_wilson_interval():
    """The Wilson score interval without continuity correction, as scipy's binomtest computes it (a second
    implementation beside statsmodels'), at the edges (0 and n right) and inside."""
    for n, k in [(1, 0), (1, 1), (10, 0), (10, 8), (10, 10), (37, 5), (500, 213), (2000, 1999)]:
        for confidence in (0.8, 0.95, 0.99):
            acc, low, high = accuracy_interval([True] * k + [False] * (n - k), confidence)
            ci = scipy_stats.binomtest(k, n).proportion_ci(confidence, method="wilson")
            assert acc == k / n
            assert (low, high) == pytest.approx((ci.low, ci.high), rel=1e-12, abs=1e-15), (n, k, confidence)


def test_normal_quantile():
    for confidence in (0.5, 0.6, 0.9, 0.95, 0.99):
        assert normal_quantile(confidence) == pytest.approx(scipy_stats.norm.ppf(0.5 + confidence / 2), rel=1e-14)
    assert normal_quantile(0.95) == pytest.approx(1.959964, abs=1e-6)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="confidence"):
            normal_quantile(bad)


# ------------------------------------------------------------------------------------------ ratio estimate
def test_ratio_estimate():
    assert ratio_estimate([1.0, 2.0, 6.0]) == pytest.approx(3.0)
    assert ratio_estimate([2.0, 6.0], weights=[1.0, 3.0]) == pytest.approx(2.0)
    assert ratio_estimate([4.0, 6.0], weights=[1.0, 4.0]) == pytest.approx(2.0)  # mean of ratios would be 2.75


# ---------------------------------------------------------------------------------------- cluster bootstrap
def test_cluster_bootstrap_contains_estimate_and_matches_binomial_width():
    rng = np.random.default_rng(0)
    n = 500
    values = (rng.random(n) < 0.3).astype(float)
    out = cluster_bootstrap(values, np.arange(n), n_boot=2000, seed=0)
    assert out["estimate"] == pytest.approx(values.mean())
    assert out["ci_low"] <= out["estimate"] <= out["ci_high"]
    assert (out["n_items"], out["n_clusters"]) == (n, n)
    p = values.mean()
    normal_width = 2 * NormalDist().inv_cdf(0.975) * math.sqrt(p * (1 - p) / n)
    width = out["ci_high"] - out["ci_low"]
    assert 0.75 * normal_width < width < 1.25 * normal_width


def test_cluster_bootstrap_duplicates_within_cluster_change_nothing():
    rng = np.random.default_rng(3)
    n = 400
    values = (rng.random(n) < 0.4).astype(float)
    clusters = np.arange(n)
    base = cluster_bootstrap(values, clusters, seed=7)
    dup_values, dup_clusters = np.repeat(values, 5), np.repeat(clusters, 5)
    within = cluster_bootstrap(dup_values, dup_clusters, seed=7)
    assert within["n_items"] == 5 * n and within["n_clusters"] == n
    for key in ("estimate", "ci_low", "ci_high"):
        assert within[key] == pytest.approx(base[key], abs=1e-12)
    # treating the duplicates as independent clusters wrongly narrows the interval by about sqrt(5)
    naive = cluster_bootstrap(dup_values, np.arange(5 * n), seed=7)
    ratio = (base["ci_high"] - base["ci_low"]) / (naive["ci_high"] - naive["ci_low"])
    assert 1.8 <= ratio <= 2.8


def test_cluster_bootstrap_weights_are_a_ratio_of_sums():
    kl = np.array([1.0, 4.0, 9.0, 2.0])
    tokens = np.array([1.0, 2.0, 3.0, 2.0])
    out = cluster_bootstrap(kl, ["x", "x", "y", "z"], weights=tokens, n_boot=500)
    assert out["estimate"] == pytest.approx(16.0 / 8.0)
    assert out["n_clusters"] == 3
    assert out["ci_low"] <= out["estimate"] <= out["ci_high"]


# scipy.stats.bootstrap (1.17) draws its resamples as rng.integers(0, n, (n_resamples, n)) from the Generator it is
# given, as draw_cluster_counts("indices") does, and takes linear quantiles as numpy does: with the same seed both
# resample the same units, so their percentile intervals agree to rounding. Should scipy change how it draws, these
# tests fail together; compare distributions instead then (the binomial-width test above).
def _scipy_percentile_interval(data, statistic, *, paired=False, n_boot, seed):
    res = scipy_stats.bootstrap(data, statistic, paired=paired, n_resamples=n_boot, method="percentile",
                                rng=np.random.default_rng(seed))
    return res.confidence_interval.low, res.confidence_interval.high


def test_cluster_bootstrap_with_one_item_per_cluster_is_scipys_percentile_bootstrap():
    values = (np.random.default_rng(0).random(300) < 0.3).astype(float)
    out = cluster_bootstrap(values, np.arange(300), n_boot=1000, seed=5)
    lib = _scipy_percentile_interval((values,), np.mean, n_boot=1000, seed=5)
    assert (out["ci_low"], out["ci_high"]) == pytest.approx(lib, rel=1e-12)


def test_cluster_bootstrap_is_scipys_bootstrap_of_clusters():
    """Clusters with weights: scipy resampling the clusters (in np.unique's order) with the ratio of the drawn
    clusters' summed values over their summed weights as the statistic."""
    rng = np.random.default_rng(1)
    values, weights, clusters = rng.normal(size=300), rng.random(300) + 0.5, rng.integers(0, 40, 300)
    out = cluster_bootstrap(values, clusters, weights=weights, n_boot=1000, seed=7)
    _, index = np.unique(clusters, return_inverse=True)
    sum_values, sum_weights = np.bincount(index, values), np.bincount(index, weights)

    def ratio(drawn, axis=-1):
        return sum_values[drawn].sum(axis) / sum_weights[drawn].sum(axis)

    lib = _scipy_percentile_interval((np.arange(len(sum_values)),), ratio, n_boot=1000, seed=7)
    assert out["n_clusters"] == 40
    assert (out["ci_low"], out["ci_high"]) == pytest.approx(lib, rel=1e-12)


def test_paired_bootstrap_with_one_item_per_cluster_is_scipys_paired_bootstrap():
    rng = np.random.default_rng(2)
    a, b = (rng.random(300) < 0.6).astype(float), (rng.random(300) < 0.5).astype(float)
    out = paired_cluster_bootstrap(a, b, np.arange(300), n_boot=1000, seed=3)

    def difference(x, y, axis=-1):
        return x.mean(axis) - y.mean(axis)

    lib = _scipy_percentile_interval((a, b), difference, paired=True, n_boot=1000, seed=3)
    assert (out["ci_low"], out["ci_high"]) == pytest.approx(lib, rel=1e-12, abs=1e-15)


def test_percentile_interval_per_column():
    boot = np.column_stack([np.arange(101.0), np.full(101, np.nan), np.r_[np.nan, np.arange(100.0)]])
    low, high = percentile_interval(boot, 0.9)
    np.testing.assert_allclose(low, [5.0, np.nan, np.quantile(np.arange(100.0), 0.05)])
    np.testing.assert_allclose(high, [95.0, np.nan, np.quantile(np.arange(100.0), 0.95)])
    with pytest.raises(ValueError, match="confidence"):
        percentile_interval(boot, 1.0)


# ------------------------------------------------------------------------------------------ paired bootstrap
def _clustered_arms(n_clusters: int = 100, per_cluster: int = 4, acc_a: float = 0.8, acc_b: float = 0.5):
    """Correlated per-item 0/1 outcomes of two arms and cluster labels, each [n_clusters * per_cluster]."""
    rng = np.random.default_rng(11)
    clusters = np.repeat(np.arange(n_clusters), per_cluster)
    u = rng.random(len(clusters))
    return (u < acc_a).astype(float), (u < acc_b).astype(float), clusters


def test_paired_bootstrap_detects_clear_effect():
    a, b, clusters = _clustered_arms()
    out = paired_cluster_bootstrap(a, b, clusters, n_boot=2000, seed=0)
    assert out["difference"] == pytest.approx(a.mean() - b.mean(), abs=1e-15)
    assert out["ci_low"] <= out["difference"] <= out["ci_high"]
    assert out["ci_low"] > 0
    assert out["p_value"] < 0.01
    assert out["p_value"] > 0  # (count + 1) / (n_boot + 1) form
    assert (out["n_items"], out["n_clusters"]) == (400, 100)


def test_paired_bootstrap_no_effect_for_equal_accuracy():
    _, b, clusters = _clustered_arms()
    a = np.random.default_rng(5).permutation(b)  # same accuracy, different items
    out = paired_cluster_bootstrap(a, b, clusters, seed=0)
    assert out["difference"] == 0.0
    assert out["p_value"] > 0.2
    assert out["ci_low"] < 0 < out["ci_high"]


def test_paired_bootstrap_same_seed_is_deterministic():
    a, b, clusters = _clustered_arms(acc_a=0.6, acc_b=0.55)
    first = paired_cluster_bootstrap(a, b, clusters, seed=4)
    assert paired_cluster_bootstrap(a, b, clusters, seed=4) == first
    assert paired_cluster_bootstrap(a, b, clusters, seed=5) != first


def test_paired_bootstrap_rejects_nan_and_length_mismatch():
    a, b, clusters = _clustered_arms()
    bad = a.copy()
    bad[[3, 9]] = np.nan
    with pytest.raises(ValueError, match="2 NaN"):
        paired_cluster_bootstrap(bad, b, clusters)
    with pytest.raises(ValueError, match="2 NaN"):
        paired_cluster_bootstrap(a, bad, clusters)
    with pytest.raises(ValueError, match="400.*399"):
        paired_cluster_bootstrap(a, b[:-1], clusters)
    with pytest.raises(ValueError):
        paired_cluster_bootstrap(a, b, clusters[:-1])


# ------------------------------------------------------------------------------------------------- compare
def test_compare_picks_the_test():
    a, b, clusters = _clustered_arms(acc_a=0.7, acc_b=0.6)
    row = compare(a, b, clusters, binary=True, n_boot=500)
    mc = mcnemar_exact(a, b)
    assert row["test"] == "mcnemar_exact"
    assert (row["n10"], row["n01"], row["p_value"]) == (mc["n10"], mc["n01"], mc["p_value"])
    assert row["difference"] == pytest.approx(a.mean() - b.mean())
    assert row["estimate_a"] == pytest.approx(a.mean())

    boot = paired_cluster_bootstrap(a, b, clusters, n_boot=500)
    not_binary = compare(a, b, clusters, binary=False, n_boot=500)
    assert not_binary["test"] == "paired_cluster_bootstrap"
    assert not_binary["p_value"] == boot["p_value"]
    assert math.isnan(not_binary["n10"]) and math.isnan(not_binary["n01"])

    seed_mean = (a + np.roll(a, 1)) / 2  # averages over seeds hold 0.5: no McNemar even with binary=True
    averaged = compare(seed_mean, b, clusters, binary=True, n_boot=500)
    assert averaged["test"] == "paired_cluster_bootstrap"
    assert math.isnan(averaged["n10"])


# ---------------------------------------------------------------------------------------------------- Holm
def test_holm_hand_example():
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(holm([0.5, 0.01, 0.02, 0.9]),
                               [1.0, 0.04, 0.06, 1.0])  # 0.5 * 2 = 1.0; 0.9 * 1 lifted to 1.0


def test_holm_ties_empty_and_all_nan():
    np.testing.assert_allclose(holm([0.01, 0.01, 0.04]), [0.03, 0.03, 0.04])  # tied p-values share one adjusted p
    assert holm([]).shape == (0,)
    assert np.isnan(holm([np.nan, np.nan])).all()


def test_holm_passes_nans_through_and_is_monotone():
    out = holm([0.02, np.nan, 0.01])
    assert math.isnan(out[1])
    np.testing.assert_allclose(out[[0, 2]], [0.02, 0.02])  # m = 2 finite p-values
    p = np.random.default_rng(2).random(20) ** 3
    adj = holm(p)
    order = np.argsort(p)
    assert np.all(np.diff(adj[order]) >= 0) and np.all(adj >= p) and np.all(adj <= 1)


def test_importing_the_statistics_loads_no_scipy():
    """statsmodels and scipy take about a second to import: only the functions that use them import them."""
    probe = ("import sys, arithmech.stats, arithmech.report.claims.registry, arithmech.interp.protocol; "
             "print(sorted({'scipy', 'statsmodels'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("confidence", [0.95, 0.9, 0.99])
@pytest.mark.parametrize("n", [1, 3, 30])
def test_accuracy_interval_holds_its_estimate_at_none_and_all_right(n, confidence):
    """At 0 or n right the interval's bound is the estimate exactly (an error bar of accuracy - low must not be
    negative: with 1 - 0.95 in floating point the library's lower bound at 0 right is 5.6e-17)."""
    for correct in (np.zeros(n, dtype=bool), np.ones(n, dtype=bool)):
        acc, low, high = accuracy_interval(correct, confidence)
        assert low <= acc <= high and (low == 0.0 if acc == 0 else high == 1.0)
