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


def layer_matched_heads(ranked: Sequence[Head], n_heads: int, seed: int, exclude: Iterable[Head] = (),
                        n_layers: int | None = None) -> list[Head]:
    """One random head per head of `ranked`, in the same layer, drawn (seeded) in rank order among that
    layer's heads not in `ranked`, not in `exclude` and not drawn before: every prefix [:k] has the layer
    histogram of ranked[:k], the random control at the same layers. Where a layer has no head left (5 of its
    9 heads ranked, say), the head comes from the nearest layer that has one (the lower first on a tie,
    within 0..n_layers-1, default: up to the highest ranked layer); fails when no layer has one."""
    ranked = [(int(l), int(h)) for l, h in ranked]
    taken = set(ranked) | {(int(l), int(h)) for l, h in exclude}
    top = n_layers if n_layers is not None else max((l for l, _ in ranked), default=-1) + 1
    rng = np.random.default_rng(seed)
    out = []
    for layer, _ in ranked:
        nearest = sorted(range(top), key=lambda other: (abs(other - layer), other))
        pools = ([(other, h) for h in range(n_heads) if (other, h) not in taken] for other in nearest)
        pool = next((p for p in pools if p), None)
        if pool is None:
            raise ValueError(f"no head left for a layer-matched random draw near layer {layer}")
        pick = pool[int(rng.integers(len(pool)))]
        taken.add(pick)
        out.append(pick)
    return out
