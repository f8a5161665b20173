"""Random head sets: the controls a knockout or a fine-tuning arm is compared with. Torch-free (the
Snakefile imports the study, which draws its layer-matched arm with these)."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

Head = tuple[int, int]  # (layer, query head)


def random_heads(n_layers: int, n_heads: int, k: int, seed: int, exclude: Iterable[Head] = ()) -> list[Head]:
    """k distinct heads drawn uniformly (seeded) from all heads not in `exclude`, in draw order."""
    excluded = {(int(l), int(h)) for l, h in exclude}
    pool = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in excluded]
    if not 0 <= k <= len(pool):
        raise ValueError(f"cannot draw {k} heads from the {len(pool)} heads left after excluding {len(excluded)}")
    picks = np.random.default_rng(seed).choice(len(pool), size=k, replace=False)
    return [pool[i] for i in picks]


def layer_matched_heads(ranked: Sequence[Head], n_heads: int, seed: int, exclude: Iterable[Head] = ()) -> list[Head]:
    """One random head per head of `ranked`, in the same layer, drawn (seeded) in rank order among that
    layer's heads not in `ranked`, not in `exclude` and not drawn before: every prefix [:k] has the layer
    histogram of ranked[:k], the random control at the same layers. Fails when a layer runs out of heads."""
    ranked = [(int(l), int(h)) for l, h in ranked]
    taken = set(ranked) | {(int(l), int(h)) for l, h in exclude}
    rng = np.random.default_rng(seed)
    out = []
    for layer, _ in ranked:
        pool = [(layer, h) for h in range(n_heads) if (layer, h) not in taken]
        if not pool:
            raise ValueError(f"layer {layer} has no head left for a layer-matched random draw "
                             f"({sum(l == layer for l, _ in ranked)} of its {n_heads} heads are ranked)")
        pick = pool[int(rng.integers(len(pool)))]
        taken.add(pick)
        out.append(pick)
    return out
