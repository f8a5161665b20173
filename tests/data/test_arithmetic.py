"""Tests for arithmech.data.arithmetic: operand pairs, rendering with spans, answer splitting, prompt pairs,
sample selection and left-padded encoding."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from arithmech.data.arithmetic import (
    TASKS,
    PromptError,
    build_prompts,
    encode,
    operand_pairs,
    render,
    select_samples,
    split_answer,
)

# ---------------------------------------------------------------------------------------------------
# Helpers


def _gpt2_style_tokenizer(eos_after: bool = False) -> PreTrainedTokenizerFast:
    """Byte-level BPE whose pre-tokenizer keeps a space glued to the following digits (GPT-2 regex),
    with merges 'Ġ'+digit, so ' 5' is ONE token and ' 12' is 'Ġ1', '2'. Optionally appends EOS."""
    vocab = {"<eos>": 0}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    merges = []

    def merge(a, b):
        merges.append((a, b))
        vocab[a + b] = len(vocab)

    for digit in "0123456789":
        merge("Ġ", digit)
    merge("Ġ", "t")
    merge("Ġt", "o")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if eos_after:
        tok.post_processor = processors.TemplateProcessing(single="$A <eos>", special_tokens=[("<eos>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


@pytest.fixture(scope="module")
def gpt2_tok():
    return _gpt2_style_tokenizer()


@pytest.fixture(scope="module")
def tok(tiny_lm):
    return tiny_lm.tokenizer


def _tokens(tokenizer, text):
    return tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])


# ---------------------------------------------------------------------------------------------------
# operand_pairs


def test_operand_pairs_addition_is_full_grid():
    pairs = operand_pairs("addition", 1, 3)
    assert pairs == [(a, b) for a in (1, 2, 3) for b in (1, 2, 3)]
    assert operand_pairs("multiplication", 2, 3) == [(2, 2), (2, 3), (3, 2), (3, 3)]


def test_operand_pairs_subtraction_never_negative():
    pairs = operand_pairs("subtraction", 1, 4)
    assert all(a >= b for a, b in pairs)
    assert len(pairs) == 10  # 4 * 5 / 2
    assert set(pairs) == {(a, b) for a in range(1, 5) for b in range(1, 5) if a >= b}


def test_operand_pairs_division_is_exact_with_quotient_in_range():
    pairs = operand_pairs("division", 1, 4)
    assert len(pairs) == 16 and len(set(pairs)) == 16
    for a, b in pairs:
        assert a % b == 0
        assert 1 <= b <= 4 and 1 <= a // b <= 4
    assert (16, 4) in pairs and (12, 3) in pairs
    # b = 0 is never produced even when 0 is in range
    assert all(b != 0 for _, b in operand_pairs("division", 0, 3))


def test_operand_pairs_unknown_task():
    with pytest.raises(PromptError, match="unknown task 'modulo'"):
        operand_pairs("modulo", 1, 4)


# ---------------------------------------------------------------------------------------------------
# render


def test_render_spans_point_at_the_fields():
    r = render("What is {a} {op} {b}? The answer is ", a=12, op="divided by", b=3)
    assert r.text == "What is 12 divided by 3? The answer is "
    assert r.spans == {"a": (8, 10), "op": (11, 21), "b": (22, 23)}
    assert r.text[slice(*r.spans["a"])] == "12"
    assert r.text[slice(*r.spans["op"])] == "divided by"
    assert r.text[slice(*r.spans["b"])] == "3"


def test_render_field_order_can_differ():
    r = render("{b} {op} {a} = ", a=7, op="@", b=345)
    assert r.text == "345 @ 7 = "
    assert {k: r.text[s:e] for k, (s, e) in r.spans.items()} == {"a": "7", "op": "@", "b": "345"}


def test_render_missing_field_raises():
    with pytest.raises(PromptError, match=r"lacks the field\(s\) \['b'\]"):
        render("{a} {op} is equal to ", a=1, op="plus", b=2)


def test_render_unknown_field_raises():
    with pytest.raises(PromptError, match=r"unknown field \{c\}"):
        render("{a} {op} {b} {c}", a=1, op="plus", b=2)


# ---------------------------------------------------------------------------------------------------
# split_answer


def test_split_answer_tiny_keeps_trailing_space(tok):
    prompt, answer_id = split_answer(tok, "2 plus 3 is equal to ", "5")
    assert prompt == "2 plus 3 is equal to "
    assert _tokens(tok, prompt)[-1] == "Ġ"
    assert tok.convert_ids_to_tokens(answer_id) == "5"
    assert tok(prompt + "5")["input_ids"] == tok(prompt)["input_ids"] + [answer_id]


def test_split_answer_tiny_multi_digit_gives_first_digit(tok):
    prompt, answer_id = split_answer(tok, "4 times 4 is equal to ", "16")
    assert prompt == "4 times 4 is equal to "
    assert tok.convert_ids_to_tokens(answer_id) == "1"


def test_gpt2_style_tokenizer_glues_space_to_digit(gpt2_tok):
    # sanity check of the helper itself, so the next tests test what they claim
    assert _tokens(gpt2_tok, "is equal to 5")[-1] == "Ġ5"
    assert _tokens(gpt2_tok, "is equal to ")[-1] == "Ġ"


def test_split_answer_gpt2_style_moves_space_into_answer(gpt2_tok):
    prompt, answer_id = split_answer(gpt2_tok, "2 plus 3 is equal to ", "5")
    assert prompt == "2 plus 3 is equal to"
    assert gpt2_tok.convert_ids_to_tokens(answer_id) == "Ġ5"
    assert gpt2_tok(prompt + " 5")["input_ids"] == gpt2_tok(prompt)["input_ids"] + [answer_id]


def test_split_answer_gpt2_style_multi_digit(gpt2_tok):
    prompt, answer_id = split_answer(gpt2_tok, "4 times 4 is equal to ", "16")
    assert prompt == "4 times 4 is equal to"
    assert gpt2_tok.convert_ids_to_tokens(answer_id) == "Ġ1"


def test_split_answer_impossible_raises():
    # a tokenizer that appends EOS never has tokenize(prompt) as a prefix of tokenize(prompt + answer)
    eos_tok = _gpt2_style_tokenizer(eos_after=True)
    with pytest.raises(PromptError, match="no split"):
        split_answer(eos_tok, "2 plus 3 is equal to ", "5")


# ---------------------------------------------------------------------------------------------------
# build_prompts


@pytest.fixture
def frames(tok, prompt_cfg):
    return {task: build_prompts(tok, task, prompt_cfg, seed=0) for task in TASKS}


def test_build_prompts_row_count_and_answers(frames, prompt_cfg):
    for task, df in frames.items():
        n_pairs = len(operand_pairs(task, 1, 4))
        assert len(df) == 2 * 1 * n_pairs
        assert df["sample_id"].tolist() == list(range(len(df)))
        assert (df["answer"] == [TASKS[task](a, b) for a, b in zip(df["a"], df["b"])]).all()
        assert set(df["template_id"]) == {0, 1}
        assert set(df["null_word"]) <= set(prompt_cfg["null_words"])
        assert (df["operator"] == prompt_cfg["operators"][task][0]).all()


def test_build_prompts_answer_token_is_first_digit(frames, tok):
    for df in frames.values():
        for row in df.itertuples():
            assert row.answer_token == str(row.answer)[0]
            assert tok.convert_ids_to_tokens(row.answer_token_id) == str(row.answer)[0]
            ids = tok(row.prompt)["input_ids"]
            assert row.n_tokens == len(ids)
            assert tok(row.prompt + str(row.answer))["input_ids"][: len(ids) + 1] == ids + [row.answer_token_id]
            assert row.prompt.endswith(" ")  # tiny tokenizer: trailing space stays in the prompt


def test_counterfactual_replaces_operator_in_every_line(frames, prompt_cfg):
    sep = prompt_cfg["shot_separator"]
    for task, df in frames.items():
        for row in df.itertuples():
            lines, cf_lines = row.prompt.split(sep), row.cf_prompt.split(sep)
            assert len(lines) == len(cf_lines) == prompt_cfg["n_shots"] + 1
            for line, cf_line in zip(lines, cf_lines):
                assert line.count(row.operator) == 1
                assert cf_line == line.replace(row.operator, row.null_word)
            assert row.cf_prompt == row.prompt.replace(row.operator, row.null_word)
            assert row.operator not in row.cf_prompt


def test_spans_slice_the_right_text(frames):
    for df in frames.values():
        for row in df.itertuples():
            p, c = row.prompt, row.cf_prompt
            assert p[row.a_start : row.a_end] == str(row.a)
            assert p[row.b_start : row.b_end] == str(row.b)
            assert p[row.op_start : row.op_end] == row.operator
            assert c[row.cf_op_start : row.cf_op_end] == row.null_word
            # spans are in the query (last) line, not in a shot
            assert row.query_start <= row.a_start and "\n" not in p[row.query_start :]
            assert p[: row.query_start].endswith(".\n")
            assert "\n" not in c[row.cf_query_start :] and c[: row.cf_query_start].endswith(".\n")
            query = render(row.template, a=row.a, op=row.operator, b=row.b).text
            assert p[row.query_start :] == query
            # the operands of the counterfactual are at the same offsets from its query start
            assert c[row.cf_query_start + (row.a_start - row.query_start) :].startswith(str(row.a))


_LINE = {
    0: re.compile(r"^(\d+) (?:plus|minus|times|divided by) (\d+) is equal to (\d+)$"),
    1: re.compile(r"^What is (\d+) (?:plus|minus|times|divided by) (\d+)\? The answer is (\d+)$"),
}


def test_shots_are_solved_distinct_and_never_the_query(frames, prompt_cfg):
    for task, df in frames.items():
        pairs = set(operand_pairs(task, 1, 4))
        for row in df.itertuples():
            shots = row.prompt.split(prompt_cfg["shot_separator"])[:-1]
            parsed = [tuple(int(g) for g in _LINE[row.template_id].match(s).groups()) for s in shots]
            shot_pairs = [(x, y) for x, y, _ in parsed]
            assert (row.a, row.b) not in shot_pairs
            assert len(set(shot_pairs)) == len(shot_pairs)
            assert set(shot_pairs) <= pairs
            assert all(z == TASKS[task](x, y) for x, y, z in parsed)


def test_same_seed_same_frame_other_seed_other_shots(tok, prompt_cfg):
    a = build_prompts(tok, "addition", prompt_cfg, seed=3)
    b = build_prompts(tok, "addition", prompt_cfg, seed=3)
    pd.testing.assert_frame_equal(a, b)
    c = build_prompts(tok, "addition", prompt_cfg, seed=4)
    # the queries are the same, the shots are not
    cols = ["a", "b", "answer", "template_id"]
    pd.testing.assert_frame_equal(a[cols], c[cols])
    shots = lambda df: df["prompt"].str.split(".\n").str[:-1].map(tuple)  # noqa: E731
    assert (shots(a) != shots(c)).sum() > len(a) // 2


def test_tasks_get_different_shots_for_the_same_seed(tok, prompt_cfg):
    # the task index is part of the RNG seed: addition and multiplication have the same pairs
    add = build_prompts(tok, "addition", prompt_cfg, seed=0)
    mul = build_prompts(tok, "multiplication", prompt_cfg, seed=0)
    strip = lambda s, w: s.replace(w, "OP")  # noqa: E731
    differs = [strip(p, "plus").split(".\n")[:-1] != strip(q, "times").split(".\n")[:-1]
               for p, q in zip(add["prompt"], mul["prompt"])]
    assert sum(differs) > 0


def test_build_prompts_gpt2_style_moves_space(gpt2_tok, prompt_cfg):
    df = build_prompts(gpt2_tok, "addition", prompt_cfg, seed=0)
    assert len(df) == 32
    for row in df.itertuples():
        assert not row.prompt.endswith(" ") and not row.cf_prompt.endswith(" ")
        assert row.answer_token == "Ġ" + str(row.answer)[0]
        assert row.prompt[row.a_start : row.a_end] == str(row.a)
        assert row.cf_prompt[row.cf_op_start : row.cf_op_end] == row.null_word


def test_build_prompts_too_many_shots_fails(tok, prompt_cfg):
    prompt_cfg["operands"] = {"min": 1, "max": 1}  # one pair: no other pair to use as a shot
    with pytest.raises(ValueError):
        build_prompts(tok, "addition", prompt_cfg, seed=0)


# ---------------------------------------------------------------------------------------------------
# select_samples


def _samples(n=10):
    """n samples of distinct operand pairs (a, b) = (i, 0), with their checked answers all correct."""
    df = pd.DataFrame({"sample_id": np.arange(n), "task": "addition", "a": np.arange(n), "b": 0,
                       "answer_token_id": np.arange(100, 100 + n)})
    checked = pd.DataFrame({"predicted_token_id": np.arange(100, 100 + n), "full_answer": [str(i) for i in range(n)],
                            "correct_first_token": True, "correct_full": True})
    return df, checked


def _splits(share=0.5, identification=100, validation=100):
    return {"validation_share": share, "max_samples": {"identification": identification, "validation": validation}}


def test_select_drops_wrong_answers_by_the_keep_rule():
    df, checked = _samples(6)
    checked.loc[[1, 4], "correct_full"] = False  # wrong in full, first token right
    checked.loc[[4], "correct_first_token"] = False
    kept, dropped = select_samples(df, checked, "full", _splits(), seed=0)
    assert kept["sample_id"].tolist() == [0, 2, 3, 5] and kept["correct"].all()
    assert dropped["sample_id"].tolist() == [1, 4] and (dropped["drop_reason"] == "wrong_answer").all()
    kept, dropped = select_samples(df, checked, "first_token", _splits(), seed=0)
    assert kept["sample_id"].tolist() == [0, 1, 2, 3, 5] and dropped["sample_id"].tolist() == [4]
    kept, dropped = select_samples(df, checked, False, _splits(), seed=0)
    assert len(kept) == 6 and kept["correct"].tolist() == [True, False, True, True, False, True]  # the full answer
    with pytest.raises(ValueError, match="keep_only_correct must be full, first_token or false"):
        select_samples(df, checked, True, _splits(), seed=0)


def test_splits_are_disjoint_operand_pairs_and_seeded():
    df = pd.DataFrame({"sample_id": np.arange(40), "task": "addition", "a": np.arange(40) % 10, "b": 1,
                       "answer_token_id": 0})  # 10 operand pairs, 4 templates each
    checked = pd.DataFrame({"predicted_token_id": np.zeros(40, int), "full_answer": "", "correct_first_token": True,
                            "correct_full": True})
    kept, _ = select_samples(df, checked, "full", _splits(0.3), seed=1)
    by_split = {s: set(g["a"]) for s, g in kept.groupby("split")}
    assert len(by_split["validation"]) == 3 and len(by_split["identification"]) == 7
    assert not by_split["validation"] & by_split["identification"]
    assert (kept.groupby("a")["split"].nunique() == 1).all()  # every template of a pair in the same split
    again, _ = select_samples(df, checked, "full", _splits(0.3), seed=1)
    pd.testing.assert_frame_equal(kept, again)
    other = {s: set(g["a"]) for s, g in select_samples(df, checked, "full", _splits(0.3), seed=2)[0].groupby("split")}
    assert other != by_split
    with pytest.raises(ValueError, match="leaves an empty split"):
        select_samples(df, checked, "full", _splits(0.01), seed=1)


def test_select_max_samples_per_split_is_seeded_and_recorded():
    df, checked = _samples(20)
    kept, dropped = select_samples(df, checked, "full", _splits(0.5, identification=3, validation=4), seed=5)
    assert kept["split"].value_counts().to_dict() == {"validation": 4, "identification": 3}
    assert kept["sample_id"].is_monotonic_increasing and dropped["sample_id"].is_monotonic_increasing
    assert set(dropped["drop_reason"]) == {"over_max_samples"} and len(dropped) == 13
    assert sorted([*dropped["sample_id"], *kept["sample_id"]]) == list(range(20))
    again, dropped_again = select_samples(df, checked, "full", _splits(0.5, identification=3, validation=4), seed=5)
    pd.testing.assert_frame_equal(kept, again)
    pd.testing.assert_frame_equal(dropped, dropped_again)


def test_split_pairs_errors_name_the_problem():
    from arithmech.data.arithmetic import split_pairs

    with pytest.raises(ValueError, match="predates splits"):
        split_pairs(pd.DataFrame({"a": [1]}), "validation", "p.parquet")
    with pytest.raises(ValueError, match="no validation pairs"):
        split_pairs(pd.DataFrame({"split": ["identification"]}), "validation", "p.parquet")


def test_counterfactual_shots_options(tok, prompt_cfg):
    rows = {}
    for option in ("keep", "blank", "zero_shot"):
        rows[option] = build_prompts(tok, "addition", prompt_cfg | {"counterfactual_shots": option}, seed=0).iloc[3]
    keep, blank, zero = rows["keep"], rows["blank"], rows["zero_shot"]
    assert keep["prompt"] == blank["prompt"] == zero["prompt"]  # the reference is the same
    query = keep["cf_prompt"][keep["cf_query_start"]:]
    assert blank["cf_prompt"].endswith(query) and zero["cf_prompt"] == query
    assert zero["cf_op_start"] == keep["cf_op_start"] - keep["cf_query_start"]
    shot_answers = [line.rsplit(" ", 1)[-1] for line in keep["cf_prompt"][: keep["cf_query_start"]].split(".\n")[:-1]]
    assert all(a.isdigit() for a in shot_answers)  # keep: the solved answers are there
    blank_lines = blank["cf_prompt"][: blank["cf_query_start"]].split(".\n")[:-1]
    assert len(blank_lines) == 2 and all(line.endswith("is equal to") or line.endswith("The answer is")
                                         for line in blank_lines)
    assert blank["cf_prompt"][blank["cf_op_start"]:blank["cf_op_end"]] == blank["null_word"]
    with pytest.raises(ValueError, match="counterfactual_shots"):
        build_prompts(tok, "addition", prompt_cfg | {"counterfactual_shots": "nope"}, seed=0)


# ---------------------------------------------------------------------------------------------------
# encode


def test_encode_left_pads_with_positions_from_first_real_token(tok):
    texts = ["1 plus 1 is equal to ", "What is 12 times 3? The answer is ", "7"]
    enc = encode(tok, texts)
    ids, mask, pos = enc["input_ids"], enc["attention_mask"], enc["position_ids"]
    assert ids.shape == mask.shape == pos.shape
    seq = ids.shape[1]
    for i, text in enumerate(texts):
        own = tok(text)["input_ids"]
        n = len(own)
        assert mask[i].tolist() == [0] * (seq - n) + [1] * n
        assert ids[i, seq - n :].tolist() == own
        assert (ids[i, : seq - n] == tok.pad_token_id).all()
        assert pos[i, seq - n :].tolist() == list(range(n))
        assert pos[i, seq - n].item() == 0
        assert ids[i, -1].item() == own[-1]  # END is each row's last real token
    assert mask[:, -1].all()
    assert max(len(tok(t)["input_ids"]) for t in texts) == seq


def test_encode_ignores_tokenizer_padding_side(tok):
    old = tok.padding_side
    try:
        tok.padding_side = "right"
        enc = encode(tok, ["1", "12 plus 3 is"])
        assert enc["attention_mask"][0, -1] == 1 and enc["attention_mask"][0, 0] == 0
    finally:
        tok.padding_side = old


def test_encode_device_and_dtype(tok):
    enc = encode(tok, ["3 minus 1"], device=torch.device("cpu"))
    assert all(v.dtype == torch.long and v.device.type == "cpu" for v in enc.values())


# ---------------------------------------------------------------------------------------------------
# other number formats and question sets (transfer targets)


@pytest.mark.parametrize("fmt", ["multi_digit", "decimal"])
@pytest.mark.parametrize("task", ["addition", "subtraction", "multiplication", "division"])
def test_format_prompts_are_exact_and_few_shot(prompt_cfg, task, fmt):
    from decimal import Decimal

    from arithmech.data.arithmetic import format_prompts

    ranges = {"multi_digit": {"min": 10, "max": 99}, "decimal": {"min": 0.1, "max": 9.9}}
    df = format_prompts(task, fmt, ranges[fmt], prompt_cfg, n=30, seed=0)
    assert len(df) == 30
    ops = {"addition": "__add__", "subtraction": "__sub__", "multiplication": "__mul__", "division": "__truediv__"}
    for row in df.itertuples():
        a, b = Decimal(row.a), Decimal(row.b)
        assert getattr(a, ops[task])(b) == Decimal(row.answer) and float(row.answer) == row.gold
        assert row.prompt.endswith(prompt_cfg["templates"][row.template_id].format(a=row.a, op=row.operator, b=row.b))
        assert row.prompt.count(prompt_cfg["shot_separator"]) == prompt_cfg["n_shots"]
        if task == "subtraction":
            assert row.gold >= 0
        if fmt == "multi_digit" and task != "division":
            assert 10 <= a <= 99 and 10 <= b <= 99
    if fmt == "decimal":
        assert any("." in a for a in df["a"])
    assert df.equals(format_prompts(task, fmt, ranges[fmt], prompt_cfg, n=30, seed=0))


def test_question_prompts_draw_other_items_as_shots():
    from arithmech.data.formatting import question_prompts

    qs, ans = [f"q{i}?" for i in range(6)], [str(10 * i) for i in range(6)]
    prompts = question_prompts(qs, ans, 2, seed=0)
    for i, p in enumerate(prompts):
        assert p.endswith(f"Question: q{i}?\nAnswer:") and p.count("Question:") == 3
        assert f"q{i}?" not in p[: -len(f"Question: q{i}?\nAnswer:")]  # never its own answer
    assert question_prompts(qs, ans, 2, seed=0, items=[3]) != []
    assert len(question_prompts(qs, ans, 2, 0, items=[1, 4])) == 2
    qa = question_prompts(qs, ans, 1, seed=1, items=[0], question_prefix="", answer_prefix="", separator="\n")
    assert qa[0].endswith("\nq0?") and qa[0].count("\n") == 1
    with pytest.raises(ValueError, match="n_shots"):
        question_prompts(qs[:2], ans[:2], 2, seed=0)
