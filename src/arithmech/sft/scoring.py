"""Scoring a model on data sets: generated math solutions (GSM8K, SVAMP), multiple choice by
log-likelihood and short generated answers (BIG-bench), perplexity (WikiText-2), teacher-forced scores of
known targets, and the KL divergence from a reference model."""

from __future__ import annotations

import math
import sys
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from arithmech.data.answers import MATH_STOP_STRINGS, extract_answer, qa_correct, same_number
from arithmech.data.arithmetic import continuation_ids
from arithmech.data.formatting import choice_prompt
from arithmech.intervention.decoding import Hooks
from arithmech.intervention.generation import SharedPrefix, generate_texts, pad_left
from arithmech.intervention.kvcache import repeated_cache
from arithmech.model.loading import LoadedModel


def _length_batches(lengths: Sequence[int], batch_size: int, min_fill: float = 0.75) -> list[tuple[int, int]]:
    """(start, stop) batches over rows sorted longest first: at most `batch_size` rows, and a new batch
    starts at a row shorter than `min_fill` of its batch's longest, so padding stays under a quarter of a
    batch (GSM8K solutions of 60 to 370 tokens otherwise pad to nearly twice their tokens). Rows of similar
    lengths (few-shot arithmetic items) get plain batches of `batch_size` rows."""
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


def _require_columns(frame: pd.DataFrame, columns: Sequence[str], where: str) -> None:
    missing = [c for c in columns if c not in frame]
    if missing:
        raise ValueError(f"{where}: the frame lacks column(s) {missing}; it has {list(frame.columns)}")


# ---------------------------------------------------------------------------------------------------
# Math word problems (GSM8K, SVAMP): generated solutions


def evaluate_generation(
    lm: LoadedModel,
    frame: pd.DataFrame,
    max_new_tokens: int,
    batch_size: int,
    *,
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
    outputs = generate_texts(lm, frame["prompt"], max_new_tokens, batch_size, hooks=hooks, stop_strings=stop_strings,
                             progress=progress, share_prefix=share_prefix)
    extracted = [extract_answer(text) for text in outputs]
    gold = frame["gold"].astype(float).to_numpy()
    correct = [v is not None and same_number(v, g) for v, g in zip(extracted, gold)]
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


@torch.no_grad()
def _choice_scores(
    lm: LoadedModel,
    contexts: Sequence[str],
    choices_per_item: Sequence[Sequence[str]],
    batch_size: int,
    progress: str | None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(summed log-likelihood, number of tokens) of every choice, per item: two lists of [n_choices] arrays.

    Items run in batches of `batch_size` of similar context lengths (`_choice_batch`: the context once, the
    choices' remaining tokens on copies of its cache)."""
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
    sums: list[np.ndarray | None] = [None] * len(contexts)
    pad = lm.tokenizer.pad_token_id
    batches = _length_batches([len(ctx_ids[i]) for i in order], batch_size)
    for start, stop in tqdm(batches, desc=progress, disable=progress is None, file=sys.stderr):
        items = order[start:stop]
        # a call of its own: the batch's cache and logits are freed on return, before the next batch's forward
        batch_sums = _choice_batch(lm, [ctx_ids[i] for i in items], [cont_ids[i] for i in items], pad)
        for i, item_sums in zip(items, batch_sums):
            sums[i] = item_sums
    counts = [np.array([len(c) for c in conts]) for conts in cont_ids]
    return sums, counts


def _choice_batch(lm: LoadedModel, ctx_ids: list[list[int]], cont_ids: list[list[list[int]]], pad: int
                  ) -> list[np.ndarray]:
    """Summed log-likelihood of every choice of one batch of items ([n_choices] per item): the contexts run
    once (left-padded, with a cache; the last position predicts every choice's first token), then every choice
    with tokens after its first continues from a copy of its own item's cache (right-padded after it, at the
    positions it has in context + choice alone)."""
    enc = pad_left(ctx_ids, pad, lm.device)
    out = lm.model(**enc, use_cache=True, logits_to_keep=1)
    first = out.logits[:, -1].float().log_softmax(-1).cpu().double()  # [items, vocab]
    sums = [np.array([float(first[k, cont[0]]) for cont in conts]) for k, conts in enumerate(cont_ids)]
    # one row per (item, choice) with tokens after its first: they continue from the item's cache
    rows = [(k, c) for k, conts in enumerate(cont_ids) for c, cont in enumerate(conts) if len(cont) > 1]
    if not rows:
        return sums
    owner = torch.tensor([k for k, _ in rows], device=lm.device)
    tails = [cont_ids[k][c] for k, c in rows]  # input: all but the last token; each predicts the next
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
        sums[k][c] += float(logp[r, : len(tail) - 1].gather(-1, target[:, None]).double().sum())
    return sums


def choice_loglik(
    lm: LoadedModel,
    contexts: Sequence[str],
    choices_per_item: Sequence[Sequence[str]],
    batch_size: int,
    progress: str | None = None,
) -> list[np.ndarray]:
    """Summed log-likelihood of each choice given its context: one [n_choices] float64 array per item.

    Each choice is scored as the sequence context ids + choice ids (see `arithmetic.continuation_ids`); only the
    choice tokens are scored, and each context is read once for all its choices (`batch_size` items per
    forward). A choice usually starts with the space that separates it from the context (" Yes")."""
    return _choice_scores(lm, contexts, choices_per_item, batch_size, progress)[0]


def evaluate_choice(
    lm: LoadedModel, frame: pd.DataFrame, batch_size: int, progress: str | None = "choice"
) -> pd.DataFrame:
    """Multiple-choice accuracy by log-likelihood.

    `frame`: columns id, input, choices (list of str), correct (index), as `datasets.load_bigbench_choice`
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


def evaluate_qa_generation(
    lm: LoadedModel,
    frame: pd.DataFrame,
    max_new_tokens: int,
    batch_size: int,
    *,
    hooks: Hooks = None,
    progress: str | None = "qa",
) -> pd.DataFrame:
    """Short answers generated greedily up to the first newline, scored by `qa_correct`.

    `frame`: columns id, input (the prompt, by default: qa_wikidata's inputs are sentences to complete,
    'The language of X is'), targets (list of str), and optionally prompt to use instead of input. Returns
    id, prompt, output (the first line of the continuation), correct (bool), in the input order."""
    _require_columns(frame, ["id", "input", "targets"], "evaluate_qa_generation")
    prompts = frame["prompt"].tolist() if "prompt" in frame else frame["input"].tolist()
    outputs = generate_texts(lm, prompts, max_new_tokens, batch_size, hooks=hooks, stop_strings=("\n",),
                             progress=progress)
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


def leading_tokens(tokenizer, text: str, max_tokens: int | None) -> list[int]:
    """The first `max_tokens` ids of `tokenizer(text)` (all of them when None), without tokenizing a long text
    whole (WikiText-2's test split is ~1.3 MB, some 300k tokens, for the 2048 the evaluations read).

    A character prefix is tokenized; its first `max_tokens` ids count only once a prefix twice as long gives the
    same ones, so a token that the cut split (or merged across) cannot slip in; failing that, the whole text."""
    if max_tokens is None:
        return tokenizer(text, verbose=False)["input_ids"]
    chars = 8 * max_tokens + 64  # English runs ~4 characters a token: usually the first try
    previous = None
    while chars < len(text):
        ids = tokenizer(text[:chars], verbose=False)["input_ids"]
        if len(ids) > max_tokens:
            if previous is not None and previous[:max_tokens] == ids[:max_tokens]:
                return ids[:max_tokens]
            previous = ids
        chars *= 2
    return tokenizer(text, verbose=False)["input_ids"][:max_tokens]


@torch.no_grad()
def perplexity(
    lm: LoadedModel,
    text: str,
    *,
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
    ids = leading_tokens(lm.tokenizer, text, max_tokens)
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

    Returns one row per item, in input order: n_tokens (target tokens, `arithmetic.continuation_ids`), nll
    (summed negative log-likelihood of the target tokens, nats, float64) and greedy_match (every target token
    is the argmax given the prompt and the target tokens before it). greedy_match is exactly whether greedy
    decoding would produce the target's tokens first (a target "68." after "23 + 45 = " is the greedy full
    answer 68, cut at the "."), without a decoding loop (tested against `generate_texts`).

    The token prefix that all prompts share (few-shot examples) runs once (`SharedPrefix`) and every
    batch continues from a copy of its cache; rows are right-padded after it, so each real token keeps the
    position it has in its own unpadded sequence and padding only follows it (causal attention)."""
    prompts, targets = list(prompts), list(targets)
    if len(prompts) != len(targets):
        raise ValueError(f"score_targets: {len(prompts)} prompts but {len(targets)} targets")
    pairs = [continuation_ids(lm.tokenizer, p, t) for p, t in zip(prompts, targets)]
    for i, (ctx, cont) in enumerate(pairs):
        if not ctx or not cont:
            raise ValueError(f"score_targets: item {i} has an empty prompt or target after tokenization")
    prefix = SharedPrefix.of_ids(lm, [ctx for ctx, _ in pairs])
    shared = 0 if prefix is None else prefix.length
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
        kwargs = {"past_key_values": repeated_cache(prefix.cache, len(rows), room=width)} if shared else {}
        # Only positions from the shortest context's last token on predict a target token: the vocabulary
        # projection skips the rest (most of a GSM8K question).
        first = min(len(pairs[i][0]) - shared for i in rows) - 1
        logits = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                          logits_to_keep=width - first, **kwargs).logits  # [rows, width - first, vocab]
        logp = logits.float().log_softmax(-1)
        for r, i in enumerate(rows):
            n_ctx, cont = len(pairs[i][0]) - shared - first, torch.tensor(pairs[i][1], device=logp.device)
            step = logp[r, n_ctx - 1 : n_ctx - 1 + len(cont)]  # the positions that predict the target tokens
            nll[i] = -float(step.gather(-1, cont[:, None]).double().sum())
            n_tok[i] = len(cont)
            match[i] = bool((step.argmax(-1) == cont).all())
        del kwargs, logits, logp, step  # this batch's cache copy and logits, before the next batch's
    return pd.DataFrame({"n_tokens": n_tok, "nll": nll, "greedy_match": match})


@torch.no_grad()
def divergence_windows(
    lm: LoadedModel,
    reference: LoadedModel | None,
    text: str,
    *,
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
    ids = leading_tokens(lm.tokenizer, text, max_tokens)
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


def off_target_rows(lm: LoadedModel, base: LoadedModel | None, cfg: dict, data_paths: dict, *, seed: int,
                    batch_size: int) -> list[pd.DataFrame]:
    """The study's off-target scores of `lm` (`study.off_target`: `cfg`; `data_paths`: each set's file), long rows
    per data set: GSM8K's and SVAMP's solutions' NLL (kind nll), social_iqa's and strategyqa's choices and
    qa_wikidata's short answers (kind choice: correct), and WikiText-2's windows' KL from `base` (kind divergence;
    `divergence_windows`). Columns dataset, kind, item, cluster and the kind's measures."""
    from arithmech.data import datasets
    from arithmech.data.answers import answer_sentence
    from arithmech.data.formatting import math_prompts

    frames = []
    style = cfg["style"]
    gsm = datasets.subsample(datasets.load_gsm8k(data_paths["gsm8k"]), cfg["gsm8k_n"], seed)
    gsm = math_prompts(gsm, (), style, lm.tokenizer)
    svamp = datasets.subsample(datasets.load_svamp(data_paths["svamp"]), cfg["svamp_n"], seed)
    svamp["solution"] = [answer_sentence(f"{g:g}") for g in svamp["gold"]]
    svamp = math_prompts(svamp, (), style, lm.tokenizer)
    for name, frame in (("gsm8k", gsm), ("svamp", svamp)):
        s = score_targets(lm, frame["prompt"].tolist(), frame["target"].tolist(), batch_size, progress=f"{name} NLL")
        ids = frame["id"].astype(str).to_numpy()
        frames.append(pd.DataFrame({"dataset": name, "kind": "nll", "item": ids, "cluster": ids,
                                    "nll": s["nll"].to_numpy(), "n_tokens": s["n_tokens"].to_numpy()}))
    for name in ("social_iqa", "strategyqa"):
        items = datasets.subsample(datasets.load_bigbench_choice(data_paths[name]), cfg[f"{name}_n"], seed)
        rows = evaluate_choice(lm, items, batch_size, progress=name)
        frames.append(pd.DataFrame({"dataset": name, "kind": "choice", "item": rows["id"], "cluster": rows["id"],
                                    "correct": rows["correct"].to_numpy()}))
    items = datasets.subsample(datasets.load_bigbench_generation(data_paths["qa_wikidata"]), cfg["qa_wikidata_n"], seed)
    rows = evaluate_qa_generation(lm, items, cfg["qa_max_new_tokens"], batch_size, progress="qa_wikidata")
    frames.append(pd.DataFrame({"dataset": "qa_wikidata", "kind": "choice", "item": rows["id"], "cluster": rows["id"],
                                "correct": rows["correct"].to_numpy()}))
    wt = cfg["wikitext"]
    div = divergence_windows(lm, base, datasets.load_text(data_paths["wikitext"]), max_tokens=wt["max_tokens"],
                             window=wt["window"], progress="WikiText-2 KL")
    ids = div["window"].astype(str).to_numpy()
    frames.append(div.drop(columns="window").assign(dataset="wikitext", kind="divergence", item=ids, cluster=ids))
    return frames
