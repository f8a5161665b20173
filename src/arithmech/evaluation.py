"""Scoring a model's answers: the first answer token (what path patching and the knockout curves measure)
and the full greedy answer (what a user sees), with or without hooks such as a mean ablation active; and the
benchmarks that check a fine-tuned model (`arithmech.data`): generated math solutions (GSM8K, SVAMP),
multiple choice by log-likelihood and short generated answers (BIG-bench), perplexity (WikiText-2), with
Wilson intervals for accuracies.

`hooks` everywhere is `decoding.Hooks`: None, or hooks(rows) -> the context manager entered around each
forward, rows (LongTensor) the indices in `texts` of the forward's rows; hooks acting on every row alike
ignore them (`lambda rows: ablation.mean_ablate(...)`), per-row ones select with them
(`ablation.ablation_hooks`). Batches are left-padded (`prompts.encode`), so END, the position that predicts
the next token, is index -1.
"""

from __future__ import annotations

import math
import re
import string
import sys
from statistics import NormalDist
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from .decoding import Hooks, entered, greedy_decode
from .formatting import choice_prompt
from .models import LoadedModel
from .kvcache import repeated_cache
from .prompts import continuation_ids, encode

def _batches(n: int, batch_size: int) -> Iterator[tuple[int, int]]:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for start in range(0, n, batch_size):
        yield start, min(n, start + batch_size)


def _length_batches(lengths: Sequence[int], batch_size: int, min_fill: float = 0.75) -> list[tuple[int, int]]:
    """(start, stop) batches over rows sorted longest first: at most `batch_size` rows, and a new batch
    starts at a row shorter than `min_fill` of its batch's longest, so padding stays under a quarter of a
    batch (GSM8K solutions of 60 to 370 tokens otherwise pad to nearly twice their tokens). Rows of similar
    lengths (few-shot arithmetic items) get the batches of `_batches`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if any(b > a for a, b in zip(lengths, lengths[1:])):
        raise ValueError("_length_batches needs lengths sorted longest first")
    batches, start = [], 0
    for row in range(1, len(lengths) + 1):
        if row == len(lengths) or row - start == batch_size or lengths[row] < min_fill * lengths[start]:
            batches.append((start, row))
            start = row
    return batches


@torch.no_grad()
def first_token_logits(lm: LoadedModel, texts: list[str], batch_size: int, hooks: Hooks = None) -> Iterator:
    """Yield (start, stop, logits [rows, vocab] float32 on the model's device) at END, batch by batch."""
    texts = list(texts)
    for start, stop in _batches(len(texts), batch_size):
        enc = encode(lm.tokenizer, texts[start:stop], lm.device)
        with entered(hooks, torch.arange(start, stop)):
            logits = lm.model(**enc, logits_to_keep=1).logits[:, -1].float()
        yield start, stop, logits


def first_token_predictions(
    lm: LoadedModel, texts: list[str], batch_size: int, hooks: Hooks = None
) -> torch.Tensor:
    """Greedy first answer token for every text: [n] token ids (CPU)."""
    out = [logits.argmax(-1).cpu() for _, _, logits in first_token_logits(lm, texts, batch_size, hooks)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def first_token_scores(
    lm: LoadedModel, texts: list[str], answer_ids: torch.Tensor, batch_size: int, hooks: Hooks = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(predicted ids [n], answer logits [n], answer log-probabilities [n]), all on the CPU."""
    answer_ids = torch.as_tensor(answer_ids)
    pred, lo, lp = [], [], []
    for start, stop, logits in first_token_logits(lm, texts, batch_size, hooks):
        idx = answer_ids[start:stop].to(logits.device)[:, None]
        pred.append(logits.argmax(-1).cpu())
        lo.append(logits.gather(1, idx)[:, 0].cpu())
        lp.append(logits.log_softmax(-1).gather(1, idx)[:, 0].cpu())
    return torch.cat(pred), torch.cat(lo), torch.cat(lp)


def first_token_accuracy(
    lm: LoadedModel, texts: list[str], answer_ids: torch.Tensor, batch_size: int, hooks: Hooks = None
) -> float:
    """Share of texts whose greedy next token is the answer's first token."""
    pred = first_token_predictions(lm, texts, batch_size, hooks)
    return float((pred == torch.as_tensor(answer_ids)).float().mean()) if len(pred) else float("nan")


# ---------------------------------------------------------------------------------------------------
# Greedy generation


def shared_prefix_length(ids: Sequence[Sequence[int]]) -> int:
    """The number of leading token ids that all rows share, leaving every row at least one id of its own
    (the END that predicts what follows)."""
    length = min(len(row) for row in ids) - 1
    first = ids[0]
    for row in ids[1:]:
        common = 0
        while common < length and row[common] == first[common]:
            common += 1
        length = common
    return length


class SharedPrefix:
    """The longest token prefix that all texts share, run once, and batches that continue from its cache.

    `of` tokenizes every text (as `prompts.encode` does) and finds the common prefix of the token ids, so a
    prefix never ends inside a token of one text's own tokenization; it keeps at least one token per text
    to run (the END that predicts the first new token). `batch(rows)` returns `decoding.greedy_decode`
    inputs: input_ids [rows, longest rest] (each row's own tokens, left-padded), attention_mask
    [rows, prefix + longest rest] and past_key_values, a fresh copy of the prefix cache repeated over the
    rows (decoding extends it)."""

    MIN_TOKENS = 8  # a shorter shared prefix is not worth a separate forward

    def __init__(self, lm: LoadedModel, ids: list[list[int]], length: int):
        self.lm, self.ids, self.length = lm, ids, length
        self.tokens = torch.tensor(ids[0][:length], dtype=torch.long, device=lm.device)  # [prefix]
        with torch.no_grad():
            self.cache = lm.model(input_ids=self.tokens[None], use_cache=True, logits_to_keep=1).past_key_values

    @classmethod
    def of(cls, lm: LoadedModel, texts: Sequence[str]) -> SharedPrefix | None:
        """The shared prefix of `texts`, or None when it is shorter than MIN_TOKENS."""
        if not texts:
            return None
        ids = lm.tokenizer(list(texts))["input_ids"]
        length = shared_prefix_length(ids)
        return cls(lm, ids, length) if length >= cls.MIN_TOKENS else None

    def batch(self, rows: Sequence[int], new_tokens: int = 0) -> dict:
        """Decoding inputs for `rows`, the cache with room for their own tokens and `new_tokens` more."""
        rests = _pad_left([self.ids[i][self.length :] for i in rows], self.lm.tokenizer.pad_token_id, self.lm.device)
        n, width = rests["input_ids"].shape
        return {
            "input_ids": rests["input_ids"],
            "attention_mask": torch.cat([torch.ones_like(self.tokens)[None].expand(n, -1), rests["attention_mask"]], 1),
            "past_key_values": repeated_cache(self.cache, n, room=width + new_tokens),
        }


@torch.no_grad()
def greedy_generate(
    lm: LoadedModel,
    texts: list[str],
    max_new_tokens: int,
    batch_size: int,
    hooks: Hooks = None,
    return_logits: bool = False,
    stop_strings: Sequence[str] | None = None,
    progress: str | None = None,
    share_prefix: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Greedy continuation token ids [n, max_new_tokens] (CPU); after a row's end-of-sequence token, and
    for rows that stop early, the pad token id. With `return_logits`, also the raw next-token logits of
    every step, [n, max_new_tokens, vocab] float32 (NaN for steps a row did not run because it had ended);
    mind the size with a large vocabulary.

    `decoding.greedy_decode` on left-padded batches of `batch_size` texts: the prompt is one forward (its
    END is the last position) and each later step a forward over the one new token, so hooks that act on
    the last position of every forward (`ablation.mean_ablate(positions="end")`) act on the prompt's END
    and then on every generated position, exactly once each. `hooks` get row indices into `texts`.

    `stop_strings`: a row also ends once its decoded continuation contains one of them (the tokens that
    complete the string are kept; the pad token id follows).
    `progress`: a tqdm progress bar over the batches (to stderr) with this description; None for none.

    `share_prefix`: run the token prefix that all texts share (few-shot examples, a chat system turn) once
    and start every batch from a copy of its KV cache; each row's own tokens follow it, left-padded
    between prefix and row (positions come from the attention mask, so a row's positions are those of its
    unpadded sequence). The same computation as without it, up to floating-point rounding (tested). Only
    without hooks: a hook on "the last position of every forward" would also act on the prefix's end."""
    if share_prefix and hooks is not None:
        raise ValueError("greedy_generate: share_prefix needs hooks=None (hooks would act on the prefix)")
    tok = lm.tokenizer
    stop = None
    if stop_strings:
        stop_strings = list(stop_strings)
        stop = lambda _, row: any(s in tok.decode(row, skip_special_tokens=True) for s in stop_strings)  # noqa: E731
    texts = list(texts)
    out = torch.full((len(texts), max_new_tokens), tok.pad_token_id, dtype=torch.long)
    all_logits = None
    if return_logits:
        all_logits = torch.full((len(texts), max_new_tokens, lm.unembed.weight.shape[0]), float("nan"))

        def keep_logits(step, rows, logits):
            all_logits[rows, step] = logits.cpu()

    prefix = SharedPrefix.of(lm, texts) if share_prefix else None
    for start, stop_row in tqdm(list(_batches(len(texts), batch_size)), desc=progress, disable=progress is None,
                                file=sys.stderr):
        if prefix is None:
            enc = encode(tok, texts[start:stop_row], lm.device)
        else:
            enc = prefix.batch(range(start, stop_row), new_tokens=max_new_tokens - 1)  # the last token is not run
        out[start:stop_row] = greedy_decode(
            lm, **enc, max_new_tokens=max_new_tokens, hooks=hooks, row_ids=torch.arange(start, stop_row),
            stop=stop, on_logits=keep_logits if return_logits else None,
        )
    return (out, all_logits) if return_logits else out


def greedy_answers(
    lm: LoadedModel, texts: list[str], max_new_tokens: int, batch_size: int, hooks: Hooks = None
) -> list[str]:
    """Decoded greedy continuations (special tokens dropped), one per text. See `greedy_generate`."""
    ids = greedy_generate(lm, texts, max_new_tokens, batch_size, hooks)
    return lm.tokenizer.batch_decode(ids, skip_special_tokens=True)


def answer_tokens(tokenizer, answers) -> int:
    """Greedy steps that read every answer in full: the longest answer's tokens (after the prompt's trailing
    space) plus one, so that "1" followed by "2" is read as 12, not 1."""
    return 1 + max(len(tokenizer(" " + str(a), add_special_tokens=False)["input_ids"]) for a in answers)


def check_answers(lm: LoadedModel, texts: list[str], answers, answer_token_ids, batch_size: int,
                  desc: str | None = None) -> pd.DataFrame:
    """The model's greedy answer to each arithmetic prompt, read two ways: its first token against the
    answer's first token (what path patching measures) and the whole greedy answer against the number
    (`answer_correct`). One row per text: predicted_token_id, full_answer (the decoded greedy tokens),
    correct_first_token, correct_full."""
    answers = list(answers)
    tokens = greedy_generate(lm, texts, answer_tokens(lm.tokenizer, answers), batch_size, progress=desc)
    full = lm.tokenizer.batch_decode(tokens, skip_special_tokens=True)
    first = tokens[:, 0].numpy()
    return pd.DataFrame({
        "predicted_token_id": first,
        "full_answer": full,
        "correct_first_token": first == np.asarray(list(answer_token_ids)),
        "correct_full": [answer_correct(t, a) for t, a in zip(full, answers)],
    })


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
    [I, I + 1). It can equal gold to `answer_correct`'s tolerance (under 0.2 for |gold| < 1e8) only if
    |gold| - 1 - tol <= I <= |gold| + tol: for gold 9, I is 8 ("8.9999999999") or 9. So when D without
    its leading zeros begins none of those integers, the answer is wrong whatever follows. Anything else
    (no number yet, a sign, a decimal point, a grouped number, a gold that is not a number) counts as not
    yet decided, which only costs decoding steps."""
    if number_settled(text):
        return True
    match = _NUMBER.search(text)
    gold_value = extract_number(gold) if isinstance(gold, str) else float(gold)
    # past 1e8 the relative tolerance of `answer_correct` could span more than one integer
    if match is None or gold_value is None or not abs(gold_value) < 1e8:
        return False
    digits = match["num"]
    if match["s1"] or match["s2"] or not (digits.isascii() and digits.isdigit()):
        return False
    lead, gold_abs = digits.lstrip("0"), abs(gold_value)
    tol = 1e-9 * (gold_abs + 2) + 1e-9  # more than answer_correct's, for any value below |gold| + 1
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


def answer_correct(text: str, gold: float | int | str, rel_tol: float = 1e-9, abs_tol: float = 1e-9) -> bool:
    """Whether the first number in `text` equals `gold` (a number or a numeric string)."""
    value = extract_number(text)
    gold_value = extract_number(gold) if isinstance(gold, str) else float(gold)
    if value is None or gold_value is None:
        return False
    return math.isclose(value, gold_value, rel_tol=rel_tol, abs_tol=abs_tol)


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


def _cut_at(text: str, stop_strings: Sequence[str]) -> str:
    """`text` up to the first stop string (exclusive)."""
    cut = min((i for i in (text.find(s) for s in stop_strings) if i >= 0), default=len(text))
    return text[:cut]


def extract_answer(text: str) -> float | None:
    """The final answer of a generated math solution, or None when it has no number.

    The text is first cut where a next few-shot block starts ("\\nQuestion:"). Then the number on the line
    after the last "####" wins, else the one after the last "The answer is" / "answer is" / "Answer:", else
    the last number in the text. Numbers are read as in `extract_number`: "1,000.5", "$18.50", "-3" or
    "\u22123", and a sentence's full stop or a trailing unit ("12 apples") is not part of them."""
    text = _cut_at(text, MATH_STOP_STRINGS)
    for mark in (_FINAL_MARK, _ANSWER_MARK):
        for match in reversed(list(mark.finditer(text))):
            value = extract_number(text[match.end() :].split("\n", 1)[0])
            if value is not None:
                return value
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return _number_value(last)


def _require_columns(frame: pd.DataFrame, columns: Sequence[str], where: str) -> None:
    missing = [c for c in columns if c not in frame]
    if missing:
        raise ValueError(f"{where}: the frame lacks column(s) {missing}; it has {list(frame.columns)}")


def generate_texts(
    lm: LoadedModel,
    prompts: Sequence[str],
    max_new_tokens: int,
    batch_size: int,
    hooks: Hooks = None,
    stop_strings: Sequence[str] = (),
    progress: str | None = "generate",
    share_prefix: bool = True,
) -> list[str]:
    """Greedy continuations of `prompts` (decoded, special tokens dropped, cut before the first stop string),
    in the order of `prompts`. Without hooks, the prompts' shared token prefix (few-shot examples) runs once
    (`greedy_generate(share_prefix=True)`); `share_prefix=False` runs every prompt whole.

    Prompts are generated longest first, so each batch holds prompts of similar length (little padding) and
    an out-of-memory error shows in the first batch. `hooks` get row indices into `prompts`."""
    prompts = list(prompts)
    lengths = np.array([len(ids) for ids in lm.tokenizer(prompts)["input_ids"]]) if prompts else np.zeros(0)
    order = np.argsort(-lengths, kind="stable")
    ordered = [prompts[i] for i in order]
    if hooks is not None:  # the decoder numbers rows as `ordered`
        order_t, given = torch.as_tensor(order, dtype=torch.long), hooks
        hooks = lambda rows: given(order_t[rows])  # noqa: E731
    ids = greedy_generate(
        lm, ordered, max_new_tokens, batch_size, hooks, stop_strings=stop_strings, progress=progress,
        share_prefix=share_prefix and hooks is None,
    )
    texts = lm.tokenizer.batch_decode(ids, skip_special_tokens=True)
    out = [""] * len(prompts)
    for position, row in enumerate(order):
        out[row] = _cut_at(texts[position], stop_strings)
    return out


def evaluate_generation(
    lm: LoadedModel,
    frame: pd.DataFrame,
    max_new_tokens: int,
    batch_size: int,
    hooks: Hooks = None,
    stop_strings: Sequence[str] = MATH_STOP_STRINGS,
    progress: str | None = "generate",
    share_prefix: bool = True,
) -> pd.DataFrame:
    """Generated math solutions, scored by their final answer (prompts' shared prefix: `generate_texts`).

    `frame`: columns id, prompt (e.g. from `formatting.math_prompts`), gold (a number). Returns one row per input
    row, in the input order: id, prompt, output (the greedy continuation, cut before the first stop
    string), extracted (`extract_answer(output)`, NaN when none), gold, correct (extracted == gold)."""
    _require_columns(frame, ["id", "prompt", "gold"], "evaluate_generation")
    outputs = generate_texts(lm, frame["prompt"], max_new_tokens, batch_size, hooks, stop_strings, progress,
                             share_prefix)
    extracted = [extract_answer(text) for text in outputs]
    gold = frame["gold"].astype(float).to_numpy()
    correct = [v is not None and math.isclose(v, g, rel_tol=1e-9, abs_tol=1e-6) for v, g in zip(extracted, gold)]
    return pd.DataFrame(
        {
            "id": frame["id"].astype(str).to_numpy(),
            "prompt": frame["prompt"].to_numpy(),
            "output": outputs,
            "extracted": [np.nan if v is None else v for v in extracted],
            "gold": gold,
            "correct": np.array(correct, dtype=bool),
        }
    )


# ---------------------------------------------------------------------------------------------------
# Multiple choice by log-likelihood (BIG-bench social_iqa, strategyqa)


def _pad_left(seqs: list[list[int]], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Left-padded batch like `prompts.encode`: input_ids, attention_mask, position_ids [batch, seq]."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[row, width - len(seq) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": positions.to(device)}


@torch.no_grad()
def _choice_scores(
    lm: LoadedModel,
    contexts: Sequence[str],
    choices_per_item: Sequence[Sequence[str]],
    batch_size: int,
    progress: str | None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(summed log-likelihood, number of tokens) of every choice, per item: two lists of [n_choices] arrays.

    Each batch of `batch_size` items reads its contexts once (left-padded, with a cache; the last position
    predicts every choice's first token), then every choice's remaining tokens continue from a copy of its
    own item's cache (right-padded after it, at the positions they have in context + choice alone)."""
    contexts, choices_per_item = list(contexts), [list(c) for c in choices_per_item]
    if len(contexts) != len(choices_per_item):
        raise ValueError(f"{len(contexts)} contexts but {len(choices_per_item)} lists of choices")
    ctx_ids, cont_ids = [], []  # per item: the context's ids, and each choice's ids
    for item, (context, choices) in enumerate(zip(contexts, choices_per_item)):
        if not choices:
            raise ValueError(f"item {item}: no choices")
        conts = []
        for choice in choices:
            ctx, cont = continuation_ids(lm.tokenizer, context, choice)  # ctx is the context's own ids
            if not ctx or not cont:
                raise ValueError(
                    f"item {item}: the context {context[-40:]!r} or the choice {choice!r} has no tokens; both "
                    "need at least one (the first choice token is predicted from the context's last token)"
                )
            conts.append(cont)
        ctx_ids.append(ctx)
        cont_ids.append(conts)
    # Longest first: batches of similar lengths, and memory trouble shows at once.
    order = sorted(range(len(contexts)), key=lambda i: -len(ctx_ids[i]))
    sums = [np.zeros(len(c)) for c in cont_ids]
    pad = lm.tokenizer.pad_token_id
    batches = _length_batches([len(ctx_ids[i]) for i in order], batch_size)
    for start, stop in tqdm(batches, desc=progress, disable=progress is None, file=sys.stderr):
        items = order[start:stop]
        enc = _pad_left([ctx_ids[i] for i in items], pad, lm.device)
        out = lm.model(**enc, use_cache=True, logits_to_keep=1)
        first = out.logits[:, -1].float().log_softmax(-1).cpu().double()  # [items, vocab]
        # one row per (item, choice) with tokens after its first: they continue from the item's cache
        rows = [(k, c) for k, i in enumerate(items) for c, cont in enumerate(cont_ids[i]) if len(cont) > 1]
        for k, i in enumerate(items):
            sums[i] += [float(first[k, cont[0]]) for cont in cont_ids[i]]
        if not rows:
            continue
        owner = torch.tensor([k for k, _ in rows], device=lm.device)
        tails = [cont_ids[items[k]][c] for k, c in rows]  # input: all but the last token; each predicts the next
        width = max(len(t) for t in tails) - 1
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        tail_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, tail in enumerate(tails):
            ids[r, : len(tail) - 1] = torch.tensor(tail[:-1])
            tail_mask[r, : len(tail) - 1] = 1
        cache = out.past_key_values
        cache.reorder_cache(owner)
        ctx_len = enc["attention_mask"].sum(-1)[owner]  # [rows] real context tokens
        logp = lm.model(
            input_ids=ids.to(lm.device),
            attention_mask=torch.cat([enc["attention_mask"][owner], tail_mask.to(lm.device)], dim=1),
            position_ids=ctx_len[:, None] + torch.arange(width, device=lm.device),
            past_key_values=cache,
        ).logits.float().log_softmax(-1)  # [rows, width, vocab]
        for r, ((k, c), tail) in enumerate(zip(rows, tails)):
            target = torch.tensor(tail[1:], device=logp.device)
            sums[items[k]][c] += float(logp[r, : len(tail) - 1].gather(-1, target[:, None]).double().sum())
    counts = [np.array([len(c) for c in conts]) for conts in cont_ids]
    return sums, counts


def choice_loglik(
    lm: LoadedModel,
    contexts: Sequence[str],
    choices_per_item: Sequence[Sequence[str]],
    batch_size: int,
    progress: str | None = None,
) -> list[np.ndarray]:
    """Summed log-likelihood of each choice given its context: one [n_choices] float64 array per item.

    Each choice is scored as the sequence context ids + choice ids (see `prompts.continuation_ids`); only the
    choice tokens are scored, and each context is read once for all its choices (`batch_size` items per
    forward). A choice usually starts with the space that separates it from the context (" Yes")."""
    return _choice_scores(lm, contexts, choices_per_item, batch_size, progress)[0]


def evaluate_choice(
    lm: LoadedModel, frame: pd.DataFrame, batch_size: int, progress: str | None = "choice"
) -> pd.DataFrame:
    """Multiple-choice accuracy by log-likelihood.

    `frame`: columns id, input, choices (list of str), correct (index), as `data.load_bigbench_choice`
    gives, and optionally prompt (the context; by default `formatting.choice_prompt(input)`). Each choice is
    scored as the continuation " " + choice. Returns one row per item: id, prediction (the choice with the
    highest summed log-likelihood; the first on a tie), correct_index, correct (bool; the main accuracy),
    n_choices, loglik (the summed scores), and prediction_norm / correct_norm, the same by the mean
    log-likelihood per choice token (length-normalised; an extra, secondary view)."""
    _require_columns(frame, ["id", "input", "choices", "correct"], "evaluate_choice")
    contexts = frame["prompt"].tolist() if "prompt" in frame else [choice_prompt(t) for t in frame["input"]]
    choices = [[" " + c for c in item] for item in frame["choices"]]
    sums, counts = _choice_scores(lm, contexts, choices, batch_size, progress)
    prediction = np.array([int(np.argmax(s)) for s in sums])
    prediction_norm = np.array([int(np.argmax(s / n)) for s, n in zip(sums, counts)])
    gold = frame["correct"].astype(int).to_numpy()
    return pd.DataFrame(
        {
            "id": frame["id"].astype(str).to_numpy(),
            "prediction": prediction,
            "correct_index": gold,
            "correct": prediction == gold,
            "n_choices": [len(c) for c in choices],
            "loglik": [s.tolist() for s in sums],
            "prediction_norm": prediction_norm,
            "correct_norm": prediction_norm == gold,
        }
    )


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


def evaluate_qa_generation(
    lm: LoadedModel,
    frame: pd.DataFrame,
    max_new_tokens: int,
    batch_size: int,
    hooks: Hooks = None,
    progress: str | None = "qa",
) -> pd.DataFrame:
    """Short answers generated greedily up to the first newline, scored by `qa_correct`.

    `frame`: columns id, input (the prompt, by default: qa_wikidata's inputs are sentences to complete,
    'The language of X is'), targets (list of str), and optionally prompt to use instead of input. Returns
    id, prompt, output (the first line of the continuation), correct (bool), in the input order."""
    _require_columns(frame, ["id", "input", "targets"], "evaluate_qa_generation")
    prompts = frame["prompt"].tolist() if "prompt" in frame else frame["input"].tolist()
    outputs = generate_texts(lm, prompts, max_new_tokens, batch_size, hooks, ("\n",), progress)
    return pd.DataFrame(
        {
            "id": frame["id"].astype(str).to_numpy(),
            "prompt": prompts,
            "output": outputs,
            "correct": np.array([qa_correct(o, t) for o, t in zip(outputs, frame["targets"])], dtype=bool),
        }
    )


# ---------------------------------------------------------------------------------------------------
# Perplexity (WikiText-2)


@torch.no_grad()
def perplexity(
    lm: LoadedModel,
    text: str,
    max_length: int,
    stride: int,
    max_tokens: int | None = None,
    progress: str | None = "perplexity",
) -> dict:
    """Token-level perplexity of `text` with a sliding window.

    The text is tokenized once (with the tokenizer's special tokens, e.g. a BOS), cut to its first
    `max_tokens` tokens when given, and every token but the first (nothing predicts it) is scored exactly
    once. The first window scores tokens 1..max_length-1 with all the context it has; every later window
    is the `max_length` tokens ending at its last target and scores the `stride` tokens that follow the
    previous window, so each of those sees at least max_length - stride tokens of context. With
    max_length >= the number of tokens this is one plain forward. Logits are cast to float32.

    Returns {"n_tokens": scored tokens, "nll": mean negative log-likelihood in nats, "perplexity": exp(nll)}."""
    if max_length < 2 or not 1 <= stride < max_length:
        raise ValueError(f"perplexity needs max_length >= 2 and 1 <= stride < max_length; got {max_length}, {stride}")
    ids = lm.tokenizer(text, verbose=False)["input_ids"]
    if max_tokens is not None:
        ids = ids[:max_tokens]
    if len(ids) < 2:
        raise ValueError(f"perplexity needs a text of at least 2 tokens, got {len(ids)}")
    ids = torch.tensor(ids, dtype=torch.long)
    # targets [t0, t1) per window; the window is ids[max(0, t1 - max_length) : t1]
    spans = [(1, min(max_length, len(ids)))]
    while spans[-1][1] < len(ids):
        spans.append((spans[-1][1], min(spans[-1][1] + stride, len(ids))))
    total = 0.0
    for t0, t1 in tqdm(spans, desc=progress, disable=progress is None, file=sys.stderr):
        window = ids[max(0, t1 - max_length) : t1][None].to(lm.device)
        n = t1 - t0
        logits = lm.model(input_ids=window, logits_to_keep=n + 1).logits[0, :-1].float()  # [n, vocab]
        total -= float(logits.log_softmax(-1).gather(-1, window[0, -n:, None]).sum())
    n_tokens = len(ids) - 1
    return {"n_tokens": n_tokens, "nll": total / n_tokens, "perplexity": math.exp(total / n_tokens)}


# ---------------------------------------------------------------------------------------------------
# Uncertainty


def accuracy_interval(correct, confidence: float = 0.95) -> tuple[float, float, float]:
    """(accuracy, low, high): the share of True in `correct` and its Wilson score interval at `confidence`.
    NaNs for an empty input."""
    correct = np.asarray(correct, dtype=bool).ravel()
    n = len(correct)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    p = correct.mean()
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return float(p), float(max(0.0, center - half)), float(min(1.0, center + half))


# ---------------------------------------------------------------------------------------------------
# Teacher-forced scoring of known targets, and divergence from a reference model


@torch.no_grad()
def score_targets(
    lm: LoadedModel,
    prompts: Sequence[str],
    targets: Sequence[str],
    batch_size: int,
    progress: str | None = None,
) -> pd.DataFrame:
    """Teacher-forced scores of each target after its prompt, one forward per batch.

    Returns one row per item, in input order: n_tokens (target tokens, `prompts.continuation_ids`), nll
    (summed negative log-likelihood of the target tokens, nats, float64) and greedy_match (every target token
    is the argmax given the prompt and the target tokens before it). greedy_match is exactly whether greedy
    decoding would produce the target's tokens first (a target "68." after "23 + 45 = " is the greedy full
    answer 68, cut at the "."), without a decoding loop (tested against `generate_texts`).

    The token prefix that all prompts share (few-shot examples) runs once (as in `SharedPrefix`) and every
    batch continues from a copy of its cache; rows are right-padded after it, so each real token keeps the
    position it has in its own unpadded sequence and padding only follows it (causal attention)."""
    prompts, targets = list(prompts), list(targets)
    if len(prompts) != len(targets):
        raise ValueError(f"score_targets: {len(prompts)} prompts but {len(targets)} targets")
    pairs = [continuation_ids(lm.tokenizer, p, t) for p, t in zip(prompts, targets)]
    for i, (ctx, cont) in enumerate(pairs):
        if not ctx or not cont:
            raise ValueError(f"score_targets: item {i} has an empty prompt or target after tokenization")
    shared = shared_prefix_length([ctx for ctx, _ in pairs]) if pairs else 0
    if shared < SharedPrefix.MIN_TOKENS:
        shared = 0
    prefix_cache = None
    if shared:
        prefix_ids = torch.tensor(pairs[0][0][:shared], dtype=torch.long, device=lm.device)[None]
        prefix_cache = lm.model(input_ids=prefix_ids, use_cache=True, logits_to_keep=1).past_key_values
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    nll, n_tok, match = np.zeros(len(pairs)), np.zeros(len(pairs), dtype=int), np.zeros(len(pairs), dtype=bool)
    order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    # lengths with the shared prefix: few-shot arithmetic rows differ by a few tokens of ~100 and stay whole
    batches = _length_batches([len(pairs[i][0]) + len(pairs[i][1]) for i in order], batch_size)
    for start, stop in tqdm(batches, desc=progress, disable=progress is None, file=sys.stderr):
        rows = order[start:stop]
        seqs = [pairs[i][0][shared:] + pairs[i][1] for i in rows]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        for r, seq in enumerate(seqs):
            ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[r, shared : shared + len(seq)] = 1
        kwargs = {"past_key_values": repeated_cache(prefix_cache, len(rows), room=width)} if shared else {}
        # Only positions from the shortest context's last token on predict a target token: the vocabulary
        # projection skips the rest (most of a GSM8K question). Positions as a tensor, not a count: HF then
        # gathers them into a contiguous copy, where a count slices a view that torch's CPU linear runs 3x slower.
        first = min(len(pairs[i][0]) - shared for i in rows) - 1
        keep = torch.arange(first, width, device=lm.device)
        logits = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                          logits_to_keep=keep, **kwargs).logits  # [rows, width - first, vocab]
        logp = logits.float().log_softmax(-1)
        for r, i in enumerate(rows):
            n_ctx, cont = len(pairs[i][0]) - shared - first, torch.tensor(pairs[i][1], device=logp.device)
            step = logp[r, n_ctx - 1 : n_ctx - 1 + len(cont)]  # the positions that predict the target tokens
            nll[i] = -float(step.gather(-1, cont[:, None]).double().sum())
            n_tok[i] = len(cont)
            match[i] = bool((step.argmax(-1) == cont).all())
    return pd.DataFrame({"n_tokens": n_tok, "nll": nll, "greedy_match": match})


@torch.no_grad()
def divergence_windows(
    lm: LoadedModel,
    reference: LoadedModel | None,
    text: str,
    max_tokens: int,
    window: int,
    progress: str | None = None,
) -> pd.DataFrame:
    """Next-token KL divergence KL(reference || lm) and negative log-likelihoods on the first `max_tokens`
    tokens of `text`, in non-overlapping windows of `window` tokens (the first token of each window is
    context only, so every other token is scored exactly once, with the context of its window).

    One row per window: window, n_tokens (scored), kl (summed over the scored tokens, nats), nll (lm's summed
    negative log-likelihood of the actual next tokens) and ref_nll (the reference's). `reference` None: kl
    is 0 and ref_nll equals nll (the reference is the model itself). Per-token KL over a text is
    sum(kl) / sum(n_tokens); perplexity exp(sum(nll) / sum(n_tokens))."""
    if window < 2:
        raise ValueError(f"divergence_windows needs window >= 2, got {window}")
    ids = lm.tokenizer(text, verbose=False)["input_ids"][:max_tokens]
    if len(ids) < 2:
        raise ValueError(f"divergence_windows needs a text of at least 2 tokens, got {len(ids)}")
    rows = []
    starts = list(range(0, len(ids) - 1, window))
    for k, start in enumerate(tqdm(starts, desc=progress, disable=progress is None, file=sys.stderr)):
        chunk = torch.tensor(ids[start : start + window], dtype=torch.long)[None]
        if chunk.shape[1] < 2:
            continue
        target = chunk[0, 1:]
        logp = lm.model(input_ids=chunk.to(lm.device)).logits[0, :-1].float().log_softmax(-1).cpu()
        nll = -float(logp.gather(-1, target[:, None]).double().sum())
        if reference is None:
            kl, ref_nll = 0.0, nll
        else:
            ref = reference.model(input_ids=chunk.to(reference.device)).logits[0, :-1].float().log_softmax(-1).cpu()
            kl = float((ref.exp() * (ref - logp)).sum(-1).double().sum())
            ref_nll = -float(ref.gather(-1, target[:, None]).double().sum())
        rows.append({"window": k, "n_tokens": len(target), "kl": kl, "nll": nll, "ref_nll": ref_nll})
    return pd.DataFrame(rows)
