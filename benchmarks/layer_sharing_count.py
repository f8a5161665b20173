"""How much decoder-layer work the knockout's answers could still share: a count, not a timing.

A head set whose first ablated node sits in layer L changes nothing below L, so while a row's tokens so far
equal the unablated answer's, its layers 0..L-1 compute exactly what the unablated row computes. This
script runs the knockout rule's answers (`ablation.greedy_end_sets`, positions "end", rows stopping once
their score is decided) for one operator's validation pairs and counts, over the (set, prompt, step) rows
that ran:

  shared     the share of the decoder-layer work (row-steps x 30 layers) below the set's first ablated
             layer on rows still on the unablated answer's tokens: what sharing could skip if rows that
             leave those tokens went on where they are
  re-decode  the work of a simpler scheme relative to today's: shared rows run from their set's first
             layer, rows that leave the unablated tokens are decoded again in full, plus one unablated
             decode per prompt

The unembedding (576 x 49,152 multiply-adds per row-step on the default model) is the same either way.
Run after the identify stage (it reads the pairs, activations, effects and key components under results/).

Usage: python benchmarks/layer_sharing_count.py [--results results/smollm2-135m] [--tasks addition division]
       [--limit 40]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch
import yaml
from safetensors.torch import load_file

from arithmech.data.answers import answer_tokens, decided_answers
from arithmech.data.arithmetic import split_pairs
from arithmech.interp.ablation import greedy_end_sets
from arithmech.interp.nodes import knockout_node_sets
from arithmech.intervention.means import AlignedMean
from arithmech.model.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def count(tokens: torch.Tensor, first_layers: list[int], n_layers: int, ended) -> tuple[float, float]:
    """tokens [n_sets, n, steps] with set 0 the empty set (the unablated answers); ended(i, ids) says whether
    text i's row stopped after generating ids (end-of-sequence or decided, as in `decoding.greedy_decode`).
    Returns (shareable share, re-decode work / today's work) in decoder-layer row-steps."""
    ref = tokens[0]
    today = shared = redecode = 0.0
    for s, first in enumerate(first_layers):
        for i in range(tokens.shape[1]):
            row = tokens[s, i].tolist()
            ran = next((t + 1 for t in range(len(row)) if ended(i, row[: t + 1])), len(row))  # steps that ran
            left = next((t for t in range(ran) if row[t] != ref[i, t]), None)  # first step off the answer
            on = ran if left is None else left + 1  # steps whose inputs were the unablated answer's
            today += n_layers * ran
            if s > 0:  # set 0's rows are the unablated decode itself
                shared += min(first, n_layers) * on
                redecode += (n_layers - first) * on + (0 if left is None else n_layers * ran)
    redecode += n_layers * tokens.shape[1] * tokens.shape[2]  # one unablated decode per prompt, every step
    return shared / today, redecode / today


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=ROOT / "results/smollm2-135m", type=Path)
    parser.add_argument("--tasks", nargs="+", default=["addition", "division"])
    parser.add_argument("--limit", type=int, default=40, help="validation pairs per operator")
    args = parser.parse_args()
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    lm = load_model(args.results / "model", device="cpu")
    for task in args.tasks:
        pairs_path = args.results / f"pairs/{task}.parquet"
        pairs = split_pairs(pd.read_parquet(pairs_path), "validation", str(pairs_path)).head(args.limit)
        cache = load_file(str(args.results / f"activations/{task}.safetensors"))
        sets = knockout_node_sets(pd.read_parquet(args.results / f"effects/{task}.parquet"),
                                  pd.read_parquet(args.results / f"key_components/{task}.parquet"),
                                  config["ablation"], n_layers=lm.n_layers, n_heads=lm.n_heads,
                                  seed=config["seed"])
        if sets[0][3] or sets[0][4]:
            raise SystemExit("the first knockout set must be the empty set (the unablated answers)")
        golds = list(pairs["answer"])
        decided = decided_answers(lm.tokenizer, golds)
        means = AlignedMean(cache["cf_mean_heads"], cache["cf_mean_mlps"])
        tokens = greedy_end_sets(
            lm, list(pairs["prompt"]), [s[3] for s in sets], means=means, max_new_tokens=answer_tokens(lm.tokenizer,
                                                                                                       golds),
            mlp_sets=[s[4] for s in sets], batch_size=config["compute"]["batch_size"], copies_per_forward=256,
            settled=decided,
        ).tokens
        first_layers = [min([l for l, _ in hs] + list(ms) + [lm.n_layers]) for _, _, _, hs, ms in sets]
        shared, redecode = count(tokens, first_layers, lm.n_layers,
                                 lambda i, ids: ids[-1] in lm.eos_ids or decided(i, ids))
        print(f"{task}: {len(sets)} sets x {len(pairs)} prompts; first ablated layers {sorted(set(first_layers))}; "
              f"shareable {shared:.1%} of the decoder-layer work; re-decode scheme {redecode:.1%} of today's")


if __name__ == "__main__":
    main()
