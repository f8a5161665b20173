"""The fast paths of the slow rules against slow, obviously correct references on the tiny model: each fast path
must give the reference's results (the same tokens, the same scores), only sooner."""

import numpy as np
import torch

from arithmech.data.answers import answer_tokens
from arithmech.data.arithmetic import build_prompts
from arithmech.intervention.generation import check_answers, greedy_generate, longest_first


def test_longest_first_sorts_by_token_count_and_keeps_ties_in_order(tiny_lm):
    texts = ["1 plus 1", "What is 1 plus 1? The answer is", "2 plus 2", "What is 2 plus 2? The answer is"]
    lengths = [len(ids) for ids in tiny_lm.tokenizer(texts)["input_ids"]]
    assert lengths[1] > lengths[0] and lengths[0] == lengths[2] and lengths[1] == lengths[3]
    assert longest_first(tiny_lm, texts).tolist() == [1, 3, 0, 2]
    assert longest_first(tiny_lm, []).tolist() == []


def test_check_answers_longest_first_matches_one_prompt_at_a_time(tiny_lm, base_prompt_cfg):
    """build_pairs' answer check runs prompts longest first (less padding); every row's answer is the one greedy
    decoding gives that prompt alone, in the caller's order."""
    pairs = build_prompts(tiny_lm.tokenizer, "addition", base_prompt_cfg, seed=0).iloc[:24]
    texts, answers = list(pairs["prompt"]), list(pairs["answer"])
    lengths = np.array([len(ids) for ids in tiny_lm.tokenizer(texts)["input_ids"]])
    assert len(set(lengths)) > 1 and (np.diff(lengths) > 0).any()  # mixed templates: the order changes
    got = check_answers(tiny_lm, texts, answers, pairs["answer_token_id"], batch_size=5)
    n_new = answer_tokens(tiny_lm.tokenizer, answers)
    alone = torch.cat([greedy_generate(tiny_lm, [t], n_new, 1) for t in texts])
    assert got["full_answer"].tolist() == tiny_lm.tokenizer.batch_decode(alone, skip_special_tokens=True)
    assert got["predicted_token_id"].tolist() == alone[:, 0].tolist()
    assert got["correct_first_token"].tolist() == (alone[:, 0].numpy() == pairs["answer_token_id"].to_numpy()).tolist()
