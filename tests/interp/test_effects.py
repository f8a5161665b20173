"""Tests for arithmech.interp.effects on hand-made tables with hand-computed answers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from arithmech.interp import effects as fx
from arithmech.interp.nodes import node_label
from arithmech.interp.patching import effects_frame
from arithmech.stats import draw_cluster_counts

# ---------------------------------------------------------------------------------------------------
# Helpers

# (logit_o, logit_p of L0H0, L0H1, L0MLP) for three samples
SAMPLES = [(10.0, 9.0, 5.0, 10.0), (20.0, 18.0, 12.0, 22.0), (10.0, 10.0, 6.0, 7.0)]


def _patching() -> pd.DataFrame:
    rows = []
    for s, (o, p0, p1, pm) in enumerate(SAMPLES):
        rows += [(s, 0, 0, "head", o, p0), (s, 0, 1, "head", o, p1), (s, 0, None, "mlp", o, pm)]
    df = pd.DataFrame(rows, columns=["sample_id", "layer", "head", "component", "logit_o", "logit_p"])
    df["head"] = df["head"].astype("Int64")
    # probabilities for prob_change
    df["prob_o"] = [0.5, 0.5, 0.5, 0.4, 0.4, 0.4, 0.6, 0.6, 0.6]
    df["prob_p"] = [0.4, 0.1, 0.5, 0.4, 0.2, 0.6, 0.3, 0.0, 0.6]
    return df.sample(frac=1.0, random_state=0).reset_index(drop=True)  # order must not matter


def _stats(values):
    values = np.asarray(values, dtype=float)
    return values.mean(), (values.std(ddof=1) if len(values) > 1 else 0.0), len(values)


def _effects(values: list[tuple[str, float]]) -> pd.DataFrame:
    """An effects table (as `aggregate` returns) from (node label, mean effect)."""
    layer = [int(n[1 : n.index("H" if "H" in n else "M")]) for n, _ in values]
    head = [None if n.endswith("MLP") else int(n.split("H")[1]) for n, _ in values]
    return pd.DataFrame(
        {
            "node": [n for n, _ in values],
            "layer": layer,
            "head": pd.array(head, dtype="Int64"),
            "component": ["mlp" if h is None else "head" for h in head],
            "mean_effect": [v for _, v in values],
            "std_effect": 0.0,
            "n": 3,
            "metric": "relative_logit",
        }
    )


# ---------------------------------------------------------------------------------------------------
# aggregate


@pytest.mark.parametrize(
    "metric, per_sample",
    [
        ("relative_logit", lambda o, p, po, pp: (p - o) / o),
        ("logit_diff", lambda o, p, po, pp: p - o),
        ("prob_change", lambda o, p, po, pp: pp - po),
    ],
)
def test_aggregate_metrics(metric, per_sample):
    df = _patching()
    out = fx.aggregate(df, metric)
    assert out.columns.tolist() == ["node", "layer", "head", "component", "mean_effect", "std_effect", "n", "metric"]
    assert out["node"].tolist() == ["L0H0", "L0H1", "L0MLP"]  # heads first, then MLPs
    assert out["component"].tolist() == ["head", "head", "mlp"]
    assert out["head"].iloc[:2].tolist() == [0, 1] and pd.isna(out["head"].iloc[2])
    assert (out["metric"] == metric).all()
    by_node = df.sort_values("sample_id")
    for i, (label, head) in enumerate([("L0H0", 0), ("L0H1", 1), ("L0MLP", None)]):
        rows = by_node[by_node["head"].isna()] if head is None else by_node[by_node["head"] == head]
        vals = [per_sample(r.logit_o, r.logit_p, r.prob_o, r.prob_p) for r in rows.itertuples()]
        mean, std, n = _stats(vals)
        got = out.iloc[i]
        assert got["node"] == label
        assert got["mean_effect"] == pytest.approx(mean, abs=1e-12)
        assert got["std_effect"] == pytest.approx(std, abs=1e-12)
        assert got["n"] == n == 3


def test_aggregate_relative_logit_hand_numbers():
    out = fx.aggregate(_patching(), "relative_logit").set_index("node")
    # L0H0: -0.1, -0.1, 0.0 ; L0H1: -0.5, -0.4, -0.4 ; L0MLP: 0.0, 0.1, -0.3
    assert out.loc["L0H0", "mean_effect"] == pytest.approx(-0.2 / 3)
    assert out.loc["L0H1", "mean_effect"] == pytest.approx(-1.3 / 3)
    assert out.loc["L0MLP", "mean_effect"] == pytest.approx(-0.2 / 3)
    # deviations (-0.2/3, 0.1/3, 0.1/3), sample std with ddof=1: sqrt((4 + 1 + 1) / 900 / 2) = sqrt(1/300)
    assert out.loc["L0H1", "std_effect"] == pytest.approx(math.sqrt(1 / 300))
    assert out.loc["L0H0", "std_effect"] == pytest.approx(math.sqrt(1 / 300))
    # L0MLP: mean -0.2/3, deviations (0.2/3, 0.5/3, -0.7/3): sqrt((4 + 25 + 49) / 900 / 2)
    assert out.loc["L0MLP", "std_effect"] == pytest.approx(math.sqrt(78 / 1800))


def test_aggregate_single_sample_std_is_zero_and_layers_sorted():
    df = pd.DataFrame(
        {
            "sample_id": [0, 0, 0, 0],
            "layer": [2, 0, 2, 0],
            "head": pd.array([None, 1, 0, None], dtype="Int64"),
            "component": ["mlp", "head", "head", "mlp"],
            "logit_o": [4.0, 4.0, 4.0, 4.0],
            "logit_p": [3.0, 2.0, 5.0, 4.0],
        }
    )
    out = fx.aggregate(df, "logit_diff")
    assert out["node"].tolist() == ["L0H1", "L2H0", "L0MLP", "L2MLP"]
    assert out["mean_effect"].tolist() == [-2.0, 1.0, 0.0, -1.0]
    assert out["std_effect"].tolist() == [0.0] * 4
    assert out["n"].tolist() == [1] * 4


def test_aggregate_of_effects_frame_from_fake_model():
    """effects_frame -> aggregate: labels and means, with a stand-in model of 2 heads."""
    lm = SimpleNamespace(n_heads=2)
    logit_o = torch.tensor([10.0, 20.0])
    logit_p = torch.tensor([[9.0, 5.0, 11.0, 10.0, 10.0, 10.0], [18.0, 12.0, 22.0, 20.0, 20.0, 16.0]])
    frame = effects_frame(lm, [7, 8], [0, 3], logit_o, logit_p)
    out = fx.aggregate(frame, "relative_logit").set_index("node")
    assert sorted(out.index) == sorted(["L0H0", "L0H1", "L0MLP", "L3H0", "L3H1", "L3MLP"])
    assert out.loc["L0H0", "mean_effect"] == pytest.approx(-0.1)
    assert out.loc["L0H1", "mean_effect"] == pytest.approx(-0.45)
    assert out.loc["L0MLP", "mean_effect"] == pytest.approx(0.1)
    assert out.loc["L3MLP", "mean_effect"] == pytest.approx(-0.1)
    assert out.loc["L3H1", "std_effect"] == 0.0


def test_unknown_metric():
    with pytest.raises(ValueError, match="metric must be one of .*'kl'"):
        fx.aggregate(_patching(), "kl")


def test_prob_change_needs_prob_columns():
    df = _patching().drop(columns=["prob_o", "prob_p"])
    with pytest.raises(ValueError, match="prob_change"):
        fx.aggregate(df, "prob_change")
    # the other metrics do not need them
    assert len(fx.aggregate(df, "logit_diff")) == 3


def test_node_label():
    from arithmech.interp.nodes import nodes_text, parse_nodes

    assert node_label(12, 3) == "L12H3"
    assert node_label(0, 0) == "L0H0"
    assert node_label(5, pd.NA) == "L5MLP"
    assert node_label(5, None) == "L5MLP"
    assert node_label(5, float("nan")) == "L5MLP"
    assert node_label(5, -1) == "L5MLP" and node_label(5) == "L5MLP"  # discovery's MLP node
    assert node_label(np.int64(2), 3.0) == "L2H3"  # a float column's head is still a head number
    heads, mlps = [(3, 2), (0, 1)], [5, 7]
    assert nodes_text(heads, mlps) == "L3H2 L0H1 L5MLP L7MLP" and parse_nodes(nodes_text(heads, mlps)) == (heads, mlps)
    assert nodes_text([]) == "" and parse_nodes("") == ([], [])


def test_relative_logit_leaves_out_nonpositive_logit_o_with_a_warning():
    df = _patching()
    df.loc[df["sample_id"] == 1, "logit_o"] = -20.0  # dividing by it would flip every effect's sign
    df.loc[df["sample_id"] == 2, "logit_o"] = 0.0  # ... or make it infinite
    assert fx.excluded_samples(df, "relative_logit") == [1, 2]
    assert fx.excluded_samples(df, "logit_diff") == []  # the other metrics do not divide by logit_o
    with pytest.warns(UserWarning, match="2 of 3 samples have logit_o <= 0"):
        out = fx.aggregate(df, "relative_logit").set_index("node")
    assert (out["n"] == 1).all()
    assert out.loc["L0H1", "mean_effect"] == pytest.approx(-0.5)  # sample 0 alone
    logit_diff = fx.aggregate(df, "logit_diff").set_index("node")  # no warning, nothing left out
    assert (logit_diff["n"] == 3).all()
    df["logit_o"] = -1.0
    with pytest.raises(ValueError, match="all 3 samples have logit_o <= 0"):
        fx.aggregate(df, "relative_logit")


# ---------------------------------------------------------------------------------------------------
# select


def test_select_threshold_is_strict():
    effects = pd.Series([-0.1, -0.05, -0.04, 0.2, -0.0500001])
    mask = fx.select(effects, {"rule": "threshold", "threshold": -0.05})
    assert mask.tolist() == [True, False, False, False, True]


def test_select_top_k_most_negative_with_stable_ties():
    effects = pd.Series([0.3, -0.2, -0.5, -0.2, 0.1], index=[10, 11, 12, 13, 14])
    mask = fx.select(effects, {"rule": "top_k", "k": 2})
    assert mask.index.tolist() == [10, 11, 12, 13, 14]
    assert mask.tolist() == [False, True, True, False, False]  # -0.5, then the first -0.2
    assert fx.select(effects, {"rule": "top_k", "k": 1}).tolist() == [False, False, True, False, False]


def test_select_top_k_only_negative_ones():
    effects = pd.Series([0.3, -0.2, 0.0, -0.5, 0.1])
    mask = fx.select(effects, {"rule": "top_k", "k": 4})
    assert mask.tolist() == [False, True, False, True, False]
    assert not fx.select(pd.Series([0.0, 0.1]), {"rule": "top_k", "k": 3}).any()


def test_select_relative_hand_computed():
    effects = pd.Series([0.0, 0.01, -0.01, 0.02, -0.02, -0.5])
    # median -0.005; |dev| = .005 .015 .005 .025 .015 .495 -> MAD 0.015; spread = 1.4826 * 0.015 = 0.022239
    spread = 1.4826 * 0.015
    assert fx.select(effects, {"rule": "relative", "z": 3.0}).tolist() == [False] * 5 + [True]  # cut -0.0717
    assert fx.select(effects, {"rule": "relative", "z": 0.5}).tolist() == [False, False, False, False, True, True]
    # a cut between every two neighbouring values, and below them all: exactly the values under the cut
    for z in (0.2, 0.5, 1.0, 3.0, 40.0):
        expected = (effects < -0.005 - z * spread).tolist()
        assert fx.select(effects, {"rule": "relative", "z": z}).tolist() == expected, z
    assert fx.select_rows(effects.to_numpy()[None], {"rule": "relative", "z": 1.0}).tolist() == [
        (effects < -0.005 - spread).tolist()]


def test_select_unknown_rule():
    with pytest.raises(ValueError, match="'best'"):
        fx.select(pd.Series([-1.0]), {"rule": "best"})


@pytest.mark.parametrize("rule", [
    {"rule": "threshold", "threshold": -0.1}, {"rule": "top_k", "k": 3}, {"rule": "relative", "z": 1.0},
])
def test_select_rows_is_select_on_every_row(rule):
    rng = np.random.default_rng(0)
    values = np.round(rng.normal(size=(50, 12)), 1)  # rounded: ties for top_k
    values[3, 4] = np.nan
    got = fx.select_rows(values, rule)
    for row, mask in zip(values, got):
        assert mask.tolist() == fx.select(pd.Series(row), rule).tolist()


# ---------------------------------------------------------------------------------------------------
# bootstrap


def _random_patching(n_samples: int, means: dict, seed: int = 0, sd: float = 1.0) -> pd.DataFrame:
    """A logit_diff patching table: per (layer, head or None) node, effects drawn around its mean."""
    rng = np.random.default_rng(seed)
    rows = [(s, l, h, "mlp" if h is None else "head", 10.0, 10.0 + m + sd * rng.normal())
            for s in range(n_samples) for (l, h), m in means.items()]
    df = pd.DataFrame(rows, columns=["sample_id", "layer", "head", "component", "logit_o", "logit_p"])
    df["head"] = df["head"].astype("Int64")
    return df


HEADS_RULE, MLP_RULE = {"rule": "top_k", "k": 1}, {"rule": "threshold", "threshold": 0.0}


def _boot(df, **kw):
    return fx.bootstrap(df, "logit_diff", HEADS_RULE, MLP_RULE, **kw).set_index("node")


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_samples():
    means = {(0, 0): -1.0, (0, 1): 0.0, (0, None): 0.5}
    widths = []
    for n in (20, 320):
        df = _random_patching(n, means)
        boot, agg = _boot(df, resamples=500, seed=1), fx.aggregate(df, "logit_diff").set_index("node")
        assert list(boot.columns) == ["layer", "head", "component", "ci_low", "ci_high", "stability"]
        assert (boot["ci_low"] < agg["mean_effect"]).all() and (agg["mean_effect"] < boot["ci_high"]).all()
        widths.append((boot["ci_high"] - boot["ci_low"]).to_numpy())
    # sd 1: a 95% interval of the mean is about 2 * 1.96 / sqrt(n) wide, 4 times narrower for 16 times the samples
    assert widths[0] == pytest.approx(2 * 1.96 / np.sqrt(20), rel=0.3)  # n = 20: the sample sd varies
    assert widths[1] == pytest.approx(2 * 1.96 / np.sqrt(320), rel=0.15)
    assert (widths[1] < widths[0] / 2.5).all()


def test_bootstrap_resamples_clusters_as_units():
    df = _random_patching(30, {(0, 0): -1.0, (0, None): 0.5})
    copies = pd.concat([df, df.assign(sample_id=df["sample_id"] + 1000)], ignore_index=True)
    same = {s: s % 1000 for s in copies["sample_id"].unique()}  # each sample and its copy: one cluster
    base = _boot(df, seed=3)
    clustered = _boot(copies, clusters=same, seed=3)
    # the same draws of the same clusters: the same interval, not a narrower one
    np.testing.assert_allclose(clustered[["ci_low", "ci_high"]], base[["ci_low", "ci_high"]], rtol=1e-12)
    apart = _boot(copies, seed=3)  # each copy its own cluster: twice the evidence, a narrower interval
    assert ((apart["ci_high"] - apart["ci_low"]) < 0.8 * (base["ci_high"] - base["ci_low"])).all()
    with pytest.raises(ValueError, match="30 sample ids have no cluster"):
        _boot(copies, clusters={s: 0 for s in range(30)})


def test_bootstrap_stability():
    means = {(0, 0): -5.0, (0, 1): 0.0, (0, 2): 0.1, (0, 3): 5.0, (1, 0): -0.05, (1, 1): 0.05,
             (0, None): -3.0, (1, None): 3.0}
    boot = fx.bootstrap(_random_patching(40, means, sd=0.5), "logit_diff", {"rule": "top_k", "k": 2}, MLP_RULE,
                        seed=0).set_index("node")
    assert boot.loc["L0H0", "stability"] == 1.0  # far below every other head: always in the top 2
    assert boot.loc["L0H3", "stability"] == 0.0  # far above: never
    # the second place goes to one of the four heads near 0, when that one is negative: each only sometimes
    close = boot.loc[["L1H0", "L0H1", "L1H1", "L0H2"], "stability"]
    assert 0.9 < close.sum() <= 1.0 and (close > 0).all() and (close < 1).all()
    assert boot.loc["L0MLP", "stability"] == 1.0 and boot.loc["L1MLP", "stability"] == 0.0  # threshold 0


def test_bootstrap_matches_a_slow_loop_over_resamples():
    means = {(0, 0): -0.3, (0, 1): -0.2, (0, 2): 0.1, (1, 0): -0.25, (0, None): -0.1, (1, None): 0.05}
    df = _random_patching(9, means, seed=5)
    clusters = {s: s // 2 for s in range(9)}  # pairs of samples, one cluster of one: uneven sizes
    heads, mlps = {"rule": "relative", "z": 0.5}, {"rule": "top_k", "k": 1}
    got = fx.bootstrap(df, "relative_logit", heads, mlps, clusters=clusters, resamples=200, confidence=0.8,
                       seed=11).set_index("node")
    counts = draw_cluster_counts(5, 200, seed=11, sampler="multinomial")  # the same draws
    df = df.assign(effect=(df["logit_p"] - df["logit_o"]) / df["logit_o"],
                   node=[node_label(l, h) for l, h in zip(df["layer"], df["head"])])
    means_b, chosen = [], []
    for row in counts:
        drawn = [s for s in range(9) for _ in range(row[clusters[s]])]  # every sample of a drawn cluster
        sample = pd.concat([df[df["sample_id"] == s] for s in drawn])
        mean = sample.groupby("node")["effect"].mean()
        means_b.append(mean)
        component = pd.Series({n: "mlp" if n.endswith("MLP") else "head" for n in mean.index})
        chosen.append(pd.concat([fx.select(mean[component == "head"], heads),
                                 fx.select(mean[component == "mlp"], mlps)]))
    means_b, chosen = pd.DataFrame(means_b), pd.DataFrame(chosen)
    np.testing.assert_allclose(got["ci_low"], means_b.quantile(0.1)[got.index], rtol=1e-10)
    np.testing.assert_allclose(got["ci_high"], means_b.quantile(0.9)[got.index], rtol=1e-10)
    np.testing.assert_allclose(got["stability"], chosen.mean()[got.index], rtol=1e-12)
    assert 0 < got["stability"].min() < 1 or 0 < got["stability"].max() < 1  # not all certain


# ---------------------------------------------------------------------------------------------------
# key_components


def test_key_components_rank_and_share():
    effects = _effects(
        [("L0H0", -0.06), ("L0H1", 0.2), ("L1H0", -0.3), ("L1H1", -0.01), ("L2H0", -0.1), ("L2H1", 0.0),
         ("L0MLP", -0.02), ("L1MLP", -0.4), ("L2MLP", -0.5)]
    )
    key = fx.key_components(effects, {"rule": "threshold", "threshold": -0.05}, {"rule": "top_k", "k": 1})
    assert key["node"].tolist() == ["L1H0", "L2H0", "L0H0", "L2MLP"]
    assert key["rank"].tolist() == [1, 2, 3, 1]
    assert key["component"].tolist() == ["head"] * 3 + ["mlp"]
    assert key["rule"].tolist() == ["mean effect < -0.05"] * 3 + ["top 1 most negative"]
    assert (key["share_key_heads"] == 3 / 6).all()
    assert (key["n_heads_total"] == 6).all()
    assert {"mean_effect", "std_effect", "n", "metric", "layer", "head"} <= set(key.columns)


def test_key_components_none_selected():
    effects = _effects([("L0H0", 0.1), ("L0H1", 0.2), ("L0MLP", 0.3)])
    key = fx.key_components(effects, {"rule": "threshold", "threshold": -0.05}, {"rule": "relative", "z": 3.0})
    assert len(key) == 0


def test_key_components_relative_rule_description():
    effects = _effects([("L0H0", -0.9), ("L0H1", 0.0), ("L0H2", 0.01), ("L0H3", -0.01), ("L0MLP", -0.2)])
    key = fx.key_components(effects, {"rule": "relative", "z": 2.0}, {"rule": "threshold", "threshold": -0.1})
    assert key["node"].tolist() == ["L0H0", "L0MLP"]
    assert key["rule"].tolist() == ["mean effect < median - 2.0 x 1.4826 MAD", "mean effect < -0.1"]
    assert key["share_key_heads"].tolist() == [0.25, 0.25]


# ---------------------------------------------------------------------------------------------------
# shared_summary


def _two_tasks(with_mlp_shared: bool = False):
    rule = {"rule": "threshold", "threshold": -0.05}
    e_add = _effects([("L0H0", -0.3), ("L0H1", -0.01), ("L1H0", -0.2), ("L1H1", 0.1),
                      ("L0MLP", -0.4 if with_mlp_shared else 0.0), ("L1MLP", -0.01)])
    e_sub = _effects([("L0H0", -0.1), ("L0H1", -0.02), ("L1H0", -0.01), ("L1H1", -0.5),
                      ("L0MLP", -0.3), ("L1MLP", 0.0)])
    effects = {"addition": e_add, "subtraction": e_sub}
    keys = {t: fx.key_components(e, rule, rule) for t, e in effects.items()}
    return effects, keys


def test_shared_summary_columns_and_values():
    effects, keys = _two_tasks()
    out = fx.shared_summary(effects, keys)
    assert out.columns.tolist() == [
        "node", "layer", "head", "component", "n_tasks", "tasks",
        "effect_addition", "key_addition", "effect_subtraction", "key_subtraction",
    ]
    rows = out.set_index("node")
    # L0H1 and L1MLP are key for no task: not listed
    assert set(rows.index) == {"L0H0", "L1H0", "L1H1", "L0MLP"}
    assert rows.loc["L0H0", "n_tasks"] == 2 and rows.loc["L0H0", "tasks"] == "addition,subtraction"
    assert rows.loc["L1H0", "n_tasks"] == 1 and rows.loc["L1H0", "tasks"] == "addition"
    assert rows.loc["L1H1", "tasks"] == "subtraction" and rows.loc["L0MLP", "tasks"] == "subtraction"
    assert rows.loc["L1H1", "effect_addition"] == pytest.approx(0.1)
    assert rows.loc["L1H1", "effect_subtraction"] == pytest.approx(-0.5)
    assert rows.loc["L1H0", "effect_subtraction"] == pytest.approx(-0.01)
    assert rows["key_addition"].to_dict() == {"L0H0": True, "L1H0": True, "L1H1": False, "L0MLP": False}
    assert rows["key_subtraction"].to_dict() == {"L0H0": True, "L1H0": False, "L1H1": True, "L0MLP": True}
    assert rows.loc["L1H0", "layer"] == 1 and rows.loc["L1H0", "head"] == 0
    assert pd.isna(rows.loc["L0MLP", "head"]) and rows.loc["L0MLP", "component"] == "mlp"


def test_shared_summary_ordering_within_heads():
    effects, keys = _two_tasks()
    out = fx.shared_summary(effects, keys)
    heads = out[out["component"] == "head"]
    # most shared first, then by mean effect over tasks: L1H1 (0.1-0.5)/2=-0.2 before L1H0 (-0.2-0.01)/2
    assert heads["node"].tolist() == ["L0H0", "L1H1", "L1H0"]
    assert heads["n_tasks"].tolist() == [2, 1, 1]


def test_shared_summary_most_shared_first_across_components():
    effects, keys = _two_tasks(with_mlp_shared=True)
    out = fx.shared_summary(effects, keys)
    assert out.set_index("node").loc["L0MLP", "n_tasks"] == 2
    assert out["n_tasks"].is_monotonic_decreasing, out[["node", "n_tasks"]].to_string()


def test_shared_summary_single_task_key_table_empty_for_other():
    effects, keys = _two_tasks()
    keys = {"addition": keys["addition"], "subtraction": keys["subtraction"].iloc[0:0]}
    out = fx.shared_summary(effects, keys)
    assert out["node"].tolist() == ["L0H0", "L1H0"]
    assert (out["tasks"] == "addition").all()
    assert not out["key_subtraction"].any()


def test_shared_summary_node_missing_from_one_task():
    rule = {"rule": "threshold", "threshold": -0.05}
    e_a = _effects([("L0H0", -0.3), ("L0H1", -0.2), ("L0MLP", 0.0)])
    e_b = _effects([("L0H0", -0.3), ("L0MLP", 0.0)])  # no L0H1 (e.g. patched on other layers)
    keys = {"a": fx.key_components(e_a, rule, rule), "b": fx.key_components(e_b, rule, rule)}
    out = fx.shared_summary({"a": e_a, "b": e_b}, keys).set_index("node")
    assert out.loc["L0H1", "n_tasks"] == 1
    assert out.loc["L0H1", "tasks"] == "a"
    assert not out.loc["L0H1", "key_b"]


def test_rank_across_tasks_averages_effects():
    from arithmech.interp.nodes import rank_across_tasks

    def frame(values):
        return pd.DataFrame({"node": ["L0H0", "L0H1", "L1H0", "L0MLP"], "layer": [0, 0, 1, 0], "head": [0, 1, 0, None],
                             "component": ["head", "head", "head", "mlp"], "mean_effect": values})

    ranked = rank_across_tasks({"a": frame([-0.1, -0.3, 0.0, -1.0]), "b": frame([-0.3, 0.0, 0.1, -2.0])}, "head")
    assert list(ranked["node"]) == ["L0H0", "L0H1", "L1H0"]
    assert ranked["mean_effect"].tolist() == pytest.approx([-0.2, -0.15, 0.05])
    assert ranked[["layer", "head"]].values.tolist() == [[0, 0], [0, 1], [1, 0]]
    assert rank_across_tasks({"a": frame([0, 0, 0, -1.0])}, "mlp")["node"].tolist() == ["L0MLP"]


def test_a_nan_reference_logit_is_named_where_it_is():
    """A NaN reference logit (logit_o of sample 3) and an infinite patched one (sample 5 at L1H0): the error names
    each sample, its operand pair and the node, in the bootstrap, the aggregate and the stage's own check; before,
    the bootstrap said the table "lacks some (sample, node) rows" and the aggregate gave a NaN mean."""
    df = _random_patching(8, {(0, 0): -1.0, (1, 0): 0.0, (0, None): 0.5})
    df.loc[df["sample_id"] == 3, "logit_o"] = np.nan
    df.loc[(df["sample_id"] == 5) & (df["layer"] == 1), "logit_p"] = np.inf
    for compute in (lambda: _boot(df), lambda: fx.aggregate(df, "logit_diff")):
        with pytest.raises(ValueError) as err:
            compute()
        assert "lacks some" not in str(err.value)
        assert "sample 3 (every node): logit_o = nan" in str(err.value)
        assert "sample 5, node L1H0: logit_p = inf" in str(err.value)
    with pytest.raises(ValueError, match=r"addition: non-finite .*sample 3 \(operands 4,7\) \(every node\)"):
        fx.check_finite(df, "addition", fx.pair_labels(pd.DataFrame({"sample_id": [3], "a": [4], "b": [7]})))
