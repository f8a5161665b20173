"""Tests for arithmech.interp.edges: the head -> MLP edge closed form against one hooked forward per edge, on the tiny
CPU model of every family (float32; Gemma 3's norms after o_proj and the MLP taken by the closed form)."""

from __future__ import annotations

import math

import pytest
import torch

from arithmech.data.arithmetic import build_prompts
from arithmech.interp.edges import edge_logits, reference_edge_logits
from arithmech.interp.patching import collect, direct_logits, nodes_of
from arithmech.model.tiny import FAMILIES
from helpers import n_hooks

ROWS = [0, 5, 11, 16, 21, 27, 30]  # both templates, one- and two-digit answers, prompts of different lengths


@pytest.fixture(scope="module", params=FAMILIES)
def tiny_lm(request, tiny_family):
    """Every test of this module on the tiny model of each family."""
    return tiny_family(request.param)[1]


@pytest.fixture(scope="module")
def data(tiny_lm, base_prompt_cfg):
    df = build_prompts(tiny_lm.tokenizer, "addition", base_prompt_cfg, seed=0).iloc[ROWS].reset_index(drop=True)
    answers = torch.tensor(df["answer_token_id"].to_numpy())
    ref, _ = collect(tiny_lm, df["prompt"].tolist(), answers, batch_size=3, mlp_inputs=True)
    cf, _ = collect(tiny_lm, df["cf_prompt"].tolist(), answers, batch_size=4, mlp_inputs=True)
    return {"texts": df["prompt"].tolist(), "answers": answers, "ref": ref, "cf": cf}


def _senders(lm):
    return [(0, 0), (0, lm.n_heads - 1), (1, 1), (lm.n_layers - 1, 0)]


def test_closed_form_equals_hooked_reference(tiny_lm, data):
    senders, receivers = _senders(tiny_lm), list(range(tiny_lm.n_layers))
    fast = edge_logits(tiny_lm, data["ref"], data["cf"], data["answers"], senders, receivers, batch_size=4)
    slow = reference_edge_logits(tiny_lm, data["texts"], data["answers"], data["ref"], data["cf"], senders, receivers,
                                 batch_size=3)
    assert n_hooks(tiny_lm.model) == 0
    assert torch.equal(fast.logit_p.isnan(), slow.logit_p.isnan())
    live = ~fast.logit_p.isnan()
    # an edge exists exactly where the receiver MLP is in the sender's layer or later
    for i, (layer, _) in enumerate(senders):
        assert live[:, i].all(0).tolist() == [r >= layer for r in receivers]
    torch.testing.assert_close(fast.logit_o, slow.logit_o, atol=1e-4, rtol=0)
    torch.testing.assert_close(fast.logit_p[live], slow.logit_p[live], atol=1e-4, rtol=0)
    # the edges move the logit (so the equality above is not 0 == 0)
    assert (fast.logit_p[live] - fast.logit_o[:, None, None].expand_as(fast.logit_p)[live]).abs().max() > 1e-3


def test_unpatched_logit_is_direct_modes(tiny_lm, data):
    """logit_o is the closed form at zero change, the one `patching.direct_logits` reports."""
    fast = edge_logits(tiny_lm, data["ref"], data["cf"], data["answers"], _senders(tiny_lm), [1])
    direct = direct_logits(tiny_lm, data["ref"], data["cf"], data["answers"], [0])
    torch.testing.assert_close(fast.logit_o, direct.logit_o, atol=1e-6, rtol=0)


def test_no_change_no_effect(tiny_lm, data):
    """A sender whose counterfactual equals its reference moves nothing through any MLP."""
    same = edge_logits(tiny_lm, data["ref"], data["ref"], data["answers"], _senders(tiny_lm), [0, 1])
    live = ~same.logit_p.isnan()
    expected = same.logit_o[:, None, None].expand_as(same.logit_p)
    torch.testing.assert_close(same.logit_p[live], expected[live], atol=1e-5, rtol=0)


def test_bad_input(tiny_lm, data):
    plain, _ = collect(tiny_lm, data["texts"][:2], data["answers"][:2], batch_size=2)
    with pytest.raises(ValueError, match="mlp_inputs=True"):
        edge_logits(tiny_lm, plain, plain, data["answers"][:2], [(0, 0)], [0])
    with pytest.raises(ValueError, match="receiver MLP layer 99"):
        edge_logits(tiny_lm, data["ref"], data["cf"], data["answers"], [(0, 0)], [99])
    with pytest.raises(ValueError, match=r"sender head \(0, 99\)"):
        edge_logits(tiny_lm, data["ref"], data["cf"], data["answers"], [(0, 99)], [0])


def test_collect_mlp_inputs_are_the_mlp_norms_inputs(tiny_lm, data):
    """mlp_in[:, l] + MLP_l(norm(mlp_in[:, l])) is the residual entering layer l + 1 (the next layer's
    attention input), checked through the last layer: it is then the final residual (the MLP's output through
    the norm after it, where the architecture has one)."""
    ref = data["ref"]
    last = tiny_lm.n_layers - 1
    x = ref.mlp_in[:, last]
    post = tiny_lm.mlp_out_norm(last) or torch.nn.Identity()
    with torch.no_grad():
        out = tiny_lm.mlp(last)(tiny_lm.mlp_norm(last)(x))
        written = post(out)
    torch.testing.assert_close(out, ref.mlps[:, last], atol=1e-5, rtol=0)
    torch.testing.assert_close(x + written, ref.resid, atol=1e-5, rtol=0)
    assert not math.isnan(float(ref.mlp_in.sum()))
    assert len(nodes_of(tiny_lm, [0])) == tiny_lm.n_heads + 1
