"""Tests for arithmech.interp.ablation (mean ablation, knockout curves, random heads), the `hooks.patch_tail`
helper it rests on, and arithmech.intervention.generation (first-token scores, greedy generation) and
arithmech.data.answers (reading numbers), all on the tiny CPU model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arithmech.data.answers import (
    answer_correct,
    answer_decided,
    decided_answers,
    extract_number,
    full_answer_accuracy,
    number_settled,
)
from arithmech.data.arithmetic import build_prompts, encode
from arithmech.interp.ablation import (
    ablation_hooks,
    greedy_end_sets,
    knockout,
    mean_ablate,
)
from arithmech.interp.nodes import random_heads
from arithmech.interp.patching import collect
from arithmech.intervention.generation import (
    first_token_accuracy,
    first_token_predictions,
    first_token_scores,
    greedy_answers,
    greedy_generate,
)
from arithmech.intervention.hooks import capture, hooks, patch_end, patch_tail
from arithmech.intervention.means import AlignedMean
from helpers import n_hooks

# both templates (30..42 tokens), so batches are padded
ROWS = [0, 3, 9, 14, 17, 22, 26, 31]
RANKED = [(2, 1), (1, 3), (0, 0), (2, 3), (1, 0)]


@pytest.fixture(scope="module")
def data(tiny_lm, base_prompt_cfg):
    df = build_prompts(tiny_lm.tokenizer, "addition", base_prompt_cfg, seed=0).iloc[ROWS].reset_index(drop=True)
    assert df["n_tokens"].nunique() > 1
    texts, cf = df["prompt"].tolist(), df["cf_prompt"].tolist()
    answers = torch.tensor(df["answer_token_id"].to_numpy())
    _, grouped = collect(tiny_lm, cf, answers, batch_size=3, groups=[0] * len(cf))
    mean = grouped.group(0)  # one mean over all counterfactuals, by offset from END, as long as the longest
    # The random tiny model gets the gold answers wrong; its own greedy tokens make accuracy 1 at baseline,
    # so the knockout curve has somewhere to fall.
    own = first_token_predictions(tiny_lm, texts, batch_size=8)
    return {"texts": texts, "answers": answers, "mean": mean, "own": own}


def _logits(lm, texts, ctx=None):
    with torch.no_grad(), (ctx if ctx is not None else torch.no_grad()):
        return lm.model(**encode(lm.tokenizer, texts), logits_to_keep=1).logits[:, -1]


# ---------------------------------------------------------------------------------------------------
# patch_tail


def test_patch_tail_with_one_position_is_patch_end(tiny_lm, data):
    texts = data["texts"][:4]
    B, H, D, d = 4, tiny_lm.n_heads, tiny_lm.head_dim, tiny_lm.d_model
    g = torch.Generator().manual_seed(0)
    hv, mv = torch.randn(B, H, D, generator=g), torch.randn(B, d, generator=g)
    hm = torch.rand(B, H, generator=g) > 0.5
    mm = torch.tensor([True, False, True, False])
    want = _logits(tiny_lm, texts, patch_end(tiny_lm, {1: (hm, hv)}, {2: (mm, mv)}))
    got = _logits(tiny_lm, texts, patch_tail(tiny_lm, {1: (hm, hv[:, None])}, {2: (mm, mv[:, None])}))
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert (got - _logits(tiny_lm, texts)).abs().max() > 1e-3  # the patch does something


# ---------------------------------------------------------------------------------------------------
# mean_ablate


def test_ablating_nothing_reproduces_the_baseline_exactly(tiny_lm, data):
    texts, own = data["texts"], data["own"]
    base = first_token_scores(tiny_lm, texts, own, batch_size=3)
    for positions in ("end", "aligned"):
        with mean_ablate(tiny_lm, [], [], data["mean"], positions=positions):
            assert n_hooks(tiny_lm.model) == 0
            got = first_token_scores(tiny_lm, texts, own, batch_size=3)
        for a, b in zip(got, base):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert first_token_accuracy(tiny_lm, texts, own, 3, ablation_hooks(tiny_lm, [], [], data["mean"])) == 1.0
    assert knockout(tiny_lm, texts, own, RANKED, K=0, means=data["mean"], positions="end",
                    batch_size=3).accuracy.tolist() == [1.0]


def _own_values(lm, texts, P):
    """Per-row values of every node over the last P positions, index 0 = END (AlignedMean layout + batch)."""
    with torch.no_grad(), capture(lm, end_only=False) as cap:
        lm.model(**encode(lm.tokenizer, texts), logits_to_keep=1)
    heads = cap.stacked_heads()[:, -P:].flip(1)  # [B, P, L, H, D]
    mlps = cap.stacked_mlps()[:, -P:].flip(1)  # [B, P, L, d]
    return AlignedMean(heads, mlps)


@pytest.mark.parametrize("positions", ["end", "aligned"])
def test_ablating_with_each_rows_own_values_is_a_no_op(tiny_lm, data, positions):
    texts = data["texts"][:5]
    own = _own_values(tiny_lm, texts, P=12)
    all_heads = [(l, h) for l in range(tiny_lm.n_layers) for h in range(tiny_lm.n_heads)]
    mlps = list(range(tiny_lm.n_layers))
    base = _logits(tiny_lm, texts)
    got = _logits(tiny_lm, texts, mean_ablate(tiny_lm, all_heads, mlps, own, positions=positions))
    torch.testing.assert_close(got, base, atol=1e-5, rtol=0)
    # ... whereas the counterfactual mean changes the logits, and "aligned" changes them differently
    ablated = _logits(tiny_lm, texts, mean_ablate(tiny_lm, RANKED, [1], data["mean"], positions=positions))
    assert (ablated - base).abs().max() > 1e-2
    assert n_hooks(tiny_lm.model) == 0


def test_end_and_aligned_write_exactly_where_they_should(tiny_lm, data):
    texts = data["texts"][:4]
    mean = data["mean"]
    P = 5
    short = AlignedMean(mean.heads[:P], mean.mlps[:P])
    enc = encode(tiny_lm.tokenizer, texts)
    S = enc["input_ids"].shape[1]
    with torch.no_grad(), capture(tiny_lm, end_only=False) as base:
        tiny_lm.model(**enc, logits_to_keep=1)
    for positions, n in (("end", 1), ("aligned", P)):
        # capture is registered after the ablation, so it sees the ablated values
        ablate = mean_ablate(tiny_lm, [(1, 2)], [2], short, positions=positions)
        with torch.no_grad(), ablate, capture(tiny_lm, end_only=False) as cap:
            tiny_lm.model(**enc, logits_to_keep=1)
        tail = slice(S - n, S)
        want_h = short.heads[:n, 1, 2].flip(0)  # oldest first
        torch.testing.assert_close(cap.heads[1][:, tail, 2], want_h.expand(4, n, -1), atol=0, rtol=0)
        torch.testing.assert_close(cap.mlps[2][:, tail], short.mlps[:n, 2].flip(0).expand(4, n, -1), atol=0, rtol=0)
        # other heads of the layer are untouched at the tail (all upstream of it is); nothing before the
        # tail changes anywhere
        torch.testing.assert_close(cap.heads[1][:, tail, 1], base.heads[1][:, tail, 1], atol=0, rtol=0)
        for l in range(tiny_lm.n_layers):
            torch.testing.assert_close(cap.heads[l][:, : S - n], base.heads[l][:, : S - n], atol=0, rtol=0)
            torch.testing.assert_close(cap.mlps[l][:, : S - n], base.mlps[l][:, : S - n], atol=0, rtol=0)
        # downstream of the ablation, the tail does change
        assert (cap.heads[2][:, -1] - base.heads[2][:, -1]).abs().max() > 1e-4


def test_row_masks_ablate_per_row(tiny_lm, data):
    texts = data["texts"][:4]
    nodes_h, nodes_m = [(0, 1), (2, 0)], [1]
    masks = torch.tensor([[False, False, False], [True, False, False], [False, True, True], [True, True, True]])
    got = _logits(tiny_lm, texts, mean_ablate(tiny_lm, nodes_h, nodes_m, data["mean"], positions="aligned",
                                              row_masks=masks))
    for i in range(4):
        hs = [h for h, m in zip(nodes_h, masks[i, :2]) if m]
        ms = [l for l, m in zip(nodes_m, masks[i, 2:]) if m]
        want = _logits(tiny_lm, texts, mean_ablate(tiny_lm, hs, ms, data["mean"], positions="aligned"))[i]
        torch.testing.assert_close(got[i], want, atol=1e-5, rtol=0)


def test_mean_ablate_rejects_bad_arguments(tiny_lm, data):
    mean = data["mean"]
    with pytest.raises(ValueError, match="positions"):
        with mean_ablate(tiny_lm, [(0, 0)], [], mean, positions="all"):
            pass
    with pytest.raises(ValueError, match="out of range"):
        with mean_ablate(tiny_lm, [(0, tiny_lm.n_heads)], [], mean):
            pass
    with pytest.raises(ValueError, match="out of range"):
        with mean_ablate(tiny_lm, [], [tiny_lm.n_layers], mean):
            pass
    with pytest.raises(ValueError, match="row_masks"):
        with mean_ablate(tiny_lm, [(0, 0)], [1], mean, row_masks=torch.ones(3, 1, dtype=torch.bool)):
            pass
    assert n_hooks(tiny_lm.model) == 0


# ---------------------------------------------------------------------------------------------------
# knockout


@pytest.mark.parametrize("positions", ["end", "aligned"])
def test_batched_knockout_equals_separate_evaluations(tiny_lm, data, positions):
    texts, own, mean = data["texts"], data["own"], data["mean"]
    K = len(RANKED)
    ko = knockout(tiny_lm, texts, own, RANKED, K=K, means=mean, positions=positions, batch_size=3)  # 3 + 3 + 2 texts
    assert ko.predicted.shape == ko.answer_logits.shape == (K + 1, len(texts))
    for k in range(K + 1):
        ablate = ablation_hooks(tiny_lm, RANKED[:k], [], mean, positions=positions)
        pred, logit, _ = first_token_scores(tiny_lm, texts, own, 8, ablate)
        assert torch.equal(ko.predicted[k], pred), k
        torch.testing.assert_close(ko.answer_logits[k], logit, atol=1e-5, rtol=0)
        assert ko.accuracy[k] == pytest.approx(float((pred == own).float().mean()))
    assert ko.accuracy[0] == 1.0 and ko.accuracy.min() < 1.0  # the ablation bites on the tiny model


def test_knockout_rejects_k_beyond_the_ranking(tiny_lm, data):
    with pytest.raises(ValueError, match="K must be"):
        knockout(tiny_lm, data["texts"], data["own"], RANKED, K=len(RANKED) + 1, means=data["mean"])


# knockout fast path (prefix KV cache, END token only): the first step of greedy_end_sets


def first_step(lm, texts, answers, head_sets, mean, batch_size, copies):
    """greedy_end_sets' first step: (first tokens, answer logits) [n_sets, n] of each head set."""
    got = greedy_end_sets(lm, texts, head_sets, means=mean, max_new_tokens=1, answer_ids=answers, batch_size=batch_size,
                          copies_per_forward=copies)
    return got.first_tokens, got.first_answer_logits


@pytest.mark.parametrize(
    "K, batch_size, copies",
    [(5, 3, 7), (5, 8, 13), (3, 5, 1), (2, 8, 256), (0, 3, 4)],  # chunks of sets that do not divide K + 1
)
def test_first_step_of_the_fast_path_equals_the_reference(tiny_lm, data, K, batch_size, copies):
    texts, own, mean = data["texts"], data["own"], data["mean"]
    want = knockout(tiny_lm, texts, own, RANKED, K=K, means=mean, positions="end", batch_size=3)
    tokens, logits = first_step(tiny_lm, texts, own, [RANKED[:k] for k in range(K + 1)], mean, batch_size, copies)
    assert tokens.shape == logits.shape == (K + 1, len(texts))
    assert torch.equal(tokens, want.predicted)
    torch.testing.assert_close(logits, want.answer_logits, atol=1e-5, rtol=0)
    if K == len(RANKED):
        assert want.accuracy[0] == 1.0 and want.accuracy.min() < 1.0
    assert n_hooks(tiny_lm.model) == 0


def test_fast_path_left_padding_is_exact(tiny_lm, data):
    """A long and a short prompt in one batch: the short one carries many pad tokens in the cache."""
    texts, own = data["texts"], data["own"]
    lengths = [len(tiny_lm.tokenizer(t)["input_ids"]) for t in texts]
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    pick = [order[0], order[-1], order[1], order[-2]]  # shortest, longest, ...
    assert lengths[pick[1]] - lengths[pick[0]] >= 5
    sub, ans = [texts[i] for i in pick], own[pick]
    K = len(RANKED)
    want = knockout(tiny_lm, sub, ans, RANKED, K=K, means=data["mean"], positions="end", batch_size=4)
    for bs in (1, 2, 4):  # unpadded and padded batches agree
        tokens, logits = first_step(tiny_lm, sub, ans, [RANKED[:k] for k in range(K + 1)], data["mean"], bs, 5)
        assert torch.equal(tokens, want.predicted)
        torch.testing.assert_close(logits, want.answer_logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("batch_size, copies", [(3, 5), (8, 11), (8, 1000)])
def test_fast_path_head_sets_equal_separate_evaluations(tiny_lm, data, batch_size, copies):
    texts, own, mean = data["texts"], data["own"], data["mean"]
    L, H = tiny_lm.n_layers, tiny_lm.n_heads
    sets = [random_heads(L, H, 3, seed=s, exclude=RANKED[:3]) for s in range(4)]
    sets += [[], RANKED[:3], [(1, 2)], [(0, 1), (0, 1), (2, 2)], []]  # baseline twice, a duplicated head
    tokens, logits = first_step(tiny_lm, texts, own, sets, mean, batch_size, copies)
    accuracy = (tokens == own[None]).float().mean(1)
    base_pred, base_logit, _ = first_token_scores(tiny_lm, texts, own, 8)
    for s, hs in enumerate(sets):
        pred, logit, _ = first_token_scores(tiny_lm, texts, own, 8, ablation_hooks(tiny_lm, hs, [], mean,
                                                                                   positions="end"))
        assert torch.equal(tokens[s], pred), s
        torch.testing.assert_close(logits[s], logit, atol=1e-5, rtol=0)
        if not hs:
            assert torch.equal(tokens[s], base_pred) and accuracy[s] == 1.0
            torch.testing.assert_close(logits[s], base_logit, atol=1e-5, rtol=0)
    assert accuracy.min() < 1.0
    assert n_hooks(tiny_lm.model) == 0


def test_fast_path_edge_cases(tiny_lm, data):
    texts, own, mean = data["texts"], data["own"], data["mean"]
    assert first_step(tiny_lm, texts, own, [], mean, 16, 256)[0].shape == (0, len(texts))
    tokens, _ = first_step(tiny_lm, texts, own, [[], []], mean, 3, 1)
    assert torch.equal(tokens[0], tokens[1])
    assert first_step(tiny_lm, [], own[:0], [[(0, 0)]], mean, 16, 256)[0].shape == (1, 0)
    with pytest.raises(ValueError, match="out of range"):
        first_step(tiny_lm, texts, own, [[(0, tiny_lm.n_heads)]], mean, 16, 256)
    per_row = AlignedMean(mean.heads[None].expand(2, -1, -1, -1, -1), mean.mlps[None].expand(2, -1, -1, -1))
    with pytest.raises(ValueError, match="shared mean"):
        first_step(tiny_lm, texts, own, [[(0, 0)]], per_row, 16, 256)
    assert n_hooks(tiny_lm.model) == 0


def test_random_heads():
    a = random_heads(3, 4, 5, seed=1, exclude=[(0, 0), (2, 3)])
    assert a == random_heads(3, 4, 5, seed=1, exclude=[(2, 3), (0, 0)])
    assert len(set(a)) == 5 and not {(0, 0), (2, 3)} & set(a)
    assert all(0 <= l < 3 and 0 <= h < 4 for l, h in a)
    assert random_heads(3, 4, 5, seed=2) != random_heads(3, 4, 5, seed=3)
    assert sorted(random_heads(3, 4, 10, seed=0, exclude=[(0, 0), (1, 1)])) == sorted(
        (l, h) for l in range(3) for h in range(4) if (l, h) not in {(0, 0), (1, 1)}
    )
    with pytest.raises(ValueError):
        random_heads(3, 4, 11, seed=0, exclude=[(0, 0), (1, 1)])


# ---------------------------------------------------------------------------------------------------
# generation


def _manual_greedy(lm, texts, n_new, prefill_ctx=None):
    """Token-by-token greedy loop with a KV cache: the prompt in one forward (inside `prefill_ctx` if given),
    then one token per forward."""
    tok = lm.tokenizer
    eos, pad = lm.model.generation_config.eos_token_id, tok.pad_token_id
    enc = encode(tok, texts)
    mask, pos = enc["attention_mask"], enc["position_ids"]
    with torch.no_grad():
        with prefill_ctx if prefill_ctx is not None else torch.no_grad():
            out = lm.model(**enc, use_cache=True)
        finished = torch.zeros(len(texts), dtype=torch.bool)
        steps, logits = [], []
        for step in range(n_new):
            logits.append(out.logits[:, -1])
            nxt = out.logits[:, -1].argmax(-1)
            nxt = torch.where(finished, torch.full_like(nxt, pad), nxt)
            steps.append(nxt)
            finished |= nxt == eos
            mask = torch.cat([mask, torch.ones(len(texts), 1, dtype=mask.dtype)], 1)
            pos = pos[:, -1:] + 1
            out = lm.model(
                input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, past_key_values=out.past_key_values,
                use_cache=True,
            )
    return torch.stack(steps, 1), torch.stack(logits, 1)


def _recompute_greedy_end_ablation(lm, texts, n_new, heads, mlps, mean):
    """No cache: every step reruns the whole sequence, with a hook of its own that writes the END mean at
    the prompt's END and at every generated position (what "end" ablation with a KV cache amounts to)."""
    tok = lm.tokenizer
    enc = encode(tok, texts)
    S0 = enc["input_ids"].shape[1]
    ids, mask, pos = enc["input_ids"], enc["attention_mask"], enc["position_ids"]
    H, D = lm.n_heads, lm.head_dim

    def head_hook(layer, hs):
        def fn(module, args):
            x = args[0].clone()
            v = x[:, S0 - 1 :].view(x.shape[0], -1, H, D)
            for h in hs:
                v[:, :, h] = mean.heads[0, layer, h]
            return (x, *args[1:])

        return fn

    def mlp_hook(layer):
        def fn(module, args, output):
            output = output.clone()
            output[:, S0 - 1 :] = mean.mlps[0, layer]
            return output

        return fn

    layers = sorted({l for l, _ in heads})
    pre = [(lm.o_proj(l), head_hook(l, [h for ll, h in heads if ll == l])) for l in layers]
    post = [(lm.mlp(l), mlp_hook(l)) for l in mlps]
    steps, logits = [], []
    with torch.no_grad(), hooks(pre, post):
        for _ in range(n_new):
            logits.append(lm.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1])
            nxt = logits[-1].argmax(-1)
            steps.append(nxt)
            ids = torch.cat([ids, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            pos = torch.cat([pos, pos[:, -1:] + 1], 1)
    return torch.stack(steps, 1), torch.stack(logits, 1)


N_NEW = 5


def _same(a, b):
    """Same tokens and the same logits at every step."""
    assert torch.equal(a[0], b[0])
    torch.testing.assert_close(a[1], b[1], atol=2e-5, rtol=0)


@pytest.fixture(scope="module")
def generated(tiny_lm, data):
    texts = data["texts"]
    plain = greedy_generate(tiny_lm, texts, N_NEW, batch_size=3, return_logits=True)
    with mean_ablate(tiny_lm, RANKED, [1], data["mean"], positions="end"):
        ablated = greedy_generate(tiny_lm, texts, N_NEW, batch_size=3, return_logits=True)
    return plain, ablated


def test_greedy_generate_matches_first_token_and_manual_loop(tiny_lm, data, generated):
    plain, _ = generated
    texts = data["texts"]
    assert plain[0].shape == (len(texts), N_NEW)
    assert plain[1].shape == (len(texts), N_NEW, tiny_lm.unembed.weight.shape[0])
    assert torch.equal(plain[0][:, 0], data["own"])
    _same(plain, _manual_greedy(tiny_lm, texts, N_NEW))
    ids = greedy_generate(tiny_lm, texts, N_NEW, batch_size=8)
    assert torch.equal(ids, plain[0])
    answers = greedy_answers(tiny_lm, texts, N_NEW, batch_size=8)
    assert answers == tiny_lm.tokenizer.batch_decode(plain[0], skip_special_tokens=True)


@pytest.mark.parametrize("positions", ["end", "aligned"])
def test_ablation_applies_at_every_generated_step(tiny_lm, data, generated, positions):
    texts, mean = data["texts"], data["mean"]
    plain, ablated_end = generated
    if positions == "end":
        ablated = ablated_end
    else:
        with mean_ablate(tiny_lm, RANKED, [1], mean, positions=positions):
            ablated = greedy_generate(tiny_lm, texts, N_NEW, batch_size=3, return_logits=True)
    with mean_ablate(tiny_lm, RANKED, [1], mean, positions=positions):
        manual = _manual_greedy(tiny_lm, texts, N_NEW)
    _same(ablated, manual)
    # the ablation changes the logits of every step
    assert ((ablated[1] - plain[1]).abs().amax(dim=(0, 2)) > 1e-3).all()
    if positions == "end":
        # the same ablation passed as per-forward hooks gives the same, and so does the cache-free definition
        per_forward = greedy_generate(tiny_lm, texts, N_NEW, 3, hooks=ablation_hooks(tiny_lm, RANKED, [1], mean,
                                                                                     positions="end"),
                                      return_logits=True)
        _same(per_forward, ablated)
        # per-row masks are numbered like the texts: odd rows ablated, even rows the plain model
        odd = (torch.arange(len(texts)) % 2 == 1)[:, None].expand(-1, len(RANKED) + 1)
        mixed = greedy_generate(tiny_lm, texts, N_NEW, 3, hooks=ablation_hooks(tiny_lm, RANKED, [1], mean,
                                                                               positions="end", row_masks=odd),
                                return_logits=True)
        rows = odd[:, 0]
        _same((mixed[0][rows], mixed[1][rows]), (ablated[0][rows], ablated[1][rows]))
        _same((mixed[0][~rows], mixed[1][~rows]), (plain[0][~rows], plain[1][~rows]))
        _same(ablated, _recompute_greedy_end_ablation(tiny_lm, texts, N_NEW, RANKED, [1], mean))
        # control: ablating only the prompt (the first forward) agrees at the first step, not after it
        only_prompt = _manual_greedy(tiny_lm, texts, N_NEW, mean_ablate(tiny_lm, RANKED, [1], mean, positions="end"))
        torch.testing.assert_close(only_prompt[1][:, 0], ablated[1][:, 0], atol=2e-5, rtol=0)
        assert ((only_prompt[1][:, 1:] - ablated[1][:, 1:]).abs().amax(dim=(0, 2)) > 1e-3).all()
        # the first generated token is the ablated first-token prediction
        first = first_token_predictions(tiny_lm, texts, 8, ablation_hooks(tiny_lm, RANKED, [1], mean, positions="end"))
        assert torch.equal(ablated[0][:, 0], first)
    assert n_hooks(tiny_lm.model) == 0


# ---------------------------------------------------------------------------------------------------
# reading numbers


@pytest.mark.parametrize(
    "text, value",
    [
        ("7", 7.0),
        ("The answer is 7.", 7.0),
        (" 42.\n3 plus 4 is equal to 7", 42.0),
        ("-3", -3.0),
        ("it is -12 degrees", -12.0),
        ("\u22125", -5.0),
        ("1,000", 1000.0),
        ("1,234,567.5 apples", 1234567.5),
        ("1,0000", 1.0),  # not a thousands grouping: the plain integer before the comma
        ("$18.50", 18.5),
        ("-$18.50", -18.5),
        ("$-2", -2.0),
        ("2.25 + 1", 2.25),
        ("0.5", 0.5),
        (".5 of it", 0.5),
        ("x2 is 3", 3.0),
        ("5-3", 5.0),
        ("The answer is", None),
        ("", None),
    ],
)
def test_extract_number(text, value):
    assert extract_number(text) == value


@pytest.mark.parametrize("text, settled", [
    ("8", False), ("8.", False), ("8.5", False), ("8.\n", True), ("8\n", True), ("8 apples", True),
    ("12,", False), ("12,5", False), ("12, and", True), ("1,234", False), ("1,234 ", True),
    ("The answer is", False), ("", False), ("-", False), ("$5 ", True), ("8\ufffd", False), ("x 3 y", True),
])
def test_number_settled(text, settled):
    assert number_settled(text) is settled


def test_a_settled_number_stays_the_first_number_whatever_follows():
    rng = np.random.default_rng(0)
    alphabet = list("0123456789.,-$ a\n") + ["\u2212", "\ufffd", "\u0663"]  # U+0663: an Arabic-Indic digit
    n_settled = 0
    for _ in range(3000):
        text = "".join(rng.choice(alphabet, size=rng.integers(0, 9)))
        if not number_settled(text):
            continue
        n_settled += 1
        for _ in range(5):
            tail = "".join(rng.choice(alphabet, size=rng.integers(1, 6)))
            assert extract_number(text + tail) == extract_number(text), (text, tail)
    assert n_settled > 300


@pytest.mark.parametrize("text, gold, decided", [
    ("8", 8, False), ("8", 9, False), ("7", 9, True), ("10", 9, True),
    ("1", 12, False), ("2", 12, True), ("12", 12, False), ("13", 12, True),
    ("1", 9.99, True), ("1", 9.9999999999, False), ("9", 10, False), ("0", 8, False),
    ("07", 8, False), ("07", 7, False), ("06", 8, True),
    ("7", 8.5, True), ("8", 8.5, False), ("8.", 9, False), ("8.5", 9, False), ("-8", 9, False), ("$3", 9, True),
    ("1,", 9, True), ("1,", 1000, False), ("x 4", 9, True), ("The", 9, False), ("", 9, False),
    ("8\n", 9, True), ("8\n", 8, True),
    ("5", "5", False), ("3", "5", True), ("4", "no number", False), ("1", 1.5e9, False), ("\u0663", 3, False),
])
def test_answer_decided(text, gold, decided):
    assert answer_decided(text, gold) is decided


def test_a_decided_answer_keeps_its_score_whatever_follows():
    """Random texts and golds near the numbers they start, random tails: once decided, a score never changes."""
    rng = np.random.default_rng(1)
    alphabet = list("0123456789.,-$ a\n") + ["\u2212", "\ufffd", "\u0663"]
    n_hopeless = 0
    for _ in range(6000):
        text = "".join(rng.choice(alphabet, size=rng.integers(0, 7)))
        gold = [int(rng.integers(0, 40)), int(rng.integers(0, 2000)), float(rng.integers(0, 400)) / 4,
                -int(rng.integers(0, 40)), str(rng.integers(0, 40))][rng.integers(0, 5)]
        if not answer_decided(text, gold):
            continue
        n_hopeless += not number_settled(text)
        score = answer_correct(text, gold)
        for _ in range(6):
            tail = "".join(rng.choice(alphabet, size=rng.integers(1, 7)))
            assert answer_correct(text + tail, gold) == score, (text, gold, tail)
    assert n_hopeless > 300  # decided because the number can no longer become the gold, not only settled


def test_decided_answers_reads_the_gold_of_the_row_text(tiny_lm):
    tok = tiny_lm.tokenizer
    decided = decided_answers(tok, [12, 3])
    ids = tok("1", add_special_tokens=False)["input_ids"]
    assert not decided(0, ids) and decided(1, ids)  # "1" can still become 12, never 3


def test_answer_accuracy():
    assert answer_correct("12.\nWhat", 12) and answer_correct(" 1,000 ", "1000") and answer_correct("3.50", 3.5)
    assert not answer_correct("13", 12) and not answer_correct("no number", 12)
    assert full_answer_accuracy(["12.", "5", "x"], [12, 6, 1]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        full_answer_accuracy(["1"], [1, 2])


# ---------------------------------------------------------------------------------------------------
# greedy answers for many node sets (prefix-cache fast path)


@pytest.mark.parametrize("positions, n_pos", [("end", None), ("aligned", None), ("aligned", 5)])
def test_greedy_end_sets_matches_greedy_generate_per_set(tiny_lm, data, positions, n_pos):
    """Against plain generation inside each set's ablation. "aligned" with the whole mean (as long as the
    longest prompt: no prefix to share in most batches) and with its last 5 offsets (a shared prefix)."""
    texts, mean, own = data["texts"], data["mean"], data["own"]
    if n_pos is not None:
        mean = AlignedMean(mean.heads[:n_pos], mean.mlps[:n_pos])
    head_sets = [[], RANKED[:1], RANKED[:3], [(0, 2), (1, 1)], RANKED]
    mlp_sets = [[], [], [1], [], [2, 0]]
    got = greedy_end_sets(tiny_lm, texts, head_sets, means=mean, max_new_tokens=N_NEW, mlp_sets=mlp_sets,
                          answer_ids=own, batch_size=3, copies_per_forward=7,
                          positions=positions)
    assert got.tokens.shape == (len(head_sets), len(texts), N_NEW)
    for s, (hs, ms) in enumerate(zip(head_sets, mlp_sets)):
        want = greedy_generate(tiny_lm, texts, N_NEW, 4, hooks=ablation_hooks(tiny_lm, hs, ms, mean,
                                                                              positions=positions))
        assert torch.equal(got.tokens[s], want), s
        scores = first_token_scores(tiny_lm, texts, own, 4, ablation_hooks(tiny_lm, hs, ms, mean, positions=positions))
        assert torch.equal(got.first_tokens[s], scores[0]), s
        torch.testing.assert_close(got.first_answer_logits[s], scores[1], atol=2e-5, rtol=0)
    # the empty set is the plain model; the first two sets' first tokens are the reference knockout's k = 0, 1
    assert torch.equal(got.tokens[0], greedy_generate(tiny_lm, texts, N_NEW, 8))
    assert torch.equal(got.first_tokens[:2], knockout(tiny_lm, texts, own, RANKED, K=1, means=mean,
                                                      positions=positions).predicted)
    assert len({tuple(got.tokens[s].flatten().tolist()) for s in range(len(head_sets))}) > 1
    assert n_hooks(tiny_lm.model) == 0
    with pytest.raises(ValueError, match="MLP sets"):
        greedy_end_sets(tiny_lm, texts, head_sets, means=mean, max_new_tokens=2, mlp_sets=mlp_sets[:2])


def test_greedy_end_sets_with_a_mean_per_set(tiny_lm, data):
    texts, mean = data["texts"], data["mean"]
    other = AlignedMean(mean.heads.flip(2) * 3, mean.mlps * -2)  # a different "task's" mean
    head_sets, mlp_sets = [RANKED[:3], RANKED[:3], [(0, 2)]], [[1], [1], []]
    got = greedy_end_sets(tiny_lm, texts, head_sets, set_means=[mean, other, other], max_new_tokens=3,
                          mlp_sets=mlp_sets, batch_size=3,
                          copies_per_forward=4)
    for s, m in enumerate([mean, other, other]):
        want = greedy_generate(tiny_lm, texts, 3, 8, hooks=ablation_hooks(tiny_lm, head_sets[s], mlp_sets[s], m))
        assert torch.equal(got.tokens[s], want), s
    assert not torch.equal(got.tokens[0], got.tokens[1])


@pytest.mark.parametrize("per_set", [False, True])
def test_greedy_end_sets_stops_settled_rows_and_keeps_the_rest_exact(tiny_lm, data, per_set):
    """A row that is settled leaves the forwards: its tokens up to that step are those of the run without
    stopping, the rest are the pad id; the rows still running (and their cache and ablation) are unchanged."""
    texts, mean = data["texts"], data["mean"]
    other = AlignedMean(mean.heads.flip(2) * 3, mean.mlps * -3)  # varied tokens among the rows that go on
    head_sets, mlp_sets = [[], RANKED[:2], [(0, 2)], RANKED], [[], [1], [], [0]]
    means = {"set_means": [mean, other, mean, other]} if per_set else {"means": mean}
    full = greedy_end_sets(tiny_lm, texts, head_sets, **means, max_new_tokens=N_NEW, mlp_sets=mlp_sets, batch_size=3,
                           copies_per_forward=7)

    def settled(i, ids):  # the tiny model's bytes decode to nothing useful: stop some rows at step 1, by id,
        return len(ids) == 2 and ids[-1] in (25, 110) and i != 2  # except those of text 2 (row -> text mapping)

    got = greedy_end_sets(tiny_lm, texts, head_sets, **means, max_new_tokens=N_NEW, mlp_sets=mlp_sets, batch_size=3,
                          copies_per_forward=7, settled=settled)
    n_stopped = 0
    for s in range(len(head_sets)):
        for i in range(len(texts)):
            row = full.tokens[s, i]
            stop = next((t for t in range(N_NEW) if settled(i, row[: t + 1].tolist())), N_NEW - 1)
            assert torch.equal(got.tokens[s, i, : stop + 1], row[: stop + 1]), (s, i)
            assert (got.tokens[s, i, stop + 1 :] == tiny_lm.tokenizer.pad_token_id).all(), (s, i)
            n_stopped += stop < N_NEW - 1
    assert 0 < n_stopped < len(head_sets) * len(texts)  # some rows stopped early, others ran to the end
    assert n_hooks(tiny_lm.model) == 0
