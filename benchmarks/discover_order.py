"""The CPR curve of the discover rule's node ranking against the older orders, on the teacher-forced protocol of
one operator of a prepared model (issue 57): the ranking is built on a seeded draw of identification pairs (as the
discover rule prunes), the curve scored on a seeded draw of validation pairs under the pruning's ablation (mean).

    PYTHONPATH=src .venv/bin/python benchmarks/discover_order.py MODEL_DIR PAIRS.parquet [--samples 16]
        [--validation 48] [--steps 8]

Orders: `|whole-model IG|` (`node_ranking`, the rule's), `whole-model IG` (the older order: the top nodes
by the whole model's signed attribution), and attribution recomputed on the circuit left as nodes drop (a quarter of
the nodes per round, `TailTrials.attribution(kept=...)`), by |attribution| (`recomputed`) or signed. Prints each
order's seconds, its curve (faithfulness of full answers and of the log-probability at each node share) and the
greedy pruning's circuits along the rule's ranking (nodes, trials, seconds)."""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from arithmech.data.arithmetic import split_pairs
from arithmech.data.datasets import subsample
from arithmech.interp import teacher_forcing as tf
from arithmech.model.loading import load_model


def recomputed(trials, steps: int, *, signed: bool, drop: float = 0.25) -> np.ndarray:
    """Every node index, most important first: the quarter of the circuit left with the least (|)attribution(|),
    recomputed on that circuit, leaves it per round; the ranking is the reverse order of leaving."""
    kept, left = np.ones(len(trials.nodes), dtype=bool), []
    while kept.any():
        a = trials.attribution(steps, kept=kept)
        inside = np.flatnonzero(kept)
        worth = a[inside] if signed else np.abs(a[inside])
        out = inside[np.argsort(worth, kind="stable")[: max(1, int(np.ceil(drop * len(inside))))]]
        left += out.tolist()
        kept[out] = False
    return np.array(left[::-1], dtype=int)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("pairs")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--validation", type=int, default=48)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--targets", type=float, nargs="*", default=[0.8, 0.9, 0.95])
    args = parser.parse_args()
    lm = load_model(args.model_dir, device="cpu")
    pairs = pd.read_parquet(args.pairs)
    ident_all = split_pairs(pairs, "identification")
    pool = tf.build_items(lm, ident_all, outputs=True)
    outputs = tf.tail_outputs(lm, pool)
    ident = tf.build_items(lm, subsample(ident_all, args.samples, 0))
    val = tf.build_items(lm, subsample(split_pairs(pairs, "validation"), args.validation, 0))
    trials = tf.TailTrials(lm, ident, tf.ablation_values(lm, ident, pool, "mean", pool_outputs=outputs),
                           batch_size=max(32, len(ident)))
    scored = tf.TailTrials(lm, val, tf.ablation_values(lm, val, pool, "mean", pool_outputs=outputs))
    orders = {}
    t0 = time.perf_counter()
    ranking, attribution = tf.node_ranking(trials, args.steps)
    t1 = time.perf_counter()
    orders["|whole-model IG|"] = (ranking, t1 - t0)
    orders["whole-model IG"] = (np.argsort(-attribution, kind="stable"), t1 - t0)
    for name, signed in (("recomputed", False), ("signed recomputed", True)):
        t0 = time.perf_counter()
        orders[name] = (recomputed(trials, args.steps, signed=signed), time.perf_counter() - t0)
    print(f"{len(ident)} identification items, {len(val)} validation items, {len(trials.nodes)} nodes")
    for name, (ranking, seconds) in orders.items():
        curve = tf.cpr_cmd(scored, ranking)
        cells = " ".join(f"{s:.0%}:{c:.2f}/{p:.2f}" for s, c, p in
                         zip(curve["share"], curve["f_correct"], curve["f_logprob"]))
        print(f"{name:>18} ({seconds:.0f} s)  share: f correct / f logprob  {cells}")
    t0 = time.perf_counter()
    pruned, _ = tf.prune(trials, args.targets, ranking=ranking, attribution=attribution,
                         two_sided=True)
    seconds = time.perf_counter() - t0
    for p in pruned:
        print(f"target {p.target}: {int(p.kept.sum())} nodes, f {p.faithfulness:.3f}, {p.trials} trials, "
              f"minimal {p.minimal}")
    print(f"pruning: {seconds:.0f} s")


if __name__ == "__main__":
    main()
