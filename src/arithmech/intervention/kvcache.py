"""A prefix's KV cache, computed once and copied for many rows that continue it.

Total-mode patching, the knockout and evaluation all run many rows on top of one prefix (everything but
END, or the few-shot examples all prompts share): the prefix runs once (`prefix_cache`), and every forward
over the rows gets its own copy of that cache, each row's prefix repeated (`repeated_cache`).

The copies are Hugging Face `DynamicCache`s, so the model's own forward runs on them. Their layers are
`RoomyLayer`s: a `DynamicLayer` appends a forward's new positions by concatenation, which copies the whole
cache of every row on every forward (profiled, the costliest copy of total mode); a `RoomyLayer` keeps its
keys and values in buffers with room for the positions still to come and writes them in place. Forwards
whose new positions are not continued (total mode: one END forward per layer's patched copies) share one
copy, rewound to the prefix before each (`PrefixCopies`).

Scorers that run the same prompts in the same batches one after the other (a circuit's greedy answers and its
END measure) share their prefixes inside `shared_prefixes()`: `prefix_cache` then computes each distinct one once.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator

import torch
from transformers.cache_utils import DynamicLayer

from arithmech.model.loading import LoadedModel


class RoomyLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values [rows, kv_heads, length, head_dim] are views of buffers
    [rows, kv_heads, length + room, head_dim]: `update` writes new positions into the room in place. Past
    the room it concatenates, as `DynamicLayer` does. A method of `DynamicLayer` that replaces the keys
    (crop, reorder) leaves the buffers, after which every update concatenates."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, copies: int, room: int):
        """keys, values: [n, kv_heads, length, head_dim]; the layer holds `copies` copies of every row (row
        i * copies + j is copy j of row i) and room for `room` more positions."""
        super().__init__()
        self.lazy_initialization(keys, values)
        n, h, length, d = keys.shape
        self._kv = []
        for t in (keys, values):
            buf = t.new_empty(n * copies, h, length + room, d)
            buf.view(n, copies, h, length + room, d)[..., :length, :] = t[:, None]  # one copy, no repeat first
            self._kv.append(buf)
        self._length = length
        self._view()

    def _view(self) -> None:
        self.keys, self.values = (buf[..., : self._length, :] for buf in self._kv)

    def _in_buffers(self) -> bool:
        return self.keys.data_ptr() == self._kv[0].data_ptr() and self.keys.shape == (
            *self._kv[0].shape[:2], self._length, self._kv[0].shape[-1])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        new = key_states.shape[-2]
        if not self._in_buffers() or self._length + new > self._kv[0].shape[-2]:
            return super().update(key_states, value_states, *args, **kwargs)
        for buf, t in zip(self._kv, (key_states, value_states)):
            buf[..., self._length : self._length + new, :] = t
        self._length += new
        self._view()
        return self.keys, self.values

    def rewind(self, length: int) -> None:
        """Forget every position from `length` on; the buffers keep the rest (for `PrefixCopies`)."""
        if not self._in_buffers() or not 0 <= length <= self._length:
            raise ValueError(f"cannot rewind a layer of {self._length} positions to {length}")
        self._length = length
        self._view()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices` (rows that finished leave a decoding batch), room included."""
        if not self._in_buffers():
            return super().batch_select_indices(indices)
        self._kv = [buf[indices] for buf in self._kv]
        self._view()


def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep the rows `rows` (LongTensor, any device) of every layer of `cache`, in place: rows that finished
    leave a decoding batch. On a model spread over devices each layer's keys live on that layer's device,
    and a CPU tensor cannot be indexed with a CUDA index nor one GPU's tensor with another's: the index goes
    to each layer's device."""
    for layer in cache.layers:
        if layer.is_initialized:  # a layer the forwards skipped (`LoadedModel.layers_from`) holds nothing
            layer.batch_select_indices(rows.to(layer.keys.device))


_SHARED: list | None = None  # (model, batch, tail, cache) of each prefix made inside `shared_prefixes`
_BATCH_KEYS = ("input_ids", "attention_mask", "position_ids")


@contextmanager
def shared_prefixes() -> Iterator[None]:
    """Inside this block, `prefix_cache` called again with the same model, batch (input_ids, attention_mask,
    position_ids, compared exactly) and tail returns the cache it made the first time instead of running the prefix
    again: a prefix cache is only ever copied (`repeated_cache`, `PrefixCopies`), never written. The caches are
    kept until the block ends."""
    global _SHARED
    outer, _SHARED = _SHARED, []
    try:
        yield
    finally:
        _SHARED = outer


def prefix_cache(lm: LoadedModel, enc: dict[str, torch.Tensor], tail: int = 1):
    """Keys and values of every position but the last `tail` (default: all but END) of a left-padded batch
    (one forward). An intervention on the last `tail` positions changes nothing before them, so many
    intervened copies can share this prefix. Inside `shared_prefixes()` a batch's prefix is computed once."""
    if not 0 < tail < enc["input_ids"].shape[1]:
        raise ValueError(f"a prefix cache needs 0 < tail < sequence length {enc['input_ids'].shape[1]}; got {tail}")
    if _SHARED is not None:
        for model, batch, t, cache in _SHARED:
            if model is lm.model and t == tail and all(
                    batch[k].shape == enc[k].shape and torch.equal(batch[k], enc[k]) for k in _BATCH_KEYS):
                return cache
    cache = lm.model(
        input_ids=enc["input_ids"][:, :-tail],
        attention_mask=enc["attention_mask"][:, :-tail],
        position_ids=enc["position_ids"][:, :-tail],
        use_cache=True,
        logits_to_keep=1,  # only the cache is wanted; the vocabulary projection of every position is not
    ).past_key_values
    if _SHARED is not None:
        _SHARED.append((lm.model, {k: enc[k] for k in _BATCH_KEYS}, tail, cache))
    return cache


def repeated_cache(prefix, copies: int, room: int = 0):
    """A new cache holding `copies` copies of every row of `prefix` (row i * copies + j is copy j of row i),
    with room for `room` more positions per layer (the tokens the forwards on it will add: with room 0 it
    grows by concatenation). `prefix` is left untouched. Plain `DynamicLayer`s become `RoomyLayer`s; other
    kinds (sliding-window layers) are copied as they are."""
    if copies < 1 or room < 0:
        raise ValueError(f"repeated_cache needs copies >= 1 and room >= 0; got {copies}, {room}")
    layers = []
    for layer in prefix.layers:
        if type(layer) is DynamicLayer and layer.is_initialized and room > 0:
            layers.append(RoomyLayer(layer.keys, layer.values, copies, room))
        else:
            repeated = copy.deepcopy(layer)
            repeated.batch_repeat_interleave(copies)
            layers.append(repeated)
    cache = copy.copy(prefix)  # same class and settings, its own list of layers
    cache.layers = layers
    return cache


class PrefixCopies:
    """Copies of `prefix` for forwards that add at most `room` positions each and are not continued (total
    mode: one END forward per layer's patched copies). `get(copies)` returns the last cache it made, rewound
    to the prefix (whose part of the buffers no forward writes), when it holds as many copies, instead of
    copying the prefix again; else a new `repeated_cache(prefix, copies, room)`. Only one cache is kept, so
    memory stays that of one copy. A cache with other than `RoomyLayer`s (sliding-window layers) is copied
    afresh every time."""

    def __init__(self, prefix, room: int):
        self.prefix, self.room, self.length = prefix, room, prefix.get_seq_length()
        self._last: tuple[int, object] | None = None  # (copies, cache)

    def get(self, copies: int):
        if self._last is not None and self._last[0] == copies:
            cache = self._last[1]
            for layer in cache.layers:
                layer.rewind(self.length)
            return cache
        self._last = None  # free the old copy before making the new one
        cache = repeated_cache(self.prefix, copies, self.room)
        if all(isinstance(layer, RoomyLayer) for layer in cache.layers):
            self._last = (copies, cache)
        return cache


def end_copies(enc: dict[str, torch.Tensor], prefix, copies: int, tail: int = 1, room: int | None = None) -> dict:
    """Forward inputs for `copies` copies of every row of a left-padded batch (row i * copies + j is copy j
    of row i) that run the last `tail` tokens (default END alone) on top of `prefix` (`prefix_cache` with the
    same `tail`): input_ids and position_ids [batch * copies, tail], attention_mask [batch * copies, seq],
    past_key_values a fresh copy (`repeated_cache`, with `room` for the positions to come, default `tail`),
    or `prefix` itself when it is a `PrefixCopies`. With prefix None, the whole sequence and no cache."""
    if prefix is None:
        tail = enc["input_ids"].shape[1]
        cache = None
    elif isinstance(prefix, PrefixCopies):
        cache = prefix.get(copies)
    else:
        cache = repeated_cache(prefix, copies, room=tail if room is None else room)
    return {
        "input_ids": enc["input_ids"][:, -tail:].repeat_interleave(copies, 0),
        "attention_mask": enc["attention_mask"].repeat_interleave(copies, 0),
        "position_ids": enc["position_ids"][:, -tail:].repeat_interleave(copies, 0),
        "past_key_values": cache,
    }
