"""Tests for arithmech.interp.sufficiency (torch-free): the circuits' node sets, faithfulness with its intervals, the
key circuit against random ones, and the edge decomposition; and the circuit and edges stages on the tiny model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from arithmech.interp import sufficiency
from arithmech.interp.nodes import layer_matched_heads

N_LAYERS, N_HEADS = 4, 6
RANKED = [(l, h) for h in reversed(range(N_HEADS)) for l in reversed(range(N_LAYERS))]  # L3H5 L2H5 ... L0H0
KEY = RANKED[:3]


def _sets(**kw):
    args = {"ranked_heads": RANKED, "key_heads": KEY, "key_mlps": [2, 3], "n_layers": N_LAYERS, "n_heads": N_HEADS,
            "grid": [2, 5, 99], "draws": 4, "band_draws": 2, "seed": 0}
    return sufficiency.circuit_sets(**(args | kw))


def test_circuit_sets():
    sets = _sets()
    by = lambda curve, mlps=None: [s for s in sets if s.curve == curve and (mlps is None or s.mlps == mlps)]  # noqa: E731
    (model,), (empty,) = by("model"), by("empty")
    assert model.ablated(N_LAYERS, N_HEADS) == ([], []) and len(model.heads) == N_LAYERS * N_HEADS
    heads, mlps = empty.ablated(N_LAYERS, N_HEADS)
    assert len(heads) == N_LAYERS * N_HEADS and mlps == list(range(N_LAYERS))
    key_key, key_all = by("key", "key")[0], by("key", "all")[0]
    assert key_key.heads == tuple(KEY) and key_key.mlp_layers == (2, 3) and key_all.mlp_layers == (0, 1, 2, 3)
    kept_h, kept_m = key_key.ablated(N_LAYERS, N_HEADS)
    assert set(kept_h) == {(l, h) for l in range(N_LAYERS) for h in range(N_HEADS)} - set(KEY) and kept_m == [0, 1]
    assert key_key.nodes() == "L3H5 L2H5 L1H5 L2MLP L3MLP"
    # the key circuit's random draws: as many heads, in the same layers, none a key head; the same draw with
    # either MLP choice
    at_key = [s for s in sets if s.curve == "random" and s.k == len(KEY)]
    assert sorted((s.seed, s.mlps) for s in at_key) == [(d, m) for d in range(4) for m in ("all", "key")]
    for d in range(4):
        drawn = {s.mlps: s.heads for s in at_key if s.seed == d}
        assert drawn["key"] == drawn["all"] == tuple(layer_matched_heads(KEY, N_HEADS, seed=700 + d, n_layers=N_LAYERS))
        assert sorted(l for l, _ in drawn["key"]) == sorted(l for l, _ in KEY) and not set(drawn["key"]) & set(KEY)
    # the curves: k = 0, the grid (capped at all heads) and all heads, with either MLP choice
    assert sorted({s.k for s in by("top")}) == [0, 2, 5, 24]
    assert all(s.heads == tuple(RANKED[: s.k]) for s in by("top"))
    # the band: band_draws at every grid k up to half the heads, but the key size (drawn above)
    band = [s for s in by("random") if s.k != len(KEY)]
    assert sorted((s.k, s.seed) for s in band) == [(2, 0), (2, 1), (5, 0), (5, 1)] and {s.mlps for s in band} == {"key"}
    assert len(_sets(curves=False)) == 4 + 2 * 4
    assert [s.heads for s in _sets(key_heads=[]) if s.curve == "random"] == [()] * 8 + [
        s.heads for s in band]


def test_faithfulness_table_and_intervals():
    sets = [s for s in _sets() if s.curve in ("model", "empty", "key")]
    rng = np.random.default_rng(0)
    n = 40
    model, empty = np.ones(n), np.zeros(n)
    half = (np.arange(n) % 2).astype(float)  # keeps half of the behaviour
    values = {"full": np.stack([model, empty, half, model]),
              "logit": np.stack([30 + rng.random(n), 20 + rng.random(n), 25 + rng.random(n), 20 + rng.random(n)])}
    clusters = np.arange(n) // 2  # two items per operand pair
    table = sufficiency.faithfulness_table(sets, values, clusters, n_boot=500, seed=0, confidence=0.95)
    assert list(table["curve"]) == ["model", "empty", "key", "key"]
    assert table["faithfulness_full"].tolist() == [1.0, 0.0, 0.5, 1.0]
    # a whole cluster holds one kept and one lost item: every resample keeps exactly half
    assert table.loc[2, "faithfulness_full_low"] == table.loc[2, "faithfulness_full_high"] == 0.5
    f = table["faithfulness_logit"]
    expected = ((values["logit"].mean(1) - values["logit"][1].mean())
                / (values["logit"][0].mean() - values["logit"][1].mean()))
    np.testing.assert_allclose(f, expected)
    assert ((table["faithfulness_logit_low"] <= f + 1e-12).all()
            and (f <= table["faithfulness_logit_high"] + 1e-12).all())
    assert table.loc[2, "faithfulness_logit_high"] - table.loc[2, "faithfulness_logit_low"] > 0.01
    # the model and the empty circuit alike: undefined, not a division by zero
    flat = sufficiency.faithfulness_table(sets, {"first": np.ones((4, n))}, clusters, n_boot=50, seed=0,
                                          confidence=0.95)
    assert flat["faithfulness_first"].isna().all()
    with pytest.raises(ValueError, match="exactly one 'model'"):
        sufficiency.faithfulness_table(sets[1:], {"full": values["full"][1:]}, clusters, n_boot=10, seed=0,
                                       confidence=0.95)


def _items(key_value, random_values, n=30):
    rows = []
    for curve, mlps, k, seed, value in [("model", "all", 24, -1, 1.0), ("empty", "none", 0, -1, 0.0),
                                        ("key", "key", 3, -1, key_value),
                                        *[("random", "key", 3, d, v) for d, v in enumerate(random_values)]]:
        for i in range(n):
            rows.append({"curve": curve, "mlps": mlps, "k": k, "seed": seed, "sample_id": i, "cluster": str(i // 3),
                         "full_correct": float(value if isinstance(value, float) else value[i]),
                         "answer_logit": 10.0 * float(value if isinstance(value, float) else value[i])})
    return pd.DataFrame(rows)


def test_key_vs_random_and_smallest_k():
    res = sufficiency.key_vs_random(_items(0.9, [0.2, 0.4]), measure="full", mlps="key", n_boot=200, seed=0,
                                    confidence=0.95)
    assert res["key"] == pytest.approx(0.9) and res["random"] == pytest.approx(0.3)
    assert res["difference"] == pytest.approx(0.6) and res["ci_low"] == pytest.approx(0.6)  # constant per item
    assert res["draws"] == 2 and res["n_items"] == 30 and res["n_clusters"] == 10
    mixed = np.r_[np.ones(15), np.zeros(15)]
    res = sufficiency.key_vs_random(_items(mixed, [np.zeros(30)]), measure="logit", mlps="key", n_boot=300, seed=0,
                           confidence=0.95)
    assert res["difference"] == pytest.approx(0.5) and res["ci_low"] < 0.5 < res["ci_high"]
    assert sufficiency.key_vs_random(_items(0.9, [0.2]), measure="full", mlps="all", n_boot=10, seed=0,
                                     confidence=0.95) is None
    alone = sufficiency.key_vs_random(_items(0.9, []), measure="full", mlps="key", n_boot=50, seed=0, confidence=0.95)
    assert alone["key"] == pytest.approx(0.9) and alone["draws"] == 0  # no random draw: its own numbers, NaN diff
    assert np.isnan(alone["difference"]) and np.isnan(alone["ci_low"]) and np.isnan(alone["random"])
    table = pd.DataFrame({"curve": "top", "mlps": "key", "k": [0, 4, 8, 16], "faithfulness_full": [0, 0.5, 0.85, 0.95]})
    assert sufficiency.smallest_k(table, measure="full", mlps="key", level=0.8) == 8
    assert sufficiency.smallest_k(table, measure="full", mlps="key", level=0.9) == 16
    assert sufficiency.smallest_k(table, measure="full", mlps="key", level=0.99) is None
    assert sufficiency.constant_accuracy([1, 1, 2, 3]) == 0.5


def test_summarize_edges_decomposes_each_sender():
    rng = np.random.default_rng(1)
    rows = []
    for i in range(20):
        for sender, receivers in (("L1H0", [1, 2]), ("L2H3", [2])):
            effects = {("direct", -1): rng.normal(-0.02, 0.005), ("total", -1): rng.normal(-0.05, 0.01)}
            effects |= {("mlp", r): rng.normal(-0.01, 0.003) for r in receivers}
            rows += [{"sample_id": i, "sender": sender, "path": p, "receiver": r, "logit_o": 10.0 if i else -1.0,
                      "rel_effect": v} for (p, r), v in effects.items()]
    samples = pd.DataFrame(rows)
    clusters = pd.Series(np.arange(20) // 2, index=range(20))
    out = sufficiency.summarize_edges(samples, clusters, ["L1H0", "L2H3"], n_boot=200, seed=0, confidence=0.95)
    out = out.set_index(["sender", "path", "receiver"])
    used = samples[samples["sample_id"] > 0]  # sample 0 has logit_o <= 0: left out
    assert (out["n"] == 19).all()
    mean = lambda s, p, r=-1: used[(used["sender"] == s) & (used["path"] == p)  # noqa: E731
                                   & (used["receiver"] == r)]["rel_effect"].mean()
    for s, receivers in (("L1H0", [1, 2]), ("L2H3", [2])):
        via = sum(mean(s, "mlp", r) for r in receivers)
        assert out.loc[(s, "via_mlps", -1), "mean_effect"] == pytest.approx(via)
        assert out.loc[(s, "rest", -1), "mean_effect"] == pytest.approx(mean(s, "total") - mean(s, "direct") - via)
        assert out.loc[(s, "via_minus_direct", -1), "mean_effect"] == pytest.approx(via - mean(s, "direct"))
        assert out.loc[(s, "total", -1), "share"] == pytest.approx(1.0)
    # the key heads' sum: an MLP before a sender's layer adds nothing from it
    assert out.loc[(sufficiency.KEY_SUM, "mlp", 1), "mean_effect"] == pytest.approx(mean("L1H0", "mlp", 1))
    assert out.loc[(sufficiency.KEY_SUM, "mlp", 2), "mean_effect"] == pytest.approx(mean("L1H0", "mlp", 2)
                                                                           + mean("L2H3", "mlp", 2))
    assert out.loc[(sufficiency.KEY_SUM, "total", -1), "mean_effect"] == pytest.approx(mean("L1H0", "total")
                                                                              + mean("L2H3", "total"))
    low, high = out["ci_low"], out["ci_high"]
    assert (low <= out["mean_effect"] + 1e-12).all() and (out["mean_effect"] <= high + 1e-12).all()
    assert out.loc[("L1H0", "direct", -1), "key"] and out.loc[(sufficiency.KEY_SUM, "direct", -1), "key"]



def test_pooled_values_keep_each_set_on_its_own_items_when_groups_differ_in_size():
    """Pooled over operators that score 3 and 2 pairs: set s's row is set s's values of the first operator's pairs,
    then of the second's, and the clusters follow (a reshape by operator count mixes sets once the counts differ)."""
    rows = []
    for task, n in (("addition", 3), ("division", 2)):
        for s in range(2):  # set-major, as the stages write a per-item table
            rows += [{"task": task, "cluster": f"{task}:{i}", "full_correct": 100 * s + 10 * (task == "division") + i}
                     for i in range(n)]
    items = pd.DataFrame(rows)
    values, clusters = sufficiency.pooled_values(items, 2, {"full": "full_correct"}, groups=["addition", "division"])
    np.testing.assert_array_equal(values["full"], [[0, 1, 2, 10, 11], [100, 101, 102, 110, 111]])
    assert clusters.tolist() == ["addition:0", "addition:1", "addition:2", "division:0", "division:1"]
    with pytest.raises(ValueError, match="'division': 3 rows are not 2 sets"):
        sufficiency.pooled_values(items.iloc[:-1], 2, {"full": "full_correct"}, groups=["addition", "division"])


# ------------------------------------------------------------------------------------------------ the stages
from helpers import COMPUTE, PROMPTS  # noqa: E402

CIRCUIT = {"max_samples": 6, "positions": ["end", "all"], "all_positions_samples": 4, "grid": [2], "random_draws": 2,
           "band_draws": 1, "contrast_means": "keep", "bootstrap": 50, "confidence": 0.95}


def _effects_and_key(lm, tmp_path):
    heads = [(l, h) for l in range(lm.n_layers) for h in range(lm.n_heads)]
    effects = pd.DataFrame({"node": [f"L{l}H{h}" for l, h in heads], "layer": [l for l, _ in heads],
                            "head": [h for _, h in heads], "component": "head",
                            "mean_effect": [-0.01 * (i + 1) for i in range(len(heads))]})  # the last head strongest
    effects.to_parquet(tmp_path / "effects.parquet")
    pd.DataFrame({"component": ["head", "head", "mlp"], "layer": [1, 1, 0], "head": [3, 2, -1]}).to_parquet(
        tmp_path / "key.parquet")
    return effects


def test_circuit_stage(prepared, tmp_path):  # noqa: F811
    from arithmech.model.loading import load_model
    from arithmech.stages.circuit import run_circuit, run_plot_circuit

    lm = load_model(prepared / "model", device="cpu")
    _effects_and_key(lm, tmp_path)
    run_circuit(model="tiny", task="division", model_dir=prepared / "model", pairs_path=prepared / "pairs.parquet",
                cache_path=prepared / "cache.safetensors", effects_path=tmp_path / "effects.parquet",
                key_path=tmp_path / "key.parquet", circuit=CIRCUIT, prompts=PROMPTS, compute=COMPUTE, seed=0,
                out_table=tmp_path / "c.parquet", out_items=tmp_path / "items.parquet")
    table, items = pd.read_parquet(tmp_path / "c.parquet"), pd.read_parquet(tmp_path / "items.parquet")
    # the older protocol's curves only: the key circuit on the teacher-forced protocol is the discover rule's
    assert not [c for c in table if c.startswith(("tf_", "sanity_"))]
    variants = table[["positions", "means"]].drop_duplicates().apply(tuple, axis=1).tolist()
    assert variants == [("end", "counterfactual"), ("all", "counterfactual"), ("end", "keep")]
    pairs = pd.read_parquet(prepared / "pairs.parquet").set_index("sample_id")
    for (positions, means), part in table.groupby(["positions", "means"], sort=False):
        its = items[(items["positions"] == positions) & (items["means"] == means)]
        model = part[part["curve"] == "model"].iloc[0]
        scored = pairs.loc[its.loc[its["curve"] == "model", "sample_id"]]
        assert model["n"] == len(scored) == (6 if positions == "end" else 4)
        # nothing ablated: the unablated model's own answers, as build_pairs checked them
        assert model["first"] == pytest.approx(scored["correct_first_token"].mean())
        assert model["full"] == pytest.approx(scored["correct_full"].mean())
        # the table's means are the per-item table's
        got = its.groupby(["curve", "mlps", "k", "seed"], sort=False)[["first_correct", "full_correct",
                                                                       "answer_logit"]].mean()
        want = part.set_index(["curve", "mlps", "k", "seed"])[["first", "full", "logit"]]
        np.testing.assert_allclose(got.to_numpy(), want.to_numpy())
        assert part.loc[part["curve"] == "model", "faithfulness_logit"].iloc[0] == 1
        assert part.loc[part["curve"] == "empty", "faithfulness_logit"].iloc[0] == 0
        # the top k = every head with every MLP is the model itself
        top_all = part[(part["curve"] == "top") & (part["mlps"] == "all") & (part["k"] == 2 * lm.n_heads)]
        if len(top_all):
            assert top_all["logit"].iloc[0] == pytest.approx(model["logit"])
    # the contrast's means differ from the counterfactuals': the same circuits score differently
    end = table[table["positions"] == "end"]
    a = end[(end["means"] == "counterfactual") & (end["curve"] == "empty")]["logit"].iloc[0]
    b = end[(end["means"] == "keep") & (end["curve"] == "empty")]["logit"].iloc[0]
    assert a != pytest.approx(b)
    assert set(table.loc[table["positions"] == "all", "curve"]) == {"model", "empty", "key", "random"}
    from arithmech.stages.circuit import run_edges

    run_edges(model="tiny", model_dir=prepared / "model", tasks=["division"], pairs_paths=[prepared / "pairs.parquet"],
              effects_paths=[tmp_path / "effects.parquet"], key_paths=[tmp_path / "key.parquet"],
              edges={"senders": 3, "max_samples": 6, "bootstrap": 50, "confidence": 0.95}, metric="logit_diff",
              compute=COMPUTE, seed=0,
              out_tables=[tmp_path / "e.parquet"], out_samples=[tmp_path / "es.parquet"],
              out_paths=[tmp_path / "ep.parquet"])
    run_plot_circuit(model="tiny", task="division", table_path=tmp_path / "c.parquet",
                     edges_path=tmp_path / "e.parquet",
                     levels=[0.8, 0.9], out_curve=tmp_path / "f.png", out_graph=tmp_path / "g.png",
                     out_heatmap=tmp_path / "h.png")
    for name in ("f.png", "g.png", "h.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_edges_stage_paths_equal_the_hooked_references(prepared, tmp_path):  # noqa: F811
    """The stage's per-sample paths are what the slow references give on the same validation pairs: total and
    direct (one hooked forward per node, `patching.reference_logits`) and through each MLP
    (`edges.reference_edge_logits`); the senders are the top N heads by effect plus the key heads."""
    import torch

    from arithmech.data.arithmetic import split_pairs
    from arithmech.interp.edges import reference_edge_logits
    from arithmech.interp.patching import collect, nodes_of, reference_logits
    from arithmech.model.loading import load_model
    from arithmech.stages.circuit import run_edges

    lm = load_model(prepared / "model", device="cpu")
    _effects_and_key(lm, tmp_path)
    run_edges(model="tiny", model_dir=prepared / "model", tasks=["division"], pairs_paths=[prepared / "pairs.parquet"],
              effects_paths=[tmp_path / "effects.parquet"], key_paths=[tmp_path / "key.parquet"],
              edges={"senders": 1, "max_samples": 6, "bootstrap": 50, "confidence": 0.95}, metric="logit_diff",
              compute=COMPUTE, seed=0, out_tables=[tmp_path / "e.parquet"], out_samples=[tmp_path / "es.parquet"],
              out_paths=[tmp_path / "ep.parquet"])
    # the key heads' paths cut on the teacher-forced protocol: per kept pair and ablation, the same items and model
    from arithmech.stages.circuit import PATH_CUT_COLUMNS

    cuts = pd.read_parquet(tmp_path / "ep.parquet")
    assert list(cuts.columns) == PATH_CUT_COLUMNS and set(cuts["kind"]) == {"resample", "mean"}
    by_kind = {k: part.reset_index(drop=True) for k, part in cuts.groupby("kind")}
    pd.testing.assert_series_equal(by_kind["mean"]["model"], by_kind["resample"]["model"])
    assert (by_kind["mean"]["both"] != by_kind["mean"]["model"]).any()
    samples = pd.read_parquet(tmp_path / "es.parquet")
    assert list(dict.fromkeys(samples["sender"])) == ["L1H3", "L1H2"]  # the top 1, then the other key head
    pairs = split_pairs(pd.read_parquet(prepared / "pairs.parquet"), "validation", "pairs")
    assert samples["sample_id"].unique().tolist() == pairs["sample_id"].tolist()
    texts, answers = list(pairs["prompt"]), torch.tensor(pairs["answer_token_id"].to_numpy())
    ref, _ = collect(lm, texts, answers, 4, mlp_inputs=True)
    cf, _ = collect(lm, list(pairs["cf_prompt"]), answers, 4, mlp_inputs=True)
    order = nodes_of(lm, [0, 1])
    cols = [order.index((1, 3)), order.index((1, 2))]
    got = lambda path, r=-1: samples[(samples["path"] == path) & (samples["receiver"] == r)].pivot(  # noqa: E731
        index="sample_id", columns="sender", values="change")[["L1H3", "L1H2"]].to_numpy()
    for mode in ("total", "direct"):
        patched, _ = reference_logits(lm, texts, answers, ref, cf, layers=[0, 1], mode=mode, batch_size=4)
        np.testing.assert_allclose(got(mode), (patched[:, cols] - ref.logits[:, None]).numpy(), atol=1e-4)
    via = reference_edge_logits(lm, texts, answers, ref, cf, [(1, 3), (1, 2)], [1], batch_size=4)
    np.testing.assert_allclose(got("mlp", 1), (via.logit_p[:, :, 0] - via.logit_o[:, None]).numpy(), atol=1e-4)
    assert np.abs(got("mlp", 1)).max() > 1e-3 and not (samples["receiver"] == 0).any()  # layer-1 senders: MLP 1 only
    summary = pd.read_parquet(tmp_path / "e.parquet")
    assert {"L1H3", "L1H2", sufficiency.KEY_SUM} <= set(summary["sender"]) and set(summary["value"]) == {"change"}
    # every answer logit of the tiny model is negative here: a relative change means nothing, so the edges fall
    # back to logit differences and say so (the run goes on, as a random model's must)
    with pytest.warns(UserWarning, match="value 'change'"):
        run_edges(model="tiny", model_dir=prepared / "model", tasks=["division"],
                  pairs_paths=[prepared / "pairs.parquet"], effects_paths=[tmp_path / "effects.parquet"],
                  key_paths=[tmp_path / "key.parquet"], metric="relative_logit", compute=COMPUTE, seed=0,
                  edges={"senders": 2, "max_samples": 6, "bootstrap": 10, "confidence": 0.95},
                  out_tables=[tmp_path / "x.parquet"], out_samples=[tmp_path / "xs.parquet"],
                  out_paths=[tmp_path / "xp.parquet"])
    assert set(pd.read_parquet(tmp_path / "x.parquet")["value"]) == {"change"}
    with pytest.raises(ValueError, match="patching.metric"):  # the aggregation alone refuses, naming the key
        sufficiency.summarize_edges(pd.read_parquet(tmp_path / "xs.parquet"), pd.Series(dtype=str), ["L1H3"], n_boot=10,
                           seed=0, confidence=0.95)


def test_sanity_stop_stops_on_every_ablation_the_verdicts_read():
    """`circuit.discover.sanity: stop`: a failed check of either ablation stops the rule (the verdicts read both);
    `warn`: none stops, the failures are recorded and the verdicts say inconclusive."""
    from arithmech.interp import protocol

    assert sufficiency.strict_kinds("stop") == list(protocol.KINDS) == ["resample", "mean"]
    assert sufficiency.strict_kinds("warn") == []
