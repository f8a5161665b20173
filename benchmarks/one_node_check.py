"""The teacher-forced one-node sanity check on the default model (docs/circuit.md, "Sanity checks"): per operator,
on the 48 validation pairs the `discover` rule checks, the share of the model's teacher-forced accuracy kept with one
node ablated, for the check's 20 seeded draws under each ablation and, as deliberately broken ablations, the mean
ablation's values tripled (a sum of three for a mean) and sign-flipped; with --all-nodes, every node under each
correct ablation too (300 circuits per ablation: about 8 minutes per operator on 2 CPU cores).

Prints the share of the draws that keep 0.95 of the answers (the check needs three quarters), their mean and the
drawn nodes below 0.95; with --all-nodes, the nodes below 0.95 and how often a mean over 20 random draws falls
below 0.95 (20,000 simulated draws from the 300 values).

    .venv/bin/python benchmarks/one_node_check.py [--tasks addition ...] [--all-nodes] [--out one_node.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from addition_prompts import CONFIG, ROOT, default_model_dir

from arithmech.data.arithmetic import build_prompts, select_samples, split_pairs
from arithmech.data.datasets import subsample
from arithmech.interp import teacher_forcing as tf
from arithmech.interp.nodes import all_nodes, node_label
from arithmech.interp.protocol import KINDS
from arithmech.intervention.generation import check_answers
from arithmech.model.loading import load_model

BATCH = 64


def checked_items(lm, task: str) -> tuple[tf.TailItems, tf.TailItems]:
    """(the sanity checks' items, the identification pool), drawn as build_pairs and discover draw them."""
    seed, discover = CONFIG["seed"], CONFIG["circuit"]["discover"]
    candidates = build_prompts(lm.tokenizer, task, CONFIG["prompts"], seed)
    checked = check_answers(lm, list(candidates["prompt"]), candidates["answer"], candidates["answer_token_id"],
                            batch_size=BATCH)
    kept, _ = select_samples(candidates, checked, CONFIG["prompts"]["keep_only_correct"], CONFIG["prompts"]["splits"],
                             seed)
    val = subsample(split_pairs(kept, "validation"), discover["validation_samples"], seed)
    pool = tf.build_items(lm, split_pairs(kept, "identification"), batch_size=BATCH, outputs=True)
    items = tf.build_items(lm, val, batch_size=BATCH)
    n = min(discover["sanity_samples"] or len(items), len(items))
    return items.subset(np.sort(np.random.default_rng([seed, 4307]).choice(len(items), n, replace=False))), pool


def shares(lm, items, values, masks) -> np.ndarray:
    trials = tf.TailTrials(lm, items, values, batch_size=BATCH)
    return trials.scores(masks)["correct"].mean(1) / trials.model_correct.mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=CONFIG["run"]["tasks"])
    parser.add_argument("--all-nodes", action="store_true", help="every node alone too, under each correct ablation")
    parser.add_argument("--out", type=Path, default=None, help="also write the per-node table as CSV")
    args = parser.parse_args()
    lm = load_model(default_model_dir(ROOT / "results/smollm2-135m/model"), device="cpu")
    nodes = all_nodes(lm.n_layers, lm.n_heads)
    labels = [node_label(*n) for n in nodes]
    draws = CONFIG["circuit"]["discover"]["sanity_draws"]
    picks = np.random.default_rng([CONFIG["seed"], 4303]).choice(len(nodes), size=draws, replace=draws > len(nodes))
    drawn = np.ones((draws, len(nodes)), dtype=bool)
    drawn[np.arange(draws), picks] = False
    rows = []
    for task in args.tasks:
        items, pool = checked_items(lm, task)
        pool_outputs = tf.tail_outputs(lm, pool, BATCH)
        for kind in KINDS:
            v = tf.ablation_values(lm, items, pool, kind, seed=CONFIG["seed"], batch_size=BATCH,
                                   pool_outputs=pool_outputs)
            variants = {"correct": v}
            if kind == "mean":
                variants |= {f"x{k:g}": tf.TailValues(k * v.heads, k * v.mlps, v.kind, v.donors) for k in (3, -1)}
            for name, values in variants.items():
                s = shares(lm, items, values, drawn)
                below = ", ".join(f"{labels[p]} {x:.2f}" for p, x in sorted(zip(picks, s), key=lambda t: t[1])
                                  if x < 0.95)
                print(f"{task} {kind} {name}: {draws} draws, {(s >= 0.95).mean():.0%} keep 0.95 (the check needs "
                      f"75%), mean {s.mean():.3f}; below 0.95: {below or 'none'}", flush=True)
            if args.all_nodes:
                s = shares(lm, items, v, ~np.eye(len(nodes), dtype=bool))
                rows += [{"task": task, "kind": kind, "node": label, "share": x} for label, x in zip(labels, s)]
                rng = np.random.default_rng(0)
                means = np.array([s[rng.choice(len(s), draws, replace=False)].mean() for _ in range(20000)])
                print(f"{task} {kind}, every node: {int((s < 0.95).sum())} of {len(s)} below 0.95 ("
                      + ", ".join(f"{labels[i]} {s[i]:.2f}" for i in np.argsort(s)[: int((s < 0.95).sum())])
                      + f"); a mean of {draws} random draws below 0.95 in {100 * (means < 0.95).mean():.0f}% of "
                      "20,000 simulated draws", flush=True)
    if args.out and rows:
        pd.DataFrame(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
