"""Tests for arithmech.interp.analysis: token roles from offsets, attention rows from END against the model's own
eager attention weights, role attention, the cosine helper and the MLP probes, on the tiny CPU model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from arithmech.data.arithmetic import build_prompts, encode, render
from arithmech.interp.analysis import (
    ROLES,
    attention_rows,
    cosine,
    equals_span,
    first_role_tokens,
    mlp_probes,
    role_attention,
    role_token_ids,
    token_roles,
)
from arithmech.intervention.hooks import hooks
from arithmech.model.loading import LoadedModel
from arithmech.model.tiny import FAMILIES
from arithmech.report import plots

TEMPLATE = "{a} {op} {b} is equal to "


def _query(prefix: str, template: str, a: str, op: str, b: str) -> tuple[str, dict]:
    """A prompt with a few-shot prefix and its spans, as build_prompts records them."""
    q = render(template, a=a, op=op, b=b)
    off = len(prefix)
    spans = {"query_start": off}
    for name, (s, e) in q.spans.items():
        spans[f"{name}_start"], spans[f"{name}_end"] = off + s, off + e
    return prefix + q.text, spans


def _labelled(tokenizer, prompt, spans):
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(prompt)["input_ids"])
    return list(zip(tokens, token_roles(tokenizer, prompt, spans)))


# ---------------------------------------------------------------------------------------------------
# token roles


def test_equals_span():
    assert equals_span("2 plus 3 is equal to ", 8) == (9, 21)
    assert equals_span("What is 2 plus 3? The answer is ", 16) == (29, 32)  # not the 'is' before operand a
    assert equals_span("2 plus 3 = ", 8) == (9, 11)
    assert equals_span("2 plus 3 equals ", 8) == (9, 16)
    assert equals_span("2 plus 3 gives", 8) == (9, 14)
    assert equals_span("2 plus 3 this ", 8) is None  # 'is' inside 'this' is not the word
    assert equals_span("2 plus 3 ", 8) is None


def test_token_roles_decimals_with_a_few_shot_prefix(tiny_lm):
    prompt, spans = _query("4 plus 3 is equal to 7.\n", TEMPLATE, "1.5", "plus", "2.25")
    assert _labelled(tiny_lm.tokenizer, prompt, spans) == [
        ("4", "prefix"), ("Ġplus", "prefix"), ("Ġ", "prefix"), ("3", "prefix"), ("Ġis", "prefix"),
        ("Ġequal", "prefix"), ("Ġto", "prefix"), ("Ġ", "prefix"), ("7", "prefix"), (".", "prefix"), ("Ċ", "prefix"),
        ("1", "operand_a"), (".", "operand_a"), ("5", "operand_a"),
        ("Ġplus", "operator"), ("Ġ", "other"),
        ("2", "operand_b"), (".", "operand_b"), ("2", "operand_b"), ("5", "operand_b"),
        ("Ġis", "equals"), ("Ġequal", "equals"), ("Ġto", "equals"), ("Ġ", "equals"),
    ]


def test_token_roles_multi_digit_question_template(tiny_lm):
    prompt, spans = _query("", "What is {a} {op} {b}? The answer is ", "12", "divided by", "345")
    assert _labelled(tiny_lm.tokenizer, prompt, spans) == [
        ("What", "other"), ("Ġis", "other"), ("Ġ", "other"),
        ("1", "operand_a"), ("2", "operand_a"),
        ("Ġdivided", "operator"), ("Ġby", "operator"), ("Ġ", "other"),
        ("3", "operand_b"), ("4", "operand_b"), ("5", "operand_b"),
        ("?", "other"), ("ĠThe", "other"), ("Ġanswer", "other"),
        ("Ġis", "equals"), ("Ġ", "equals"),
    ]


def test_token_roles_on_built_prompts(tiny_lm, base_prompt_cfg):
    """Every pair of both templates: the role tokens decode to the operands, every prefix token lies
    before the query, and the prompt ends on an 'equals' token."""
    tok = tiny_lm.tokenizer
    df = build_prompts(tok, "subtraction", base_prompt_cfg, seed=0)
    for row in df.to_dict("records"):
        ids = tok(row["prompt"])["input_ids"]
        roles = token_roles(tok, row["prompt"], row)
        assert len(roles) == len(ids) == row["n_tokens"]
        pick = lambda r: tok.decode([i for i, x in zip(ids, roles) if x == r])  # noqa: E731
        assert pick("operand_a").strip() == str(row["a"])
        assert pick("operand_b").strip() == str(row["b"])
        assert pick("operator").strip() == row["operator"]
        assert pick("prefix") == row["prompt"][: row["query_start"]]
        assert roles[-1] == "equals"
        assert role_token_ids(tok, row["prompt"], row, "operand_a")[0] == tok(str(row["a"])[0])["input_ids"][0]


@pytest.fixture(scope="module")
def glued_tokenizer():
    """A GPT-2-style tokenizer that keeps numbers whole and glues the leading space to them (' 12')."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = [f"{a} plus {b} is equal to {a + b}. {a}.{b} times 1.5" for a in range(8, 40) for b in range(8, 40)]
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_token_roles_with_numbers_glued_to_their_space(glued_tokenizer):
    prompt, spans = _query("12 plus 13 is equal to 25. ", TEMPLATE, "21", "plus", "12.5")
    labelled = _labelled(glued_tokenizer, prompt, spans)
    tokens = [t for t, _ in labelled]
    assert "Ġ21" in tokens and "Ġ12" in tokens  # the space and the number are one token here
    by_role = {r: [t for t, x in labelled if x == r] for r in ROLES}
    assert by_role["operand_a"] == ["Ġ21"]
    assert "".join(by_role["operand_b"]) == "Ġ12.5"
    assert by_role["operator"] == ["Ġplus"]
    assert "".join(by_role["equals"]) == "ĠisĠequalĠtoĠ"
    assert "".join(by_role["prefix"]) == "12ĠplusĠ13ĠisĠequalĠtoĠ25."


# ---------------------------------------------------------------------------------------------------
# attention rows


@pytest.fixture(scope="module")
def texts(tiny_lm, base_prompt_cfg):
    df = build_prompts(tiny_lm.tokenizer, "multiplication", base_prompt_cfg, seed=0).iloc[[0, 5, 17, 30, 3]]
    assert df["n_tokens"].nunique() > 1
    return df


def _eager(model_dir) -> LoadedModel:
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    model.eval().requires_grad_(False)
    return LoadedModel(model, model_dir)


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_rows_match_eager_attention(tiny_family, family, texts):
    """On every family: Gemma 3's q/k norms, its scaling, its sliding-window layers (a window shorter than the
    prompts) and their own rotary frequencies."""
    tiny_dir, tiny_lm = tiny_family(family)
    eager_lm = _eager(tiny_dir)
    prompts = texts["prompt"].tolist()
    all_heads = [(l, h) for l in range(tiny_lm.n_layers) for h in range(tiny_lm.n_heads)]
    heads = [(2, 3), (0, 1), (1, 0), (0, 2)]  # any order, several layers
    rows = attention_rows(tiny_lm, prompts, heads, batch_size=2)  # batches of different widths
    enc = encode(tiny_lm.tokenizer, prompts)
    with torch.no_grad():
        eager = eager_lm.model(**enc, output_attentions=True).attentions  # L x [B, H, S, S]
    assert rows.weights.shape == (len(prompts), len(heads), enc["input_ids"].shape[1])
    assert torch.equal(rows.mask, enc["attention_mask"].bool())
    for j, (l, h) in enumerate(heads):
        torch.testing.assert_close(rows.weights[:, j], eager[l][:, h, -1].float(), atol=1e-5, rtol=0)
    # rows sum to one over real positions and are exactly zero on padding
    torch.testing.assert_close(rows.weights.sum(-1), torch.ones(len(prompts), len(heads)), atol=1e-5, rtol=0)
    assert (rows.weights.masked_select(~rows.mask[:, None, :]) == 0).all()
    assert (~rows.mask).any()  # there is padding to check
    # the same from the sdpa model and the eager one; and the query-head -> kv-head map matters (GQA):
    # heads 0 and 1 share key/value head 0 but not their rows
    from_eager = attention_rows(eager_lm, prompts, all_heads, batch_size=5)
    for j, (l, h) in enumerate(all_heads):
        torch.testing.assert_close(from_eager.weights[:, j], eager[l][:, h, -1].float(), atol=1e-5, rtol=0)
    assert (from_eager.weights[:, 0] - from_eager.weights[:, 1]).abs().max() > 1e-3
    assert rows.row(0).shape == (len(heads), int(rows.mask[0].sum()))


def test_role_attention(tiny_lm, texts):
    prompts = texts["prompt"].tolist()
    heads = [(1, 2), (2, 0)]
    rows = attention_rows(tiny_lm, prompts, heads, batch_size=8)
    roles = [token_roles(tiny_lm.tokenizer, p, r) for p, r in zip(prompts, texts.to_dict("records"))]
    table = role_attention(rows, roles)
    assert len(table) == len(heads) * len(ROLES)
    per_head = table.groupby(["layer", "head"])["attention"].sum()
    np.testing.assert_allclose(per_head.to_numpy(), 1.0, atol=1e-5)
    # one cell by hand: head (2, 0), operand_a
    want = np.mean([rows.row(i)[1][[r == "operand_a" for r in roles[i]]].sum().item() for i in range(len(prompts))])
    got = table.query("layer == 2 and head == 0 and role == 'operand_a'")
    assert got["attention"].item() == pytest.approx(want, abs=1e-6)
    assert got["tokens"].item() == pytest.approx(np.mean([r.count("operand_a") for r in roles]))
    with pytest.raises(ValueError):
        role_attention(rows, roles[:-1])
    with pytest.raises(ValueError):
        role_attention(rows, [r[1:] for r in roles])


# ---------------------------------------------------------------------------------------------------
# cosine and MLP probes


def test_cosine_matches_numpy():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 1, 7)), rng.normal(size=(1, 5, 7))
    want = (x * y).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))
    got = cosine(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32))
    assert got.shape == (4, 5)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-6)
    np.testing.assert_allclose(cosine(torch.tensor(x), torch.tensor(x)).numpy(), 1.0, atol=1e-12)
    np.testing.assert_allclose(cosine(torch.tensor(x), -torch.tensor(x)).numpy(), -1.0, atol=1e-12)
    assert cosine(torch.zeros(3), torch.ones(3)).item() == 0.0
    # along another axis
    u, v = x[:, 0], y[0, :4]  # [4, 7] each, compared along axis 0
    want0 = (u * v).sum(0) / (np.linalg.norm(u, axis=0) * np.linalg.norm(v, axis=0))
    np.testing.assert_allclose(cosine(torch.tensor(u), torch.tensor(v), dim=0).numpy(), want0)


def _operand_ids(tok, texts):
    records = texts.to_dict("records")
    a_ids = [role_token_ids(tok, r["prompt"], r, "operand_a")[0] for r in records]
    b_ids = [role_token_ids(tok, r["prompt"], r, "operand_b")[0] for r in records]
    return a_ids, b_ids


def _cos_np(u, v):
    return (u * v).sum(-1) / (np.linalg.norm(u, axis=-1) * np.linalg.norm(v, axis=-1))


def test_mlp_probes(tiny_lm, texts):
    """The `normed` variant on all texts: the MLP module's input (after the post-attention norm), its output
    and unit(output) - unit(input), recomputed with NumPy; plus the table's shape and the seeded baseline."""
    prompts = texts["prompt"].tolist()
    tok = tiny_lm.tokenizer
    a_ids, b_ids = _operand_ids(tok, texts)
    assert first_role_tokens(tok, texts, "operand_a") == a_ids == [tok(str(a)[0])["input_ids"][0] for a in texts["a"]]
    assert first_role_tokens(tok, texts, "operand_b") == b_ids
    with pytest.raises(ValueError, match="no token"):
        first_role_tokens(tok, texts.assign(b_end=texts["b_start"]), "operand_b")
    c_ids = texts["answer_token_id"].tolist()
    full = mlp_probes(tiny_lm, prompts, a_ids, b_ids, c_ids, batch_size=2, n_random=64, seed=3)
    L = tiny_lm.n_layers
    n_distinct = sum(c != a and c != b for a, b, c in zip(a_ids, b_ids, c_ids))
    assert 0 < n_distinct < len(prompts)  # both subsets are there, and differ
    assert len(full) == 2 * 2 * L * 3 * 4  # variants x subsets x layers x vectors x targets
    assert set(full["variant"]) == {"paper", "normed"} and set(full["subset"]) == {"all", "answer_distinct"}
    assert full.groupby(["variant", "subset", "layer", "vector", "target"]).size().eq(1).all()
    assert set(full.loc[full["subset"] == "answer_distinct", "n_texts"]) == {n_distinct}
    table = full[(full["variant"] == "normed") & (full["subset"] == "all")]
    assert set(table["vector"]) == {"input", "output", "delta"} and set(table["target"]) == {"a", "b", "c", "random"}
    # independently: the MLP input is the post-attention norm's output; recompute with NumPy
    seen = {}
    post = [(tiny_lm.layer(l).post_attention_layernorm, lambda m, a, o, l=l: seen.__setitem__(("in", l), o[:, -1]))
            for l in range(L)]
    post += [(tiny_lm.mlp(l), lambda m, a, o, l=l: seen.__setitem__(("out", l), o[:, -1])) for l in range(L)]
    with torch.no_grad(), hooks(post=post):
        tiny_lm.model(**encode(tok, prompts), logits_to_keep=1)
    W = tiny_lm.unembed.weight.double().numpy()

    for l in range(L):
        x_in, x_out = seen[("in", l)].double().numpy(), seen[("out", l)].double().numpy()
        unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
        vecs = {"input": x_in, "output": x_out, "delta": unit(x_out) - unit(x_in)}
        for vector, v in vecs.items():
            for target, ids in (("a", a_ids), ("b", b_ids), ("c", c_ids)):
                cell = table.query(f"layer == {l} and vector == '{vector}' and target == '{target}'")
                values = _cos_np(v, W[ids])
                assert cell["mean"].item() == pytest.approx(values.mean(), abs=1e-6)
                assert cell["std"].item() == pytest.approx(values.std(ddof=1), abs=1e-6)
                assert cell["n"].item() == cell["n_texts"].item() == len(prompts)
            rnd = table.query(f"layer == {l} and vector == '{vector}' and target == 'random'")
            assert rnd["n"].item() == 64 and 0 < rnd["std"].item() < 1
    # the random baseline is seeded
    again = mlp_probes(tiny_lm, prompts, a_ids, b_ids, c_ids, batch_size=5, n_random=64, seed=3)
    np.testing.assert_allclose(again["mean"].to_numpy(), full["mean"].to_numpy(), atol=1e-6)  # other batches
    other = mlp_probes(tiny_lm, prompts, a_ids, b_ids, c_ids, batch_size=5, n_random=64, seed=4)
    assert not np.allclose(other.query("target == 'random'")["mean"], full.query("target == 'random'")["mean"])
    with pytest.raises(ValueError):
        mlp_probes(tiny_lm, prompts, a_ids[:-1], b_ids, c_ids, batch_size=2)


@pytest.fixture(scope="module")
def gained_lm(tiny_dir):
    """The tiny model with random post-attention norm gains: with the built model's unit gains the normed
    MLP input is a positive multiple of the residual, and no cosine could tell the two apart."""
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    model.eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    for layer in model.model.layers:
        gain = layer.post_attention_layernorm.weight
        gain.copy_(torch.rand(gain.shape, generator=gen) * 2 - 0.5)
    return LoadedModel(model, tiny_dir)


@pytest.mark.parametrize("family", FAMILIES)
def test_mlp_probes_paper_variant_is_the_residual_entering_the_mlp_block(gained_lm, tiny_family, family, texts):
    """The `paper` variant, slowly: the residual entering layer l's MLP block is the layer's input
    (hidden_states[l]) plus the attention block's output; the MLP's output is what the layer adds after it
    (hidden_states[l + 1] minus that residual, for every layer but the last, whose hidden state HF returns
    after the final norm); the change is their difference. On Gemma 3 the attention block's output is that of
    the norm after o_proj, and what the MLP adds is that of the norm after it."""
    lm = gained_lm if family == "llama" else tiny_family(family)[1]
    prompts = texts["prompt"].tolist()
    tok = lm.tokenizer
    a_ids, b_ids = _operand_ids(tok, texts)
    c_ids = texts["answer_token_id"].tolist()
    full = mlp_probes(lm, prompts, a_ids, b_ids, c_ids, batch_size=2, n_random=8)
    table = full[(full["variant"] == "paper") & (full["subset"] == "all")]
    L = lm.n_layers
    attn = {}
    post = [(lm.layer(l).self_attn, lambda m, a, o, l=l: attn.__setitem__(l, o[0][:, -1])) if lm.attn_out_norm(l)
            is None else (lm.attn_out_norm(l), lambda m, a, o, l=l: attn.__setitem__(l, o[:, -1])) for l in range(L)]
    with torch.no_grad(), hooks(post=post):
        hidden = lm.model(**encode(tok, prompts), output_hidden_states=True).hidden_states  # L + 1 x [B, S, d]
    W = lm.unembed.weight.double().numpy()
    for l in range(L):
        resid_mid = (hidden[l][:, -1] + attn[l]).double().numpy()
        vecs = {"input": resid_mid}
        if l < L - 1:
            out = hidden[l + 1][:, -1].double().numpy() - resid_mid
            vecs |= {"output": out, "delta": out - resid_mid}
        for vector, v in vecs.items():
            for target, ids in (("a", a_ids), ("b", b_ids), ("c", c_ids)):
                cell = table.query(f"layer == {l} and vector == '{vector}' and target == '{target}'")
                values = _cos_np(v, W[ids])
                assert cell["mean"].item() == pytest.approx(values.mean(), abs=1e-5)
                assert cell["std"].item() == pytest.approx(values.std(ddof=1), abs=1e-5)
    # the two definitions of the input differ (the norm's gain and scale), the output is the same MLP output
    by = full[full["subset"] == "all"].set_index(["variant", "layer", "vector", "target"])["mean"]
    assert not np.allclose(by["paper"].xs("input", level="vector"), by["normed"].xs("input", level="vector"))
    np.testing.assert_allclose(by["paper"].xs("output", level="vector"), by["normed"].xs("output", level="vector"))


def test_mlp_probes_answer_distinct_subset(tiny_lm, texts):
    """answer_distinct rows are the probes of only the texts whose answer token is neither operand token:
    here text 0's answer token is its A token and text 1's its B token, so the subset is texts 2, 3, 4."""
    prompts = texts["prompt"].tolist()
    tok = tiny_lm.tokenizer
    a_ids, b_ids = _operand_ids(tok, texts)
    digits = [tok.convert_tokens_to_ids(d) for d in "0123456789"]
    c_ids = [a_ids[0], b_ids[1]] + [next(d for d in digits if d not in (a, b)) for a, b in zip(a_ids[2:], b_ids[2:])]
    table = mlp_probes(tiny_lm, prompts, a_ids, b_ids, c_ids, batch_size=2, n_random=16, seed=1)
    distinct = table[table["subset"] == "answer_distinct"].drop(columns="subset").reset_index(drop=True)
    only = mlp_probes(tiny_lm, prompts[2:], a_ids[2:], b_ids[2:], c_ids[2:], batch_size=2, n_random=16, seed=1)
    assert set(only["subset"]) == {"all", "answer_distinct"}  # every text of the three is distinct
    expected = only[only["subset"] == "all"].drop(columns="subset").reset_index(drop=True)
    pd.testing.assert_frame_equal(distinct, expected, atol=1e-9, rtol=0)
    assert set(distinct["n_texts"]) == {3} and set(distinct.loc[distinct["target"] != "random", "n"]) == {3}
    # and they differ from the rows on all five texts
    all_rows = table[table["subset"] == "all"].drop(columns="subset").reset_index(drop=True)
    assert not np.allclose(all_rows["mean"], distinct["mean"])


def test_mlp_probes_empty_answer_distinct_subset_has_no_rows(tiny_lm, texts, tmp_path):
    """Every answer token equal to an operand token: no answer_distinct rows, and the figure still draws."""
    prompts = texts["prompt"].tolist()
    a_ids, b_ids = _operand_ids(tiny_lm.tokenizer, texts)
    c_ids = [b if i % 2 else a for i, (a, b) in enumerate(zip(a_ids, b_ids))]
    table = mlp_probes(tiny_lm, prompts, a_ids, b_ids, c_ids, batch_size=5, n_random=8)
    assert set(table["subset"]) == {"all"} and len(table) == 2 * tiny_lm.n_layers * 3 * 4
    plots.mlp_probe_lines(table, "no distinct answers", tmp_path / "probes.png")
    assert (tmp_path / "probes.png").read_bytes()[:4] == b"\x89PNG"
