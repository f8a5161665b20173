"""Speed of the validate stage's greedy answers with and without stopping settled rows, measured in one run.

The knockout and transfer rules answer many ablated head sets greedily on the prefix KV cache
(`ablation.greedy_end_sets`). A row whose first number is settled (`evaluation.number_settled`: followed by
a character that cannot continue it) cannot change its score any more, so it leaves the forwards. This
script times both ways on the same prompts and head sets, and checks that every score is the same.

  knockout: one operator's kept pairs, the knockout rule's head sets (top 0..K, `random_seeds` x K random
            heads, the key MLPs), full greedy answers
  transfer: the transfer rule's number-answer targets (other operators' pairs, multi-digit, decimal, SVAMP)
            with the empty set, one operator's key heads and two random sets

Prints seconds per arm and the ratio (reference / settled). Run after the identify stage (it reads the
pairs, activations and key components under results/).

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

from arithmech.ablation import greedy_end_sets
from arithmech.controls import random_heads
from arithmech.evaluation import settled_number
from arithmech.models import load_model
from arithmech.patching import AlignedMean
from arithmech.evaluation import answer_tokens
from arithmech.stages.validate import _answers_correct, _transfer_targets, knockout_node_sets

ROOT = Path(__file__).resolve().parents[1]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def compare(lm, name: str, texts, golds, head_sets, mlp_sets, means, max_new_tokens: int, batch_size: int):
    """Times both arms on the same work; returns (reference s, settled s) after checking equal scores."""
    def run(settled):
        return greedy_end_sets(lm, texts, head_sets, means, max_new_tokens, mlp_sets, None, batch_size, 256,
                               settled=settled).tokens

    t_ref, ref = timed(lambda: run(None))
    t_fast, fast = timed(lambda: run(settled_number(lm.tokenizer)))
    same = (_answers_correct(lm.tokenizer, ref, golds) == _answers_correct(lm.tokenizer, fast, golds)).all()
    first = torch.equal(ref[..., 0], fast[..., 0])
    if not (same and first):
        raise SystemExit(f"{name}: the scores differ between the two arms")
    rows = len(head_sets) * len(texts)
    print(f"{name:34s} {rows:6d} rows x {max_new_tokens} steps: reference {t_ref:7.1f} s, "
          f"settled {t_fast:7.1f} s, ratio {t_ref / t_fast:.2f}x (same scores)")
    return t_ref, t_fast


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
    totals = [0.0, 0.0]

    # knockout: the rule's sets for one operator
    pairs = pd.read_parquet(args.results / f"pairs/{args.task}.parquet").head(args.limit)
    key = pd.read_parquet(args.results / f"key_components/{args.task}.parquet")
    node_sets = knockout_node_sets(pd.read_parquet(args.results / f"effects/{args.task}.parquet"), key,
                                   config["ablation"], lm.n_layers, lm.n_heads, config["seed"])
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
    targets = _transfer_targets(lm, tasks, [args.results / f"pairs/{t}.parquet" for t in tasks],
                                ROOT / tr["svamp"]["file"], ROOT / tr["non_math"]["file"], tr, config["prompts"],
                                config["seed"])
    for target in targets:
        if target["kind"] == "non_math":
            continue
        n = len(target["texts"]) if args.limit is None else args.limit
        target.update(texts=target["texts"][:n], golds=target["golds"][:n])
        for i, t in enumerate(compare(lm, f"transfer {target['name']}", target["texts"], target["golds"], sets,
                                      [[] for _ in sets], means[args.task], target["max_new_tokens"], batch_size)):
            totals[i] += t
    print(f"{'all of the above':34s} reference {totals[0]:.1f} s, settled {totals[1]:.1f} s, "
          f"ratio {totals[0] / totals[1]:.2f}x")


if __name__ == "__main__":
    main()
