"""Total-effect path patching at END against TransformerLens: the same numbers, timed in one run.

The quantity: for every attention head and MLP of the default model (SmolLM2-135M), the answer logit with
that node's output at END replaced by its value on the counterfactual prompt, everything downstream
recomputed (`patching.total_logits`), and from it the paper's relative effect per sample and node. The
peer computes it the way a TransformerLens user would: `TransformerBridge` around a second copy of the same
HF model (`hf_model=`; the bridge replaces its modules in place and switches it to eager attention, so it
cannot share arithmech's copy), the counterfactual `hook_z` / `hook_mlp_out` values at END from
`run_with_cache`, then one `run_with_hooks` forward per node over the whole batch (left-padded, so END is
the last position) that overwrites that node at END.

Both sides are timed from the prompts to the logits (the counterfactual forward included). arithmech runs
as the workflow runs it (SDPA attention). The numbers are then compared on the same kernels: arithmech
again with eager attention against the bridge, within --tolerance, before any time is printed (a
comparison that does not compute the same numbers is not a speed comparison); the SDPA-vs-eager gap is
printed beside it. TransformerLens is a benchmark-only dependency (benchmarks/requirements-peer.txt,
installed by `make peer-benchmark`).

Usage: python benchmarks/peer_speed.py [--model-dir results/smollm2-135m/model] [--samples 16]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from addition_prompts import addition_pairs, default_model_dir
from arithmech.models import load_model
from arithmech.patching import collect, nodes_of, total_logits
from arithmech.prompts import encode

ROOT = Path(__file__).resolve().parents[1]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


@torch.no_grad()
def peer_total_logits(bridge, lm, texts, cf_texts, answers, nodes) -> torch.Tensor:
    """[n_samples, n_nodes] answer logits, one hooked TransformerLens forward per node."""
    enc, cf_enc = (encode(lm.tokenizer, t, lm.device) for t in (texts, cf_texts))
    names = [f"blocks.{l}.attn.hook_z" if h is not None else f"blocks.{l}.hook_mlp_out" for l, h in nodes]
    _, cache = bridge.run_with_cache(cf_enc["input_ids"], attention_mask=cf_enc["attention_mask"],
                                     names_filter=lambda name: name in set(names))
    cf_end = {name: cache[name][:, -1].clone() for name in set(names)}  # END values of every hooked tensor
    columns = []
    for (layer, head), name in zip(nodes, names):
        value = cf_end[name]

        def patch(act, hook, head=head, value=value):
            act = act.clone()
            if head is None:
                act[:, -1] = value
            elif act.dim() == 4:  # [batch, pos, n_heads, d_head]
                act[:, -1, head] = value[:, head]
            else:  # [batch, pos, n_heads * d_head]
                d = lm.head_dim
                act[:, -1, head * d : (head + 1) * d] = value[:, head * d : (head + 1) * d]
            return act

        logits = bridge.run_with_hooks(enc["input_ids"], attention_mask=enc["attention_mask"],
                                       fwd_hooks=[(name, patch)])
        columns.append(logits[:, -1].float().gather(1, answers[:, None])[:, 0].cpu())
    return torch.stack(columns, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=ROOT / "results/smollm2-135m/model", type=Path)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest allowed |effect difference|")
    args = parser.parse_args()

    from transformer_lens.model_bridge import TransformerBridge

    args.model_dir = default_model_dir(args.model_dir)
    torch.manual_seed(0)
    lm = load_model(args.model_dir, device="cpu", dtype="float32")
    pairs = addition_pairs(lm.tokenizer, args.samples)
    texts, cf_texts = list(pairs["prompt"]), list(pairs["cf_prompt"])
    answers = torch.tensor(pairs["answer_token_id"].to_numpy())
    layers = list(range(lm.n_layers))
    nodes = nodes_of(lm, layers)
    n = args.samples
    peer_model = load_model(args.model_dir, device="cpu", dtype="float32").model  # the bridge's own copy
    bridge = TransformerBridge.boot_transformers(str(args.model_dir), hf_model=peer_model, tokenizer=lm.tokenizer,
                                                 device="cpu", dtype=torch.float32)
    print(f"model {lm.describe()}, arithmech attention {lm.model.config._attn_implementation}, "
          f"bridge attention {peer_model.config._attn_implementation}, threads {torch.get_num_threads()}")
    print(f"{n} addition prompts of {pairs['n_tokens'].min()}-{pairs['n_tokens'].max()} tokens, {len(nodes)} nodes")

    def ours():
        cf, _ = collect(lm, cf_texts, answers, n)
        out = total_logits(lm, texts, answers, cf, layers, batch_size=n)  # logit_o from its own unpatched END forward
        return out.logit_o, out.logit_p

    @torch.no_grad()
    def peer():
        enc = encode(lm.tokenizer, texts, lm.device)
        logit_o = bridge(enc["input_ids"], attention_mask=enc["attention_mask"])[:, -1].float()
        logit_o = logit_o.gather(1, answers[:, None])[:, 0].cpu()
        return logit_o, peer_total_logits(bridge, lm, texts, cf_texts, answers, nodes)

    def effects(logit_o, logit_p):
        return (logit_p - logit_o[:, None]) / logit_o[:, None]

    t_ours, (o_ours, p_ours) = timed(ours)
    t_peer, (o_peer, p_peer) = timed(peer)
    lm.model.set_attn_implementation("eager")  # the bridge's kernels, for the agreement check
    effect_eager = effects(*ours())
    effect_ours, effect_peer = effects(o_ours, p_ours), effects(o_peer, p_peer)
    gap = float((effect_eager - effect_peer).abs().max())
    print(f"largest |effect difference| over {effect_peer.numel()} (sample, node) pairs, largest |effect| "
          f"{float(effect_peer.abs().max()):.3f}:")
    print(f"  arithmech (eager) vs TransformerLens: {gap:.2e}")
    print(f"  arithmech SDPA vs eager:              {float((effect_ours - effect_eager).abs().max()):.2e}")
    if not gap <= args.tolerance:
        raise SystemExit(f"the two computations disagree (>{args.tolerance:g}): no speed comparison")
    print(f"arithmech total_logits                {t_ours:8.2f} s")
    print(f"TransformerLens, one forward per node {t_peer:8.2f} s")
    print(f"arithmech is {t_peer / t_ours:.1f}x faster (target >= 50x)")


if __name__ == "__main__":
    main()
