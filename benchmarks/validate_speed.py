"""Speed of the validate stage's greedy answers, by when a row stops, measured in one run.

The knockout and transfer rules answer many ablated head sets greedily on the prefix KV cache
(`ablation.greedy_end_sets`). Three arms on the same prompts and head sets, every score checked equal:

  none     every row runs all its steps (to its end-of-sequence token)
  settled  a row stops once its first number is settled (`answers.number_settled`: followed by a
           character that cannot continue it), since 2026-11-22
  decided  a row stops once its score is decided, right or wrong (`answers.answer_decided`: settled, or
           its first number can no longer become the gold, "3" for 12), what the rules run since 2026-11-23

  knockout: one operator's kept pairs, the knockout rule's head sets (top 0..K, `random_seeds` x K random
            heads, the key MLPs), full greedy answers
  transfer: the transfer rule's number-answer targets (other operators' pairs, multi-digit, decimal, SVAMP)
            with the empty set, one operator's key heads and two random sets

Prints seconds per arm and the ratios none / decided and settled / decided. Run after the identify stage
(it reads the pairs, activations and key components under results/).

Usage: python benchmarks/validate_speed.py [--results results/smollm2-135m] [--task addition] [--limit N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch
import yaml
from safetensors.torch import load_file

from arithmech.data.answers import answer_tokens, decided_answers, settled_number
from arithmech.interp.ablation import answers_correct, greedy_end_sets, transfer_targets
from arithmech.interp.nodes import knockout_node_sets, random_heads
from arithmech.intervention.means import AlignedMean
from arithmech.model.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


ARMS = ("none", "settled", "decided")


def compare(lm, name: str, texts, golds, head_sets, mlp_sets, means, max_new_tokens: int, batch_size: int):
    """Times the three arms on the same work; returns their seconds after checking that the scores (the first
    token and the full answer of every row) are equal."""
    stops = {"none": None, "settled": settled_number(lm.tokenizer), "decided": decided_answers(lm.tokenizer, golds)}
    seconds, scores = [], []
    for arm in ARMS:
        t, tokens = timed(lambda: greedy_end_sets(lm, texts, head_sets, means=means, max_new_tokens=max_new_tokens,
                                                  mlp_sets=mlp_sets,
                                                  batch_size=batch_size, copies_per_forward=256,
                                                  settled=stops[arm]).tokens)
        seconds.append(t)
        scores.append((tokens[..., 0], torch.as_tensor(answers_correct(lm.tokenizer, tokens, golds))))
    if not all(torch.equal(a, b) for first, full in scores[1:] for a, b in zip((first, full), scores[0])):
        raise SystemExit(f"{name}: the scores differ between the arms")
    rows = len(head_sets) * len(texts)
    print(f"{name:34s} {rows:6d} rows x {max_new_tokens} steps: "
          + ", ".join(f"{arm} {t:6.1f} s" for arm, t in zip(ARMS, seconds))
          + f"; none/decided {seconds[0] / seconds[2]:.2f}x, settled/decided {seconds[1] / seconds[2]:.2f}x")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=ROOT / "results/smollm2-135m", type=Path)
    parser.add_argument("--task", default="addition")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--limit", type=int, default=None, help="at most this many prompts per data set")
    args = parser.parse_args()

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    torch.manual_seed(0)
    lm = load_model(args.results / "model", device=args.device, dtype=args.dtype)
    batch_size = config["compute"]["batch_size"]
    print(f"{lm.device}, {lm.dtype}, {torch.get_num_threads()} threads, batch {batch_size}")
    caches = {t: load_file(str(args.results / f"activations/{t}.safetensors")) for t in config["run"]["tasks"]}
    means = {t: AlignedMean(c["cf_mean_heads"], c["cf_mean_mlps"]) for t, c in caches.items()}
    totals = [0.0] * len(ARMS)

    # knockout: the rule's sets for one operator
    pairs = pd.read_parquet(args.results / f"pairs/{args.task}.parquet").head(args.limit)
    key = pd.read_parquet(args.results / f"key_components/{args.task}.parquet")
    node_sets = knockout_node_sets(pd.read_parquet(args.results / f"effects/{args.task}.parquet"), key,
                                   config["ablation"], n_layers=lm.n_layers, n_heads=lm.n_heads,
                                   seed=config["seed"])
    sets, mlp_sets = [s[3] for s in node_sets], [s[4] for s in node_sets]
    for i, t in enumerate(compare(lm, f"knockout {args.task}", list(pairs["prompt"]), list(pairs["answer"]), sets,
                                  mlp_sets, means[args.task], answer_tokens(lm.tokenizer, pairs["answer"]),
                                  batch_size)):
        totals[i] += t

    # transfer: the number-answer targets, with one operator's key heads and two random sets
    key_heads = [(int(l), int(h)) for l, h in key.loc[key["component"] == "head", ["layer", "head"]].to_numpy()]
    sets = [[], key_heads] + [random_heads(lm.n_layers, lm.n_heads, len(key_heads), seed=config["seed"] * 1000 + s,
                                           exclude=key_heads) for s in range(2)]
    tasks = config["run"]["tasks"]
    tr = config["transfer"]
    targets = transfer_targets(lm, tasks=tasks, pairs_paths=[args.results / f"pairs/{t}.parquet" for t in tasks],
                                svamp_path=ROOT / tr["svamp"]["file"], non_math_path=ROOT / tr["non_math"]["file"],
                                transfer=tr, prompts_cfg=config["prompts"], seed=config["seed"])
    for target in targets:
        if target["kind"] == "non_math":
            continue
        n = len(target["texts"]) if args.limit is None else args.limit
        target.update(texts=target["texts"][:n], golds=target["golds"][:n])
        for i, t in enumerate(compare(lm, f"transfer {target['name']}", target["texts"], target["golds"], sets,
                                      [[] for _ in sets], means[args.task], target["max_new_tokens"], batch_size)):
            totals[i] += t
    print(f"{'all of the above':34s} " + ", ".join(f"{arm} {t:.1f} s" for arm, t in zip(ARMS, totals))
          + f"; none/decided {totals[0] / totals[2]:.2f}x, settled/decided {totals[1] / totals[2]:.2f}x")


if __name__ == "__main__":
    main()
