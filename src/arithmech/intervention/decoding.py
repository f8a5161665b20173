"""Greedy decoding: the one decoder that generation, the knockout and the transfer share.

`greedy_decode` continues a left-padded batch one token per forward with a KV cache. It starts either from
whole prompts (no cache) or from a cache that already holds a prefix of every row (the few-shot examples
all prompts share, `generation.SharedPrefix`; everything but END, `ablation.greedy_end_sets`), and a row
leaves the forwards (and the cache) as soon as it has ended, so a batch whose answers end early costs only
what its live rows need.

Hooks follow one convention everywhere (`Hooks`): a callable that takes the row indices of a forward's rows
and returns a context manager entered around that forward. Hooks that act on every row alike ignore the
indices (`lambda rows: mean_ablate(...)`); hooks with per-row values or masks select them with the indices
(`ablation.ablation_hooks`). As the first forward runs every token the cache does not hold and each later
one only the new token, a hook that acts on "the last position of every forward" acts on END and then on
each generated position, exactly once each.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch

from arithmech.intervention.kvcache import select_rows
from arithmech.model.loading import LoadedModel

# hooks(rows) -> the context manager entered around a forward; rows: LongTensor [forward rows], each row's
# index in the caller's numbering (its batch, or the texts the caller was given)
Hooks = Callable[[torch.Tensor], ContextManager] | None


def entered(hooks: Hooks, rows: torch.Tensor) -> ContextManager:
    """The context of `hooks` for a forward over `rows` (LongTensor [forward rows]); none for None."""
    return contextlib.nullcontext() if hooks is None else hooks(rows)


@torch.no_grad()
def greedy_decode(
    lm: LoadedModel,
    *,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    position_ids: torch.Tensor | None = None,
    past_key_values=None,
    hooks: Hooks = None,
    row_ids: torch.Tensor | None = None,
    stop: Callable[[int, list[int]], bool] | None = None,
    on_logits: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Greedy continuation token ids [rows, max_new_tokens] on the CPU; after a row has ended, the pad id.

    input_ids:       [rows, S] the tokens the cache does not hold yet (left-padded prompts without a cache;
                     the rows' own tokens, or END alone, after a prefix cache)
    attention_mask:  [rows, cached + S] over the cached and the new tokens
    position_ids:    [rows, S]; default from the attention mask (a row's positions are those of its
                     unpadded sequence, as `arithmetic.encode` gives them)
    past_key_values: a cache of the first `cached` positions of every row, or None; it is extended and
                     shrunk in place, so pass a copy of one that is reused (`kvcache.repeated_cache`)
    hooks:           `Hooks`, called with `row_ids` of the forward's rows (default 0..rows-1)
    stop:            a row also ends once stop(its row id, its tokens so far) is true (its score is decided,
                     a stop string has appeared)
    on_logits:       on_logits(step, rows [live], logits [live, vocab] float32) after every forward, rows
                     numbered as `row_ids`

    A row ends at one of the model's end-of-sequence ids (`LoadedModel.eos_ids`, kept in the output) or at
    `stop`; a batch ends when all its rows have."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    n = input_ids.shape[0]
    if position_ids is None:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
    row_ids = torch.arange(n) if row_ids is None else torch.as_tensor(row_ids).cpu()
    pad = lm.tokenizer.pad_token_id
    out = torch.full((n, max_new_tokens), pad, dtype=torch.long)
    eos = torch.tensor(lm.eos_ids)
    live = torch.arange(n)  # the rows still being generated, in forward order
    ids, mask, pos, cache = input_ids, attention_mask, position_ids, past_key_values
    for step in range(max_new_tokens):
        with entered(hooks, row_ids[live]):
            res = lm.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                           use_cache=True, logits_to_keep=1)
        logits = res.logits[:, -1].float()
        cache = res.past_key_values
        if on_logits is not None:
            on_logits(step, row_ids[live], logits)
        nxt = logits.argmax(-1).cpu()
        out[live, step] = nxt
        done = torch.isin(nxt, eos)
        if stop is not None:
            rows_so_far = zip(row_ids[live].tolist(), out[live, : step + 1].tolist())
            done |= torch.tensor([stop(r, row) for r, row in rows_so_far], dtype=torch.bool)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        keep = (~done).nonzero()[:, 0]
        if len(keep) < len(live):  # finished rows leave the forwards and the cache
            live, mask, pos, nxt = live[keep], mask[keep], pos[keep], nxt[keep]
            select_rows(cache, keep)
        ids = nxt[:, None].to(mask.device)
        mask = torch.cat([mask, mask.new_ones(len(live), 1)], 1)
        pos = pos[:, -1:] + 1
    return out
