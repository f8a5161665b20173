"""Speed of the knockout's all-positions curve (`ablation.positions: all`), against the plain way, in one run.

Reference: what the rule did before 2026-11-23 (commit 90788cf), one greedy generation (`generation.greedy_generate`)
per node set and template inside `ablation.mean_ablate(..., "aligned")` with the template's counterfactual mean.
Fast path (`stages.validate.set_answers`): every set at once per template on `ablation.greedy_end_sets`
(positions "aligned"): the prefix the template's mean does not reach (with zero-shot counterfactuals, the
few-shot lines) runs once per batch, and answers stop once their score is decided. Both arms get the
rule's node sets and validation draw for one operator; the script checks that every set's first tokens and
full-answer scores are equal, and prints seconds per arm and the ratio.

Run after the identify stage (it reads the pairs, activations, effects and key components under results/).

Usage: python benchmarks/knockout_all_speed.py [--results results/smollm2-135m] [--task addition]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from safetensors.torch import load_file

from arithmech.data.answers import answer_tokens
from arithmech.data.arithmetic import split_pairs
from arithmech.data.datasets import subsample
from arithmech.interp.ablation import ablation_hooks, answers_correct, set_answers
from arithmech.interp.activations import cache_means
from arithmech.interp.nodes import knockout_node_sets
from arithmech.intervention.generation import greedy_generate
from arithmech.intervention.means import GroupedMean
from arithmech.model.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def reference_answers(lm, texts, template_ids, head_sets, mlp_sets, grouped: GroupedMean, max_new_tokens: int,
                      batch_size: int) -> torch.Tensor:
    """[n_sets, n, max_new_tokens]: one plain ablated generation per set and template."""
    out = torch.empty(len(head_sets), len(texts), max_new_tokens, dtype=torch.long)
    for t in np.unique(template_ids):
        rows = np.flatnonzero(template_ids == t)
        part = [texts[i] for i in rows]
        for s, (hs, ms) in enumerate(zip(head_sets, mlp_sets)):
            hooks = ablation_hooks(lm, hs, ms, grouped.group(int(t)), positions="aligned")
            out[s, torch.as_tensor(rows)] = greedy_generate(lm, part, max_new_tokens, batch_size, hooks=hooks)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=ROOT / "results/smollm2-135m", type=Path)
    parser.add_argument("--task", default="addition")
    args = parser.parse_args()

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    ablation, seed, batch_size = config["ablation"], config["seed"], config["compute"]["batch_size"]
    torch.manual_seed(0)
    lm = load_model(args.results / "model", device="cpu")
    print(f"{lm.device}, {lm.dtype}, {torch.get_num_threads()} threads, batch {batch_size}")
    pairs_path = args.results / f"pairs/{args.task}.parquet"
    pairs = split_pairs(pd.read_parquet(pairs_path), "validation", str(pairs_path))
    scored = subsample(pairs, ablation["all_positions_samples"], seed).reset_index(drop=True)
    sets = knockout_node_sets(pd.read_parquet(args.results / f"effects/{args.task}.parquet"),
                              pd.read_parquet(args.results / f"key_components/{args.task}.parquet"), ablation,
                              n_layers=lm.n_layers, n_heads=lm.n_heads, seed=seed, positions="all")
    head_sets, mlp_sets = [s[3] for s in sets], [s[4] for s in sets]
    cache = load_file(str(args.results / f"activations/{args.task}.safetensors"))
    grouped = GroupedMean(cache["cf_template_heads"], cache["cf_template_mlps"], cache["cf_template_counts"])
    texts, templates = list(scored["prompt"]), scored["template_id"].to_numpy()
    n_new = answer_tokens(lm.tokenizer, scored["answer"])

    start = time.perf_counter()
    ref = reference_answers(lm, texts, templates, head_sets, mlp_sets, grouped, n_new, batch_size)
    t_ref = time.perf_counter() - start
    start = time.perf_counter()
    fast = set_answers(lm, texts, list(scored["answer"]), template_ids=templates, head_sets=head_sets,
                       mlp_sets=mlp_sets, means=cache_means(cache, "all"), positions="all", max_new_tokens=n_new,
                       batch_size=batch_size, copies=256).tokens
    t_fast = time.perf_counter() - start
    same_full = (answers_correct(lm.tokenizer, ref, scored["answer"])
                 == answers_correct(lm.tokenizer, fast, scored["answer"])).all()
    if not (same_full and torch.equal(ref[..., 0], fast[..., 0])):
        raise SystemExit("the two arms' scores differ")
    print(f"knockout {args.task}, positions all: {len(head_sets)} sets x {len(texts)} prompts x {n_new} steps: "
          f"reference {t_ref:.1f} s, fast path {t_fast:.1f} s, ratio {t_ref / t_fast:.2f}x (same scores)")


if __name__ == "__main__":
    main()
