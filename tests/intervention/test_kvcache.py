"""The prefix cache and its copies (`arithmech.intervention.kvcache`): a cache with room written in place gives exactly
what Hugging Face's own concatenating cache gives, and the prefix it was copied from is never touched."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from arithmech.data.arithmetic import encode
from arithmech.intervention.decoding import greedy_decode
from arithmech.intervention.kvcache import PrefixCopies, RoomyLayer, end_copies, prefix_cache, repeated_cache
from arithmech.model.tiny import FAMILIES

TEXTS = ["1 plus 2 is equal to ", "What is 3 times 4? The answer is ", "4 minus 1 is equal to "]


@pytest.fixture(scope="module")
def enc(tiny_lm):
    return encode(tiny_lm.tokenizer, TEXTS, tiny_lm.device)


def _snapshot(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def _decode(lm, enc, cache_inputs, steps, stop=None):
    """Greedy tokens [rows, steps] and every step's logits, from `end_copies`-style inputs."""
    seen = []
    out = greedy_decode(lm, **cache_inputs, max_new_tokens=steps, stop=stop,
                        on_logits=lambda step, rows, logits: seen.append((step, rows.clone(), logits.clone())))
    return out, seen


@pytest.mark.parametrize("room", [1, 3, 6, 20])
def test_decoding_on_a_roomy_cache_equals_the_concatenating_cache(tiny_lm, enc, room):
    """Rows that stop at different steps (their cache rows dropped) and a room that runs out before the last
    step (then it concatenates) give bit-identical logits and tokens."""
    prefix = prefix_cache(tiny_lm, enc, tail=1)
    stop = lambda _, row: len(row) >= 2 + (row[0] % 3)  # rows end after 2, 3 or 4 tokens  # noqa: E731
    plain_inputs = end_copies(enc, prefix, 2, room=0)
    assert all(type(layer) is DynamicLayer for layer in plain_inputs["past_key_values"].layers)
    plain, plain_logits = _decode(tiny_lm, enc, plain_inputs, 6, stop)
    roomy_inputs = end_copies(enc, prefix, 2, room=room)
    assert all(type(layer) is RoomyLayer for layer in roomy_inputs["past_key_values"].layers)
    roomy, roomy_logits = _decode(tiny_lm, enc, roomy_inputs, 6, stop)
    assert torch.equal(plain, roomy)
    assert len(plain_logits) == len(roomy_logits) >= 3
    for (s1, r1, l1), (s2, r2, l2) in zip(plain_logits, roomy_logits):
        assert s1 == s2 and torch.equal(r1, r2) and torch.equal(l1, l2)


def test_a_roomy_cache_holds_the_prefix_then_the_new_positions(tiny_lm, enc):
    prefix = prefix_cache(tiny_lm, enc, tail=2)
    cache = repeated_cache(prefix, 3, room=4)
    layer, source = cache.layers[1], prefix.layers[1]
    n, h, length, d = source.keys.shape
    assert layer.keys.shape == (n * 3, h, length, d) and cache.get_seq_length() == length
    assert torch.equal(layer.keys, source.keys.repeat_interleave(3, 0))
    assert torch.equal(layer.values, source.values.repeat_interleave(3, 0))
    new_k, new_v = torch.randn(n * 3, h, 2, d), torch.randn(n * 3, h, 2, d)
    keys, values = layer.update(new_k, new_v)
    assert torch.equal(keys, torch.cat([source.keys.repeat_interleave(3, 0), new_k], -2))
    assert torch.equal(values, torch.cat([source.values.repeat_interleave(3, 0), new_v], -2))
    assert layer.get_seq_length() == length + 2
    keys, _ = layer.update(new_k, new_v)  # the room is now full
    assert keys.shape[-2] == length + 4
    keys, _ = layer.update(new_k[..., :1, :], new_v[..., :1, :])  # past the room: concatenated
    assert keys.shape[-2] == length + 5 and torch.equal(keys[..., -1:, :], new_k[..., :1, :])


def test_the_prefix_is_left_untouched(tiny_lm, enc):
    prefix = prefix_cache(tiny_lm, enc, tail=1)
    before = _snapshot(prefix)
    for room in (0, 1, 5):
        inputs = end_copies(enc, prefix, 2, room=room)
        _decode(tiny_lm, enc, inputs, 4, stop=lambda _, row: len(row) >= 1 + row[0] % 3)
    after = _snapshot(prefix)
    assert all(torch.equal(k0, k1) and torch.equal(v0, v1) for (k0, v0), (k1, v1) in zip(before, after))


def test_prefix_copies_are_made_once_and_rewound_to_the_prefix(tiny_lm, enc):
    """A forward on a reused copy gives exactly what it gives on a fresh copy, and the copy is not remade."""
    prefix = prefix_cache(tiny_lm, enc, tail=1)
    shared = PrefixCopies(prefix, room=1)
    first = shared.get(3)
    assert shared.get(3) is first
    other = shared.get(2)
    assert other is not first and shared.get(2) is other and shared.get(3) is not first  # one kept at a time
    first = shared.get(3)
    for _ in range(3):  # the same forward again and again on the rewound copy
        fresh = tiny_lm.model(**end_copies(enc, prefix, 3)).logits
        reused = tiny_lm.model(**end_copies(enc, shared, 3)).logits
        assert torch.equal(fresh, reused)
    assert first.get_seq_length() == prefix.get_seq_length() + 1
    with pytest.raises(ValueError, match="cannot rewind"):
        first.layers[0].rewind(prefix.get_seq_length() + 2)


def test_sliding_window_layers_are_copied_and_repeated():
    keys, values = torch.randn(2, 1, 5, 4), torch.randn(2, 1, 5, 4)
    prefix = DynamicCache(ddp_cache_data=[(keys, values, torch.tensor(8))])  # one sliding-window layer
    layer = prefix.layers[0]
    cache = repeated_cache(prefix, 3, room=2)
    copied = cache.layers[0]
    assert type(copied) is DynamicSlidingWindowLayer and copied is not layer
    assert torch.equal(copied.keys, keys.repeat_interleave(3, 0))
    copied.update(torch.randn(6, 1, 1, 4), torch.randn(6, 1, 1, 4))
    assert torch.equal(layer.keys, keys) and prefix.get_seq_length() == 5


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_copies_continue_as_the_whole_forward(tiny_family, family):
    """Every family (Gemma 3's sliding-window layers, with a window shorter than the prompts, among them): END run
    on fresh copies of the prefix cache, and again on a reused, rewound copy (`PrefixCopies`), gives the whole
    forward's END logits; greedy decoding on the copies gives the tokens of decoding without a cache."""
    lm = tiny_family(family)[1]
    enc = encode(lm.tokenizer, TEXTS, lm.device)
    window = getattr(lm.model.config, "sliding_window", None)
    assert window is None or enc["input_ids"].shape[1] > window  # the window cuts the prompts
    with torch.no_grad():
        whole = lm.model(**enc).logits[:, -1]
        prefix = prefix_cache(lm, enc, tail=1)
        shared = PrefixCopies(prefix, room=1)
        for source in (prefix, shared, shared):
            got = lm.model(**end_copies(enc, source, 2)).logits[:, -1]
            torch.testing.assert_close(got, whole.repeat_interleave(2, 0), atol=1e-5, rtol=0)
    cached, _ = _decode(lm, enc, end_copies(enc, prefix_cache(lm, enc, tail=1), 1, room=3), 4)
    uncached, _ = _decode(lm, enc, end_copies(enc, None, 1), 4)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("kwargs", [{"copies": 0}, {"copies": 2, "room": -1}])
def test_repeated_cache_rejects_bad_arguments(tiny_lm, enc, kwargs):
    prefix = prefix_cache(tiny_lm, enc, tail=1)
    with pytest.raises(ValueError, match="repeated_cache needs"):
        repeated_cache(prefix, **kwargs)


class _LiveCopies:
    """Wraps `repeated_cache` and `prefix_cache` where the decoders and scorers call them and records, at each
    new copy and each prefix forward, how many copies made earlier are still alive (weak references, no
    garbage collection: memory that only a collection would free counts as alive)."""

    def __init__(self, monkeypatch, copy_modules, prefix_modules):
        import weakref

        from arithmech.intervention import kvcache
        self.refs, self.alive_at_copy, self.alive_at_prefix = [], [], []
        copy_of, prefix_of = kvcache.repeated_cache, kvcache.prefix_cache

        def alive():
            return sum(ref() is not None for ref in self.refs)

        def tracked_copy(*args, **kwargs):
            self.alive_at_copy.append(alive())
            cache = copy_of(*args, **kwargs)
            self.refs.append(weakref.ref(cache))
            return cache

        def tracked_prefix(*args, **kwargs):
            self.alive_at_prefix.append(alive())
            return prefix_of(*args, **kwargs)

        for module in copy_modules:
            monkeypatch.setattr(module, "repeated_cache", tracked_copy)
        for module in prefix_modules:
            monkeypatch.setattr(module, "prefix_cache", tracked_prefix)


def test_one_batch_of_cache_copies_is_alive_at_a_time(tiny_lm, monkeypatch):
    """The copies of a prefix cache are the largest memory of the knockout, the transfer, total-mode patching
    and evaluation (rows x the longest prompt): each batch's (and each chunk of node sets') copies must be
    freed before the next batch's prefix forward and before the next copies are made, or the peak is two
    batches' worth."""
    from arithmech.interp import ablation, patching
    from arithmech.interp.ablation import greedy_end_sets
    from arithmech.interp.patching import collect, total_logits
    from arithmech.intervention import generation, kvcache
    from arithmech.intervention.generation import greedy_generate
    from arithmech.intervention.means import AlignedMean
    from arithmech.sft import scoring
    from arithmech.sft.scoring import score_targets

    shots = "Question: Ann has 3 pens and buys 4 more. How many pens does she have?\nAnswer: 7.\n\n"
    texts = [shots + t for t in TEXTS * 3]  # 9 prompts with a shared prefix
    answers = torch.full((len(texts),), 5)
    cf, _ = collect(tiny_lm, texts, answers, batch_size=4)
    live = _LiveCopies(monkeypatch, [kvcache, generation, scoring], [ablation, patching])
    means = AlignedMean(torch.zeros(1, tiny_lm.n_layers, tiny_lm.n_heads, tiny_lm.head_dim),
                        torch.zeros(1, tiny_lm.n_layers, tiny_lm.d_model))
    # 3 batches of 3 texts x 3 chunks of 2 sets (5 sets, 6 rows a forward)
    greedy_end_sets(tiny_lm, texts, [[], [(0, 0)], [(1, 1)], [(0, 1)], [(1, 0)]], means=means, max_new_tokens=3,
                    batch_size=3, copies_per_forward=6)
    assert (len(live.alive_at_prefix), len(live.alive_at_copy)) == (3, 9)
    greedy_generate(tiny_lm, texts, 3, 4, share_prefix=True)  # 3 batches on the shared few-shot prefix
    score_targets(tiny_lm, texts, [" 3"] * len(texts), batch_size=4)  # 3 batches on the shared prefix
    assert len(live.alive_at_copy) == 15
    total_logits(tiny_lm, texts, answers, cf, [0, 1], batch_size=4, copies_per_forward=8)  # 3 batches
    assert len(live.alive_at_prefix) == 6 and len(live.alive_at_copy) > 15
    assert max(live.alive_at_copy) == 0, str(live.alive_at_copy)
    assert max(live.alive_at_prefix) == 0, live.alive_at_prefix


def test_shared_prefixes_run_each_batch_once_and_change_no_score(tiny_lm, enc):
    """Inside `shared_prefixes` a batch equal in ids, mask and positions (and tail, and model) gets the cache made
    the first time; another tail or batch gets its own; outside the block every call runs the prefix. Two scorers of
    one circuit set on the shared prefix (greedy answers, then again) give exactly what they give alone."""
    from arithmech.interp.ablation import greedy_end_sets
    from arithmech.intervention.kvcache import shared_prefixes
    from arithmech.intervention.means import AlignedMean

    lm = tiny_lm
    other = encode(lm.tokenizer, TEXTS[:2], lm.device)
    with shared_prefixes():
        first = prefix_cache(lm, enc)
        assert prefix_cache(lm, {k: v.clone() for k, v in enc.items()}) is first
        assert prefix_cache(lm, enc, tail=2) is not first and prefix_cache(lm, other) is not first
        with shared_prefixes():  # a nested block starts its own store and gives the outer one back
            assert prefix_cache(lm, enc) is not first
        assert prefix_cache(lm, enc) is first
    assert prefix_cache(lm, enc) is not first
    zeros = AlignedMean(torch.zeros(1, lm.n_layers, lm.n_heads, lm.head_dim), torch.zeros(1, lm.n_layers, lm.d_model))
    sets = [[(0, 0), (1, 1)], [(0, 1)]]
    alone = greedy_end_sets(lm, TEXTS, sets, means=zeros, max_new_tokens=3, batch_size=2).tokens
    with shared_prefixes():
        shared = [greedy_end_sets(lm, TEXTS, sets, means=zeros, max_new_tokens=3, batch_size=2).tokens
                  for _ in range(2)]
    assert torch.equal(shared[0], alone) and torch.equal(shared[1], alone)
