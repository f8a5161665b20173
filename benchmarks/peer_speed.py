"""Total-effect path patching at END against TransformerLens: the same numbers, each side timed in its own
process, the median of several repeats after a warm-up.

The quantity: for every attention head and MLP of the default model (SmolLM2-135M), the answer logit with
that node's output at END replaced by its value on the counterfactual prompt, everything downstream
recomputed (`patching.total_logits`), and from it the paper's relative effect per sample and node. The
peer computes it the way a TransformerLens user would: `TransformerBridge` around the same HF model (the
bridge switches it to eager attention), the counterfactual `hook_z` / `hook_mlp_out` values at END from
`run_with_cache`, then one `run_with_hooks` forward per node over the whole batch (left-padded, so END is
the last position) that overwrites that node at END.

The script runs each side in a fresh process of its own (`--side arithmech`, `--side transformerlens`),
which writes its timings and logits as JSON; neither side ever shares a process with the other's model.
Each side is timed from the prompts to the logits (the counterfactual forward included), after an untimed
warm-up:

  arithmech        `collect` + `total_logits` as the workflow runs them (SDPA attention), --repeats times.
                   After the timed repeats the same process computes it once more with eager attention,
                   the bridge's kernels, for the agreement check.
  TransformerLens  --peer-full complete runs (about 400 s each on 2 CPU cores), and --repeats estimates
                   from a sample: the unpatched and counterfactual forwards plus the forwards of
                   --peer-nodes random nodes, the node forwards scaled to all nodes. Every node costs
                   TransformerLens one full forward, so the sample's mean stands for all of them.

The TransformerLens median is over the complete runs when there are at least 3 of them, else over the
sampled estimates (the output says which). Before any time is printed, the logits of the timed runs are
compared: arithmech (eager) against the bridge's complete run, within --tolerance (a comparison that does
not compute the same numbers is not a speed comparison); the SDPA-vs-eager gap is printed beside it. Then
every repeat, the spread, the ratio of medians and whether the 50x target is met. TransformerLens is a
benchmark-only dependency (benchmarks/requirements-peer.txt, installed by `make peer-benchmark`).

Usage: python benchmarks/peer_speed.py [--model-dir results/smollm2-135m/model] [--samples 16]
       [--repeats 5] [--peer-full 1] [--peer-nodes 30]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from addition_prompts import addition_pairs, default_model_dir

from arithmech.data.arithmetic import encode
from arithmech.interp.patching import collect, nodes_of, total_logits
from arithmech.model.loading import LoadedModel, load_model, resolve_model_dir

ROOT = Path(__file__).resolve().parents[1]
TARGET = 50.0  # arithmech at least this many times faster than TransformerLens
SIDES = ("arithmech", "transformerlens")
SHARED = ("model_dir", "samples", "repeats", "peer_full", "peer_nodes")  # what a side's process is given


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=ROOT / "results/smollm2-135m/model", type=Path)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed repeats of arithmech, and sampled estimates of TransformerLens")
    parser.add_argument("--peer-full", type=int, default=1, help="complete timed runs of TransformerLens")
    parser.add_argument("--peer-nodes", type=int, default=30, help="nodes per sampled TransformerLens estimate")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest allowed |effect difference|")
    parser.add_argument("--side", choices=SIDES, help="time one side only, in this process")
    parser.add_argument("--out", type=Path, help="with --side: write its JSON here (default: print it)")
    return parser.parse_args(argv)


def side_command(args: argparse.Namespace, side: str, out: Path) -> list[str]:
    """The command that times `side` in a fresh process with this run's options, writing JSON to `out`."""
    command = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--out", str(out)]
    for name in SHARED:
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return command


def timed(fn):
    """(seconds, fn())."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def summary(times: list[float]) -> dict:
    """Median, min, max and the relative spread (max - min) / median of repeated timings."""
    median = statistics.median(times)
    return {"median": median, "min": min(times), "max": max(times), "spread": (max(times) - min(times)) / median}


def describe_times(times: list[float]) -> str:
    """Every repeat, then the median and the spread, on one line."""
    if len(times) == 1:
        return f"{times[0]:.2f} s"
    s = summary(times)
    return (f"{' '.join(f'{t:.2f}' for t in times)} s; median {s['median']:.2f} s, "
            f"spread {s['min']:.2f}-{s['max']:.2f} s ({100 * s['spread']:.1f}%)")


class Inputs:
    """What both sides compute from: the model, the addition prompts with their counterfactual twins, the
    answer token ids and every node (layer, head or None for the MLP) of every layer."""

    def __init__(self, model_dir: Path, n: int):
        torch.manual_seed(0)
        self.lm: LoadedModel = load_model(model_dir, device="cpu", dtype="float32")
        pairs = addition_pairs(self.lm.tokenizer, n)
        self.texts, self.cf_texts = list(pairs["prompt"]), list(pairs["cf_prompt"])
        self.answers = torch.tensor(pairs["answer_token_id"].to_numpy())
        self.tokens = [int(pairs["n_tokens"].min()), int(pairs["n_tokens"].max())]
        self.layers = list(range(self.lm.n_layers))
        self.nodes = nodes_of(self.lm, self.layers)

    def header(self) -> dict:
        return {"model": self.lm.describe(), "threads": torch.get_num_threads(), "samples": len(self.texts),
                "tokens": self.tokens, "nodes": len(self.nodes)}


# arithmech


def arithmech_logits(x: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(logit_o [samples], logit_p [samples, nodes]) as the workflow computes them."""
    n = len(x.texts)
    cf, _ = collect(x.lm, x.cf_texts, x.answers, n)
    out = total_logits(x.lm, x.texts, x.answers, cf, x.layers, batch_size=n)  # logit_o: its unpatched forward
    return out.logit_o, out.logit_p


def arithmech_side(args: argparse.Namespace) -> dict:
    """Warm-up, --repeats timed runs (SDPA), then one untimed eager run for the agreement check."""
    x = Inputs(args.model_dir, args.samples)
    result = {"side": "arithmech", **x.header(), "attention": x.lm.model.config._attn_implementation}
    result["warmup_s"], _ = timed(lambda: arithmech_logits(x))
    runs = [timed(lambda: arithmech_logits(x)) for _ in range(args.repeats)]
    result["repeats_s"] = [t for t, _ in runs]
    result["logits"] = as_lists(*runs[0][1])
    x.lm.model.set_attn_implementation("eager")  # the bridge's kernels
    result["eager_logits"] = as_lists(*arithmech_logits(x))
    return result


# TransformerLens


def hook_name(layer: int, head: int | None) -> str:
    return f"blocks.{layer}.attn.hook_z" if head is not None else f"blocks.{layer}.hook_mlp_out"


def answer_logits(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """[samples] the answer token's logit at END of [samples, seq, vocab] logits."""
    return logits[:, -1].float().gather(1, answers[:, None])[:, 0].cpu()


@torch.no_grad()
def peer_unpatched(bridge, x: Inputs):
    """The forwards every node shares: (encoded prompts, logit_o, the counterfactual END value of every
    hooked tensor, from `run_with_cache`)."""
    enc, cf_enc = (encode(x.lm.tokenizer, t, x.lm.device) for t in (x.texts, x.cf_texts))
    logit_o = answer_logits(bridge(enc["input_ids"], attention_mask=enc["attention_mask"]), x.answers)
    names = {hook_name(*node) for node in x.nodes}
    _, cache = bridge.run_with_cache(cf_enc["input_ids"], attention_mask=cf_enc["attention_mask"],
                                     names_filter=lambda name: name in names)
    return enc, logit_o, {name: cache[name][:, -1].clone() for name in names}


@torch.no_grad()
def peer_patched(bridge, x: Inputs, enc, cf_end: dict, node: tuple[int, int | None]) -> torch.Tensor:
    """[samples] answer logits of one hooked forward that overwrites `node` at END with its counterfactual
    value."""
    layer, head = node
    name = hook_name(layer, head)
    value, d = cf_end[name], x.lm.head_dim

    def patch(act, hook):
        act = act.clone()
        if head is None:
            act[:, -1] = value
        elif act.dim() == 4:  # [batch, pos, n_heads, d_head]
            act[:, -1, head] = value[:, head]
        else:  # [batch, pos, n_heads * d_head]
            act[:, -1, head * d : (head + 1) * d] = value[:, head * d : (head + 1) * d]
        return act

    logits = bridge.run_with_hooks(enc["input_ids"], attention_mask=enc["attention_mask"], fwd_hooks=[(name, patch)])
    return answer_logits(logits, x.answers)


def peer_logits(bridge, x: Inputs, nodes=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logit_o, logit_p [samples, nodes]): the unpatched forwards, then one hooked forward per node of
    `nodes` (default: every node)."""
    enc, logit_o, cf_end = peer_unpatched(bridge, x)
    return logit_o, torch.stack([peer_patched(bridge, x, enc, cf_end, node) for node in nodes or x.nodes], 1)


def peer_sampled_estimate(bridge, x: Inputs, k: int, seed: int) -> dict:
    """The unpatched forwards timed, and the forwards of k random nodes timed and scaled to every node."""
    sample = random.Random(seed).sample(x.nodes, k)
    fixed_s, (enc, _, cf_end) = timed(lambda: peer_unpatched(bridge, x))
    nodes_s, _ = timed(lambda: [peer_patched(bridge, x, enc, cf_end, node) for node in sample])
    return {"fixed_s": fixed_s, "nodes_s": nodes_s, "scaled_s": fixed_s + nodes_s * len(x.nodes) / k}


def transformerlens_side(args: argparse.Namespace) -> dict:
    """Warm-up (the unpatched forwards and two nodes' forwards), --peer-full complete timed runs, then
    --repeats sampled estimates."""
    from transformer_lens.model_bridge import TransformerBridge

    x = Inputs(args.model_dir, args.samples)
    bridge = TransformerBridge.boot_transformers(str(resolve_model_dir(args.model_dir)), hf_model=x.lm.model,
                                                 tokenizer=x.lm.tokenizer, device="cpu", dtype=torch.float32)
    result = {"side": "transformerlens", **x.header(), "attention": x.lm.model.config._attn_implementation}
    first_head, first_mlp = x.nodes[0], next(node for node in x.nodes if node[1] is None)
    result["warmup_s"], _ = timed(lambda: peer_logits(bridge, x, [first_head, first_mlp]))
    runs = [timed(lambda: peer_logits(bridge, x)) for _ in range(args.peer_full)]
    result["full_s"] = [t for t, _ in runs]
    result["logits"] = as_lists(*runs[0][1]) if runs else None
    k = min(args.peer_nodes, len(x.nodes))
    result["sample_nodes"] = k
    result["sampled"] = [peer_sampled_estimate(bridge, x, k, seed) for seed in range(args.repeats)]
    return result


# comparison


def as_lists(logit_o: torch.Tensor, logit_p: torch.Tensor) -> dict:
    return {"logit_o": logit_o.tolist(), "logit_p": logit_p.tolist()}


def effects(logits: dict) -> torch.Tensor:
    """[samples, nodes] relative effects (logit_p - logit_o) / logit_o."""
    logit_o, logit_p = torch.tensor(logits["logit_o"]), torch.tensor(logits["logit_p"])
    return (logit_p - logit_o[:, None]) / logit_o[:, None]


def check_agreement(ours: dict, peer: dict, tolerance: float) -> list[str]:
    """The agreement lines; raises SystemExit when arithmech (eager) and TransformerLens differ by more than
    `tolerance` in any effect, or when there is no complete TransformerLens run to compare."""
    if peer["logits"] is None:
        raise SystemExit("no complete TransformerLens run (--peer-full 0): nothing to check, no speed comparison")
    eager, sdpa, theirs = effects(ours["eager_logits"]), effects(ours["logits"]), effects(peer["logits"])
    gap = float((eager - theirs).abs().max())
    lines = [f"largest |effect difference| over {theirs.numel()} (sample, node) pairs, largest |effect| "
             f"{float(theirs.abs().max()):.3f}:",
             f"  arithmech (eager) vs TransformerLens: {gap:.2e}",
             f"  arithmech SDPA vs eager:              {float((sdpa - eager).abs().max()):.2e}"]
    if not gap <= tolerance:
        raise SystemExit("\n".join(lines) + f"\nthe two computations disagree (>{tolerance:g}): no speed comparison")
    return lines


def peer_median(peer: dict) -> tuple[str, float]:
    """(which timings, their median): the complete runs if there are at least 3, else the sampled estimates."""
    if len(peer["full_s"]) >= 3:
        return "complete runs", statistics.median(peer["full_s"])
    return "sampled estimates", statistics.median(e["scaled_s"] for e in peer["sampled"])


def timing_lines(ours: dict, peer: dict) -> list[str]:
    """Every repeat of both sides with its spread, the ratio of medians and the verdict on the target."""
    k, n = peer["sample_nodes"], peer["nodes"]
    ours_median = statistics.median(ours["repeats_s"])
    which, theirs_median = peer_median(peer)
    ratio = theirs_median / ours_median
    lines = [f"arithmech collect + total_logits ({ours['attention']}), warm-up {ours['warmup_s']:.2f} s, "
             f"{len(ours['repeats_s'])} repeats:",
             f"  {describe_times(ours['repeats_s'])}",
             f"TransformerLens, one hooked forward per node ({peer['attention']}), warm-up {peer['warmup_s']:.2f} s:"]
    if peer["full_s"]:
        lines += [f"  complete runs ({len(peer['full_s'])}): {describe_times(peer['full_s'])}"]
    lines += [f"  sampled estimates ({len(peer['sampled'])}; each: the unpatched and counterfactual forwards + "
              f"{k} random nodes' forwards x {n}/{k}):",
              f"  {describe_times([e['scaled_s'] for e in peer['sampled']])}",
              f"  (unpatched forwards {describe_times([e['fixed_s'] for e in peer['sampled']])})",
              f"ratio of medians, TransformerLens ({which}) / arithmech: {theirs_median:.2f} / {ours_median:.2f} s "
              f"= {ratio:.1f}x"]
    if which != "complete runs":
        lines += [f"  a complete run / arithmech median: {t / ours_median:.1f}x" for t in peer["full_s"]]
    lines += [f"target >= {TARGET:g}x: {'met' if ratio >= TARGET else 'NOT met'}"]
    return lines


def run_side(args: argparse.Namespace, side: str, folder: Path) -> dict:
    """Time `side` in a fresh process and read back its JSON."""
    out = folder / f"{side}.json"
    print(f"timing {side} in its own process ...", flush=True)
    subprocess.run(side_command(args, side, out), check=True)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.side:
        result = (arithmech_side if args.side == "arithmech" else transformerlens_side)(args)
        if args.out:
            args.out.write_text(json.dumps(result))
        else:
            print(json.dumps(result))
        return
    args.model_dir = default_model_dir(args.model_dir)
    with tempfile.TemporaryDirectory() as folder:
        ours, peer = (run_side(args, side, Path(folder)) for side in SIDES)
    agreement = check_agreement(ours, peer, args.tolerance)  # before any time is printed
    print(f"model {ours['model']}, threads {ours['threads']}")
    print(f"{ours['samples']} addition prompts of {ours['tokens'][0]}-{ours['tokens'][1]} tokens, "
          f"{ours['nodes']} nodes; each side in its own process")
    print("\n".join(agreement + timing_lines(ours, peer)))


if __name__ == "__main__":
    main()
