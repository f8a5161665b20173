"""Node sets (`arithmech.interp.nodes`): a circuit's kept and ablated nodes, and the knockout rule's node sets at each
position set."""

import pandas as pd

from arithmech.interp.nodes import MLP, CircuitSet, all_nodes, kept_masks, knockout_node_sets

N_LAYERS, N_HEADS = 4, 6
KEY = [(3, 5), (2, 5), (1, 5)]


def test_circuit_set_ablates_every_node_it_does_not_keep():
    every = tuple((l, h) for l in range(N_LAYERS) for h in range(N_HEADS))
    model = CircuitSet("model", "all", len(every), -1, every, tuple(range(N_LAYERS)))
    empty = CircuitSet("empty", "none", 0, -1, (), ())
    key_key = CircuitSet("key", "key", len(KEY), -1, tuple(KEY), (2, 3))
    assert model.ablated(N_LAYERS, N_HEADS) == ([], [])
    heads, mlps = empty.ablated(N_LAYERS, N_HEADS)
    assert len(heads) == N_LAYERS * N_HEADS and mlps == list(range(N_LAYERS))
    kept_h, kept_m = key_key.ablated(N_LAYERS, N_HEADS)
    assert set(kept_h) == {(l, h) for l in range(N_LAYERS) for h in range(N_HEADS)} - set(KEY) and kept_m == [0, 1]
    assert key_key.nodes() == "L3H5 L2H5 L1H5 L2MLP L3MLP"
    # its kept mask over every node (heads layer by layer, then the MLPs) keeps exactly its heads and MLPs
    nodes = all_nodes(N_LAYERS, N_HEADS)
    masks = kept_masks([model, empty, key_key], nodes)
    assert masks[0].all() and not masks[1].any()
    assert {n for n, k in zip(nodes, masks[2]) if k} == set(KEY) | {(2, MLP), (3, MLP)}


def test_knockout_node_sets_draw_the_controls_at_the_given_k():
    heads = [(l, h) for l in range(4) for h in range(6)]
    effects = pd.DataFrame({"node": [f"L{l}H{h}" for l, h in heads], "layer": [l for l, _ in heads],
                            "head": [h for _, h in heads], "component": "head",
                            "mean_effect": [-0.01 * (4 * h + l + 1) for l, h in heads]})  # top 4: L3H5 L2H5 L1H5 L0H5
    key = pd.DataFrame({"component": ["mlp"], "layer": [2], "head": [-1]})
    ablation = {"max_heads": 4, "random_seeds": 3, "random_k": [1, 3, 9]}
    sets = knockout_node_sets(effects, key, ablation, n_layers=4, n_heads=6, seed=0)
    by_curve = {}
    for curve, seed, k, hs, ms in sets:
        by_curve.setdefault(curve, []).append((seed, k, hs, ms))
    assert [k for _, k, _, _ in by_curve["top_heads"]] == [0, 1, 2, 3, 4]  # every k up to max_heads
    for curve in ("random_heads", "random_layer_matched"):
        assert [(s, k) for s, k, _, _ in by_curve[curve]] == [(s, k) for s in range(3) for k in (1, 3, 4)]  # 9 -> K
        for s in range(3):  # one draw per seed, its prefixes at each k
            draws = [hs for seed, _, hs, _ in by_curve[curve] if seed == s]
            assert draws[0] == draws[-1][:1] and draws[1] == draws[-1][:3]
    top4 = by_curve["top_heads"][-1][2]
    for _, k, hs, _ in by_curve["random_layer_matched"]:
        assert sorted(l for l, _ in hs) == sorted(l for l, _ in top4[:k]) and not set(hs) & set(top4)
    assert by_curve["key_mlps"] == [(-1, 1, [], [2])]
    # every position: the top heads at 0 and random_k (capped), the controls at max_heads only
    every = knockout_node_sets(effects, key, ablation, n_layers=4, n_heads=6, seed=0, positions="all")
    assert [(c, k) for c, _, k, _, _ in every if c != "key_mlps"] == (
        [("top_heads", 0), ("top_heads", 1), ("top_heads", 3), ("top_heads", 4)] + [("random_heads", 4)] * 3
        + [("random_layer_matched", 4)] * 3)
