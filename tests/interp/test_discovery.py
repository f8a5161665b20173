"""Circuit discovery (`teacher_forcing.node_ranking`, `prune`) on the tiny model, on the teacher-forced trials the
discover rule prunes on (`teacher_forcing.TailTrials`): the ranking by |attribution|, the greedy pruning's path
(nested targets, bounded trials), and the discover stages writing their tables. The trials against whole hooked
forwards, the attribution's completeness and the pruning against every subset are in
tests/interp/test_teacher_forcing.py; the search on a planted circuit in tests/interp/test_planted_circuit.py."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import yaml

from arithmech.data.arithmetic import split_pairs
from arithmech.interp import protocol
from arithmech.interp import teacher_forcing as tf
from arithmech.interp.nodes import node_label
from arithmech.model.loading import load_model
from helpers import COMPUTE


@pytest.fixture(scope="module")
def trials(prepared):  # noqa: F811
    """Teacher-forced trials (mean ablation, logprob) on the tiny model's identification pairs, values from them."""
    lm = load_model(prepared / "model", device="cpu")
    pairs = split_pairs(pd.read_parquet(prepared / "pairs.parquet"), "identification")
    items = tf.build_items(lm, pairs, batch_size=4)
    return tf.TailTrials(lm, items, tf.ablation_values(lm, items, items, "mean", batch_size=4), batch_size=4)


def test_greedy_pruning_path_and_nested_targets(trials):
    """Each target's circuit (two-sided, as the rule prunes) is what its path records: the trials it counts (the
    highest target's also the bisection over the ranking's prefixes), its final size; the highest target starts from
    the whole model and visits every node, each lower one prunes the circuit above."""
    targets = [0.7, 0.8, 0.9]
    ranking, attribution = tf.node_ranking(trials, 4)
    pruned, path = tf.prune(trials, targets, ranking=ranking, attribution=attribution, max_passes=5, two_sided=True)
    n = len(trials.nodes)
    full, empty = trials.mean(np.array([[True] * n, [False] * n]))
    for p in pruned:
        f = protocol.faithfulness(trials.mean(p.kept[None]), full, empty)[0]
        assert f == pytest.approx(p.faithfulness, abs=1e-5) and abs(1 - f) <= 1 - p.target and p.minimal
        mine = path[path["target"] == p.target]
        assert mine["tried"].sum() == p.trials if p.target != 0.9 else mine["tried"].sum() < p.trials
        assert mine["nodes_kept"].iloc[-1] == p.kept.sum()
        np.testing.assert_allclose(mine["attribution"], attribution[[trials.nodes.index((l, h))
                                                                     for l, h in zip(mine["layer"], mine["head"])]])
    assert set(path.loc[path["target"] == 0.9, "node"]) == {node_label(*v) for v in trials.nodes}
    for higher, lower in zip(pruned[::-1], pruned[::-1][1:]):
        assert not (lower.kept & ~higher.kept).any()


def test_bounded_trials_leave_the_bottom_of_the_ranking_at_once(trials):
    """With fewer trials than nodes, the nodes below the top `max_trials` of the ranking (or below the smallest prefix
    that keeps the target, if that is smaller) leave together in one checked trial; the others are tried one by one,
    least important first."""
    ranking, attribution = tf.node_ranking(trials, 4)
    pruned, path = tf.prune(trials, [0.8], ranking=ranking, attribution=attribution, max_trials=6, max_passes=5,
                            two_sided=True)
    untried = path[~path["tried"]]
    assert len(untried) >= 4 and (untried["pass"] == 0).all()
    assert set(untried["node"]) == {node_label(*trials.nodes[i]) for i in ranking[10 - len(untried):]}
    first = path[(path["pass"] == 1)]
    assert first["rank"].is_monotonic_decreasing  # least important first
    assert abs(1 - pruned[0].faithfulness) <= 0.2 and pruned[0].trials > 1 + path["tried"].sum()


def test_ranking_by_absolute_attribution(trials):
    """`node_ranking`: every node by |attribution| on the whole model, largest first (ties by index), with the
    attribution it ranked by."""
    n = len(trials.nodes)
    ranking, attribution = tf.node_ranking(trials, 4)
    np.testing.assert_allclose(attribution, trials.attribution(4))
    assert sorted(ranking.tolist()) == list(range(n))
    assert (np.diff(np.abs(attribution[ranking])) <= 0).all()


# ------------------------------------------------------------------------------------------------ the stages
DISCOVER = {"tf_measure": "logprob", "tf_ablation": "mean", "sanity_draws": 4, "sanity_samples": None,
            "sanity": "warn", "targets": [0.3, 0.5], "min_full_share": 0.8,  # small circuits: random draws exist
            "selection_samples": 2, "max_samples": 6,
            "validation_samples": 6, "random_draws": 2, "max_trials": 1000, "max_passes": 3, "ig_steps": 4,
            "bootstrap": 50, "confidence": 0.95}


def _effects_and_key(lm, root):
    from arithmech.io import write_parquet

    heads = [(l, h) for l in range(lm.n_layers) for h in range(lm.n_heads)]
    effects = pd.DataFrame({"node": [f"L{l}H{h}" for l, h in heads], "layer": [l for l, _ in heads],
                            "head": [h for _, h in heads], "component": "head",
                            "mean_effect": [-0.01 * (i + 1) for i in range(len(heads))]})  # the last head strongest
    write_parquet(effects, root / "effects.parquet")
    write_parquet(pd.DataFrame({"component": ["head", "head", "mlp"], "layer": [1, 1, 0], "head": [3, 2, -1]}),
                  root / "key.parquet")


def _run_discover(root, tmp_path, out: dict, discover: dict) -> None:
    """`run_discover` on the tiny model's division pairs (`root`: the `prepared` fixture), writing the tables
    `out` names."""
    from arithmech.stages.discover import run_discover

    run_discover(model="tiny", task="division", model_dir=root / "model", pairs_path=root / "pairs.parquet",
                 effects_path=tmp_path / "effects.parquet",
                 key_path=tmp_path / "key.parquet", discover=discover, compute=COMPUTE, seed=0,
                 out_table=out[""], out_path=out["_path"], out_validation=out["_validation"],
                 out_items=out["_items"], out_added=out["_added"])


def _run_union(root, tmp_path, out: dict, discover: dict) -> None:
    """`run_discover_union` over that one operator: union.parquet and summary.parquet in `tmp_path`."""
    from arithmech.stages.discover import run_discover_union

    run_discover_union(model="tiny", model_dir=root / "model", tasks=["division"],
                       pairs_paths=[root / "pairs.parquet"],
                       key_paths=[tmp_path / "key.parquet"], table_paths=[out[""]],
                       validation_paths=[out["_validation"]], items_paths=[out["_items"]], discover=discover,
                       compute=COMPUTE, seed=0, out_validation=tmp_path / "union.parquet",
                       out_summary=tmp_path / "summary.parquet")


def test_discover_stages_write_their_tables(prepared, tmp_path):  # noqa: F811
    """The discover rule on the teacher-forced protocol: two-sided pruning, the validation table with both ablations
    (END + answer positions), the sanity checks' values (the random tiny model fails some: sanity 'warn' records
    them) and the CPR/CMD rows; the union and the summary's teacher-forced columns; nothing of the old END protocol."""
    from arithmech.stages.discover import run_plot_discover

    lm = load_model(prepared / "model", device="cpu")
    _effects_and_key(lm, tmp_path)
    out = {name: tmp_path / f"division{name}.parquet" for name in ("", "_path", "_validation", "_items", "_added")}
    # the random tiny model gets no full answer right: no target keeps 80% of it, the largest is taken, with a warning
    with pytest.warns(UserWarning, match="min_full_share"):
        _run_discover(prepared, tmp_path, out, DISCOVER)
    table = pd.read_parquet(out[""])
    assert table["target"].tolist() == [0.3, 0.5] and table["chosen"].tolist() == [False, True]
    assert (abs(1 - table["faithfulness"]) <= 1 - table["target"] + 1e-9).all()
    assert (table["pruned_on"] == "tf_mean_logprob").all() and not {"measure", "protocol"} & set(table)
    assert (table["n_nodes"] == table["nodes"].str.split().str.len()).all()
    assert (table["share"] == table["n_nodes"] / 10).all()
    assert f"tf_{protocol.KINDS[0]}_correct_identification" in table
    # every identification pair asked for: operand pairs are still held out for the choice, never pruned on
    assert (table["selected_on"] == "held-out identification pairs").all() and (table["n_selection"] >= 1).all()
    assert (table["n_identification"] + table["n_selection"] <= 6).all()
    path = pd.read_parquet(out["_path"])
    # the highest target's trials also count the bisection over the ranking's prefixes
    tried = path.groupby("target")["tried"].sum()
    assert set(path["target"]) == {0.3, 0.5} and tried[0.3] == table["trials"].iloc[0]
    assert tried[0.5] < table["trials"].iloc[1]
    validation = pd.read_parquet(out["_validation"])
    circuits = validation[validation["curve"] != "share"]
    for target, n_heads, chosen in zip(table["target"], table["n_heads"], table["chosen"]):
        mine = circuits[circuits["target"] == target]
        # the controls for the chosen target's circuit only
        assert sorted(mine["curve"]) == (["discovered", "random", "random", "top"] if chosen else ["discovered"])
        assert (mine["n_heads"] == n_heads).all()
        found = mine[mine["curve"] == "discovered"].iloc[0]
        assert found["nodes"] == table.loc[table["target"] == target, "nodes"].iloc[0]
        kept, added = found["key_kept"].split(), found["added"].split()
        assert sorted(kept + added) == sorted(n for n in found["nodes"].split() if not n.endswith("MLP"))
    # the key circuit and its layer-matched random circuits (the circuit rule's draws), disjoint from it
    key_random = circuits[(circuits["curve"] == "random") & (circuits["mlps"] == "key")]
    assert len(key_random) == 2 and (key_random["n_heads"] == 2).all() and key_random["target"].isna().all()
    for nodes in key_random["nodes"]:
        assert not {"L1H3", "L1H2"} & set(nodes.split()) and nodes.split()[-1] == "L0MLP"  # the key MLP
    # both ablations at END + answer positions, every measure; no END-only decomposition, no old-protocol column
    for kind, m in itertools.product(protocol.KINDS, protocol.TAIL_MEASURES):
        for column in (f"tf_{kind}_tail_{m}", f"faithfulness_tf_{kind}_tail_{m}"):
            assert column in validation, column
    assert not [c for c in validation if "_end_" in c or c.startswith(("faithfulness_full", "faithfulness_first"))]
    assert circuits["tf_flag"].isin([True, False]).all()
    model = circuits[circuits["curve"] == "model"].iloc[0]
    assert model["faithfulness_tf_mean_tail_logprob"] == pytest.approx(1) and model["n"] == 6
    assert model["tf_mean_tail_kl"] == pytest.approx(0, abs=1e-5)
    shares = validation[validation["curve"] == "share"]
    assert shares["node_share"].tolist() == list(tf.SHARES)
    assert shares["faithfulness_tf_mean_tail_logprob"].iloc[-1] == pytest.approx(1, abs=1e-5)
    for kind in protocol.KINDS:
        assert validation[f"sanity_{kind}_nothing_kl"].abs().max() < 1e-4
        assert f"sanity_{kind}_failed" in validation
    # per-item teacher-forced values, every set on every drawn pair (NaN for a pair the protocol leaves out)
    items = pd.read_parquet(out["_items"])
    kept = int(model["tf_n_items"])  # pairs whose terminator continues the number are dropped (NaN here)
    assert len(items) == len(circuits) * 6 and items["tf_mean_tail_logprob"].notna().sum() == len(circuits) * kept
    assert not {"full_correct", "first_correct", "answer_logit", "measure_value"} & set(items)
    model_items = items[items["curve"] == "model"]
    assert model_items["tf_mean_tail_logprob"].mean() == pytest.approx(model["tf_mean_tail_logprob"])
    # the circuit_sufficient verdict reads the key circuit against its random draws from these items
    from arithmech.report.claims import circuit_faithful, circuit_sufficient

    assert (items["sanity_mean_failed"] == validation["sanity_mean_failed"].iloc[0]).all()
    claims_cfg = yaml.safe_load(open("config.yaml"))["claims"] | {"bootstrap": 50}
    row = circuit_sufficient.score({"division": items}, claims_cfg, seed=0)[1]
    assert row["n"] == kept and row["source"] == "discover/division_items.parquet" and "mean:" in row["note"]
    # the union does not run the sanity checks again (no warning): the operator's values, same pairs and pool
    _run_union(prepared, tmp_path, out, DISCOVER)
    union_validation = pd.read_parquet(tmp_path / "union.parquet")
    for column in (c for c in validation if c.startswith("sanity_")):
        assert union_validation[column].iloc[0] == validation[column].iloc[0], column
    assert not [c for c in union_validation if "_end_" in c or c.startswith("faithfulness_full")]
    summary = pd.read_parquet(tmp_path / "summary.parquet")
    assert summary["task"].tolist() == ["division", "division", "union"]
    assert summary["draws"].tolist() == [0, 2, 2]  # no controls for 0.3
    assert (summary["pruned_on"] == "tf_mean_logprob").all() and "faithfulness_full" not in summary
    assert set(circuit_faithful.DISCOVER_COLUMNS) <= set(summary)
    for kind in protocol.KINDS:
        # the random tiny model answers nothing, so full-answer faithfulness is undefined; log-probability is not
        assert summary[[f"tf_{kind}_logprob{x}" for x in ("", "_low", "_high")]].notna().all().all()
        # the gap: each circuit's full-answer faithfulness on its pruning pairs minus that on validation pairs
        np.testing.assert_allclose(summary[f"tf_{kind}_gap"],
                                   summary[f"tf_{kind}_correct_identification"] - summary[f"tf_{kind}_correct"])
    assert (summary["tf_n_items"] == kept).all()
    assert summary["cpr_order_flag"].map(type).eq(str).all()
    # a single operator: the union is its chosen circuit, scored on the same items under the same values
    chosen = summary[(summary["task"] == "division") & summary["chosen"]].iloc[0]
    union = summary[summary["task"] == "union"].iloc[0]
    assert union["n_heads"] == chosen["n_heads"]
    for kind in protocol.KINDS:
        assert union[f"tf_{kind}_logprob"] == pytest.approx(chosen[f"tf_{kind}_logprob"])
        # the key circuit's teacher-forced faithfulness (the README's sentence), per operator and pooled for the union
        # (here one operator's key circuit on the same items: the same value; NaN where the model answers nothing)
        for suffix in ("", "_low", "_high"):
            np.testing.assert_allclose(union[f"tf_{kind}_key_correct{suffix}"],
                                       chosen[f"tf_{kind}_key_correct{suffix}"], equal_nan=True)
    run_plot_discover(model="tiny", task="division", path_path=out["_path"], validation_path=out["_validation"],
                      key_path=tmp_path / "key.parquet", out_path_png=tmp_path / "p.png",
                      out_grid_png=tmp_path / "g.png")
    for name in ("p.png", "g.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_random_sets_are_disjoint_layer_matched_or_absent():
    """A circuit of at most half the heads gets disjoint layer-matched random circuits of its size; a larger one has
    none (there is no disjoint set of its size), said by a warning rather than a failed job."""
    from arithmech.stages.discover import _random_sets

    heads = [(0, 0), (0, 1), (2, 3)]
    drawn = _random_sets(heads, (1,), n_layers=3, n_heads=4, draws=3, seed=0, label="discovered")
    assert len(drawn) == 3
    for s in drawn:
        assert not set(s.heads) & set(heads) and sorted(l for l, _ in s.heads) == [0, 0, 2] and s.mlp_layers == (1,)
    big = [(l, h) for l in range(3) for h in range(4)][:7]
    with pytest.warns(UserWarning, match="no disjoint random circuit"):
        assert _random_sets(big, (), n_layers=3, n_heads=4, draws=3, seed=0, label="discovered") == []


def _curve_and_circuits(low):
    """A validation table of one operator with a CPR curve (shares of 100 nodes) and a 10-node circuit whose
    full-answer faithfulness interval starts at `low` under resample."""
    from arithmech.interp import teacher_forcing as tf

    shares = list(tf.SHARES)
    sizes = [int(np.ceil(s * 100)) for s in shares]
    rows = [{"curve": "share", "node_share": s, "n_heads": n, "n_mlps": 0, "target": np.nan,
             **{f"faithfulness_tf_{k}_tail_correct{x}": min(1.0, n / 40) for k in protocol.KINDS
                for x in ("", "_low", "_high")}} for s, n in zip(shares, sizes)]
    rows.append({"curve": "discovered", "node_share": np.nan, "n_heads": 8, "n_mlps": 2, "target": 0.9,
                 "faithfulness_tf_resample_tail_correct": low + 0.1, "faithfulness_tf_resample_tail_correct_low": low,
                 "faithfulness_tf_resample_tail_correct_high": low + 0.2,
                 "faithfulness_tf_mean_tail_correct": 0.2, "faithfulness_tf_mean_tail_correct_low": 0.1,
                 "faithfulness_tf_mean_tail_correct_high": 0.3})
    return pd.DataFrame(rows)


def test_order_flag_names_a_circuit_above_the_curve():
    """A 10-node circuit is compared with the curve at the next share holding 10 nodes (10%: 0.25 here): an interval
    starting above it flags the order with the numbers; one starting below it does not."""
    from arithmech.stages.discover import _circuits_of, order_flag

    above = _curve_and_circuits(0.5)
    flag = order_flag("addition", above, *_circuits_of(above))
    assert flag == ("addition: the circuit at target 0.9 (10 nodes) keeps 0.60 [0.50, 0.70] of full answers "
                    "(resample), above the ranking's top 10% (10 nodes) at 0.25")
    below = _curve_and_circuits(0.2)
    assert order_flag("addition", below, *_circuits_of(below)) == ""
    assert order_flag("addition", below[below["curve"] != "share"], *_circuits_of(below)) == ""


def test_selection_pairs_hold_other_operands(prepared):  # noqa: F811
    """The target is chosen on identification pairs whose operands the pruning draw does not hold (a seeded draw of at
    most `selection_samples`), or on none (None) when the draw holds every operand pair."""
    from arithmech.data.datasets import subsample
    from arithmech.stages.discover import _selection_pairs

    pairs = pd.read_parquet(prepared / "pairs.parquet")
    ident = split_pairs(pairs, "identification")
    pruned_on = subsample(ident, 2, 0)
    chosen_on = _selection_pairs(pairs, pruned_on, 3, 0, "pairs")
    assert 0 < len(chosen_on) <= 3 and (chosen_on["split"] == "identification").all()
    assert not set(zip(chosen_on["a"], chosen_on["b"])) & set(zip(pruned_on["a"], pruned_on["b"]))
    assert _selection_pairs(pairs, ident, 3, 0, "pairs") is None


def test_the_pruning_draw_leaves_operand_pairs_for_the_choice(prepared):  # noqa: F811
    """Held out by operand pair before the pruning draw: with every identification prompt asked for, the pruning
    draw still leaves operand pairs (at most a third) whose prompts the target is chosen on."""
    from arithmech.stages.discover import SELECTION_MAX_OPERANDS, _scored_pairs, _selection_pairs

    pairs = pd.read_parquet(prepared / "pairs.parquet")
    ident = split_pairs(pairs, "identification")
    operands = set(zip(ident["a"], ident["b"]))
    pruned_on, _ = _scored_pairs(pairs, {"max_samples": len(ident), "selection_samples": 3,
                                         "validation_samples": 4}, 0, "pairs")
    chosen_on = _selection_pairs(pairs, pruned_on, 3, 0, "pairs")
    held = set(zip(chosen_on["a"], chosen_on["b"]))
    assert held and not held & set(zip(pruned_on["a"], pruned_on["b"]))
    assert len(held) <= len(operands) * SELECTION_MAX_OPERANDS
    assert len(pruned_on) + (ident[[p in held for p in zip(ident["a"], ident["b"])]]).shape[0] == len(ident)
