"""Tests for arithmech.intervention.hooks (capture, patch_end) and arithmech.interp.patching (collect, the direct /
total fast paths against the explicit reference, effects_frame), all on the tiny CPU models of every family
(`tiny.FAMILIES`: the Llama block, and Gemma 3's with norms between the nodes and the residual stream)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from arithmech.data.arithmetic import build_prompts, encode
from arithmech.interp.patching import (
    collect,
    direct_logits,
    effects_frame,
    nodes_of,
    reference_logits,
    total_logits,
)
from arithmech.intervention.hooks import capture, hooks, patch_end
from arithmech.model.loading import load_model
from arithmech.model.tiny import FAMILIES, build_tiny_model
from helpers import n_hooks

# rows mixing both templates (30..44 tokens) and one- and two-digit answers
ROWS = [0, 5, 11, 16, 21, 27, 30]


@pytest.fixture(scope="module", params=FAMILIES)
def tiny_lm(request, tiny_family):
    """Every test of this module on the tiny model of each family."""
    return tiny_family(request.param)[1]


def _node_index(lm, layer, head):
    return nodes_of(lm, list(range(lm.n_layers))).index((layer, head))


@pytest.fixture(scope="module")
def data(tiny_lm, base_prompt_cfg):
    df = build_prompts(tiny_lm.tokenizer, "multiplication", base_prompt_cfg, seed=0).iloc[ROWS].reset_index(drop=True)
    assert df["n_tokens"].nunique() > 1 and df["template_id"].nunique() == 2
    return {
        "texts": df["prompt"].tolist(),
        "cf_texts": df["cf_prompt"].tolist(),
        "answers": torch.tensor(df["answer_token_id"].to_numpy()),
        "sample_ids": df["sample_id"].tolist(),
    }


@pytest.fixture(scope="module")
def states(tiny_lm, data):
    ref, _ = collect(tiny_lm, data["texts"], data["answers"], batch_size=3)
    cf, _ = collect(tiny_lm, data["cf_texts"], data["answers"], batch_size=3)
    return ref, cf


@pytest.fixture(scope="module")
def layers(tiny_lm):
    return list(range(tiny_lm.n_layers))


@pytest.fixture(scope="module")
def ref_direct(tiny_lm, data, states, layers):
    ref, cf = states
    return reference_logits(tiny_lm, data["texts"], data["answers"], ref, cf, layers=layers, mode="direct",
                            batch_size=4)


@pytest.fixture(scope="module")
def ref_total(tiny_lm, data, states, layers):
    ref, cf = states
    return reference_logits(tiny_lm, data["texts"], data["answers"], ref, cf, layers=layers, mode="total", batch_size=4)


@pytest.fixture(scope="module")
def enc(tiny_lm, data):
    return encode(tiny_lm.tokenizer, data["texts"])


# ---------------------------------------------------------------------------------------------------
# hooks


def test_hooks_run_inside_and_are_removed_after(tiny_lm, enc):
    calls = []
    o_proj, mlp = tiny_lm.o_proj(1), tiny_lm.mlp(2)
    before = n_hooks(tiny_lm.model)
    with hooks(pre=[(o_proj, lambda m, a: calls.append("pre"))], post=[(mlp, lambda m, a, o: calls.append("post"))]):
        assert len(o_proj._forward_pre_hooks) == 1 and len(mlp._forward_hooks) == 1
        tiny_lm.model(**enc, logits_to_keep=1)
    assert calls == ["pre", "post"]
    assert n_hooks(tiny_lm.model) == before == 0
    tiny_lm.model(**enc, logits_to_keep=1)
    assert calls == ["pre", "post"]


def test_hooks_are_removed_when_the_block_raises(tiny_lm, enc, data, states):
    ref, _ = states
    with pytest.raises(RuntimeError, match="boom"):
        with hooks(pre=[(tiny_lm.o_proj(0), lambda m, a: None)], post=[(tiny_lm.mlp(0), lambda m, a, o: None)]):
            raise RuntimeError("boom")
    assert n_hooks(tiny_lm.model) == 0
    with pytest.raises(RuntimeError, match="boom"):
        with capture(tiny_lm):
            raise RuntimeError("boom")
    assert n_hooks(tiny_lm.model) == 0
    n = len(data["texts"])
    heads = {1: (torch.ones(n, tiny_lm.n_heads, dtype=torch.bool), torch.zeros(n, tiny_lm.n_heads, tiny_lm.head_dim))}
    with pytest.raises(RuntimeError, match="boom"):
        with patch_end(tiny_lm, heads=heads):
            raise RuntimeError("boom")
    assert n_hooks(tiny_lm.model) == 0
    # and the model is back to normal: the same logits as before
    with torch.no_grad():
        logits = tiny_lm.model(**enc, logits_to_keep=1).logits[:, -1]
    got = logits.gather(1, data["answers"][:, None])[:, 0]
    torch.testing.assert_close(got, ref.logits, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------
# capture


def test_capture_shapes_end_only(tiny_lm, enc):
    B, S = enc["input_ids"].shape
    L, H, D, d = tiny_lm.n_layers, tiny_lm.n_heads, tiny_lm.head_dim, tiny_lm.d_model
    with torch.no_grad(), capture(tiny_lm) as cap:
        tiny_lm.model(**enc, logits_to_keep=1)
    assert sorted(cap.heads) == sorted(cap.mlps) == list(range(L))
    assert all(cap.heads[l].shape == (B, H, D) for l in range(L))
    assert all(cap.mlps[l].shape == (B, d) for l in range(L))
    assert cap.resid_final.shape == (B, d)
    assert cap.stacked_heads().shape == (B, L, H, D)
    assert cap.stacked_mlps().shape == (B, L, d)
    torch.testing.assert_close(cap.stacked_heads()[:, 2], cap.heads[2], atol=0, rtol=0)


def test_capture_shapes_full_sequence_and_layer_subset(tiny_lm, enc):
    B, S = enc["input_ids"].shape
    H, D, d = tiny_lm.n_heads, tiny_lm.head_dim, tiny_lm.d_model
    with torch.no_grad(), capture(tiny_lm, layers=[0, 2], end_only=False) as cap:
        tiny_lm.model(**enc, logits_to_keep=1)
    assert sorted(cap.heads) == sorted(cap.mlps) == [0, 2]
    assert cap.heads[0].shape == (B, S, H, D)
    assert cap.mlps[2].shape == (B, S, d)
    assert cap.resid_final.shape == (B, S, d)
    assert cap.stacked_heads().shape == (B, S, 2, H, D)
    assert cap.stacked_mlps().shape == (B, S, 2, d)
    # the full-sequence capture's last position is the END capture
    with torch.no_grad(), capture(tiny_lm) as end:
        tiny_lm.model(**enc, logits_to_keep=1)
    torch.testing.assert_close(cap.heads[2][:, -1], end.heads[2], atol=0, rtol=0)
    torch.testing.assert_close(cap.mlps[0][:, -1], end.mlps[0], atol=0, rtol=0)


def test_capture_matches_independent_hooks(tiny_lm, enc):
    """Captured heads are the o_proj input split per head; o_proj of their concatenation is what the
    attention block outputs; the MLP capture is the MLP output; the final residual gives the logits."""
    seen = {}

    def pre(layer):
        return lambda m, a: seen.__setitem__(("in", layer), a[0].detach().clone())

    def post_o(layer):
        return lambda m, a, o: seen.__setitem__(("out", layer), o.detach().clone())

    def post_mlp(layer):
        return lambda m, a, o: seen.__setitem__(("mlp", layer), o.detach().clone())

    L, H, D = tiny_lm.n_layers, tiny_lm.n_heads, tiny_lm.head_dim
    own = [(tiny_lm.o_proj(l), pre(l)) for l in range(L)]
    own_post = [(tiny_lm.o_proj(l), post_o(l)) for l in range(L)] + [(tiny_lm.mlp(l), post_mlp(l)) for l in range(L)]
    with torch.no_grad(), hooks(own, own_post), capture(tiny_lm) as cap:
        logits = tiny_lm.model(**enc).logits[:, -1]
    B = enc["input_ids"].shape[0]
    with torch.no_grad():
        for l in range(L):
            x = seen[("in", l)][:, -1]
            for h in range(H):
                torch.testing.assert_close(cap.heads[l][:, h], x[:, h * D : (h + 1) * D], atol=0, rtol=0)
            concat = cap.heads[l].reshape(B, H * D)
            torch.testing.assert_close(tiny_lm.o_proj(l)(concat), seen[("out", l)][:, -1], atol=1e-6, rtol=0)
            torch.testing.assert_close(cap.mlps[l], seen[("mlp", l)][:, -1], atol=0, rtol=0)
        from_resid = tiny_lm.unembed(tiny_lm.final_norm(cap.resid_final))
    torch.testing.assert_close(from_resid, logits, atol=1e-5, rtol=0)


def test_captured_values_are_not_all_zero(states):
    ref, cf = states
    assert ref.heads.abs().max() > 1e-3 and ref.mlps.abs().max() > 1e-3
    # the operator word changes what the last-layer heads write at END
    assert (ref.heads[:, -1] - cf.heads[:, -1]).abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------------
# patch_end


def _forward(lm, enc, **kw):
    with torch.no_grad():
        return lm.model(**enc, **kw).logits


def test_patch_end_with_own_values_changes_nothing(tiny_lm, enc):
    with torch.no_grad(), capture(tiny_lm) as cap:
        clean = tiny_lm.model(**enc).logits
    B = clean.shape[0]
    heads = {l: (torch.ones(B, tiny_lm.n_heads, dtype=torch.bool), cap.heads[l]) for l in range(tiny_lm.n_layers)}
    mlps = {l: (torch.ones(B, dtype=torch.bool), cap.mlps[l]) for l in range(tiny_lm.n_layers)}
    with patch_end(tiny_lm, heads, mlps):
        patched = _forward(tiny_lm, enc)
    assert (patched - clean).abs().max().item() <= 1e-6
    assert n_hooks(tiny_lm.model) == 0


def test_patch_end_all_false_mask_is_a_noop(tiny_lm, enc, states):
    ref, cf = states
    clean = _forward(tiny_lm, enc)
    B, L = clean.shape[0], tiny_lm.n_layers
    heads = {l: (torch.zeros(B, tiny_lm.n_heads, dtype=torch.bool), cf.heads[:, l] + 5.0) for l in range(L)}
    mlps = {l: (torch.zeros(B, dtype=torch.bool), cf.mlps[:, l] + 5.0) for l in range(L)}
    with patch_end(tiny_lm, heads, mlps):
        patched = _forward(tiny_lm, enc)
    assert torch.equal(patched, clean)


def test_patch_end_changes_only_end_and_only_masked_rows(tiny_lm, enc, states):
    _, cf = states
    clean = _forward(tiny_lm, enc)
    B = clean.shape[0]
    mask = torch.zeros(B, tiny_lm.n_heads, dtype=torch.bool)
    mask[1, 2] = True  # row 1, head 2 of layer 0
    with patch_end(tiny_lm, heads={0: (mask, cf.heads[:, 0] + 3.0)}):
        patched = _forward(tiny_lm, enc)
    assert torch.equal(patched[:, :-1], clean[:, :-1])  # earlier positions untouched (causal)
    others = [i for i in range(B) if i != 1]
    assert torch.equal(patched[others], clean[others])
    assert (patched[1, -1] - clean[1, -1]).abs().max() > 1e-3


def test_patch_end_values_broadcast(tiny_lm, enc, states):
    _, cf = states
    B = enc["input_ids"].shape[0]
    mean = cf.heads[:, 1].mean(0)  # [H, D]
    mask = torch.zeros(B, tiny_lm.n_heads, dtype=torch.bool)
    mask[:, 0] = True
    with patch_end(tiny_lm, heads={1: (mask, mean)},
                   mlps={2: (torch.ones(B, dtype=torch.bool), cf.mlps[:, 2].mean(0))}):
        a = _forward(tiny_lm, enc, logits_to_keep=1)
    with patch_end(tiny_lm, heads={1: (mask, mean.expand(B, -1, -1))},
                   mlps={2: (torch.ones(B, dtype=torch.bool), cf.mlps[:, 2].mean(0).expand(B, -1))}):
        b = _forward(tiny_lm, enc, logits_to_keep=1)
    assert torch.equal(a, b)
    assert (a - _forward(tiny_lm, enc, logits_to_keep=1)).abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------------
# collect


def test_collect_batch_equals_one_by_one(tiny_lm, data, states):
    ref, _ = states
    assert ref.heads.shape == (7, tiny_lm.n_layers, tiny_lm.n_heads, tiny_lm.head_dim)
    assert ref.mlps.shape == ref.resid.shape[:1] + (tiny_lm.n_layers, tiny_lm.d_model)
    assert ref.logits.shape == ref.logprobs.shape == ref.predicted.shape == (7,)
    alone = [
        collect(tiny_lm, [t], data["answers"][i : i + 1], batch_size=1)[0] for i, t in enumerate(data["texts"])
    ]
    whole, _ = collect(tiny_lm, data["texts"], data["answers"], batch_size=7)
    for name in ("heads", "mlps", "resid", "logits", "logprobs"):
        single = torch.cat([getattr(s, name) for s in alone])
        torch.testing.assert_close(getattr(ref, name), single, atol=1e-5, rtol=0, msg=name)
        torch.testing.assert_close(getattr(whole, name), single, atol=1e-5, rtol=0, msg=name)
    assert torch.equal(ref.predicted, torch.cat([s.predicted for s in alone]))


def test_collect_logits_and_logprobs_match_plain_forward(tiny_lm, data, states):
    ref, _ = states
    for i, text in enumerate(data["texts"]):
        ids = torch.tensor([tiny_lm.tokenizer(text)["input_ids"]])
        with torch.no_grad():
            logits = tiny_lm.model(ids).logits[0, -1]
        a = data["answers"][i]
        assert abs(ref.logits[i].item() - logits[a].item()) < 1e-5
        assert abs(ref.logprobs[i].item() - logits.log_softmax(-1)[a].item()) < 1e-5
        assert ref.predicted[i].item() == logits.argmax().item()


def test_closed_form_clean_logit(tiny_lm, data, states):
    ref, _ = states
    with torch.no_grad():
        normed = tiny_lm.final_norm(ref.resid)
        closed = (normed * tiny_lm.unembed.weight[data["answers"]]).sum(-1)
        full = normed @ tiny_lm.unembed.weight.T
    torch.testing.assert_close(closed, ref.logits, atol=1e-5, rtol=0)
    assert torch.equal(full.argmax(-1), ref.predicted)


def test_collect_groups_means_each_group_by_offset_from_end(tiny_lm, data, states):
    """collect(groups=...) gives each group's mean at every offset back from END, averaged over the group's
    prompts that reach it, against one unpadded forward per prompt; and the END state is the plain one."""
    ref, _ = states
    groups = [i % 2 for i in range(len(data["texts"]))]
    state, grouped = collect(tiny_lm, data["texts"], data["answers"], batch_size=3, groups=groups)
    for name in ("heads", "mlps", "resid", "logits"):
        torch.testing.assert_close(getattr(state, name), getattr(ref, name), atol=1e-5, rtol=0)
    per_prompt = []  # (heads [S, L, H, D], mlps [S, L, d]) with offset 0 = END
    for text in data["texts"]:
        with torch.no_grad(), capture(tiny_lm, end_only=False) as cap:
            tiny_lm.model(**encode(tiny_lm.tokenizer, [text]))
        per_prompt.append((cap.stacked_heads()[0].flip(0), cap.stacked_mlps()[0].flip(0)))
    longest = max(h.shape[0] for h, _ in per_prompt)
    assert grouped.heads.shape == (2, longest, tiny_lm.n_layers, tiny_lm.n_heads, tiny_lm.head_dim)
    for g in (0, 1):
        mine = [hm for hm, x in zip(per_prompt, groups) if x == g]
        lengths = sorted(h.shape[0] for h, _ in mine)
        assert lengths[0] < lengths[-1]  # so the last offset below is reached by some of the group's prompts only
        for j in (0, 2, lengths[0]):
            reach = [(h[j], m[j]) for h, m in mine if h.shape[0] > j]
            assert grouped.counts[g, j] == len(reach) > 0
            torch.testing.assert_close(grouped.heads[g, j], torch.stack([h for h, _ in reach]).mean(0),
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(grouped.mlps[g, j], torch.stack([m for _, m in reach]).mean(0),
                                       atol=1e-5, rtol=0)
        n_g = max(h.shape[0] for h, _ in mine)
        assert (grouped.counts[g, n_g:] == 0).all() and grouped.group(g).heads.shape[0] == n_g
    end = grouped.end()  # over all prompts of all groups: the plain END mean
    torch.testing.assert_close(end.heads[0], state.heads.mean(0), atol=1e-6, rtol=0)
    torch.testing.assert_close(end.mlps[0], state.mlps.mean(0), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------------
# direct / total / reference


def test_nodes_order(tiny_lm):
    assert nodes_of(tiny_lm, [0, 2]) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, None),
                                         (2, 0), (2, 1), (2, 2), (2, 3), (2, None)]


def test_direct_matches_reference_direct(tiny_lm, data, states, layers, ref_direct):
    ref, cf = states
    n_nodes = len(nodes_of(tiny_lm, layers))
    for bs in (64, 3):
        out = direct_logits(tiny_lm, ref, cf, data["answers"], layers, batch_size=bs)
        assert out.logprob_o is None and out.logprob_p is None
        assert out.logit_p.shape == (7, n_nodes) == ref_direct[0].shape
        torch.testing.assert_close(out.logit_p, ref_direct[0], atol=1e-4, rtol=0)
    # the patch matters for some node (otherwise this test would prove nothing)
    assert (ref_direct[0] - ref.logits[:, None]).abs().max() > 1e-2


def test_direct_with_logprobs_matches_reference(tiny_lm, data, states, layers, ref_direct):
    ref, cf = states
    out = direct_logits(tiny_lm, ref, cf, data["answers"], layers, batch_size=5, with_logprobs=True)
    torch.testing.assert_close(out.logit_p, ref_direct[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(out.logprob_p, ref_direct[1], atol=1e-4, rtol=0)
    assert (out.logprob_p <= 0).all()
    # the unpatched scores, from the closed form at zero change, are the forward's own
    torch.testing.assert_close(out.logit_o, ref.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logprob_o, ref.logprobs, atol=1e-5, rtol=0)


def test_direct_layer_subset_is_the_matching_columns(tiny_lm, data, states, layers, ref_direct):
    ref, cf = states
    logits = direct_logits(tiny_lm, ref, cf, data["answers"], [2]).logit_p
    H = tiny_lm.n_heads
    torch.testing.assert_close(logits, ref_direct[0][:, 2 * (H + 1) :], atol=1e-4, rtol=0)


def test_direct_with_cf_equal_ref_gives_reference_logits(tiny_lm, data, states, layers):
    ref, _ = states
    out = direct_logits(tiny_lm, ref, ref, data["answers"], layers, with_logprobs=True)
    logits, lp = out.logit_p, out.logprob_p
    # zero change for every node: all columns are the same number, logit_o exactly (the same computation)...
    assert torch.equal(logits, out.logit_o[:, None].expand_as(logits))
    assert torch.equal(lp, out.logprob_o[:, None].expand_as(lp))
    # ... the model's own answer logit and log-prob
    torch.testing.assert_close(out.logit_o, ref.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logprob_o, ref.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "batch_size, copies",
    [(3, 7), (2, 5), (7, 256), (4, 1), (5, 20)],  # chunks of 2, 2, 36, 1, 4 nodes for 15 nodes
)
def test_total_matches_reference_total(tiny_lm, data, states, layers, ref_total, batch_size, copies):
    ref, cf = states
    out = total_logits(tiny_lm, data["texts"], data["answers"], cf, layers, batch_size=batch_size,
                       copies_per_forward=copies, with_logprobs=True)
    assert out.logit_p.shape == out.logprob_p.shape == ref_total[0].shape == (7, 15)
    torch.testing.assert_close(out.logit_p, ref_total[0], atol=1e-4, rtol=0)
    torch.testing.assert_close(out.logprob_p, ref_total[1], atol=1e-4, rtol=0)
    # the unpatched END forward is the full forward
    torch.testing.assert_close(out.logit_o, ref.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logprob_o, ref.logprobs, atol=1e-5, rtol=0)
    # without log-probs only the answers' unembedding rows are read: the same logits
    alone = total_logits(tiny_lm, data["texts"], data["answers"], cf, layers, batch_size=batch_size,
                         copies_per_forward=copies)
    assert alone.logprob_o is None and alone.logprob_p is None
    torch.testing.assert_close(alone.logit_p, out.logit_p, atol=1e-5, rtol=0)
    torch.testing.assert_close(alone.logit_o, out.logit_o, atol=1e-5, rtol=0)


def test_layers_from_runs_the_rest_of_the_model(tiny_lm, data):
    """The model's own forward from layer l, given the residual stream entering layer l, is the whole
    forward; the model has all its layers again afterwards, also after an error inside the block."""
    enc = encode(tiny_lm.tokenizer, data["texts"], tiny_lm.device)
    with torch.no_grad():
        full = tiny_lm.model(**enc, output_hidden_states=True)
        for layer in range(tiny_lm.n_layers):
            with tiny_lm.layers_from(layer):
                assert len(tiny_lm.model.model.layers) == tiny_lm.n_layers - layer
                got = tiny_lm.model(inputs_embeds=full.hidden_states[layer], attention_mask=enc["attention_mask"],
                                    position_ids=enc["position_ids"]).logits
            torch.testing.assert_close(got, full.logits, atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="inside"), tiny_lm.layers_from(1):
        raise RuntimeError("inside")
    assert len(tiny_lm.model.model.layers) == tiny_lm.n_layers
    with pytest.raises(ValueError, match="out of range"), tiny_lm.layers_from(tiny_lm.n_layers):
        pass


def test_total_layer_subset(tiny_lm, data, states, ref_total):
    _, cf = states
    logits = total_logits(tiny_lm, data["texts"], data["answers"], cf, [1], batch_size=4, copies_per_forward=8).logit_p
    H = tiny_lm.n_heads
    torch.testing.assert_close(logits, ref_total[0][:, H + 1 : 2 * (H + 1)], atol=1e-4, rtol=0)


def test_direct_and_total_differ(ref_direct, ref_total, tiny_lm):
    # last-layer MLP has nothing downstream: identical in both modes; early heads do not
    last_mlp = _node_index(tiny_lm, tiny_lm.n_layers - 1, None)
    torch.testing.assert_close(ref_direct[0][:, last_mlp], ref_total[0][:, last_mlp], atol=1e-4, rtol=0)
    assert (ref_direct[0][:, :5] - ref_total[0][:, :5]).abs().max() > 1e-3


def test_reference_total_against_handwritten_hooks(tiny_lm, data, states, ref_total):
    """The reference itself, against hooks written here: one head, one MLP, full forward each."""
    _, cf = states
    D = tiny_lm.head_dim
    e = encode(tiny_lm.tokenizer, data["texts"])
    layer, head = 1, 2

    def head_pre(m, args):
        x = args[0].clone()
        x[:, -1, head * D : (head + 1) * D] = cf.heads[:, layer, head]
        return (x,)

    def mlp_post(m, args, out):
        out = out.clone()
        out[:, -1] = cf.mlps[:, 0]
        return out

    for hook_args, node in (
        (([(tiny_lm.o_proj(layer), head_pre)], []), (layer, head)),
        (([], [(tiny_lm.mlp(0), mlp_post)]), (0, None)),
    ):
        with torch.no_grad(), hooks(*hook_args):
            logits = tiny_lm.model(**e).logits[:, -1]
        got = logits.gather(1, data["answers"][:, None])[:, 0]
        torch.testing.assert_close(ref_total[0][:, _node_index(tiny_lm, *node)], got, atol=1e-5, rtol=0)


def test_direct_closed_form_by_hand(tiny_lm, data, states, ref_direct):
    """Direct effect of one head, written out: resid + W_O[:, head] (z_cf - z_ref) -> norm -> answer row; where a
    norm follows o_proj (Gemma 3), resid + norm(o_proj(z with the head's cf value)) - norm(o_proj(z_ref))."""
    ref, cf = states
    layer, head, D = 2, 1, tiny_lm.head_dim
    w = tiny_lm.o_proj(layer).weight[:, head * D : (head + 1) * D]
    post = tiny_lm.attn_out_norm(layer)
    with torch.no_grad():
        if post is None:
            resid = ref.resid + (cf.heads[:, layer, head] - ref.heads[:, layer, head]) @ w.T
        else:
            z = ref.heads[:, layer].clone()
            z[:, head] = cf.heads[:, layer, head]
            o_proj = tiny_lm.o_proj(layer)
            resid = ref.resid + post(o_proj(z.flatten(1))) - post(o_proj(ref.heads[:, layer].flatten(1)))
        logit = (tiny_lm.final_norm(resid) * tiny_lm.unembed.weight[data["answers"]]).sum(-1)
    torch.testing.assert_close(ref_direct[0][:, _node_index(tiny_lm, layer, head)], logit, atol=1e-5, rtol=0)


def test_the_llama_closed_form_is_wrong_on_gemma3(tiny_family, data, base_prompt_cfg):
    """On Gemma 3 a head's direct effect is not W_O[:, head] (z_cf - z_ref) added to the residual: the norm after
    o_proj makes it another number (so `direct_logits` must go through that norm, as it does), and the table
    says so."""
    lm = tiny_family("gemma3")[1]
    assert not lm.arch.head_linear and not lm.arch.mlp_direct and not lm.arch.linear_writes
    ref, _ = collect(lm, data["texts"], data["answers"], batch_size=4)
    cf, _ = collect(lm, data["cf_texts"], data["answers"], batch_size=4)
    layer, head, D = 2, 1, lm.head_dim
    w = lm.o_proj(layer).weight[:, head * D : (head + 1) * D]
    with torch.no_grad():
        resid = ref.resid + (cf.heads[:, layer, head] - ref.heads[:, layer, head]) @ w.T
        linear = (lm.final_norm(resid) * lm.unembed.weight[data["answers"]]).sum(-1)
    exact = direct_logits(lm, ref, cf, data["answers"], [layer]).logit_p[:, head]
    assert (linear - exact).abs().max() > 1e-3


def test_reference_logits_bad_mode(tiny_lm, data, states, layers):
    ref, cf = states
    with pytest.raises(ValueError, match="mode"):
        reference_logits(tiny_lm, data["texts"], data["answers"], ref, cf, layers=layers, mode="indirect")


def test_one_layer_model(tmp_path, data):
    """With one layer nothing is downstream of the MLP, so its direct and total effects agree. The heads
    still differ: the same layer's MLP reads their output, and direct mode freezes it."""
    lm = load_model(build_tiny_model(tmp_path / "one", n_layers=1), device="cpu")
    texts, cf_texts, answers = data["texts"], data["cf_texts"], data["answers"]
    ref, _ = collect(lm, texts, answers, batch_size=4)
    cf, _ = collect(lm, cf_texts, answers, batch_size=4)
    direct = direct_logits(lm, ref, cf, answers, [0]).logit_p
    total = total_logits(lm, texts, answers, cf, [0], batch_size=4, copies_per_forward=8).logit_p
    assert direct.shape == total.shape == (7, lm.n_heads + 1)
    torch.testing.assert_close(direct[:, -1], total[:, -1], atol=1e-4, rtol=0)
    r_direct, _ = reference_logits(lm, texts, answers, ref, cf, layers=[0], mode="direct")
    r_total, _ = reference_logits(lm, texts, answers, ref, cf, layers=[0], mode="total")
    torch.testing.assert_close(direct, r_direct, atol=1e-4, rtol=0)
    torch.testing.assert_close(total, r_total, atol=1e-4, rtol=0)
    assert (direct[:, :-1] - total[:, :-1]).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------------
# effects_frame


def test_effects_frame(tiny_lm, data, states, layers, ref_direct):
    ref, _ = states
    logit_p, lp_p = ref_direct
    n_s, n_n = logit_p.shape
    frame = effects_frame(tiny_lm, data["sample_ids"], layers, ref.logits, logit_p, logprob_o=ref.logprobs,
                          logprob_p=lp_p)
    assert len(frame) == n_s * n_n == 7 * 15
    assert frame["sample_id"].tolist() == [s for s in data["sample_ids"] for _ in range(n_n)]
    nodes = nodes_of(tiny_lm, layers)
    first = frame.iloc[:n_n]
    assert [(l, None if pd.isna(h) else h) for l, h in zip(first["layer"], first["head"])] == nodes
    assert frame["layer"].tolist() == [l for l, _ in nodes] * n_s
    assert str(frame["head"].dtype) == "Int64"
    assert (frame["head"].isna() == (frame["component"] == "mlp")).all()
    assert set(frame["component"]) == {"head", "mlp"}
    assert (frame["component"] == "mlp").sum() == n_s * tiny_lm.n_layers
    heads = frame[frame["component"] == "head"]
    assert heads["head"].tolist() == list(range(tiny_lm.n_heads)) * (n_s * tiny_lm.n_layers)
    # values
    row = frame.iloc[3 * n_n + 6]  # sample 3, node 6 = (1, 1)
    assert (row["layer"], row["head"], row["component"]) == (1, 1, "head")
    assert row["logit_o"] == pytest.approx(ref.logits[3].item(), abs=1e-6)
    assert row["logit_p"] == pytest.approx(logit_p[3, 6].item(), abs=1e-6)
    expected = (frame["logit_p"] - frame["logit_o"]) / frame["logit_o"]
    assert (frame["rel_effect"] == expected).all()
    assert row["rel_effect"] == pytest.approx((logit_p[3, 6].item() - ref.logits[3].item()) / ref.logits[3].item(),
                                              rel=1e-6)
    assert frame["prob_o"].to_numpy() == pytest.approx(ref.logprobs.double().exp().repeat_interleave(n_n).numpy())
    assert frame["prob_p"].to_numpy() == pytest.approx(lp_p.double().exp().reshape(-1).numpy())


def test_effects_frame_without_logprobs(tiny_lm, states):
    ref, _ = states
    logit_p = torch.arange(2 * 5, dtype=torch.float32).view(2, 5) + 1
    frame = effects_frame(tiny_lm, [10, 20], [1], torch.tensor([2.0, 4.0]), logit_p)
    assert "prob_o" not in frame and "prob_p" not in frame
    assert frame["sample_id"].tolist() == [10] * 5 + [20] * 5
    assert frame["layer"].tolist() == [1] * 10
    assert frame["rel_effect"].tolist() == pytest.approx([(v - 2) / 2 for v in range(1, 6)]
                                                         + [(v - 4) / 4 for v in range(6, 11)])
