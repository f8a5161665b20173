"""Speed of the roomy prefix cache against Hugging Face's concatenating one, measured in one run.

Every job that runs many rows on one prefix (total-mode patching, the knockout and transfer answers, the
evaluation's generation after the shared few-shot examples) copies the prefix's KV cache for its rows
(`kvcache.repeated_cache`). Before `kvcache.RoomyLayer`, each forward appended its new positions by
concatenation (`DynamicLayer.update`), which copies the whole cache of every row again, once per forward
and layer, and total mode copied the prefix for every forward. The roomy cache copies the prefix once into
buffers with room for the positions to come and writes new positions in place; total mode's forwards
share one copy (`kvcache.PrefixCopies`).

Three workloads, each run both ways on the same inputs, the outputs checked to be identical before any
time is printed:
  total:    `patching.total_logits`, all 300 nodes, 16 addition prompts (as benchmarks/patching_speed.py)
  knockout: `ablation.greedy_end_sets` with the knockout rule's head sets for one operator (--limit prompts)
  evaluate: `generation.generate_texts` on GSM8K test items in the evaluate rule's format (--gsm8k-n items,
            the rule's max_new_tokens and batch size), the few-shot prefix shared

Run after the identify stage (the knockout reads pairs, activations and key components under results/).

Usage: python benchmarks/cache_speed.py [--results results/smollm2-135m] [--limit 40] [--gsm8k-n 16]
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch
import yaml
from addition_prompts import addition_pairs
from safetensors.torch import load_file

from arithmech.data import datasets
from arithmech.data.answers import MATH_STOP_STRINGS, answer_tokens, settled_number
from arithmech.data.formatting import math_prompts
from arithmech.interp.ablation import greedy_end_sets
from arithmech.interp.nodes import knockout_node_sets
from arithmech.interp.patching import collect, total_logits
from arithmech.intervention import generation, kvcache
from arithmech.intervention.generation import generate_texts
from arithmech.intervention.means import AlignedMean
from arithmech.model.loading import load_model
from arithmech.sft import scoring

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def concatenating_cache():
    """The cache before `RoomyLayer`: no room, so Hugging Face's `DynamicLayer`, which concatenates (and which
    `kvcache.PrefixCopies` copies afresh for every forward)."""
    roomy = kvcache.repeated_cache

    def concatenating(prefix, copies, room=0):
        return roomy(prefix, copies)

    kvcache.repeated_cache = generation.repeated_cache = scoring.repeated_cache = concatenating
    try:
        yield
    finally:
        kvcache.repeated_cache = generation.repeated_cache = scoring.repeated_cache = roomy


def compare(name: str, work, same) -> tuple[float, float]:
    """Times `work()` with the concatenating cache and then the roomy one; `same(a, b)` must hold."""
    with concatenating_cache():
        start = time.perf_counter()
        before = work()
        t_before = time.perf_counter() - start
    start = time.perf_counter()
    now = work()
    t_now = time.perf_counter() - start
    if not same(before, now):
        raise SystemExit(f"{name}: the two caches give different outputs")
    print(f"{name:10s} concatenating {t_before:7.1f} s, roomy {t_now:7.1f} s, {t_before / t_now:5.2f}x faster "
          "(identical outputs)", flush=True)
    return t_before, t_now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=ROOT / "results/smollm2-135m", type=Path)
    parser.add_argument("--task", default="addition")
    parser.add_argument("--limit", type=int, default=40, help="knockout prompts")
    parser.add_argument("--gsm8k-n", type=int, default=16)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    torch.manual_seed(0)
    lm = load_model(args.results / "model", device=args.device, dtype=args.dtype)
    print(f"{lm.device}, {lm.dtype}, {torch.get_num_threads()} threads")

    pairs = addition_pairs(lm.tokenizer, 16)
    answers = torch.tensor(pairs["answer_token_id"].to_numpy())
    cf, _ = collect(lm, list(pairs["cf_prompt"]), answers, 16)
    layers = list(range(lm.n_layers))
    compare("total", lambda: total_logits(lm, list(pairs["prompt"]), answers, cf, layers, batch_size=16),
            lambda a, b: torch.equal(a.logit_p, b.logit_p) and torch.equal(a.logit_o, b.logit_o))

    acts = load_file(str(args.results / f"activations/{args.task}.safetensors"))
    means = AlignedMean(acts["cf_mean_heads"], acts["cf_mean_mlps"])
    ko = pd.read_parquet(args.results / f"pairs/{args.task}.parquet").head(args.limit)
    node_sets = knockout_node_sets(pd.read_parquet(args.results / f"effects/{args.task}.parquet"),
                                   pd.read_parquet(args.results / f"key_components/{args.task}.parquet"),
                                   config["ablation"], n_layers=lm.n_layers, n_heads=lm.n_heads,
                                   seed=config["seed"])
    compare("knockout", lambda: greedy_end_sets(
        lm, list(ko["prompt"]), [s[3] for s in node_sets], means=means, max_new_tokens=answer_tokens(lm.tokenizer,
                                                                                                     ko["answer"]),
        mlp_sets=[s[4] for s in node_sets], batch_size=config["compute"]["batch_size"], copies_per_forward=256,
        settled=settled_number(lm.tokenizer)).tokens, torch.equal)

    ev = config["evaluation"]
    shots = datasets.few_shot_examples(datasets.load_gsm8k(ROOT / config["finetune"]["data"]["file"]), ev["n_shots"],
                                 config["seed"])
    items = datasets.subsample(datasets.load_gsm8k(ROOT / ev["gsm8k"]["file"]), args.gsm8k_n, config["seed"])
    prompts = math_prompts(items.drop(columns=["solution"], errors="ignore"), shots, ev["style"], lm.tokenizer)
    compare("evaluate", lambda: generate_texts(lm, prompts["prompt"], ev["gsm8k"]["max_new_tokens"], ev["batch_size"],
                                               stop_strings=MATH_STOP_STRINGS, progress=None),
            lambda a, b: a == b)


if __name__ == "__main__":
    main()
