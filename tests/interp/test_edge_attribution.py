"""Tests for EAP-IG edge attribution on teacher-forced tails (arithmech.interp.edges: eap_ig_edges, exact_edge_effects,
edge_circuit_measure, top_edges, node_ranked_edges), on the tiny CPU model (float32).

The tail: each row is a 2-shot addition prompt followed by its gold answer "<digit>." (T = 3: END, the digit and
the full stop, read against the digit, the full stop and the end-of-text token). Three kinds of ablated values,
per row and tail position, index 0 = the last position (`hooks.patch_tail`'s convention):
  clean     the model's own outputs (nothing changes);
  near      clean + 1% (or 0.5%) of each tensor's spread in Gaussian noise: the regime where a first-order estimate
            must agree with the exact effect;
  resample  the outputs of another row of the same template (the issue's resample ablation), far from linear.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from arithmech.data.arithmetic import build_prompts
from arithmech.interp import edges as E
from arithmech.interp.nodes import MLP, all_nodes
from arithmech.interp.teacher_forcing import tail_gated
from arithmech.intervention.hooks import capture, hooks
from arithmech.intervention.means import AlignedMean
from arithmech.model.tiny import FAMILIES
from helpers import n_hooks, rank_correlation

ROWS = [0, 5, 11, 16, 21, 27, 30, 3]  # both templates (4 rows each), prompts of two lengths


@pytest.fixture(scope="module")
def tf_of(tiny_family, base_prompt_cfg):
    """tf_of(family) -> (the tiny model of `family`, its `tf` data), made once per family."""
    made = {}

    def get(family):
        if family not in made:
            lm = tiny_family(family)[1]
            made[family] = (lm, _tail_data(lm, base_prompt_cfg))
        return made[family]

    return get


@pytest.fixture(scope="module")
def tf(tf_of):
    return tf_of("llama")[1]


def _tail_data(lm, base_prompt_cfg):
    """Teacher-forced token sequences, targets, and the three kinds of ablated values (module docstring)."""
    tok = lm.tokenizer
    df = build_prompts(tok, "addition", base_prompt_cfg, seed=0).iloc[ROWS].reset_index(drop=True)
    seqs, targets = [], []
    for prompt, answer in zip(df["prompt"], df["answer"]):
        gold = tok(f"{answer}.").input_ids
        seqs.append(tok(prompt).input_ids + gold)
        targets.append(gold + [lm.eos_ids[0]])
    targets = torch.tensor(targets)
    T = targets.shape[1]
    assert T == 3 and len({len(s) for s in seqs}) == 2  # padding is exercised
    with torch.no_grad(), capture(lm, end_only=False) as cap:
        lm.model(**E.tail_batch(lm, seqs))
    heads, mlps = cap.stacked_heads()[:, -T:].flip(1), cap.stacked_mlps()[:, -T:].flip(1)  # index 0 = last
    gen = torch.Generator().manual_seed(0)
    noise_h, noise_m = torch.randn(heads.shape, generator=gen), torch.randn(mlps.shape, generator=gen)

    def near(eps):
        return AlignedMean(heads + eps * heads.std() * noise_h, mlps + eps * mlps.std() * noise_m)

    template = df["template_id"].tolist()
    same = [[j for j in range(len(ROWS)) if template[j] == t] for t in template]
    donor = [s[(s.index(i) + 1) % len(s)] for i, s in enumerate(same)]  # the next row of the same template
    assert all(d != i for i, d in enumerate(donor))
    return {"seqs": seqs, "targets": targets, "clean": AlignedMean(heads, mlps), "near": near,
            "resample": AlignedMean(heads[donor], mlps[donor])}


def _all_senders(lm):
    return [(l, h) for l in range(lm.n_layers) for h in range(lm.n_heads)]


def _flat(scores: E.EdgeScores) -> torch.Tensor:
    """Every (row, edge) value, head -> MLP and head -> logits, NaN (no edge) left out."""
    values = torch.cat([scores.mlp.flatten(), scores.direct.flatten()])
    return values[~values.isnan()]


def test_near_linear_regime_matches_exact_patching(tiny_lm, tf):
    """Where the ablated values are close to the outputs, EAP-IG is the exact edge effect up to second order. With
    1% noise the largest effect is ~0.016 nats and EAP-IG is within 0.6% of it (measured; float32 rounding of the
    summed log-probability, ~3e-6, is far below): tolerance 2%. The error is second order, the effects first: so
    halving the noise halves the relative error (measured 0.54% -> 0.26%). An estimate with a wrong gradient
    (scaled by the interpolation's alpha, as differentiating through the gates would do, or read at the residual
    stream) is off at first order: an error that does not shrink with the noise, of tens of percent."""
    lm, senders, receivers = tiny_lm, _all_senders(tiny_lm), list(range(tiny_lm.n_layers))
    errors = {"nodes": [], "model": []}
    for eps in (1e-2, 5e-3):
        ablated = tf["near"](eps)
        exact = E.exact_edge_effects(lm, tf["seqs"], tf["targets"], ablated, senders, receivers, direct=True)
        a = _flat(exact)
        assert len(a) == len(ROWS) * (24 + 12)  # 24 head -> MLP edges (receiver layer >= sender's) + 12 direct
        assert a.abs().max() > 1e-3  # the effects are not all ~0
        for path in errors:
            ig = E.eap_ig_edges(lm, tf["seqs"], tf["targets"], ablated, senders, receivers, steps=4, direct=True,
                                path=path)
            assert torch.equal(exact.mlp.isnan(), ig.mlp.isnan())
            errors[path].append(float((a - _flat(ig)).abs().max() / a.abs().max()))
    for path, (err, half) in errors.items():
        assert err < 0.02 and err / half > 1.6, (path, errors)
    assert n_hooks(lm.model) == 0


def test_rank_correlation_with_resampled_values(tiny_lm, tf):
    """With real ablated values (resampled from another prompt of the same template) the tiny random model is far
    from linear, and EAP-IG is a first-order estimate: it ranks the (row, edge) effects with Spearman 0.95 and
    the row-averaged edges with 0.76 (measured; 24 edges, many near 0 where sign flips reorder them), and finds
    the strongest edge. Floors 0.9 and 0.6."""
    lm, senders, receivers = tiny_lm, _all_senders(tiny_lm), list(range(tiny_lm.n_layers))
    args = (lm, tf["seqs"], tf["targets"], tf["resample"], senders, receivers)
    exact = E.exact_edge_effects(*args, direct=True)
    ig = E.eap_ig_edges(*args, steps=8, direct=True)
    assert rank_correlation(_flat(exact), _flat(ig)) > 0.9
    by_three = E.eap_ig_edges(*args, steps=8, direct=True, batch_size=3)  # rows batched: the same scores
    torch.testing.assert_close(_flat(by_three), _flat(ig), atol=1e-6, rtol=0)
    model = E.eap_ig_edges(*args, direct=True, path="model")  # the model's own gradient: here much the same
    assert rank_correlation(_flat(exact), _flat(model)) > 0.9
    live = ~exact.mlp[0].isnan()
    mean_exact, mean_ig = exact.mlp.mean(0)[live], ig.mlp.mean(0)[live]
    assert rank_correlation(mean_exact, mean_ig) > 0.6
    assert int(mean_exact.abs().argmax()) == int(mean_ig.abs().argmax())
    assert rank_correlation(exact.direct.mean(0), ig.direct.mean(0)) > 0.9


@pytest.mark.parametrize("family", FAMILIES)
def test_isolated_edge_path_converges_to_exact_effect(tf_of, family):
    """The gradient's place and the sender's change, checked exactly: along each edge's own path (only its
    receiver's input moves) the score is an integral of the edge effect's derivative, so it converges to the exact
    effect as steps grow, for any ablated values. A gradient of the residual stream (skip connection included)
    instead of the norm's input breaks this (checked by mutation); the deltas are shared with the exact effects,
    so their o_proj columns are checked by the slow reference of `edge_circuit_measure` below. The all-node path
    differs from the exact effect here by far more (so the agreement is not trivial). On every family: Gemma 3's
    sender change is taken through the norm after o_proj."""
    lm, tf = tf_of(family)
    receivers = list(range(lm.n_layers))
    senders = [(0, 0), (0, 3), (1, 2), (2, 1)]
    seqs, targets = tf["seqs"][2:4], tf["targets"][2:4]  # one row of each template
    ablated = AlignedMean(tf["resample"].heads[2:4], tf["resample"].mlps[2:4])
    args = (lm, seqs, targets, ablated, senders, receivers)
    exact = _flat(E.exact_edge_effects(*args, direct=True))
    coarse = _flat(E.eap_ig_edges(*args, steps=6, direct=True, path="edge"))
    fine = _flat(E.eap_ig_edges(*args, steps=24, direct=True, path="edge"))
    nodes = _flat(E.eap_ig_edges(*args, steps=8, direct=True))
    scale = float(exact.abs().max())
    assert scale > 0.05
    torch.testing.assert_close(fine, exact, atol=1e-4 * scale + 1e-5, rtol=0)
    torch.testing.assert_close(coarse, fine, atol=2e-3 * scale, rtol=0)  # stable in the number of steps
    assert float((nodes - exact).abs().max()) > 30 * float((fine - exact).abs().max())
    assert n_hooks(lm.model) == 0


def test_nothing_ablated_nothing_moves(tiny_lm, tf):
    """Ablated values equal to the model's own outputs, in `patch_tail`'s order (index 0 = the last position):
    every edge effect and score is 0 and an edge circuit without any edge is the model. Values read in the wrong
    order (positions swapped) would move things."""
    lm, senders, receivers = tiny_lm, _all_senders(tiny_lm), [0, 2]
    args = (lm, tf["seqs"], tf["targets"], tf["clean"], senders, receivers)
    exact, ig = E.exact_edge_effects(*args, direct=True), E.eap_ig_edges(*args, steps=2, direct=True)
    assert _flat(exact).abs().max() < 1e-5 and _flat(ig).abs().max() < 1e-6
    kept = np.zeros((len(senders), len(receivers)), dtype=bool)
    none, full = E.edge_circuit_measure(*args, np.stack([kept, ~kept]), kept_direct=np.zeros((2, len(senders))))
    np.testing.assert_allclose(none, full, atol=1e-5)
    swapped = AlignedMean(tf["clean"].heads.flip(1), tf["clean"].mlps.flip(1))
    moved = E.exact_edge_effects(lm, tf["seqs"], tf["targets"], swapped, senders, receivers)
    assert float(np.nanmax(moved.mlp.abs().numpy())) > 1e-3


def _slow_circuit_measure(lm, seqs, targets, ablated, senders, receivers, kept, kept_direct):
    """The definition of `edge_circuit_measure`, written apart: one unpadded row and one circuit at a time, one
    pre-hook per ablated edge, each passing a head-masked input (the sender's output in this forward minus its
    ablated value, read back from index T - 1 - t) through the real o_proj weights (whole, bias included) and
    subtracting the result. Where a norm follows o_proj (Gemma 3) a receiver instead gets one pre-hook per sender
    layer, subtracting the real attention block's output (o_proj's weights, then the norm) minus that output with
    the senders it drops ablated together."""
    through_norm = lm.attn_out_norm(0) is not None
    T, H, D = targets.shape[1], lm.n_heads, lm.head_dim
    out = np.zeros((len(kept), len(seqs)))
    for c, (kept_c, direct_c) in enumerate(zip(kept, kept_direct)):
        # each receiver (its module, the last sender layer it reads, which senders' edges into it are dropped)
        receivers_c = [(lm.mlp_norm(r), r, [not kept_c[s, j] for s in range(len(senders))])
                       for j, r in enumerate(receivers)] + [(lm.final_norm, lm.n_layers, [not d for d in direct_c])]
        for i, seq in enumerate(seqs):
            live = {}

            def record(layer):
                def fn(module, args):
                    live[layer] = args[0][0, -T:].view(T, H, D).clone()

                return fn

            def drop(layer, heads):
                def fn(module, args):
                    z = live[layer]
                    cut = z.clone()
                    for t in range(T):
                        for head in heads:
                            cut[t, head] = ablated.heads[i, T - 1 - t, layer, head]
                    proj = lm.o_proj(layer)
                    if through_norm:  # the whole block's output, its other heads as they are, through the norm
                        norm = lm.attn_out_norm(layer)
                        removed = norm(F.linear(z.flatten(1), proj.weight, proj.bias)) - norm(
                            F.linear(cut.flatten(1), proj.weight, proj.bias))
                    else:  # the head-masked difference alone through o_proj
                        masked = torch.zeros(T, H, D)
                        masked[:, heads] = z[:, heads] - cut[:, heads]
                        removed = F.linear(masked.flatten(1), proj.weight, proj.bias) - F.linear(
                            torch.zeros(T, H * D), proj.weight, proj.bias)
                    x = args[0].clone()
                    x[0, -T:] -= removed
                    return (x, *args[1:])

                return fn

            pre = [(lm.o_proj(l), record(l)) for l in range(lm.n_layers)]
            for module, limit, dropped in receivers_c:
                for layer in range(lm.n_layers):
                    heads = [h for s, (l, h) in enumerate(senders) if l == layer and l <= limit and dropped[s]]
                    # one hook per dropped edge; through a norm one per sender layer, its dropped senders together
                    for group in ([heads] if through_norm else [[h] for h in heads]) if heads else []:
                        pre.append((module, drop(layer, group)))
            with torch.no_grad(), hooks(pre=pre):
                logits = lm.model(input_ids=torch.tensor([seq])).logits[0, -T:]
            out[c, i] = float(logits.log_softmax(-1).gather(1, targets[i][:, None]).sum())
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_edge_circuit_measure_against_slow_reference(tf_of, family):
    """Edge circuits scored in one batched forward equal the slow per-edge definition; with every edge kept the
    measure is the model's own, and with one edge dropped it is the model's minus that edge's exact effect. On
    every family (Gemma 3: the dropped senders of a layer taken out through the norm after o_proj together)."""
    lm, tf = tf_of(family)
    senders, receivers = _all_senders(lm), list(range(lm.n_layers))
    seqs, targets, ablated = tf["seqs"][:5], tf["targets"][:5], AlignedMean(tf["resample"].heads[:5],
                                                                            tf["resample"].mlps[:5])
    rng = np.random.default_rng(0)
    S, R = len(senders), len(receivers)
    kept = rng.random((4, S, R)) < 0.5
    kept[0], kept[1] = True, False
    kept_direct = rng.random((4, S)) < 0.5
    kept_direct[0] = True
    fast = E.edge_circuit_measure(lm, seqs, targets, ablated, senders, receivers, kept, kept_direct=kept_direct,
                                  batch_size=2)
    slow = _slow_circuit_measure(lm, seqs, targets, ablated, senders, receivers, kept, kept_direct)
    assert fast.shape == (4, 5)
    np.testing.assert_allclose(fast, slow, atol=2e-5, rtol=0)
    assert np.abs(fast[1:] - fast[0]).max() > 0.05  # the dropped edges matter
    with torch.no_grad():
        own = lm.model(**E.tail_batch(lm, seqs)).logits[:, -3:].log_softmax(-1)
    np.testing.assert_allclose(fast[0], own.gather(2, targets[..., None]).sum((1, 2)).numpy(), atol=1e-5)
    # one edge dropped: the exact effect's definition
    one = np.ones((S, R), dtype=bool)
    one[5, 2] = False  # (1, 1) -> MLP 2
    single = E.edge_circuit_measure(lm, seqs, targets, ablated, senders, receivers, one)
    exact = E.exact_edge_effects(lm, seqs, targets, ablated, senders, receivers)
    np.testing.assert_allclose(fast[0] - single[0], exact.mlp[:, 5, 2].numpy(), atol=2e-5)
    assert n_hooks(lm.model) == 0


def test_node_path_is_the_attributions_gated_path(tiny_lm, tf):
    """Path "nodes" moves every node along the discover rule's integrated-gradients path
    (`teacher_forcing.tail_gated`): with a tail of END alone and the same END values for every row, its forward at
    alpha is tail_gated's at g = alpha."""
    lm = tiny_lm
    T1 = tf["targets"][:, :1]
    seqs = [s[:-2] for s in tf["seqs"]]  # the prompts alone: END is the last position
    means = AlignedMean(tf["resample"].heads[:1, :1].mean(0), tf["resample"].mlps[:1, :1].mean(0))  # [1, L, ...]
    n = len(seqs)
    per_row = AlignedMean(means.heads[None].repeat(n, 1, 1, 1, 1), means.mlps[None].repeat(n, 1, 1, 1))
    tail = E._tail(lm, seqs, T1, per_row, "logprob")
    alpha = 0.3
    pre, post = E._node_path_hooks(lm, tail, torch.full((n,), alpha), 1)
    with torch.no_grad(), hooks(pre, post):
        ours = lm.model(**tail.enc).logits[:, -1]
    gates = torch.full((n, len(all_nodes(lm.n_layers, lm.n_heads))), alpha)
    with torch.no_grad(), tail_gated(lm, gates, per_row, 1):
        theirs = lm.model(**tail.enc).logits[:, -1]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    with torch.no_grad():
        assert (lm.model(**tail.enc).logits[:, -1] - ours).abs().max() > 1e-2


def test_top_edges():
    scores = np.array([[0.5, -2.0, np.nan], [1.0, 0.1, 3.0]])
    assert E.top_edges(scores, 2).tolist() == [[False, True, False], [False, False, True]]
    assert E.top_edges(scores, 2, absolute=False).tolist() == [[False, False, False], [True, False, True]]
    assert E.top_edges(scores, 5).sum() == 5 and not E.top_edges(scores, 5)[0, 2]
    with pytest.raises(ValueError, match="between 0 and the 5 edges"):
        E.top_edges(scores, 6)


def test_node_ranked_edges_are_the_node_circuits_edges():
    """At every size n of a node circuit taken in node-score order, the k edges `node_ranked_edges` returns for k =
    the circuit's number of head -> MLP edges are exactly that circuit's edges."""
    L, H = 3, 4
    nodes = all_nodes(L, H)
    senders, receivers = [(l, h) for l in range(L) for h in range(H)], list(range(L))
    scores = np.random.default_rng(1).normal(size=len(nodes))
    order = np.argsort(-np.abs(scores), kind="stable")
    checked = 0
    for size in range(len(nodes) + 1):
        top = {nodes[i] for i in order[:size]}
        induced = np.array([[s in top and (r, MLP) in top and r >= s[0] for r in receivers] for s in senders])
        got = E.node_ranked_edges(scores, senders, receivers, L, H, int(induced.sum()))
        assert got.tolist() == induced.tolist()
        checked += induced.sum() > 0
    assert checked > 5
    with pytest.raises(ValueError, match=r"node scores must be \[15\]"):
        E.node_ranked_edges(scores[:3], senders, receivers, L, H, 1)


def test_bad_input(tiny_lm, tf):
    lm, seqs, targets, ablated = tiny_lm, tf["seqs"], tf["targets"], tf["resample"]
    senders, receivers = [(0, 0)], [1]
    with pytest.raises(ValueError, match=r"targets must be \[rows, tail\]"):
        E.eap_ig_edges(lm, seqs, targets[:, 0], ablated, senders, receivers)
    with pytest.raises(ValueError, match=r"targets must be \[rows, tail\] = \[8, T\]"):
        E.eap_ig_edges(lm, seqs, targets[:3], ablated, senders, receivers, batch_size=2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        E.exact_edge_effects(lm, seqs, targets, ablated, senders, receivers, batch_size=0)
    end_mean = AlignedMean(ablated.heads[0, :1], ablated.mlps[0, :1])  # an END mean, not per-row tail values
    with pytest.raises(ValueError, match="ablated values must be per row and tail position"):
        E.eap_ig_edges(lm, seqs, targets, end_mean, senders, receivers)
    enc = E.tail_batch(lm, seqs)
    right_padded = {k: v.flip(1) for k, v in enc.items()}
    with pytest.raises(ValueError, match="left-padded"):
        E.exact_edge_effects(lm, right_padded, targets, ablated, senders, receivers)
    with pytest.raises(ValueError, match="must lie inside every row's tokens"):
        E.eap_ig_edges(lm, [s[-2:] for s in seqs], targets, ablated, senders, receivers)
    with pytest.raises(ValueError, match="receiver MLP layer 7"):
        E.eap_ig_edges(lm, seqs, targets, ablated, senders, [7])
    with pytest.raises(ValueError, match=r"sender head \(0, 9\)"):
        E.edge_circuit_measure(lm, seqs, targets, ablated, [(0, 9)], receivers, [[True]])
    with pytest.raises(ValueError, match=r"kept edges must be \[circuits, 1 senders, 1 receivers\]"):
        E.edge_circuit_measure(lm, seqs, targets, ablated, senders, receivers, np.ones((2, 2), dtype=bool))
    with pytest.raises(ValueError, match="measure must be one of logprob, kl"):
        E.eap_ig_edges(lm, seqs, targets, ablated, senders, receivers, measure="logit")
    with pytest.raises(ValueError, match="path must be one of nodes, model, edge"):
        E.eap_ig_edges(lm, seqs, targets, ablated, senders, receivers, path="inputs")
    with pytest.raises(ValueError, match="IG steps must be >= 1"):
        E.eap_ig_edges(lm, seqs, targets, ablated, senders, receivers, steps=0)
    assert n_hooks(lm.model) == 0


def test_kl_measure(tiny_lm, tf):
    """The kl measure is minus KL(model || circuit): 0 with every edge kept, negative without them, and every single
    edge's exact effect on it is >= 0 (no edge can bring the circuit closer to the model than the model). EAP-IG on
    kl is not asserted to rank well: KL is flat at the model (zero gradient at alpha = 1), so one edge's effect on it
    is second order and a first-order estimate reads noise (Spearman 0.48 against the exact effects here, against
    0.95 for logprob): rank edges on logprob."""
    lm, senders, receivers = tiny_lm, _all_senders(tiny_lm), [1, 2]
    args = (lm, tf["seqs"], tf["targets"], tf["resample"], senders, receivers)
    kept = np.ones((2, len(senders), len(receivers)), dtype=bool)
    kept[1] = False
    full, none = E.edge_circuit_measure(*args, kept, measure="kl")
    np.testing.assert_allclose(full, 0, atol=1e-5)
    assert (none < -1e-3).all()
    exact = E.exact_edge_effects(*args, measure="kl")
    live = ~exact.mlp.isnan()
    assert (exact.mlp[live] > -1e-5).all() and exact.mlp[live].max() > 1e-3


def test_edge_size_curve(tiny_lm, tf):
    """Both rankings scored exactly at the same sizes: no edge is faithfulness 0, every edge 1, and each row is the
    measure of the edge set its ranking picks (checked against edge_circuit_measure for one k)."""
    lm, senders, receivers = tiny_lm, _all_senders(tiny_lm), list(range(tiny_lm.n_layers))
    args = (lm, tf["seqs"], tf["targets"], tf["resample"], senders, receivers)
    scores = E.eap_ig_edges(*args, steps=4).mlp.mean(0).numpy()
    node_scores = np.random.default_rng(2).normal(size=len(all_nodes(lm.n_layers, lm.n_heads)))
    curve = E.edge_size_curve(*args, scores, node_scores, [0, 6, 24])
    assert curve["ranking"].tolist() == ["eap_ig", "nodes"] * 3 and curve["edges"].tolist() == [0, 0, 6, 6, 24, 24]
    np.testing.assert_allclose(curve["faithfulness"].to_numpy()[[0, 1]], 0, atol=1e-9)
    np.testing.assert_allclose(curve["faithfulness"].to_numpy()[[4, 5]], 1, atol=1e-6)
    six = E.edge_circuit_measure(*args, E.top_edges(scores, 6)).mean()
    assert abs(curve["measure"][2] - six) < 1e-6
    with pytest.raises(ValueError, match="between 0 and the 24 edges"):
        E.edge_size_curve(*args, scores, node_scores, [25])


def _mixed_tail_items(lm, base_prompt_cfg):
    """Teacher-forced items of two tail lengths (answers "<n>." and "<n>") and resample values from a donor of the
    same tail length."""
    from arithmech.interp import teacher_forcing as tfm

    tok = lm.tokenizer
    df = build_prompts(tok, "addition", base_prompt_cfg, seed=0).iloc[ROWS].reset_index(drop=True)
    answers = [tok(f"{a}." if i % 2 else f"{a}").input_ids for i, a in enumerate(df["answer"])]
    items = tfm.TailItems(df, [tok(p).input_ids for p in df["prompt"]], answers, [lm.eos_ids[0]] * len(df))
    heads, mlps = tfm.tail_outputs(lm, items, batch_size=3)
    tails = items.tails
    donors = np.array([next(j for j in range(1, len(df)) if tails[(i + j) % len(df)] == tails[i]) for i in
                       range(len(df))])
    donors = (np.arange(len(df)) + donors) % len(df)
    return items, tfm.TailValues(heads[donors], mlps[donors], "resample", donors)


def test_items_edge_curve_on_mixed_tails(tiny_lm, base_prompt_cfg):
    """`edges.items_edge_curve` on items of two tail lengths: every edge is faithfulness 1; each row's measure is
    the mean over items of `edge_circuit_measure` on each item alone with the edge set its ranking picks from
    the item-averaged EAP-IG scores (an independent per-item computation); sizes follow the shares."""
    lm = tiny_lm
    items, values = _mixed_tail_items(lm, base_prompt_cfg)
    senders, receivers = [(0, 1), (1, 0), (1, 3)], list(range(lm.n_layers))
    node_scores = np.random.default_rng(3).normal(size=len(all_nodes(lm.n_layers, lm.n_heads)))
    curve = E.items_edge_curve(lm, (items, values), (items, values), senders, receivers, node_scores,
                               shares=[0.25, 1.0], steps=2, batch_size=3)
    n_edges = sum(r >= l for l, _ in senders for r in receivers)
    assert curve["edges"].tolist() == [int(np.ceil(0.25 * n_edges))] * 2 + [n_edges] * 2
    assert (curve["n_edges"] == n_edges).all() and curve["share"].tolist() == [0.25, 0.25, 1.0, 1.0]
    np.testing.assert_allclose(curve["faithfulness"].to_numpy()[2:], 1, atol=1e-6)
    per_item = [E.eap_ig_edges(lm, [items.prompt_ids[i] + items.answer_ids[i]], [items.targets(i)],
                               values.rows([i], int(items.tails[i])), senders, receivers, steps=2).mlp[0]
                for i in range(len(items))]
    scores = torch.stack(per_item).mean(0).numpy()
    k = int(curve["edges"].iloc[0])
    picks = {"eap_ig": E.top_edges(scores, k),
             "nodes": E.node_ranked_edges(node_scores, senders, receivers, lm.n_layers, lm.n_heads, k)}
    for ranking, kept in picks.items():
        alone = [E.edge_circuit_measure(lm, [items.prompt_ids[i] + items.answer_ids[i]], [items.targets(i)],
                                        values.rows([i], int(items.tails[i])), senders, receivers, kept)[0, 0]
                 for i in range(len(items))]
        got = curve[(curve["ranking"] == ranking) & (curve["edges"] == k)]["measure"].iloc[0]
        assert got == pytest.approx(float(np.mean(alone)), abs=1e-4), ranking


def test_path_cuts_map_items_of_mixed_tails_and_agree_with_the_protocols_model(tiny_lm, base_prompt_cfg):
    """`edges.path_cuts` on teacher-forced items of two tail lengths (answers "<n>." and "<n>"): each cut equals
    `edge_circuit_measure` called on that item alone with the cut written out by hand, 'model' equals the
    protocol's own full-model log-probability (`teacher_forcing.TailTrials`, an independent forward), and cutting
    every edge changes the measure."""
    from arithmech.interp import teacher_forcing as tfm

    lm = tiny_lm
    items, values = _mixed_tail_items(lm, base_prompt_cfg)
    tails = items.tails
    senders = [(0, 1), (1, 0)]
    cuts = E.path_cuts(lm, items, values, senders, batch_size=3)
    receivers = list(range(lm.n_layers))
    for i in range(len(items)):
        T = int(tails[i])
        for cut, (mlp_kept, direct_kept) in E.PATH_CUTS.items():
            kept = torch.full((len(senders), len(receivers)), mlp_kept)
            one = E.edge_circuit_measure(lm, [items.prompt_ids[i] + items.answer_ids[i]], [items.targets(i)],
                                         values.rows([i], T), senders, receivers, kept,
                                         kept_direct=torch.full((len(senders),), direct_kept))
            assert cuts[cut][i] == pytest.approx(float(one[0, 0]), abs=1e-4), (cut, i)
    trials = tfm.TailTrials(lm, items, values, measure="logprob", batch_size=3)
    model = trials.scores(np.ones((1, len(trials.nodes)), dtype=bool))["logprob"][0]
    np.testing.assert_allclose(cuts["model"], model, atol=1e-4)
    assert np.abs(cuts["both"] - cuts["model"]).max() > 1e-3
