"""Reading a model's answers, torch-free: the first number of a greedy answer and whether it is the gold
one, when a growing answer's score is decided, the final answer of a generated math solution (and the
sentence a solution ends with, `answer_sentence`), and short text answers (BIG-bench qa_wikidata) against
their targets."""

from __future__ import annotations

import math
import re
import string
from typing import Callable, Sequence

# Two numbers are the same answer when they agree to this, relatively or absolutely (`same_number`): golds
# are integers or short decimals, so it only absorbs float rounding.
ANSWER_TOLERANCE = 1e-9

# ---------------------------------------------------------------------------------------------------
# Reading numbers

# An optional sign (ASCII hyphen or Unicode minus) before or after an optional dollar sign, then either a
# thousands-grouped integer ("1,000"), a plain integer, with an optional decimal part, or a bare decimal
# (".5"). The look-behind keeps the match from starting inside a word or another number ("x2", "1.5.").
_NUMBER = re.compile(
    r"(?<![\w.,])(?P<s1>[-\u2212]?)\$?(?P<s2>[-\u2212]?)"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
)


def extract_number(text: str) -> float | None:
    """The first number in `text`, or None: '-3' -> -3.0, '1,000' -> 1000.0, '$18.50' -> 18.5,
    'The answer is 7.' -> 7.0 (a sentence's full stop is not a decimal point), '2.25' -> 2.25."""
    return _number_value(_NUMBER.search(text))


def _number_value(match: re.Match | None) -> float | None:
    if match is None:
        return None
    value = float(match["num"].replace(",", ""))
    return -value if (match["s1"] or match["s2"]) else value


def number_settled(text: str) -> bool:
    """Whether `extract_number` (and so `answer_correct`) can no longer change, whatever text is appended:
    the first number is followed by a character that cannot continue it (not a digit, not an undecoded
    partial character), or by "." or "," and then such a character ("8.\n" is settled, "8." is not: "8.5").
    A greedy answer can stop there (`settled_number`).

    Exact because a number continues only through a digit, "." + digit or "," + digits, so no match can
    span those characters: the first match cannot grow, and one that starts earlier would have had to end
    before them, inside `text`, where it would already have been found."""
    match = _NUMBER.search(text)
    if match is None:
        return False

    def stops(char: str) -> bool:
        return not (char.isdigit() or char == "\ufffd")

    after = text[match.end() : match.end() + 2]
    if not after:
        return False
    if after[0] in ".,":
        return len(after) == 2 and stops(after[1])
    return stops(after[0])


def answer_decided(text: str, gold: float | int | str) -> bool:
    """Whether `answer_correct(text + suffix, gold)` is the same for every suffix: the first number is
    settled (`number_settled`), or it can no longer become `gold`. A greedy answer can stop there
    (`decided_answers`), as its score is known.

    "Can no longer become gold" is decided only where it is simple to prove: the first number so far is
    ASCII digits D alone (no sign, no "," or "." in it). Whatever follows, the final first number then
    starts at the same place with all of D (the regex takes a digit run whole; a thousands group only
    adds digits after it), so its integer part I, commas dropped, starts with D, and its value lies in
    [I, I + 1). It can equal gold to `same_number`'s tolerance (under 0.2 for |gold| < 1e8) only if
    |gold| - 1 - tol <= I <= |gold| + tol: for gold 9, I is 8 ("8.9999999999") or 9. So when D without
    its leading zeros begins none of those integers, the answer is wrong whatever follows. Anything else
    (no number yet, a sign, a decimal point, a grouped number, a gold that is not a number) counts as not
    yet decided, which only costs decoding steps."""
    if number_settled(text):
        return True
    match = _NUMBER.search(text)
    gold_value = extract_number(gold) if isinstance(gold, str) else float(gold)
    # past 1e8 the relative tolerance of `same_number` could span more than one integer
    if match is None or gold_value is None or not abs(gold_value) < 1e8:
        return False
    digits = match["num"]
    if match["s1"] or match["s2"] or not (digits.isascii() and digits.isdigit()):
        return False
    lead, gold_abs = digits.lstrip("0"), abs(gold_value)
    # more than `same_number`'s tolerance, for any value below |gold| + 1
    tol = ANSWER_TOLERANCE * (gold_abs + 2) + ANSWER_TOLERANCE
    wholes = range(max(0, math.ceil(gold_abs - 1 - tol)), math.floor(gold_abs + tol) + 1)
    return not any(str(i).startswith(lead) for i in wholes)


def settled_number(tokenizer) -> Callable[[int, list[int]], bool]:
    """`number_settled` on generated token ids (decoded without special tokens), for `settled=` of
    `ablation.greedy_end_sets` (which calls it with the row's text index, unused here, and its tokens)."""
    return lambda _, ids: number_settled(tokenizer.decode(ids, skip_special_tokens=True))


def decided_answers(tokenizer, golds: Sequence) -> Callable[[int, list[int]], bool]:
    """`answer_decided` on generated token ids (decoded without special tokens) against golds[i], for
    `settled=` of `ablation.greedy_end_sets` (i: the index of the row's text): a row stops as soon as its
    score is known, right or wrong."""
    golds = list(golds)
    return lambda i, ids: answer_decided(tokenizer.decode(ids, skip_special_tokens=True), golds[i])


def same_number(value: float, gold: float) -> bool:
    """Whether two numbers are the same answer: equal to ANSWER_TOLERANCE, relative or absolute."""
    return math.isclose(value, gold, rel_tol=ANSWER_TOLERANCE, abs_tol=ANSWER_TOLERANCE)


def answer_correct(text: str, gold: float | int | str) -> bool:
    """Whether the first number in `text` equals `gold` (a number or a numeric string; `same_number`)."""
    value = extract_number(text)
    gold_value = extract_number(gold) if isinstance(gold, str) else float(gold)
    if value is None or gold_value is None:
        return False
    return same_number(value, gold_value)


def answer_tokens(tokenizer, answers) -> int:
    """Greedy steps that read every answer in full: the longest answer's tokens (after the prompt's trailing
    space) plus one, so that "1" followed by "2" is read as 12, not 1."""
    return 1 + max(len(tokenizer(" " + str(a), add_special_tokens=False)["input_ids"]) for a in answers)


def full_answer_accuracy(texts: list[str], golds) -> float:
    """Share of generated texts whose first number is the gold answer."""
    texts, golds = list(texts), list(golds)
    if len(texts) != len(golds):
        raise ValueError(f"{len(texts)} texts but {len(golds)} gold answers")
    return sum(answer_correct(t, g) for t, g in zip(texts, golds)) / len(texts) if texts else float("nan")


# ---------------------------------------------------------------------------------------------------
# Math word problems (GSM8K, SVAMP): generated solutions

# A plain few-shot prompt is "...Question: q\nAnswer:"; a model that has answered goes on with the next
# question, which is where its answer ends.
MATH_STOP_STRINGS = ("\nQuestion:",)
_FINAL_MARK = re.compile(r"####")
_ANSWER_MARK = re.compile(r"answer\s*(?:is\b|:)", re.IGNORECASE)


def answer_sentence(answer) -> str:
    """The sentence a math solution ends with, which fine-tuning teaches (GSM8K's solutions end with it,
    `datasets.gsm8k_solution`) and `extract_answer` reads back: answer_sentence(8) == "The answer is 8."."""
    return f"The answer is {answer}."


def cut_at(text: str, stop_strings: Sequence[str]) -> str:
    """`text` up to the first stop string (exclusive)."""
    cut = min((i for i in (text.find(s) for s in stop_strings) if i >= 0), default=len(text))
    return text[:cut]


def extract_answer(text: str) -> float | None:
    """The final answer of a generated math solution, or None when it has no number.

    The text is first cut where a next few-shot block starts ("\\nQuestion:"). Then the number on the line
    after the last "####" wins, else the one after the last "The answer is" / "answer is" / "Answer:", else
    the last number in the text. Numbers are read as in `extract_number`: "1,000.5", "$18.50", "-3" or
    "\u22123", and a sentence's full stop or a trailing unit ("12 apples") is not part of them."""
    text = cut_at(text, MATH_STOP_STRINGS)
    for mark in (_FINAL_MARK, _ANSWER_MARK):
        for match in reversed(list(mark.finditer(text))):
            value = extract_number(text[match.end() :].split("\n", 1)[0])
            if value is not None:
                return value
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return _number_value(last)


# ---------------------------------------------------------------------------------------------------
# Short generated answers (BIG-bench qa_wikidata)

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """First line, lower case, without punctuation and articles (a, an, the), single spaces."""
    text = text.strip(" ").split("\n", 1)[0].lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def qa_correct(output: str, targets: Sequence[str]) -> bool:
    """Whether the normalised output equals a normalised target or starts with it as whole words
    ("comedy film" matches "comedy", "comedyfilm" does not)."""
    out = normalize_answer(output)
    for target in map(normalize_answer, targets):
        if target and (out == target or out.startswith(target + " ")):
            return True
    return False
