"""The model's answers to prompts: the first answer token (what path patching and the knockout curves
measure) and greedy generation (what a user sees), optionally from a shared-prefix KV cache, with or
without hooks such as a mean ablation active.

`hooks` everywhere is `decoding.Hooks`: None, or hooks(rows) -> the context manager entered around each
forward, rows (LongTensor) the indices in `texts` of the forward's rows; hooks acting on every row alike
ignore them (`lambda rows: ablation.mean_ablate(...)`), per-row ones select with them
(`ablation.ablation_hooks`). Batches are left-padded (`arithmetic.encode`), so END, the position that predicts
the next token, is index -1.
"""

from __future__ import annotations

import sys
from typing import Iterator, Literal, Sequence, overload

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from arithmech.data.answers import answer_correct, answer_tokens, cut_at
from arithmech.data.arithmetic import encode
from arithmech.intervention.batching import SHARED_PREFIX_MIN_TOKENS
from arithmech.intervention.decoding import Hooks, entered, greedy_decode
from arithmech.intervention.kvcache import repeated_cache
from arithmech.model.loading import LoadedModel


def _batches(n: int, batch_size: int) -> Iterator[tuple[int, int]]:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for start in range(0, n, batch_size):
        yield start, min(n, start + batch_size)


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

    `of` tokenizes every text (as `arithmetic.encode` does) and finds the common prefix of the token ids, so a
    prefix never ends inside a token of one text's own tokenization; it keeps at least one token per text
    to run (the END that predicts the first new token). `batch(rows)` returns `decoding.greedy_decode`
    inputs: input_ids [rows, longest rest] (each row's own tokens, left-padded), attention_mask
    [rows, prefix + longest rest] and past_key_values, a fresh copy of the prefix cache repeated over the
    rows (decoding extends it)."""

    MIN_TOKENS = SHARED_PREFIX_MIN_TOKENS

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
        return cls.of_ids(lm, lm.tokenizer(list(texts))["input_ids"])

    @classmethod
    def of_ids(cls, lm: LoadedModel, ids: list[list[int]]) -> SharedPrefix | None:
        """The shared prefix of token id rows, or None when it is shorter than MIN_TOKENS."""
        if not ids:
            return None
        length = shared_prefix_length(ids)
        return cls(lm, ids, length) if length >= cls.MIN_TOKENS else None

    def batch(self, rows: Sequence[int], new_tokens: int = 0) -> dict:
        """Decoding inputs for `rows`, the cache with room for their own tokens and `new_tokens` more."""
        rests = pad_left([self.ids[i][self.length :] for i in rows], self.lm.tokenizer.pad_token_id, self.lm.device)
        n, width = rests["input_ids"].shape
        return {
            "input_ids": rests["input_ids"],
            "attention_mask": torch.cat([torch.ones_like(self.tokens)[None].expand(n, -1), rests["attention_mask"]], 1),
            "past_key_values": repeated_cache(self.cache, n, room=width + new_tokens),
        }


@overload
def greedy_generate(
    lm: LoadedModel, texts: list[str], max_new_tokens: int, batch_size: int, *, hooks: Hooks = None,
    return_logits: Literal[False] = False, stop_strings: Sequence[str] | None = None, progress: str | None = None,
    share_prefix: bool = False,
) -> torch.Tensor: ...


@overload
def greedy_generate(
    lm: LoadedModel, texts: list[str], max_new_tokens: int, batch_size: int, *, hooks: Hooks = None,
    return_logits: Literal[True], stop_strings: Sequence[str] | None = None, progress: str | None = None,
    share_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]: ...


@torch.no_grad()
def greedy_generate(
    lm: LoadedModel,
    texts: list[str],
    max_new_tokens: int,
    batch_size: int,
    *,
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
        del enc  # this batch's cache copy, before the next batch makes its own
    return (out, all_logits) if return_logits else out


def greedy_answers(
    lm: LoadedModel, texts: list[str], max_new_tokens: int, batch_size: int, hooks: Hooks = None
) -> list[str]:
    """Decoded greedy continuations (special tokens dropped), one per text. See `greedy_generate`."""
    ids = greedy_generate(lm, texts, max_new_tokens, batch_size, hooks=hooks)
    return lm.tokenizer.batch_decode(ids, skip_special_tokens=True)


def longest_first(lm: LoadedModel, texts: Sequence[str]) -> np.ndarray:
    """The order that sorts `texts` by token count, longest first (ties keep their order): batches of similar
    lengths pad little, and an out-of-memory error shows in the first batch."""
    lengths = np.array([len(ids) for ids in lm.tokenizer(list(texts))["input_ids"]]) if len(texts) else np.zeros(0)
    return np.argsort(-lengths, kind="stable")


def check_answers(lm: LoadedModel, texts: list[str], answers, answer_token_ids, *, batch_size: int,
                  desc: str | None = None) -> pd.DataFrame:
    """The model's greedy answer to each arithmetic prompt, read two ways: its first token against the
    answer's first token (what path patching measures) and the whole greedy answer against the number
    (`answer_correct`). One row per text: predicted_token_id, full_answer (the decoded greedy tokens),
    correct_first_token, correct_full. Prompts run longest first (`longest_first`): the default config's
    few-shot prompts of six templates, padded in their given order, cost 6-13% more tokens per task."""
    answers, texts = list(answers), list(texts)
    order = longest_first(lm, texts)
    ordered = greedy_generate(lm, [texts[i] for i in order], answer_tokens(lm.tokenizer, answers), batch_size,
                              progress=desc)
    tokens = torch.empty_like(ordered)
    tokens[torch.as_tensor(order, dtype=torch.long)] = ordered
    full = lm.tokenizer.batch_decode(tokens, skip_special_tokens=True)
    first = tokens[:, 0].numpy()
    return pd.DataFrame({
        "predicted_token_id": first,
        "full_answer": full,
        "correct_first_token": first == np.asarray(list(answer_token_ids)),
        "correct_full": [answer_correct(t, a) for t, a in zip(full, answers)],
    })


def generate_texts(
    lm: LoadedModel,
    prompts: Sequence[str],
    max_new_tokens: int,
    batch_size: int,
    *,
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
    order = longest_first(lm, prompts)
    ordered = [prompts[i] for i in order]
    if hooks is not None:  # the decoder numbers rows as `ordered`
        order_t, given = torch.as_tensor(order, dtype=torch.long), hooks
        hooks = lambda rows: given(order_t[rows])  # noqa: E731
    ids = greedy_generate(
        lm, ordered, max_new_tokens, batch_size, hooks=hooks, stop_strings=stop_strings, progress=progress,
        share_prefix=share_prefix and hooks is None,
    )
    texts = lm.tokenizer.batch_decode(ids, skip_special_tokens=True)
    out = [""] * len(prompts)
    for position, row in enumerate(order):
        out[row] = cut_at(texts[position], stop_strings)
    return out


def pad_left(seqs: list[list[int]], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Left-padded batch like `arithmetic.encode`: input_ids, attention_mask, position_ids [batch, seq]."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[row, width - len(seq) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "position_ids": positions.to(device)}
