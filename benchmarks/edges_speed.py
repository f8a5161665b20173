"""Speed of the head -> MLP edge closed form (`edges.edge_logits`) against its hooked reference
(`edges.reference_edge_logits`, one full forward of the prompt per edge), measured in one run on the default
model (SmolLM2-135M, CPU fp32 unless a GPU is present). Target: the closed form at least 50x faster.

Both compute the same edges: --senders heads (spread over the layers) into every MLP of their layer or later, on
--samples addition prompts, one batch. The reference is timed on --reference-senders of the senders and scaled to
all edges (printed as such: its cost is one forward per edge by construction); the closed form runs on all of
them. The closed form's time includes neither of the two captured forwards it reads (reference and
counterfactual), which the reference needs too; they are timed and printed beside it. The two agree (max
difference printed) on the edges both computed.

Usage: python benchmarks/edges_speed.py [--model-dir results/smollm2-135m/model] [--samples 16] [--senders 24]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from addition_prompts import addition_pairs, default_model_dir

from arithmech.interp.edges import edge_logits, reference_edge_logits
from arithmech.interp.patching import collect
from arithmech.model.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, sync, repeats: int = 1):
    """Best wall time of `repeats` calls and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        out = fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=ROOT / "results/smollm2-135m/model", type=Path)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--senders", type=int, default=24)
    parser.add_argument("--reference-senders", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()

    lm = load_model(default_model_dir(args.model_dir), device=args.device, dtype=args.dtype)
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    pairs = addition_pairs(lm.tokenizer, args.samples)
    texts, answers = list(pairs["prompt"]), torch.tensor(pairs["answer_token_id"].to_numpy())
    first = lm.n_layers // 3  # senders from a third of the way up, spread over layers and heads
    senders = [(first + (i * (lm.n_layers - first)) // args.senders, (5 * i) % lm.n_heads) for i in range(args.senders)]
    receivers = list(range(first, lm.n_layers))
    n_edges = sum(r >= l for l, _ in senders for r in receivers)
    print(f"model {lm.describe()['n_parameters']:,} parameters, {lm.n_layers} layers; device {lm.device}, dtype "
          f"{lm.dtype}, threads {torch.get_num_threads()}; {args.samples} prompts, {len(senders)} senders, "
          f"{n_edges} edges")

    t_collect, (ref, cf) = timed(lambda: (collect(lm, texts, answers, args.samples, mlp_inputs=True)[0],
                                          collect(lm, list(pairs["cf_prompt"]), answers, args.samples,
                                                  mlp_inputs=True)[0]), sync)
    edge_logits(lm, ref, cf, answers, senders[:1], receivers[-1:])  # warm-up
    t_fast, fast = timed(lambda: edge_logits(lm, ref, cf, answers, senders, receivers, batch_size=args.samples),
                         sync, repeats=3)
    few = senders[: args.reference_senders]
    n_few = sum(r >= l for l, _ in few for r in receivers)
    t_ref, slow = timed(lambda: reference_edge_logits(lm, texts, answers, ref, cf, few, receivers,
                                                      batch_size=args.samples), sync)
    t_ref_all = t_ref / n_few * n_edges
    live = ~slow.logit_p.isnan()
    diff = (fast.logit_p[:, : len(few)][live] - slow.logit_p[live]).abs().max().item()
    print(f"two captured forwards (reference + counterfactual, with MLP inputs): {t_collect:.3f} s")
    print(f"closed form, all {n_edges} edges: {t_fast:.4f} s (best of 3)")
    print(f"hooked reference: {t_ref:.2f} s for {n_few} edges, scaled to {n_edges} edges: {t_ref_all:.1f} s")
    print(f"ratio reference / closed form: {t_ref_all / t_fast:.0f}x (target >= 50x); "
          f"with the two forwards counted on the closed form's side: {t_ref_all / (t_fast + t_collect):.0f}x")
    print(f"max |closed form - reference| over the {int(live.sum())} shared edge values: {diff:.2e}")


if __name__ == "__main__":
    main()
