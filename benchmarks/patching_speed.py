"""Speed of the patching fast paths against the per-node reference, measured in one run.

Prints four ratios on the default model (SmolLM2-135M, CPU fp32 unless a GPU is present):
  1. direct mode (2 captured forwards + closed form for every node) vs the per-node reference
     (one full hooked forward per node)                                              target >= 50x
  2. total mode (prefix once + END-only patched copies) vs the per-node reference    target >= 10x
  3. direct mode vs the two plain forwards (reference + counterfactual) it cannot avoid  target <= 1.5x
  4. total mode vs the same two plain forwards                                          target <= 3x
The per-node reference costs one full forward per node by construction, so it is timed on
--reference-layers layers and scaled to all nodes (printed as such); everything else runs on all nodes.

Usage: python benchmarks/patching_speed.py [--model-dir results/smollm2-135m/model] [--samples 16]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from addition_prompts import addition_pairs, default_model_dir

from arithmech.data.arithmetic import encode
from arithmech.interp.patching import collect, direct_logits, nodes_of, reference_logits, total_logits
from arithmech.model.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, repeats: int = 1):
    """Best wall time of `repeats` calls (the first call also warms up) and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=ROOT / "results/smollm2-135m/model", type=Path)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--reference-layers", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    args.model_dir = default_model_dir(args.model_dir)
    torch.manual_seed(0)
    lm = load_model(args.model_dir, device=args.device, dtype=args.dtype)
    pairs = addition_pairs(lm.tokenizer, args.samples)
    texts, cf_texts = list(pairs["prompt"]), list(pairs["cf_prompt"])
    answers = torch.tensor(pairs["answer_token_id"].to_numpy())
    batch = args.samples  # one batch: the comparison is per forward, not about batching
    all_layers = list(range(lm.n_layers))
    n_nodes = len(nodes_of(lm, all_layers))
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    print(f"model {lm.describe()}, device {lm.device}, dtype {lm.dtype}, threads {torch.get_num_threads()}")
    print(f"{args.samples} addition prompts of {pairs['n_tokens'].min()}-{pairs['n_tokens'].max()} tokens, "
          f"{n_nodes} nodes")

    @torch.no_grad()
    def plain():
        for t in (texts, cf_texts):
            lm.model(**encode(lm.tokenizer, t, lm.device), logits_to_keep=1)
        sync()

    def direct():
        ref, _ = collect(lm, texts, answers, batch)
        cf, _ = collect(lm, cf_texts, answers, batch)
        out = direct_logits(lm, ref, cf, answers, all_layers, batch_size=batch)
        sync()
        return ref, cf, out

    t_plain, _ = timed(plain, repeats=3)
    t_direct, (ref, cf, _) = timed(direct, repeats=3)
    t_total, _ = timed(lambda: (total_logits(lm, texts, answers, cf, all_layers, batch_size=batch), sync()))
    ref_layers = all_layers[-args.reference_layers:]
    ref_nodes = len(nodes_of(lm, ref_layers))
    t_ref_d, _ = timed(lambda: (reference_logits(lm, texts, answers, ref, cf, layers=ref_layers, mode="direct",
                                                 batch_size=batch), sync()))
    t_ref_t, _ = timed(lambda: (reference_logits(lm, texts, answers, ref, cf, layers=ref_layers, mode="total",
                                                 batch_size=batch), sync()))
    scale = n_nodes / ref_nodes
    t_ref_direct, t_ref_total = t_ref_d * scale, t_ref_t * scale

    print(f"two plain forwards                 {t_plain:8.3f} s")
    print(f"direct mode, all nodes             {t_direct:8.3f} s")
    print(f"total mode, all nodes              {t_total:8.3f} s")
    print(f"reference direct, {ref_nodes:3d} nodes         {t_ref_d:8.3f} s "
          f"-> all {n_nodes} nodes {t_ref_direct:8.1f} s")
    print(f"reference total,  {ref_nodes:3d} nodes         {t_ref_t:8.3f} s "
          f"-> all {n_nodes} nodes {t_ref_total:8.1f} s")
    print()
    print(f"direct vs per-node reference:  {t_ref_direct / t_direct:7.1f}x faster   (target >= 50x)")
    print(f"total  vs per-node reference:  {t_ref_total / t_total:7.1f}x faster   (target >= 10x)")
    print(f"direct vs two plain forwards:  {t_direct / t_plain:7.2f}x the time (target <= 1.5x)")
    print(f"total  vs two plain forwards:  {t_total / t_plain:7.2f}x the time (target <= 3x)")


if __name__ == "__main__":
    main()
