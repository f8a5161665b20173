"""The teacher-forced, position-matched protocol (`arithmech.interp.teacher_forcing`) on a tiny 2-layer model: the
fast trials against whole hooked forwards, teacher-forced correctness against greedy answers, the sanity checks
(passing on the protocol, failing on a broken ablation), the pruning against every subset, and the CPR/CMD curve.

The tiny model is random, so its answers to arithmetic are noise: the items' gold answers are the model's OWN greedy
tokens (1 or 2 of them, by template) and the terminator its next greedy token, so the full model is right on every
item by construction and an ablation has something to lose."""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np
import pandas as pd
import pytest
import torch

from arithmech.data.arithmetic import build_prompts, continuation_ids, split_operands
from arithmech.interp import protocol
from arithmech.interp import teacher_forcing as tf
from arithmech.interp.nodes import node_label
from arithmech.model.loading import load_model
from arithmech.model.tiny import FAMILIES, build_tiny_model
from helpers import PROMPT_CFG, rank_correlation


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tf") / "model", n_layers=2)


@pytest.fixture(scope="module")
def lm(model_dir):
    return load_model(model_dir, device="cpu")


@torch.no_grad()
def _own_items(lm, table: pd.DataFrame) -> tf.TailItems:
    """Items whose gold answer is the model's own greedy continuation: 1 + template_id tokens, then the terminator."""
    prompt_ids, answer_ids, terms = [], [], []
    for prompt, template in zip(table["prompt"], table["template_id"]):
        ids = lm.tokenizer(prompt)["input_ids"]
        out = lm.model.generate(torch.tensor([ids]), max_new_tokens=2 + int(template), do_sample=False,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long), pad_token_id=0)
        new = out[0, len(ids):].tolist()
        prompt_ids.append(ids)
        answer_ids.append(new[:-1])
        terms.append(new[-1])
    table = table.reset_index(drop=True).assign(answer=[" ".join(map(str, a)) for a in answer_ids])
    return tf.TailItems(table, prompt_ids, answer_ids, terms)


@pytest.fixture(scope="module")
def setup(lm):
    return _setup(lm)


@pytest.fixture(scope="module")
def family_setup(lm, setup, tmp_path_factory):
    """family_setup(family) -> (the 2-layer tiny model of `family`, its `setup`), made once per family."""
    made = {"llama": (lm, setup)}

    def get(family):
        if family not in made:
            directory = build_tiny_model(tmp_path_factory.mktemp(f"tf-{family}") / "model", n_layers=2, family=family)
            other = load_model(directory, device="cpu")
            made[family] = (other, _setup(other))
        return made[family]

    return get


def _setup(lm):
    pairs = build_prompts(lm.tokenizer, "addition", PROMPT_CFG, seed=0)
    pairs["split"] = split_operands(pairs, 0.5, seed=0)
    pool = _own_items(lm, pairs[pairs["split"] == "identification"])
    items = _own_items(lm, pairs[pairs["split"] == "validation"].iloc[::2])  # 8 items, T = 2 and 3
    values = {kind: tf.ablation_values(lm, items, pool, kind, seed=0, batch_size=3) for kind in protocol.KINDS}
    return items, pool, values


def _trials(lm, setup, kind, measure="logprob", **kw):
    items, _, values = setup
    return tf.TailTrials(lm, items, values[kind], measure=measure, batch_size=3, **kw)


def _masks(n, count, seed=0):
    masks = np.random.default_rng(seed).random((count, n)) < 0.6
    masks[0], masks[1] = True, False
    return masks


def test_items_read_the_answer_as_the_tokenizer_splits_it(lm):
    """`build_items`: the answer ids are the continuation's as the tokenizer splits it after the prompt, the terminator
    is the full model's greedy token after prompt + answer, and a pair whose terminator does not end the number is
    dropped and counted (`ends_number`)."""
    pairs = build_prompts(lm.tokenizer, "addition", PROMPT_CFG, seed=0).iloc[:6]
    items = tf.build_items(lm, pairs, batch_size=4, outputs=True)
    assert len(items) > 0 and len(items) + len(items.dropped) == 6
    print(f"{len(items)} kept, {len(items.dropped)} dropped")
    # the outputs captured in the same forward are those of a forward of their own
    again = tf.tail_outputs(lm, dataclasses.replace(items, outputs=None), batch_size=3)
    for captured, separate in zip(items.outputs, again):
        torch.testing.assert_close(captured, separate, atol=1e-5, rtol=1e-5)
    assert (items.dropped["drop_reason"] == "terminator_continues_number").all()
    for i, row in items.table.iterrows():
        ctx, cont = continuation_ids(lm.tokenizer, row["prompt"], str(row["answer"]))
        assert items.prompt_ids[i] == ctx and items.answer_ids[i] == cont
        with torch.no_grad():
            logits = lm.model(input_ids=torch.tensor([ctx + cont])).logits[0, -1]
        assert items.terminators[i] == int(logits.argmax())
        assert tf.ends_number(lm.tokenizer, cont, items.terminators[i], row["answer"])


def test_a_draw_of_the_pool_is_its_own_items(lm):
    """`TailItems.of_pairs`: a draw of identification pairs taken from the pool built over all of them (no forward of
    its own) is what `build_items` builds for that draw alone, the slow reference: the same pairs in the draw's order,
    ids, terminators and dropped pairs; a pair the pool does not hold is left out."""
    pairs = build_prompts(lm.tokenizer, "addition", PROMPT_CFG, seed=0).iloc[:12]
    pool = tf.build_items(lm, pairs, batch_size=5, outputs=True)
    draw = pairs.iloc[[9, 2, 7, 4, 0, 11]]
    mine, alone = pool.of_pairs(draw), tf.build_items(lm, draw, batch_size=4)
    assert len(mine) == len(alone) > 0 and len(alone.dropped) == len(mine.dropped)
    assert mine.table["sample_id"].tolist() == alone.table["sample_id"].tolist()
    assert (mine.prompt_ids, mine.answer_ids, mine.terminators) == (alone.prompt_ids, alone.answer_ids,
                                                                     alone.terminators)
    assert sorted(mine.dropped["sample_id"]) == sorted(alone.dropped["sample_id"])
    assert len(pool.of_pairs(pairs.iloc[:0])) == 0


def test_ends_number(lm):
    tok = lm.tokenizer
    five, dot, seven = (tok.convert_tokens_to_ids(t) for t in ("5", ".", "7"))
    assert tf.ends_number(tok, [five], dot, 5)
    assert not tf.ends_number(tok, [five], seven, 5)  # "57": the number goes on


def test_ablation_values_are_position_matched(lm, setup):
    """Resample: each item's donor shares its template and tail length, has other operands, and its values are the
    donor's own outputs at the same offsets; mean: the group's mean at each offset; index 0 is the last tail
    position."""
    items, pool, values = setup
    heads, mlps = tf.tail_outputs(lm, pool, batch_size=5)
    res = values["resample"]
    for i, d in enumerate(res.donors):
        assert pool.table.loc[d, "template_id"] == items.table.loc[i, "template_id"]
        assert pool.tails[d] == items.tails[i]
        assert (pool.table.loc[d, "a"], pool.table.loc[d, "b"]) != (items.table.loc[i, "a"], items.table.loc[i, "b"])
        torch.testing.assert_close(res.heads[i], heads[d])
    # the last tail position's MLP output is that of the last token of the donor's sequence
    d = int(res.donors[0])
    from arithmech.intervention.hooks import capture

    with torch.no_grad(), capture(lm) as cap:
        lm.model(input_ids=torch.tensor([pool.prompt_ids[d] + pool.answer_ids[d]]))
    torch.testing.assert_close(res.mlps[0, 0], cap.stacked_mlps()[0], atol=1e-5, rtol=1e-5)
    mean = values["mean"]
    same = [j for j in range(len(pool)) if pool.table.loc[j, "template_id"] == items.table.loc[0, "template_id"]]
    torch.testing.assert_close(mean.mlps[0], mlps[same].mean(0), atol=1e-5, rtol=1e-5)


def test_resample_without_donor_names_the_group(lm, setup):
    items, pool, _ = setup
    lonely = tf.TailItems(pool.table.iloc[:1], pool.prompt_ids[:1], pool.answer_ids[:1], pool.terminators[:1])
    with pytest.raises(ValueError, match=r"no pool prompt with template/shots/tail \(\d, \d\) and other operands"):
        tf.draw_donors(items, lonely, seed=0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", protocol.KINDS)
def test_trials_equal_whole_hooked_forwards(family_setup, family, kind):
    """Every measure of several circuits (as copies on the prefix cache, items of two tail lengths in batches of 3)
    equals the slow reference: one item and one circuit at a time, whole sequences under `patch_tail`. On every
    family (Gemma 3: sliding-window layers, the prefix forwards skipping layers below the lowest ablated one)."""
    lm, setup = family_setup(family)
    items, _, values = setup
    trials = _trials(lm, setup, kind, copies_per_forward=7)
    masks = _masks(len(trials.nodes), 6)
    t0 = time.perf_counter()
    fast = trials.scores(masks)
    t1 = time.perf_counter()
    slow = tf.reference_scores(lm, items, values[kind], masks)
    t2 = time.perf_counter()
    print(f"{kind}: fast {t1 - t0:.3f} s, reference {t2 - t1:.3f} s ({len(masks)} circuits x "
          f"{len(items)} items)")
    for m in protocol.TAIL_MEASURES:
        np.testing.assert_allclose(fast[m], slow[m], atol=1e-4, rtol=1e-4, err_msg=m)
    assert np.abs(fast["logprob"][0] - fast["logprob"][1]).max() > 1e-2  # the ablation does something
    np.testing.assert_allclose(fast["kl"][0], 0, atol=1e-5)
    assert fast["correct"][0].all()  # the gold answers are the model's own


def test_the_whole_model_circuit_is_read_from_the_reference(lm, setup):
    """A circuit that keeps every node is scored from the reference log-probabilities without a forward; the hooked
    forward (`hooked=True`, what the 'nothing ablated' check runs) gives the same measures."""
    trials = _trials(lm, setup, "resample")
    kept = np.ones((2, len(trials.nodes)), dtype=bool)
    kept[1, 3] = False
    read, hooked = trials.scores(kept), trials.scores(kept, hooked=True)
    for m in protocol.TAIL_MEASURES:
        np.testing.assert_allclose(read[m], hooked[m], atol=1e-5, rtol=1e-5, err_msg=m)
    np.testing.assert_array_equal(read["correct"][0], trials.model_correct)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_trials_equal_whole_hooked_forwards_on_cuda(model_dir, setup, dtype):
    """The same on a GPU, both ablations through `with_values`, values re-captured there:
    float32 within the CPU's tolerance; bfloat16 (the prefix cache and the whole forwards round differently) with
    log-probabilities within 5% of their spread over the circuits and correctness equal on 90% of circuit x item."""
    items, pool, _ = setup
    gpu = load_model(model_dir, device="cuda", dtype=dtype)
    values = {kind: tf.ablation_values(gpu, items, pool, kind, seed=0, batch_size=3) for kind in protocol.KINDS}
    base = tf.TailTrials(gpu, items, values["mean"], batch_size=3, copies_per_forward=7)
    masks = _masks(len(base.nodes), 6)
    for kind in protocol.KINDS:
        fast = base.with_values(values[kind]).scores(masks)
        slow = tf.reference_scores(gpu, items, values[kind], masks)
        spread = np.ptp(slow["logprob"])
        gap = np.abs(fast["logprob"] - slow["logprob"]).max()
        same = (fast["correct"] == slow["correct"]).mean()
        print(f"{kind} {dtype} on cuda: largest |trial - hooked forward| log-prob {gap:.2e}, "
              f"spread {spread:.3f}, correctness equal on {same:.0%}")
        assert spread > 1e-2
        if dtype == "float32":
            for m in protocol.TAIL_MEASURES:
                np.testing.assert_allclose(fast[m], slow[m], atol=1e-4, rtol=1e-4, err_msg=f"{kind} {m}")
        else:
            assert gap < 0.05 * spread and same >= 0.9


def test_shared_trials_and_padded_chunks_equal_the_reference(lm, setup):
    """`with_values` (another ablation on the same prefix caches and references) and chunks padded
    to one size (5 circuits in forwards of 2 copies of a 3-row batch: 2, 2, 1 + 1 pad) give the reference's
    values; a call of no circuits gives empty arrays."""
    items, _, values = setup
    base = _trials(lm, setup, "mean", copies_per_forward=7)
    masks = _masks(len(base.nodes), 5, seed=3)
    for kind in protocol.KINDS:
        fast = base.with_values(values[kind]).scores(masks)
        slow = tf.reference_scores(lm, items, values[kind], masks)
        for m in protocol.TAIL_MEASURES:
            np.testing.assert_allclose(fast[m], slow[m], atol=1e-4, rtol=1e-4, err_msg=f"{kind} {m}")
    assert base.values.kind == "mean"  # the base is left as it was
    assert base.scores(masks[:0])["logprob"].shape == (0, len(items))


def test_sanity_checks_on_a_draw_of_the_items(lm, setup):
    """`protocol_scores(sanity_samples=k)`: the checks run on a seeded draw of k items (said in {kind}_n_items),
    with the values the checks give on those items' own trials; the circuits' values stay on every item."""
    items, pool, _ = setup
    kept = _masks(len(_trials(lm, setup, "mean").nodes), 3, seed=7)
    kw = {"batch_size": 3, "sanity_draws": 3, "strict": False, "seed": 2}
    with pytest.warns(UserWarning):
        every, _ = tf.protocol_scores(lm, items, pool, kept, **kw)
        some, checked = tf.protocol_scores(lm, items, pool, kept, sanity_samples=5, **kw)
    # float32: batched differently, sums may run in another order (1e-6 apart); a wrong row is off by far more
    for key, v in every.items():
        np.testing.assert_allclose(some[key], v, atol=1e-5, err_msg=key)
    rows = np.sort(np.random.default_rng([2, 4307]).choice(len(items), 5, replace=False))
    for kind in protocol.KINDS:
        assert checked[f"{kind}_n_items"] == 5
        values = tf.ablation_values(lm, items, pool, kind, seed=2, batch_size=3).subset(rows)
        own = tf.TailTrials(lm, items.subset(rows), values, batch_size=3)
        checks = [c for c in tf.SANITY_CHECKS if c != "position alignment" or kind == protocol.KINDS[0]]
        with pytest.warns(UserWarning):  # the random tiny model fails the one-node check: its message says how
            expected = tf.sanity_checks(own, draws=3, seed=2, strict=False, checks=checks)
        for k, v in expected.items():
            assert checked[f"{kind}_{k}"] == (v if isinstance(v, str) else pytest.approx(v)), (kind, k)
        assert "of 3 single-node draws keep 0.95" in checked[f"{kind}_failed"]


@pytest.mark.parametrize("kind", protocol.KINDS)
def test_teacher_forced_correctness_is_greedy_correctness(lm, setup, kind):
    """Greedy answers with the same per-offset values at END and at each generated position are prompt + gold +
    terminator exactly where the teacher-forced item is correct; both outcomes occur."""
    items, _, values = setup
    trials = _trials(lm, setup, kind)
    masks = _masks(len(trials.nodes), 12, seed=1)
    correct = trials.scores(masks)["correct"].astype(bool)
    seen = set()
    for j, mask in enumerate(masks):
        tokens = tf.greedy_tail(lm, items, values[kind], mask)
        greedy = np.array([tokens[i, : items.tails[i]].tolist() == items.targets(i) for i in range(len(items))])
        np.testing.assert_array_equal(greedy, correct[j])
        seen |= set(greedy.tolist())
    assert seen == {True, False}


def test_per_item_and_try_drop_against_the_reference(lm, setup):
    items, _, values = setup
    trials = _trials(lm, setup, "resample", measure="kl")
    n = len(trials.nodes)
    kept = _masks(n, 3, seed=2)[2]
    bases = trials.start_circuit(kept)
    for node in np.flatnonzero(kept):
        m, new = trials.try_drop(kept, node, bases)
        trial = kept.copy()
        trial[node] = False
        slow = tf.reference_scores(lm, items, values["resample"], trial[None])["kl"].mean()
        assert m == pytest.approx(slow, abs=1e-4)
    np.testing.assert_allclose(trials.per_item(kept[None]),
                               tf.reference_scores(lm, items, values["resample"], kept[None])["kl"], atol=1e-4)


def test_attribution_sums_to_the_span(lm, setup):
    trials = _trials(lm, setup, "mean")
    n = len(trials.nodes)
    attribution = trials.attribution(steps=16)
    full, empty = trials.mean(np.array([[True] * n, [False] * n]))
    assert attribution.sum() == pytest.approx(full - empty, rel=0.05)
    single = ~np.eye(n, dtype=bool)
    rho = rank_correlation(attribution, full - trials.mean(single))
    print(f"tail attribution vs single-node effects: Spearman {rho:.3f}")
    assert rho > 0.5
    # on a circuit: the path from the empty circuit to it, its nodes' attributions summing to m(C) - m(empty)
    kept = _masks(n, 3, seed=3)[2]
    on = trials.attribution(steps=16, kept=kept)
    assert (on[~kept] == 0).all()
    assert on.sum() == pytest.approx(trials.mean(kept[None])[0] - empty, rel=0.05, abs=1e-3)


@pytest.mark.parametrize("measure", protocol.PRUNE_MEASURES)
def test_two_sided_pruning_against_every_subset(lm, setup, measure):
    """Every subset of the 10 nodes enumerated: each target's pruned circuit keeps |1 - f| <= 1 - target (overshoot
    not free) and is minimal; the smallest subset that does is no larger."""
    trials = _trials(lm, setup, "mean", measure=measure)
    n = len(trials.nodes)
    subsets = np.array(list(itertools.product([False, True], repeat=n)))
    means = trials.mean(subsets)
    f_all = protocol.faithfulness(means, means[-1], means[0])
    pruned, path = tf.prune(trials, [0.7, 0.9], ranking=tf.node_ranking(trials, 4)[0], max_passes=5, two_sided=True)
    for p in pruned:
        assert p.minimal and abs(1 - p.faithfulness) <= 1 - p.target
        f = protocol.faithfulness(trials.mean(p.kept[None]), means[-1], means[0])[0]
        assert f == pytest.approx(p.faithfulness, abs=1e-5)
        smaller = np.repeat(p.kept[None], p.kept.sum(), 0)
        smaller[np.arange(p.kept.sum()), np.flatnonzero(p.kept)] = False
        assert (np.abs(1 - protocol.faithfulness(trials.mean(smaller), means[-1], means[0])) > 1 - p.target).all()
        best = int(subsets[np.abs(1 - f_all) <= 1 - p.target].sum(1).min())
        print(f"{measure} target {p.target}: greedy {int(p.kept.sum())} nodes, smallest {best}")
        assert best <= p.kept.sum()


def test_two_sided_acceptance_refuses_overshoot():
    class Fake:
        nodes = [(0, 0), (0, 1)]

        def mean(self, kept):  # dropping node 0 overshoots: f = 1.5
            return np.array([{(True, True): 1.0, (False, False): 0.0, (False, True): 1.5, (True, False): 0.2}[
                tuple(bool(x) for x in k)] for k in np.asarray(kept)])

        def start_circuit(self, kept):
            return None

        def try_drop(self, kept, node, bases):
            trial = np.array(kept).copy()
            trial[node] = False
            return float(self.mean(trial[None])[0]), None

    one, _ = tf.prune(Fake(), [0.9], ranking=[1, 0])
    two, _ = tf.prune(Fake(), [0.9], ranking=[1, 0], two_sided=True)
    assert one[0].kept.tolist() == [False, True] and two[0].kept.tolist() == [True, True]


@pytest.mark.parametrize("kind", protocol.KINDS)
def test_sanity_checks_pass_on_the_protocol(lm, setup, kind):
    """Nothing ablated is the model (f = 1, its own accuracy), its own values at every offset are the model, and the
    empty circuit stays within the constant predictor. (One node of the tiny random model's ten moves its answers, so
    'one node ablated' is printed here and its verdict tested on known values below.)"""
    trials = _trials(lm, setup, kind)
    values = (tf.check_nothing_ablated(trials) | tf.check_position_alignment(trials)
              | tf.check_everything_ablated(trials))
    print(kind, values, tf.check_one_node(trials, share=0.0))
    assert values["nothing_correct"] == values["model_correct"] == 1 and values["self_patch_kl"] < 1e-4
    assert values["empty_correct"] <= values["constant_correct"] + 0.05


def test_sanity_checks_fail_on_a_broken_ablation(lm, setup, monkeypatch):
    """Hooks that ablate the KEPT nodes (the mask inverted) fail 'nothing ablated' and 'everything ablated'; values
    read at reversed offsets (END gets the last answer position's) fail 'position alignment'."""
    trials = _trials(lm, setup, "mean")
    right_ablation, right_rows = tf.TailTrials._ablation, tf.TailValues.rows
    monkeypatch.setattr(tf.TailTrials, "_ablation", lambda self, batch, kept: right_ablation(self, batch, ~kept))
    with pytest.raises(ValueError, match="'nothing ablated' failed"):
        tf.check_nothing_ablated(trials)
    with pytest.raises(ValueError, match="'everything ablated' failed"):
        tf.check_everything_ablated(trials)
    monkeypatch.undo()

    def reversed_rows(self, rows, T):
        v = right_rows(self, rows, T)
        return tf.AlignedMean(v.heads.flip(1), v.mlps.flip(1))

    monkeypatch.setattr(tf.TailValues, "rows", reversed_rows)
    tf.check_nothing_ablated(trials)  # nothing ablated reads no values: this check cannot see it
    with pytest.raises(ValueError, match="'position alignment' failed"):
        tf.check_position_alignment(trials)


def test_one_node_check_reads_a_share_of_the_models_accuracy(lm, setup, monkeypatch):
    trials = _trials(lm, setup, "mean")
    for acc, ok in [(0.96, True), (0.94, False)]:
        monkeypatch.setattr(trials, "scores", lambda kept, acc=acc: {"correct": np.full((len(kept), 8), acc)})
        monkeypatch.setattr(trials, "model_correct", np.ones(8))
        if ok:
            assert tf.check_one_node(trials)["one_node_share"] == pytest.approx(acc)
        else:
            with pytest.raises(ValueError, match="'one node ablated' failed"):
                tf.check_one_node(trials)
    monkeypatch.setattr(trials, "model_correct", np.full(8, 0.5))  # relative to the model's own
    monkeypatch.setattr(trials, "scores", lambda kept: {"correct": np.full((len(kept), 8), 0.48)})
    assert tf.check_one_node(trials)["one_node_share"] == pytest.approx(0.96)


def test_one_node_check_reads_most_draws_and_names_the_nodes_that_matter(lm, setup, monkeypatch):
    """Three of 20 draws hit nodes the model needs (their ablation keeps nothing): the mean over draws is 0.85, below
    0.95, yet 85% of the draws keep everything, so the check passes and names the three nodes; when six of 20 (or
    more) move the answers, fewer than three quarters keep them and it fails, naming them."""
    trials = _trials(lm, setup, "mean")
    monkeypatch.setattr(trials, "model_correct", np.ones(8))
    picks = np.random.default_rng([0, 4303]).choice(len(trials.nodes), size=20, replace=True)

    def scores(kept, lost=(3, 11, 17)):  # the draws `lost` keep nothing, the others everything
        out = np.ones((len(kept), 8))
        out[list(lost)] = 0.0
        return {"correct": out}

    monkeypatch.setattr(trials, "scores", scores)
    values = tf.check_one_node(trials)
    assert values["one_node_share"] == pytest.approx(0.85) and values["one_node_kept"] == pytest.approx(0.85)
    assert values["one_node_failing"] == ", ".join(f"{node_label(*trials.nodes[picks[j]])} 0.00" for j in (3, 11, 17))
    monkeypatch.setattr(trials, "scores", lambda kept: scores(kept, lost=range(5)))
    assert tf.check_one_node(trials)["one_node_kept"] == 0.75  # exactly three quarters: passes
    monkeypatch.setattr(trials, "scores", lambda kept: scores(kept, lost=range(6)))
    with pytest.raises(ValueError, match=r"'one node ablated' failed: 70% of 20 single-node draws keep 0\.95"):
        tf.check_one_node(trials)


@pytest.fixture(scope="module")
def quiet(model_dir):
    """The tiny model with every head's and MLP's output scaled by 0.1 (o_proj, down_proj), and its setup: no single
    node decides its answers, as in a trained model of hundreds of nodes (the random tiny model's near-tied answers
    move with any node), so a correct ablation of one node must leave them nearly all standing."""
    quiet_lm = load_model(model_dir, device="cpu")
    with torch.no_grad():
        for layer in quiet_lm.model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.1)
            layer.mlp.down_proj.weight.mul_(0.1)
    return quiet_lm, _setup(quiet_lm)


@pytest.mark.parametrize("kind", protocol.KINDS)
def test_one_node_check_passes_a_correct_ablation_and_fails_a_broken_one(quiet, kind):
    """On a model no single node decides: most draws of the correct ablation keep the answers; values tripled (the
    group's sum of three for its mean) or sign-flipped move them whichever node is ablated, and fail the check."""
    quiet_lm, (items, _, values) = quiet
    v = values[kind]

    def trials(heads, mlps):
        return tf.TailTrials(quiet_lm, items, tf.TailValues(heads, mlps, v.kind, v.donors), batch_size=3)

    assert tf.check_one_node(trials(v.heads, v.mlps))["one_node_kept"] >= 0.75
    for broken in (3.0, -1.0):
        with pytest.raises(ValueError, match="'one node ablated' failed"):
            tf.check_one_node(trials(broken * v.heads, broken * v.mlps))


def test_cpr_cmd_curve(lm, setup):
    trials = _trials(lm, setup, "mean")
    ranking, _ = tf.node_ranking(trials, 4)
    curve = tf.cpr_cmd(trials, ranking)
    assert curve["share"].tolist() == list(tf.SHARES)
    assert curve["n_nodes"].tolist() == [1, 1, 1, 1, 2, 5, 10]
    assert curve["f_logprob"].iloc[-1] == pytest.approx(1, abs=1e-5) and curve["dev_logprob"].iloc[-1] < 1e-5
    masks = tf.share_circuits(ranking, [0.5])
    assert set(np.flatnonzero(masks[0])) == set(ranking[:5].tolist())


def test_sanity_checks_run_every_check_and_name_the_failed(lm, setup, monkeypatch):
    """`sanity_checks` runs every check: strict, one ValueError naming each failed one; not strict, a warning and the
    messages in 'failed' beside the values of the checks that passed."""
    trials = _trials(lm, setup, "mean")
    right = tf.TailTrials._ablation
    monkeypatch.setattr(tf.TailTrials, "_ablation", lambda self, batch, kept: right(self, batch, ~kept))
    checks = ["nothing ablated", "everything ablated"]
    with pytest.raises(ValueError, match="'nothing ablated' failed.*'everything ablated' failed"):
        tf.sanity_checks(trials, checks=checks)
    with pytest.warns(UserWarning, match="'nothing ablated' failed"):
        values = tf.sanity_checks(trials, checks=checks + ["position alignment"], strict=False)
    assert "'everything ablated' failed" in values["failed"] and values["self_patch_kl"] < 1e-4
    with pytest.raises(ValueError, match="unknown sanity checks"):
        tf.sanity_checks(trials, checks=["nothing"])


def test_protocol_scores_stops_only_on_the_strict_kinds(lm, setup):
    """`protocol_scores(strict=[kind])`: a failed check of that ablation raises; the other's is recorded in its
    'failed' value with a warning (`protocol.strict_kinds`: every kind with circuit.discover.sanity stop, none
    with warn). The random tiny model fails the one-node check under both ablations (its near-tied answers move with
    any node: each draw loses one to four of its eight items)."""
    items, pool, _ = setup
    kept = np.ones((1, 10), dtype=bool)
    with pytest.raises(ValueError, match="one node ablated"):
        tf.protocol_scores(lm, items, pool, kept, batch_size=3, sanity_draws=4, strict=["mean"])
    with pytest.warns(UserWarning, match="one node ablated"):
        _, sanity = tf.protocol_scores(lm, items, pool, kept, batch_size=3, sanity_draws=4, strict=[])
    assert "one node ablated" in sanity["resample_failed"] and "one node ablated" in sanity["mean_failed"]
