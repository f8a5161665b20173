"""Tests for the benchmark side of arithmech.sft.scoring and arithmech.data.answers on the tiny CPU model: reading the
final answer of a generated solution, generation in input order whatever the batching, multiple-choice log-likelihoods
and perplexity against slow, obviously correct references, short-answer matching and Wilson intervals."""

from __future__ import annotations

import contextlib
import math
import re

import numpy as np
import pandas as pd
import pytest
import torch

from arithmech.data.answers import answer_sentence, extract_answer, extract_number, normalize_answer, qa_correct
from arithmech.data.arithmetic import continuation_ids
from arithmech.data.formatting import choice_prompt
from arithmech.intervention.generation import SharedPrefix, _batches, generate_texts, greedy_answers, greedy_generate
from arithmech.intervention.hooks import hooks
from arithmech.model.tiny import FAMILIES
from arithmech.sft.scoring import (
    _length_batches,
    choice_loglik,
    evaluate_choice,
    evaluate_generation,
    evaluate_qa_generation,
    leading_tokens,
    perplexity,
)
from arithmech.stats import accuracy_interval
from helpers import ROOT

# ---------------------------------------------------------------------------------------------------
# reading the final answer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She pays 500 + 500 = 1,000 dollars.\n#### 1,000", 1000.0),
        ("#### 1,000.5", 1000.5),
        ("It costs 2 * 9.25 = $18.50.\nThe answer is $18.50.", 18.5),
        ("2 + 5 = 7 so the answer is 7.", 7.0),
        ("The answer is 7.", 7.0),
        ("Answer: 12 apples", 12.0),
        ("He has 3 bags of 4, so 12 apples", 12.0),
        ("3 + 2 = 5 dollars", 5.0),
        ("The answer is -3.", -3.0),
        ("The answer is \u22123", -3.0),
        ("The temperature drops 5 degrees to -3", -3.0),
        ("Each gets 9 / 4 = 2.25", 2.25),
        ("The answer is: 1,000.5 meters.", 1000.5),
        # the marked answer wins over later numbers, and the last mark over earlier ones
        ("#### 42\nThat took 3 steps.", 42.0),
        ("The answer is 5. Wait, 2 + 4 = 6. The answer is 6. It took 2 minutes.", 6.0),
        # a mark without a number falls back to the next rule
        ("4 + 4 = 8\n####", 8.0),
        # the model going on with the next few-shot block is cut off
        ("3 + 4 = 7\nThe answer is 7.\n\nQuestion: Tom has 5 pens. How many?\nAnswer: The answer is 5.", 7.0),
        ("so 9 in all\nQuestion: 12 birds", 9.0),
        ("I do not know.", None),
        ("", None),
        ("The answer is unclear.\n\nQuestion: 5 cats", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_the_answer_sentence_is_read_back():
    """The sentence fine-tuning teaches a solution to end with is what extract_answer reads, after a reasoning line
    with other numbers in it."""
    for gold in (8, 1000.5, -3):
        assert extract_answer(f"2 + 3 = 5, then 4 more.\n{answer_sentence(f'{gold:g}')}") == gold


def test_extract_number_still_reads_the_first_number():
    assert extract_number("3 + 4 = 7. The answer is 7") == 3.0
    assert extract_number("$18.50 and 2") == 18.5
    assert extract_number("none") is None


# ---------------------------------------------------------------------------------------------------
# generation

MATH_PROMPTS = [
    "Question: What is 2 plus 3?\nAnswer:",
    "Question: Tom has 12 apples and eats 4 of them. How many apples are left?\nAnswer:",
    "Question: 7 times 8?\nAnswer:",
    "Question: A class has 23 students in 4 rows. How many students are in each row, if the rows are even?\nAnswer:",
    "Question: 1 minus 1?\nAnswer:",
]


@pytest.fixture(scope="module")
def math_frame(tiny_lm):
    # gold: the tiny model's own answer where it gives one, so some rows are correct
    own = [extract_answer(o) for o in greedy_answers(tiny_lm, MATH_PROMPTS, 12, batch_size=1)]
    gold = [v if v is not None else 1.0 for v in own]
    return pd.DataFrame({"id": [f"q{i}" for i in range(len(MATH_PROMPTS))], "prompt": MATH_PROMPTS, "gold": gold})


def test_evaluate_generation_keeps_input_order_whatever_the_batching(tiny_lm, math_frame):
    one = evaluate_generation(tiny_lm, math_frame, 12, batch_size=1, stop_strings=(), progress=None)
    three = evaluate_generation(tiny_lm, math_frame, 12, batch_size=3, stop_strings=(), progress=None)
    assert list(one.columns) == ["id", "prompt", "output", "extracted", "gold", "correct"]
    pd.testing.assert_frame_equal(one, three)
    assert one["id"].tolist() == math_frame["id"].tolist()
    assert one["prompt"].tolist() == MATH_PROMPTS
    # the same continuations as plain generation, prompt by prompt
    assert one["output"].tolist() == [greedy_answers(tiny_lm, [p], 12, 1)[0] for p in MATH_PROMPTS]
    for row in one.itertuples():
        value = extract_answer(row.output)
        assert math.isnan(row.extracted) if value is None else row.extracted == value
        assert row.correct == (value is not None and value == row.gold)


def test_evaluate_generation_stops_at_stop_strings(tiny_lm, math_frame):
    free = evaluate_generation(tiny_lm, math_frame, 12, batch_size=2, stop_strings=(), progress=None)
    # stop at a word the model writes after its first character (the tiny model writes much byte noise)
    row, word = next(
        (i, m) for i, text in enumerate(free["output"]) if (m := re.search(r"[A-Za-z]{3,}", text)) and m.start() > 0
    )
    stop = word.group()
    cut = evaluate_generation(tiny_lm, math_frame, 12, batch_size=2, stop_strings=(stop,), progress=None)
    assert cut["output"][row] == free["output"][row][: word.start()]
    assert cut["output"].tolist() == [full.split(stop, 1)[0] for full in free["output"]]
    # generation itself stopped: the row is padded after the token that completed the stop string
    ids = greedy_generate(tiny_lm, MATH_PROMPTS, 12, batch_size=5, stop_strings=(stop,))[row]
    done = next(k for k in range(1, 13) if stop in tiny_lm.tokenizer.decode(ids[:k]))
    assert done < 12 and (ids[done:] == tiny_lm.tokenizer.pad_token_id).all()


def test_hooks_see_rows_numbered_as_the_prompts(tiny_lm, math_frame):
    """generate_texts sorts prompts by length and rows leave the forwards as they end; hooks still get each
    row's index in the given prompts: a hook that forces one token on row 2 changes row 2 alone."""
    forced = tiny_lm.tokenizer("7", add_special_tokens=False)["input_ids"][0]
    seen = []

    def force_row_2(rows):
        seen.append(rows.tolist())
        hit = (rows == 2).to(tiny_lm.device)

        def bias(module, args, output):
            output = output.clone()
            output[hit, :, forced] += 1e4
            return output

        return hooks(post=[(tiny_lm.unembed, bias)])

    free = generate_texts(tiny_lm, math_frame["prompt"], 4, 2, progress=None)
    got = generate_texts(tiny_lm, math_frame["prompt"], 4, 2, hooks=force_row_2, progress=None)
    assert got[2] == "7777" and free[2] != "7777"
    assert [g for i, g in enumerate(got) if i != 2] == [f for i, f in enumerate(free) if i != 2]
    assert sorted({r for rows in seen for r in rows}) == list(range(5))


SHOTS = "Question: Ann has 3 pens and buys 4 more. How many pens does she have?\nAnswer: 3 + 4 = 7. #### 7\n\n"


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_shared_prefix_generation_matches_whole_prompts(tiny_lm, batch_size):
    prompts = [SHOTS + p for p in MATH_PROMPTS]
    prefix = SharedPrefix.of(tiny_lm, prompts)
    ids = tiny_lm.tokenizer(prompts)["input_ids"]
    # the prefix is the longest common token prefix, and every prompt keeps tokens of its own
    assert prefix is not None and prefix.length >= len(tiny_lm.tokenizer(SHOTS)["input_ids"]) - 1
    assert all(row[: prefix.length] == ids[0][: prefix.length] for row in ids)
    assert len({row[prefix.length] for row in ids}) > 1
    whole, whole_logits = greedy_generate(tiny_lm, prompts, 10, batch_size, return_logits=True)
    shared, shared_logits = greedy_generate(tiny_lm, prompts, 10, batch_size, return_logits=True, share_prefix=True)
    assert torch.equal(shared, whole)
    torch.testing.assert_close(shared_logits, whole_logits, rtol=1e-4, atol=1e-4, equal_nan=True)
    # and so do the scored answers, which share the prefix by default
    frame = pd.DataFrame({"id": [str(i) for i in range(5)], "prompt": prompts, "gold": [1.0] * 5})
    pd.testing.assert_frame_equal(
        evaluate_generation(tiny_lm, frame, 10, batch_size, progress=None),
        evaluate_generation(tiny_lm, frame, 10, batch_size, progress=None, share_prefix=False),
    )


def test_shared_prefix_needs_a_prefix_and_no_hooks(tiny_lm):
    assert SharedPrefix.of(tiny_lm, MATH_PROMPTS[:1] + ["Tom has 12 apples."]) is None  # nothing shared
    assert SharedPrefix.of(tiny_lm, [SHOTS, SHOTS]).length == len(tiny_lm.tokenizer(SHOTS)["input_ids"]) - 1
    with pytest.raises(ValueError, match="share_prefix needs hooks=None"):
        greedy_generate(tiny_lm, [SHOTS], 2, 1, hooks=lambda rows: contextlib.nullcontext(), share_prefix=True)


def test_evaluate_generation_names_missing_columns(tiny_lm):
    with pytest.raises(ValueError, match=r"evaluate_generation: the frame lacks column\(s\) \['gold'\]"):
        evaluate_generation(tiny_lm, pd.DataFrame({"id": ["a"], "prompt": ["b"]}), 2, 1)


# ---------------------------------------------------------------------------------------------------
# multiple choice

CONTEXTS = [
    choice_prompt("Is it common to see frost during some college commencements?"),
    choice_prompt("What does Tracy need to do before this?"),
    "The answer is",
    choice_prompt("Pick one."),
]
CHOICES = [
    [" Yes", " No"],
    [" Make a new plan", " Go home and see Riley", " Find somewhere to go"],
    [" 7", " 12", " seven hundred", " none"],
    [" a"],
]


def _reference_loglik(lm, context, choice):
    """One unbatched forward of context + choice; sum log p(choice token | everything before it) by hand."""
    ctx = lm.tokenizer(context)["input_ids"]
    cont = lm.tokenizer(choice, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = lm.model(input_ids=ids).logits[0].double().log_softmax(-1)
    return sum(float(logp[len(ctx) + j - 1, token]) for j, token in enumerate(cont))


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_choice_loglik_matches_unbatched_reference(tiny_lm, batch_size):
    tok = tiny_lm.tokenizer
    for context, choices in zip(CONTEXTS, CHOICES):
        for choice in choices:  # these never merge across the boundary, so the reference tokenizes apart
            assert continuation_ids(tok, context, choice)[1] == tok(choice, add_special_tokens=False)["input_ids"]
    scores = choice_loglik(tiny_lm, CONTEXTS, CHOICES, batch_size=batch_size)
    assert [s.shape for s in scores] == [(len(c),) for c in CHOICES]
    for got, context, choices in zip(scores, CONTEXTS, CHOICES):
        expected = [_reference_loglik(tiny_lm, context, c) for c in choices]
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
        assert (got < 0).all()


@pytest.mark.parametrize(
    "context, choice, merges",
    [("is equal to ", "5", False), ("Answer:", " yes", False), ("Answer: ", "yes", True), ("It is ", "the", True)],
)
def test_choice_token_ids_keep_the_context_tokens(tiny_lm, context, choice, merges):
    tok = tiny_lm.tokenizer
    joint = tok(context + choice)["input_ids"]
    ctx, cont = continuation_ids(tok, context, choice)
    # "Answer: " + "yes" tokenizes jointly as ":", " yes": the context's own last token " " is not a prefix
    assert (joint[: len(ctx)] != ctx) == merges
    assert ctx == tok(context)["input_ids"]
    assert ctx + cont == (tok(context)["input_ids"] + tok(choice)["input_ids"] if merges else joint)
    assert tok.decode(ctx + cont) == context + choice


def test_evaluate_choice(tiny_lm):
    frame = pd.DataFrame(
        {
            "id": ["a", "b", "c"],
            "input": ["Is it common to see frost?", "What now?", "Pick."],
            "choices": [["Yes", "No"], ["Make a new plan", "Go home", "Find somewhere to go"], ["x", "yy"]],
            "correct": [0, 2, 1],
        }
    )
    res = evaluate_choice(tiny_lm, frame, batch_size=2, progress=None)
    assert res["id"].tolist() == ["a", "b", "c"] and res["n_choices"].tolist() == [2, 3, 2]
    for row, item in zip(res.itertuples(), frame.itertuples()):
        context = choice_prompt(item.input)
        ref = [_reference_loglik(tiny_lm, context, " " + c) for c in item.choices]
        np.testing.assert_allclose(row.loglik, ref, atol=1e-4, rtol=0)
        assert row.prediction == int(np.argmax(ref))
        assert row.correct == (row.prediction == item.correct) and row.correct_index == item.correct
        n_tokens = [len(tiny_lm.tokenizer(" " + c)["input_ids"]) for c in item.choices]
        assert row.prediction_norm == int(np.argmax(np.array(ref) / n_tokens))
    # a prompt column replaces the default context
    own = evaluate_choice(tiny_lm, frame.assign(prompt=["Q1", "Q2", "Q3"]), batch_size=2, progress=None)
    np.testing.assert_allclose(
        own["loglik"][0], [_reference_loglik(tiny_lm, "Q1", c) for c in (" Yes", " No")], atol=1e-4
    )


def test_choice_loglik_errors(tiny_lm):
    with pytest.raises(ValueError, match="2 contexts but 1 lists of choices"):
        choice_loglik(tiny_lm, ["a", "b"], [[" x"]], 1)
    with pytest.raises(ValueError, match=r"item 0: the context '' or the choice ' x' has no tokens"):
        choice_loglik(tiny_lm, [""], [[" x"]], 1)
    with pytest.raises(ValueError, match="item 1: no choices"):
        choice_loglik(tiny_lm, ["a", "b"], [[" x"], []], 1)


# ---------------------------------------------------------------------------------------------------
# short generated answers


def test_normalize_and_qa_correct():
    assert normalize_answer("  The United Kingdom.\nmore") == "united kingdom"
    assert normalize_answer("An  apple, a day!") == "apple day"
    assert qa_correct(" English", ["English"])
    assert qa_correct(" comedy film from 1983.", ["comedy", "parody"])
    assert qa_correct(" the parody", ["comedy", "parody"])
    assert not qa_correct(" comedyfilm", ["comedy"])
    assert not qa_correct(" film comedy", ["comedy"])
    assert not qa_correct("\nEnglish", ["English"])  # only the first line counts
    assert not qa_correct(" anything", ["the"])  # a target that normalises to nothing matches nothing


def test_evaluate_qa_generation(tiny_lm):
    prompts = ["The genre of Weird Al is", "The language of Satisfaction is", "The capital of France is"]
    free = greedy_answers(tiny_lm, prompts, 6, batch_size=1)
    frame = pd.DataFrame({"id": ["x", "y", "z"], "input": prompts})
    # targets: row x accepts the model's own first line, the others never match
    first = normalize_answer(free[0])
    assume = first if first else "@@"
    frame["targets"] = [["nothing at all", assume], ["zzzz"], ["qqqq"]]
    res = evaluate_qa_generation(tiny_lm, frame, 6, batch_size=2, progress=None)
    assert list(res.columns) == ["id", "prompt", "output", "correct"]
    assert res["id"].tolist() == ["x", "y", "z"] and res["prompt"].tolist() == prompts
    assert res["output"].tolist() == [f.split("\n", 1)[0] for f in free]
    assert res["correct"].tolist() == [bool(first), False, False]


# ---------------------------------------------------------------------------------------------------
# perplexity

TEXT = (
    " = Robert <unk> = \n \n Robert <unk> is an English film , television and theatre actor . He had a guest "
    "@-@ starring role on the television series The Bill in 2000 . "
)


def _token_logprobs(lm, ids):
    with torch.no_grad():
        logp = lm.model(input_ids=torch.tensor([ids])).logits[0].double().log_softmax(-1)
    return [float(logp[t - 1, ids[t]]) for t in range(1, len(ids))]


def test_perplexity_with_one_window_is_the_plain_forward(tiny_lm):
    ids = tiny_lm.tokenizer(TEXT)["input_ids"]
    nll = -np.mean(_token_logprobs(tiny_lm, ids))
    res = perplexity(tiny_lm, TEXT, max_length=len(ids) + 10, stride=4, progress=None)
    assert res["n_tokens"] == len(ids) - 1
    assert res["nll"] == pytest.approx(nll, abs=1e-5)
    assert res["perplexity"] == pytest.approx(math.exp(nll), rel=1e-5)
    capped = perplexity(tiny_lm, TEXT, max_length=512, stride=4, max_tokens=20, progress=None)
    assert capped["n_tokens"] == 19
    assert capped["nll"] == pytest.approx(-np.mean(_token_logprobs(tiny_lm, ids[:20])), abs=1e-5)


@pytest.mark.parametrize("max_length, stride, max_tokens", [(16, 5, None), (16, 15, None), (8, 1, 30), (30, 7, None)])
def test_perplexity_sliding_window_scores_each_token_once_with_its_window(tiny_lm, max_length, stride, max_tokens):
    ids = tiny_lm.tokenizer(TEXT)["input_ids"][:max_tokens]
    assert len(ids) > 3 * max_length
    # Token t (t >= 1) is scored in the window ending at the last target of its chunk: the first chunk is
    # targets 1..max_length-1, then chunks of `stride`; the window is the max_length tokens ending there.
    expected, t0 = [], 1
    while t0 < len(ids):
        t1 = min(max_length if t0 == 1 else t0 + stride, len(ids))
        start = max(0, t1 - max_length)
        window = _token_logprobs(tiny_lm, ids[start:t1])
        expected += window[t0 - start - 1 :]
        assert t0 - start >= min(t0, max_length - stride)  # the context each target sees
        t0 = t1
    assert len(expected) == len(ids) - 1
    res = perplexity(tiny_lm, TEXT, max_length=max_length, stride=stride, max_tokens=max_tokens, progress=None)
    assert res["n_tokens"] == len(ids) - 1
    assert res["nll"] == pytest.approx(-np.mean(expected), abs=1e-5)
    # with all the context (one window) the number differs, so the windows really cut the context
    full = perplexity(tiny_lm, TEXT, max_length=len(ids), stride=1, max_tokens=max_tokens, progress=None)
    assert abs(full["nll"] - res["nll"]) > 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_leading_tokens_are_the_whole_texts_first_tokens(tiny_family, family):
    """The prefix tokenization (a character prefix, checked against one twice as long) gives exactly the first
    tokens of the whole text: WikiText-2's test split as the evaluations read it, every tiny tokenizer, caps that
    cut the prefix in different places, and a text shorter than the first prefix."""
    tokenizer = tiny_family(family)[1].tokenizer
    text = (ROOT / "resources/data/wikitext-2/test.txt").read_text(encoding="utf-8")[:300_000]
    whole = tokenizer(text, verbose=False)["input_ids"]
    for max_tokens in (1, 2, 37, 200, 2048, 5000):
        assert leading_tokens(tokenizer, text, max_tokens) == whole[:max_tokens], max_tokens
    assert leading_tokens(tokenizer, TEXT, 20) == tokenizer(TEXT)["input_ids"][:20]
    assert leading_tokens(tokenizer, TEXT, None) == tokenizer(TEXT)["input_ids"]


def test_perplexity_errors(tiny_lm):
    with pytest.raises(ValueError, match="1 <= stride < max_length"):
        perplexity(tiny_lm, TEXT, max_length=8, stride=8)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        perplexity(tiny_lm, "a", max_length=8, stride=2)


# ---------------------------------------------------------------------------------------------------
# Wilson interval


def test_accuracy_interval_known_values():
    mean, low, high = accuracy_interval([True] * 8 + [False] * 2)
    assert mean == 0.8 and low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    z2 = 1.959963984540054**2
    assert accuracy_interval(np.zeros(10, bool)) == pytest.approx((0.0, 0.0, z2 / (10 + z2)))
    assert accuracy_interval(np.ones(10, bool)) == pytest.approx((1.0, 10 / (10 + z2), 1.0))
    # 90%: z = 1.6449; 50 of 100 -> 0.5 -/+ 1.6449 / 1.02706 * sqrt(0.0025 + 0.0000676) = 0.5 -/+ 0.08115
    mean, low, high = accuracy_interval([True, False] * 50, confidence=0.90)
    assert (low, high) == pytest.approx((0.5 - 0.08115, 0.5 + 0.08115), abs=1e-4)
    assert all(math.isnan(v) for v in accuracy_interval([]))
    with pytest.raises(ValueError, match="confidence"):
        accuracy_interval([True], confidence=1.5)


# ---------------------------------------------------------------------------------------------------
# bfloat16 (what a GPU run uses): scores are computed in float32 and stay close to the fp32 ones


def test_bfloat16_model(tiny_dir, tiny_lm, math_frame):
    from arithmech.model.loading import load_model

    bf16 = load_model(tiny_dir, device="cpu", dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    got = choice_loglik(bf16, CONTEXTS, CHOICES, batch_size=4)
    want = choice_loglik(tiny_lm, CONTEXTS, CHOICES, batch_size=4)
    for g, w in zip(got, want):
        assert g.dtype == np.float64
        np.testing.assert_allclose(g, w, rtol=0.05, atol=0.2)
    ppl = perplexity(bf16, TEXT, max_length=16, stride=5, progress=None)
    assert ppl["nll"] == pytest.approx(perplexity(tiny_lm, TEXT, max_length=16, stride=5, progress=None)["nll"],
                                       rel=0.05)
    res = evaluate_generation(bf16, math_frame, 4, batch_size=2, progress=None)
    assert len(res) == len(math_frame) and res["correct"].dtype == bool


@pytest.mark.parametrize("batch_size", [1, 2, 3, 64])
def test_length_batches_cover_rows_in_order_and_bound_padding(batch_size):
    lengths = sorted([370, 300, 290, 200, 160, 150, 149, 80, 79, 78, 12, 11, 10, 9], reverse=True)
    batches = _length_batches(lengths, batch_size)
    assert [r for a, b in batches for r in range(a, b)] == list(range(len(lengths)))  # every row once, in order
    for a, b in batches:
        assert 1 <= b - a <= batch_size
        assert min(lengths[a:b]) >= 0.75 * lengths[a]  # padding under a quarter of the batch's longest row
    # a batch only ends early where the next row would break the bound
    assert all(b - a == batch_size or b == len(lengths) or lengths[b] < 0.75 * lengths[a] for a, b in batches)
    assert _length_batches([9, 9, 8, 8, 7], batch_size) == list(_batches(5, batch_size))
    with pytest.raises(ValueError, match="sorted longest first"):
        _length_batches([1, 2], batch_size)
