"""The discover search on a planted circuit (issue 57): a tiny 3-layer model whose answer is carried by a known set of
nodes, every other node's output scaled to 2% of its own (o_proj's columns of the head, the MLP's down_proj), the
planted nodes' to 300% (so each of them matters). The search (`tf.node_ranking` and `tf.prune`, as the
discover rule runs them on the teacher-forced protocol with the mean ablation) must return exactly the planted set,
and the CPR curve of its ranking must keep f >= 0.9 at the planted set's size on held-out items; orders that are
known to be wrong (the ranking reversed, a random one) and the older order (the top nodes by the whole model's
signed attribution, which ranks a planted MLP that opposes the answer on its own below the idle nodes) do not.
Pruned on two operators' items together (one `TailTrials` of `concat_items` and `concat_values`, each operator's items
ablated with its own pool's values, as the discover_shared rule prunes the shared circuit), the search returns the
planted set too.

The tiny model is random: the items' gold answers are the planted model's OWN greedy tokens, so it is right on every
item by construction (as tests/interp/test_teacher_forcing.py does)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arithmech.data.arithmetic import build_prompts, split_operands
from arithmech.interp import protocol
from arithmech.interp import teacher_forcing as tf
from arithmech.interp.nodes import MLP
from arithmech.model.loading import load_model
from arithmech.model.tiny import build_tiny_model
from helpers import PROMPT_CFG

PLANTED = [(1, 3), (2, 1), (1, MLP), (2, MLP)]  # L1H3, L2H1, L1MLP, L2MLP of 15 nodes
IDLE, GAIN = 0.02, 3.0  # the other nodes' outputs scaled to ~0, the planted ones' up
TARGET = 0.9  # the threshold: the curve keeps f >= 0.9 at the planted size


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    lm = load_model(build_tiny_model(tmp_path_factory.mktemp("planted") / "model", n_layers=3), device="cpu")
    D = lm.head_dim
    with torch.no_grad():
        for layer in range(lm.n_layers):
            weight = lm.o_proj(layer).weight
            for head in range(lm.n_heads):
                weight[:, head * D : (head + 1) * D] *= GAIN if (layer, head) in PLANTED else IDLE
            lm.mlp_proj(layer, "down_proj").weight.mul_(GAIN if (layer, MLP) in PLANTED else IDLE)
    pairs = build_prompts(lm.tokenizer, "addition", PROMPT_CFG, seed=0)
    pairs["split"] = split_operands(pairs, 0.5, seed=0)
    pool = _own_items(lm, pairs[pairs["split"] == "identification"])
    held_out = _own_items(lm, pairs[pairs["split"] == "validation"])
    fit = tf.TailTrials(lm, pool, tf.ablation_values(lm, pool, pool, "mean"), batch_size=16)
    scored = tf.TailTrials(lm, held_out, tf.ablation_values(lm, held_out, pool, "mean"), batch_size=16)
    return fit, scored, np.array([n in PLANTED for n in fit.nodes])


@pytest.fixture(scope="module")
def second_operator(planted):
    """The planted model's identification items of a second operator (multiplication), with their own pool."""
    lm = planted[0].lm
    pairs = build_prompts(lm.tokenizer, "multiplication", PROMPT_CFG, seed=1)
    pairs["split"] = split_operands(pairs, 0.5, seed=1)
    pool = _own_items(lm, pairs[pairs["split"] == "identification"])
    return tf.TailTrials(lm, pool, tf.ablation_values(lm, pool, pool, "mean"), batch_size=16)


@torch.no_grad()
def _own_items(lm, table) -> tf.TailItems:
    """Items whose gold answer is the model's own greedy continuation (1 + template_id tokens), then its terminator."""
    prompt_ids, answer_ids, terminators = [], [], []
    for prompt, template in zip(table["prompt"], table["template_id"]):
        ids = lm.tokenizer(prompt)["input_ids"]
        out = lm.model.generate(torch.tensor([ids]), max_new_tokens=2 + int(template), do_sample=False,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long), pad_token_id=0)
        new = out[0, len(ids) :].tolist()
        prompt_ids.append(ids)
        answer_ids.append(new[:-1])
        terminators.append(new[-1])
    table = table.reset_index(drop=True).assign(answer=[" ".join(map(str, a)) for a in answer_ids])
    return tf.TailItems(table, prompt_ids, answer_ids, terminators)


def _f_at(trials, ranking, size: int) -> dict:
    """The CPR curve of `ranking` at `size` nodes: {measure: f}."""
    curve = tf.cpr_cmd(trials, ranking, [size / len(trials.nodes)])
    assert int(curve["n_nodes"].iloc[0]) == size
    return {m: float(curve[f"f_{m}"].iloc[0]) for m in ("logprob", "correct")}


def test_the_construction_plants_a_circuit(planted):
    """The premise: the planted set keeps the model's behaviour (|1 - f| <= 0.1 on the log-probability) and none of
    its nodes can go (each drop leaves |1 - f| > 0.1), so the planted set is what a faithful minimal search finds."""
    fit, _, mask = planted
    n = len(mask)
    full, empty, kept = fit.mean(np.vstack([np.ones(n, dtype=bool), np.zeros(n, dtype=bool), mask]))
    assert abs(1 - protocol.faithfulness(kept, full, empty)) <= 1 - TARGET
    less = np.repeat(mask[None], mask.sum(), 0)
    less[np.arange(mask.sum()), np.flatnonzero(mask)] = False
    f_less = protocol.faithfulness(fit.mean(less), full, empty)
    print(f"planted minus one node: f {np.round(f_less, 3).tolist()}")
    assert (np.abs(1 - f_less) > 1 - TARGET).all()


def test_the_search_returns_the_planted_circuit(planted):
    """Pruned on the identification items at target 0.9 (two-sided, as the rule prunes): exactly the planted set. The
    ranking's CPR curve on the held-out items keeps f >= 0.9 at the planted size, on the log-probability and on full
    answers."""
    fit, scored, mask = planted
    ranking, attribution = tf.node_ranking(fit, 8)
    pruned, _ = tf.prune(fit, [TARGET], ranking=ranking, attribution=attribution, two_sided=True)
    found = {fit.nodes[i] for i in np.flatnonzero(pruned[0].kept)}
    assert found == set(PLANTED) and pruned[0].minimal
    f = _f_at(scored, ranking, len(PLANTED))
    print(f"the rule's ranking at {len(PLANTED)} nodes: {f}")
    assert f["logprob"] >= TARGET and f["correct"] >= TARGET


def test_wrong_orders_fail_the_planted_curve(planted):
    """The negative controls: the same check fails for the ranking reversed, a random order and the older order (the
    top nodes by the whole model's signed attribution), so the test above can fail."""
    fit, scored, _ = planted
    ranking, attribution = tf.node_ranking(fit, 8)
    wrong = {"reversed": ranking[::-1], "random": np.random.default_rng(0).permutation(len(ranking)),
             "whole-model attribution": np.argsort(-attribution, kind="stable")}
    for name, order in wrong.items():
        f = _f_at(scored, order, len(PLANTED))
        print(f"{name} at {len(PLANTED)} nodes: {f}")
        assert min(f.values()) < TARGET, name


def _pooled(*parts: tf.TailTrials) -> tf.TailTrials:
    """One trial set of every part's items, each with its own values (as discover_shared builds it)."""
    return tf.TailTrials(parts[0].lm, tf.concat_items([p.items for p in parts]),
                         tf.concat_values([p.values for p in parts]), batch_size=sum(p.n_items for p in parts))


def test_pooled_trials_are_the_mean_over_every_operators_items(planted, second_operator):
    """Two operators' items in one `TailTrials` (their items of one T in one forward) against each operator's own
    trials, the slow reference: every item's measure is its own operator's (so the pruning measure is the mean over
    both operators' items), a layer-resumed drop equals the dropped circuit measured whole, and the attribution is
    the parts' weighted by their items."""
    fit, _, mask = planted
    pooled = _pooled(fit, second_operator)
    assert pooled.n_items == fit.n_items + second_operator.n_items
    assert len(pooled.batches) < len(fit.batches) + len(second_operator.batches)  # shared forwards
    masks = np.vstack([np.ones_like(mask), mask, ~mask])
    for measure in ("logprob", "correct", "kl"):
        both = np.concatenate([fit.scores(masks)[measure], second_operator.scores(masks)[measure]], 1)
        np.testing.assert_allclose(pooled.scores(masks)[measure], both, rtol=1e-4, atol=1e-4)
    node = int(np.flatnonzero(mask)[0])
    dropped, _ = pooled.try_drop(mask, node, pooled.start_circuit(mask))
    less = mask.copy()
    less[node] = False
    assert dropped == pytest.approx(float(pooled.mean(less[None])[0]), rel=1e-5)
    expected = (fit.attribution(4) * fit.n_items + second_operator.attribution(4) * second_operator.n_items)
    np.testing.assert_allclose(pooled.attribution(4), expected / pooled.n_items, rtol=1e-4, atol=1e-6)


def test_two_operators_pruned_together_give_back_the_planted_circuit(planted, second_operator):
    """The shared circuit on a planted case: two operators whose answers the same planted nodes carry, pruned
    together at target 0.9 (two-sided), give back exactly the planted set, which on the pooled items keeps the
    target and loses it without any one of its nodes (so another set could have come back)."""
    fit, _, mask = planted
    pooled = _pooled(fit, second_operator)
    ranking, attribution = tf.node_ranking(pooled, 8)
    pruned, _ = tf.prune(pooled, [TARGET], ranking=ranking, attribution=attribution, two_sided=True)
    found = {pooled.nodes[i] for i in np.flatnonzero(pruned[0].kept)}
    assert found == set(PLANTED) and pruned[0].minimal
    less = np.repeat(mask[None], mask.sum(), 0)
    less[np.arange(mask.sum()), np.flatnonzero(mask)] = False
    full, empty, kept, *dropped = pooled.mean(np.vstack([np.ones_like(mask), np.zeros_like(mask), mask, less]))
    assert abs(1 - protocol.faithfulness(kept, full, empty)) <= 1 - TARGET
    assert (np.abs(1 - protocol.faithfulness(np.array(dropped), full, empty)) > 1 - TARGET).all()
