"""Circuit discovery (`arithmech.interp.discovery`) on the tiny model: the prefix-cache trials against whole hooked
forwards, the attribution against the exact single-node effects, the greedy pruning against a brute-force search over
every subset, and the discover stages writing their tables."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file

from arithmech.data.arithmetic import split_pairs
from arithmech.interp import discovery as dc
from arithmech.interp import protocol
from arithmech.interp.activations import cache_means
from arithmech.interp.nodes import node_label
from arithmech.model.loading import load_model
from arithmech.model.tiny import FAMILIES
from helpers import COMPUTE, prepare_tiny


@pytest.fixture(scope="module")
def setup(prepared):  # noqa: F811
    return _setup_of(prepared)


@pytest.fixture(scope="module")
def family_setup(setup, tmp_path_factory):
    """family_setup(family) -> `setup` on the 2-layer tiny model of `family` (its pairs and activations from the
    identify stage's rules), made once per family."""
    made = {"llama": setup}

    def get(family):
        if family not in made:
            made[family] = _setup_of(prepare_tiny(tmp_path_factory.mktemp(f"stages-{family}"), family))
        return made[family]

    return get


def _setup_of(prepared):  # noqa: F811
    lm = load_model(prepared / "model", device="cpu")
    pairs = split_pairs(pd.read_parquet(prepared / "pairs.parquet"), "identification")
    means = cache_means(load_file(str(prepared / "cache.safetensors")), "end")
    return lm, pairs, means


def _trials(setup, measure):
    lm, pairs, means = setup
    return dc.EndTrials(lm, list(pairs["prompt"]), pairs["answer_token_id"].to_numpy(), means, measure=measure,
                        batch_size=4)


def _random_masks(n_nodes, count, seed=0):
    rng = np.random.default_rng(seed)
    masks = rng.random((count, n_nodes)) < 0.5
    masks[0], masks[1] = True, False  # the model and the empty circuit
    return masks


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("measure", dc.MEASURES)
def test_trials_equal_whole_hooked_forwards(family_setup, family, measure):
    """The END-token trials on the shared prefix cache (several circuits as copies, prompts in two batches) give what
    whole prompts under `mean_ablate` give, one prompt and one circuit at a time; on every family."""
    setup = family_setup(family)
    lm, pairs, means = setup
    trials = _trials(setup, measure)
    masks = _random_masks(len(trials.nodes), 6)
    fast = trials.per_item(masks)
    slow = dc.reference_measure(lm, list(pairs["prompt"]), pairs["answer_token_id"].to_numpy(), means, masks,
                                measure=measure)
    np.testing.assert_allclose(fast, slow, atol=1e-4, rtol=1e-4)
    assert np.abs(fast[0] - fast[1]).max() > 1e-3  # the ablation does something
    if measure == "kl":
        np.testing.assert_allclose(fast[0], 0, atol=1e-5)  # the model against itself


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("measure", dc.MEASURES)
def test_trials_equal_whole_hooked_forwards_on_cuda(prepared, measure, dtype):  # noqa: F811
    """The same on a GPU: float32 within the CPU's tolerance; bfloat16 (the cache and the whole forwards round
    differently) within 5% of the measure's spread over the circuits."""
    pairs = split_pairs(pd.read_parquet(prepared / "pairs.parquet"), "identification")
    lm = load_model(prepared / "model", device="cuda", dtype=dtype)
    means = cache_means(load_file(str(prepared / "cache.safetensors")), "end")
    texts, answers = list(pairs["prompt"]), pairs["answer_token_id"].to_numpy()
    trials = dc.EndTrials(lm, texts, answers, means, measure=measure, batch_size=4)
    masks = _random_masks(len(trials.nodes), 6)
    fast = trials.per_item(masks)
    slow = dc.reference_measure(lm, texts, answers, means, masks, measure=measure)
    spread = np.ptp(slow)
    print(f"{measure} {dtype} on cuda: largest |trial - hooked forward| {np.abs(fast - slow).max():.2e}, "
          f"spread {spread:.3f}")
    assert spread > 1e-3
    if dtype == "float32":
        np.testing.assert_allclose(fast, slow, atol=1e-4, rtol=1e-4)
    else:
        assert np.abs(fast - slow).max() < 0.05 * spread


def test_attribution_sums_to_the_span_and_ranks_single_node_effects(setup):
    """Integrated gradients add up to m(model) - m(empty) (completeness) and rank the nodes like the exact effect of
    ablating each node alone (Spearman's rank correlation, printed)."""
    trials = _trials(setup, "logit_diff")
    n = len(trials.nodes)
    attribution = trials.attribution(steps=16)
    full, empty = trials.mean(np.array([[True] * n, [False] * n]))
    assert attribution.sum() == pytest.approx(full - empty, rel=0.05, abs=1e-3)
    single = np.ones((n, n), dtype=bool) & ~np.eye(n, dtype=bool)  # row v: every node but v
    effects = full - trials.mean(single)
    rho = dc.rank_correlation(attribution, effects)
    print(f"attribution vs single-node effects: Spearman {rho:.3f} over {n} nodes")
    assert rho > 0.6


@pytest.mark.parametrize("measure", ["logit_diff", "kl"])
def test_greedy_pruning_against_every_subset(setup, measure):
    """On the tiny model's 10 nodes, every subset enumerated: each target's greedy circuit is faithful (its measure,
    recomputed, reaches the target) and minimal (dropping any one of its nodes falls below the target); how much
    larger it is than the smallest faithful subset is printed."""
    trials = _trials(setup, measure)
    n = len(trials.nodes)
    subsets = np.array(list(itertools.product([False, True], repeat=n)))  # [2^n, n]
    means = trials.mean(subsets)
    full, empty = means[-1], means[0]
    f_all = dc.faithfulness(means, full, empty)
    targets = [0.8, 0.9, 0.95]
    ranking, attribution = dc.node_ranking(trials, 8)
    pruned, path = dc.prune(trials, targets, ranking=ranking, attribution=attribution, max_passes=5)
    for p in pruned:
        assert p.minimal
        f = dc.faithfulness(trials.mean(p.kept[None]), full, empty)[0]
        assert f == pytest.approx(p.faithfulness, abs=1e-5) and f >= p.target
        smaller = np.repeat(p.kept[None], p.kept.sum(), 0)
        smaller[np.arange(p.kept.sum()), np.flatnonzero(p.kept)] = False  # row j: the circuit without its j-th node
        assert (dc.faithfulness(trials.mean(smaller), full, empty) < p.target).all()
        best = int(subsets[f_all >= p.target].sum(1).min())
        print(f"{measure} target {p.target}: greedy {int(p.kept.sum())} nodes, smallest faithful subset {best} "
              f"(+{int(p.kept.sum()) - best}); {p.trials} trials")
        assert best <= p.kept.sum()
        mine = path[path["target"] == p.target]
        # the highest target also counts the bisection over the ranking's prefixes
        assert mine["tried"].sum() == p.trials if p.target != 0.95 else mine["tried"].sum() < p.trials
        assert mine["nodes_kept"].iloc[-1] == p.kept.sum()
    # the highest target starts from the whole model and visits every node; each lower one prunes the circuit above
    assert set(path.loc[path["target"] == 0.95, "node"]) == {node_label(*v) for v in trials.nodes}
    for higher, lower in zip(pruned[::-1], pruned[::-1][1:]):
        assert not (lower.kept & ~higher.kept).any()


def test_bounded_trials_leave_the_bottom_of_the_ranking_at_once(setup):
    """With fewer trials than nodes, the nodes below the top `max_trials` of the ranking (or below the smallest prefix
    that keeps the target, if that is smaller) leave together in one checked trial; the others are tried one by one,
    least important first."""
    trials = _trials(setup, "logit_diff")
    ranking, attribution = dc.node_ranking(trials, 4)
    pruned, path = dc.prune(trials, [0.8], ranking=ranking, attribution=attribution, max_trials=6, max_passes=5)
    untried = path[~path["tried"]]
    assert len(untried) >= 4 and (untried["pass"] == 0).all()
    assert set(untried["node"]) == {node_label(*trials.nodes[i]) for i in ranking[10 - len(untried):]}
    first = path[(path["pass"] == 1)]
    assert first["rank"].is_monotonic_decreasing  # least important first
    assert pruned[0].faithfulness >= 0.8 and pruned[0].trials > 1 + path["tried"].sum()


def test_ranking_by_absolute_attribution_and_attribution_on_a_circuit(setup):
    """`node_ranking`: every node by |attribution| on the whole model, largest first. On a circuit the attribution's
    path runs from the empty circuit to it: 0 outside it, its nodes' summing to m(circuit) - m(empty)."""
    trials = _trials(setup, "logit_diff")
    n = len(trials.nodes)
    ranking, attribution = dc.node_ranking(trials, 4)
    np.testing.assert_allclose(attribution, trials.attribution(4))
    assert sorted(ranking.tolist()) == list(range(n))
    assert (np.diff(np.abs(attribution[ranking])) <= 0).all()
    kept = _random_masks(n, 3, seed=4)[2]
    on = trials.attribution(16, kept=kept)
    full, empty, circuit = trials.mean(np.vstack([np.ones(n, dtype=bool), np.zeros(n, dtype=bool), kept]))
    assert (on[~kept] == 0).all() and on.sum() == pytest.approx(circuit - empty, rel=0.05, abs=1e-3)


# ------------------------------------------------------------------------------------------------ the stages
DISCOVER = {"protocol": "end", "tf_measure": "logprob", "tf_ablation": "mean", "sanity_draws": 4,
            "sanity_samples": None, "sanity": "warn",
            "measure": "logit_diff", "targets": [0.8, 0.95], "min_full_share": 0.8,
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
                 cache_path=root / "cache.safetensors", effects_path=tmp_path / "effects.parquet",
                 key_path=tmp_path / "key.parquet", discover=discover, compute=COMPUTE, seed=0,
                 out_table=out[""], out_path=out["_path"], out_validation=out["_validation"],
                 out_items=out["_items"], out_added=out["_added"])


def _run_union(root, tmp_path, out: dict, discover: dict) -> None:
    """`run_discover_union` over that one operator: union.parquet and summary.parquet in `tmp_path`."""
    from arithmech.stages.discover import run_discover_union

    run_discover_union(model="tiny", model_dir=root / "model", tasks=["division"],
                       pairs_paths=[root / "pairs.parquet"], cache_paths=[root / "cache.safetensors"],
                       key_paths=[tmp_path / "key.parquet"], table_paths=[out[""]],
                       validation_paths=[out["_validation"]], items_paths=[out["_items"]], discover=discover,
                       compute=COMPUTE, seed=0, out_validation=tmp_path / "union.parquet",
                       out_summary=tmp_path / "summary.parquet")


def test_discover_stages_write_their_tables(prepared, tmp_path):  # noqa: F811
    from arithmech.stages.discover import run_plot_discover

    lm = load_model(prepared / "model", device="cpu")
    _effects_and_key(lm, tmp_path)
    out = {name: tmp_path / f"division{name}.parquet" for name in ("", "_path", "_validation", "_items", "_added")}
    # the random tiny model gets no full answer right: no target keeps 80% of it, the largest is taken, with a warning
    with pytest.warns(UserWarning, match="min_full_share"):
        _run_discover(prepared, tmp_path, out, DISCOVER)
    table = pd.read_parquet(out[""])
    assert table["target"].tolist() == [0.8, 0.95] and table["chosen"].tolist() == [False, True]
    assert (table["faithfulness"] >= table["target"]).all() and table["minimal"].all()
    assert (table["n_nodes"] == table["nodes"].str.split().str.len()).all()
    assert (table["share"] == table["n_nodes"] / 10).all()
    # every identification pair (6) is pruned on: none is left to choose on, the pruning pairs are (with a warning)
    assert (table["selected_on"] == "pruning pairs").all() and (table["n_selection"] == 6).all()
    path = pd.read_parquet(out["_path"])
    # the highest target's trials also count the bisection over the ranking's prefixes
    tried = path.groupby("target")["tried"].sum()
    assert set(path["target"]) == {0.8, 0.95} and tried[0.8] == table["trials"].iloc[0]
    assert tried[0.95] < table["trials"].iloc[1]
    validation = pd.read_parquet(out["_validation"])
    for target, n_heads, chosen in zip(table["target"], table["n_heads"], table["chosen"]):
        mine = validation[validation["target"] == target]
        # the controls for the chosen target's circuit only
        assert sorted(mine["curve"]) == (["discovered", "random", "random", "top"] if chosen else ["discovered"])
        assert (mine["n_heads"] == n_heads).all()
        found = mine[mine["curve"] == "discovered"].iloc[0]
        assert found["nodes"] == table.loc[table["target"] == target, "nodes"].iloc[0]
        kept, added = found["key_kept"].split(), found["added"].split()
        assert sorted(kept + added) == sorted(n for n in found["nodes"].split() if not n.endswith("MLP"))
    # the pruning measure on validation pairs: the model's own is 1, the empty circuit's 0
    model = validation[validation["curve"] == "model"].iloc[0]
    assert model["faithfulness_measure"] == 1 and model["n"] == 6
    # the key circuit and its layer-matched random circuits (the circuit rule's draws), disjoint from it
    key_random = validation[(validation["curve"] == "random") & (validation["mlps"] == "key")]
    assert len(key_random) == 2 and (key_random["n_heads"] == 2).all() and key_random["target"].isna().all()
    for nodes in key_random["nodes"]:
        assert not {"L1H3", "L1H2"} & set(nodes.split()) and nodes.split()[-1] == "L0MLP"  # the key MLP
    items = pd.read_parquet(out["_items"])
    assert len(items) == len(validation) * 6  # the old protocol: no CPR rows
    _run_union(prepared, tmp_path, out, DISCOVER)
    summary = pd.read_parquet(tmp_path / "summary.parquet")
    assert summary["task"].tolist() == ["division", "division", "union"]
    for column in ("task", "target", "chosen", "n_heads", "n_mlps", "share", "faithfulness_full",
                   "faithfulness_full_low", "faithfulness_full_high", "faithfulness_logit", "faithfulness_first",
                   "key_faithfulness_full", "random_faithfulness_full", "diff_vs_random_full", "ci_low", "ci_high",
                   "diff_vs_random_measure", "constant_first", "n_items", "n_clusters", "draws"):
        assert column in summary, column
    assert summary["draws"].tolist() == [0, 2, 2] and (summary["n_items"] == 6).all()  # no controls for 0.8
    # a single operator: the union is its chosen circuit, scored on the same pairs
    chosen = summary[(summary["task"] == "division") & summary["chosen"]].iloc[0]
    union = summary[summary["task"] == "union"].iloc[0]
    for column in ("faithfulness_logit", "faithfulness_measure", "faithfulness_first"):
        assert union[column] == pytest.approx(chosen[column], nan_ok=True)
    assert union["n_heads"] == chosen["n_heads"]
    run_plot_discover(model="tiny", task="division", path_path=out["_path"], validation_path=out["_validation"],
                      key_path=tmp_path / "key.parquet", out_path_png=tmp_path / "p.png",
                      out_grid_png=tmp_path / "g.png")
    for name in ("p.png", "g.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_discover_stage_on_the_teacher_forced_protocol(prepared, tmp_path):  # noqa: F811
    """protocol teacher_forced: the pruning's faithfulness is two-sided, and the validation table carries both
    ablations at both position sets beside the old protocol's columns, the sanity checks' values (the random tiny
    model fails some: sanity 'warn' records them) and the CPR/CMD rows."""
    from arithmech.interp import teacher_forcing as tf

    lm = load_model(prepared / "model", device="cpu")
    _effects_and_key(lm, tmp_path)
    out = {name: tmp_path / f"division{name}.parquet" for name in ("", "_path", "_validation", "_items", "_added")}
    discover = DISCOVER | {"protocol": "teacher_forced", "targets": [0.3, 0.5]}  # small circuits: random draws exist
    with pytest.warns(UserWarning):
        _run_discover(prepared, tmp_path, out, discover)
    table = pd.read_parquet(out[""])
    assert (abs(1 - table["faithfulness"]) <= 1 - table["target"] + 1e-9).all()
    assert (table["pruned_on"] == "tf_mean_logprob").all() and (table["measure"] == "logit_diff").all()
    validation = pd.read_parquet(out["_validation"])
    for kind, positions, m in itertools.product(protocol.KINDS, protocol.POSITIONS, protocol.TAIL_MEASURES):
        for column in (f"tf_{kind}_{positions}_{m}", f"faithfulness_tf_{kind}_{positions}_{m}"):
            assert column in validation, column
    circuits = validation[validation["curve"] != "share"]
    # the old protocol beside it
    assert circuits["tf_flag"].isin([True, False]).all() and "faithfulness_full" in circuits
    model = circuits[circuits["curve"] == "model"].iloc[0]
    assert model["faithfulness_tf_mean_tail_logprob"] == pytest.approx(1)
    assert model["tf_mean_tail_kl"] == pytest.approx(0, abs=1e-5)
    shares = validation[validation["curve"] == "share"]
    assert shares["node_share"].tolist() == list(tf.SHARES)
    assert shares["faithfulness_tf_mean_tail_logprob"].iloc[-1] == pytest.approx(1, abs=1e-5)
    for kind in protocol.KINDS:
        assert validation[f"sanity_{kind}_nothing_kl"].abs().max() < 1e-4
        assert f"sanity_{kind}_failed" in validation
    # per-item teacher-forced values beside the old ones, and the summary's teacher-forced columns (the verdict's)

    items = pd.read_parquet(out["_items"])
    kept = int(model["tf_n_items"])  # pairs whose terminator continues the number are dropped (NaN here)
    assert len(items) == len(circuits) * 6 and items["tf_mean_tail_logprob"].notna().sum() == len(circuits) * kept
    model_items = items[items["curve"] == "model"]
    assert model_items["tf_mean_tail_logprob"].mean() == pytest.approx(model["tf_mean_tail_logprob"])
    # the END-only decomposition of the discovered circuits (with the model and the empty circuit) only
    decomposed = circuits["curve"].isin(["model", "empty", "discovered"])
    assert circuits.loc[decomposed, "tf_mean_end_logprob"].notna().all()
    assert circuits.loc[~decomposed, "tf_mean_end_logprob"].isna().all()
    # the circuit_sufficient verdict reads the key circuit against its random draws from these items
    from arithmech.report import verdicts

    assert (items["sanity_mean_failed"] == validation["sanity_mean_failed"].iloc[0]).all()
    claims_cfg = yaml.safe_load(open("config.yaml"))["claims"] | {"bootstrap": 50}
    row = verdicts.circuit_sufficient({"division": None}, claims_cfg, seed=0, teacher_forced={"division": items})[1]
    assert row["n"] == kept and row["source"] == "discover/division_items.parquet" and "mean:" in row["note"]
    # the union does not run the sanity checks again (no warning): the operator's values, same pairs and pool
    _run_union(prepared, tmp_path, out, discover)
    union_validation = pd.read_parquet(tmp_path / "union.parquet")
    # the union's END-only decomposition, pooled: the discovered circuit's, the same as the one operator's here (to
    # float32 rounding: the union batches other circuits beside it)
    pooled = union_validation[(union_validation["task"] == "union") & (union_validation["curve"] == "discovered")]
    own = validation[(validation["curve"] == "discovered") & validation["chosen"]]
    assert pooled["faithfulness_tf_mean_end_logprob"].iloc[0] == pytest.approx(
        own["faithfulness_tf_mean_end_logprob"].iloc[0], rel=1e-4)
    for column in (c for c in validation if c.startswith("sanity_")):
        assert union_validation[column].iloc[0] == validation[column].iloc[0], column
    summary = pd.read_parquet(tmp_path / "summary.parquet")
    names, suffixes = ("correct", "logprob", "random_diff"), ("", "_low", "_high")
    for kind, name, suffix in itertools.product(protocol.KINDS, names, suffixes):
        assert f"tf_{kind}_{name}{suffix}" in summary, (kind, name, suffix)
        # the random tiny model answers nothing, so full-answer faithfulness is undefined; log-probability is not
        assert name != "logprob" or summary[f"tf_{kind}_{name}{suffix}"].notna().all(), (kind, name, suffix)
    assert (summary["tf_n_items"] == kept).all()
    # the gap: each circuit's full-answer faithfulness on its pruning pairs minus that on validation pairs (NaN here,
    # where the random model answers nothing), and the order check's flag ('' or sentences) on every row
    for kind in protocol.KINDS:
        np.testing.assert_allclose(summary[f"tf_{kind}_gap"],
                                   summary[f"tf_{kind}_correct_identification"] - summary[f"tf_{kind}_correct"])
    assert f"tf_{protocol.KINDS[0]}_correct_identification" in table
    assert summary["cpr_order_flag"].map(type).eq(str).all()
    # a single operator: the union is its chosen circuit, scored on the same items under the same values
    chosen = summary[(summary["task"] == "division") & summary["chosen"]].iloc[0]
    union = summary[summary["task"] == "union"].iloc[0]
    for kind in protocol.KINDS:
        assert union[f"tf_{kind}_logprob"] == pytest.approx(chosen[f"tf_{kind}_logprob"])
        # the key circuit's teacher-forced faithfulness (the README's sentence), per operator and pooled for the union
        # (here one operator's key circuit on the same items: the same value; NaN where the model answers nothing)
        for suffix in ("", "_low", "_high"):
            np.testing.assert_allclose(union[f"tf_{kind}_key_correct{suffix}"],
                                       chosen[f"tf_{kind}_key_correct{suffix}"], equal_nan=True)


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
