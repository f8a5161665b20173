"""Path patching of head -> MLP edges at END: how much of a head's effect reaches the answer through each MLP.

An edge (sender head s of layer l_s, receiver MLP of layer r >= l_s) is patched in the sense of Wang et al.: the
sender's counterfactual change at END, delta = W_O[:, s] (z_cf - z_ref), enters ONLY the receiver MLP's input
(the residual stream entering its block, before its norm), and every node after that MLP keeps its reference
value. The change then reaches the logits only along sender -> MLP -> residual stream -> final norm ->
unembedding, so the patched final residual is the reference one plus the MLP's output change

    d_mlp = MLP(norm(x + delta)) - MLP(norm(x)),   x = the reference residual entering the MLP block at END,

and an MLP reads only its own position. Two implementations of the same quantity:

- `edge_logits`: the closed form above, for all senders, receivers and samples at once, from the captured
  reference and counterfactual END states (`patching.collect(mlp_inputs=True)`): one batched call of each
  receiver's norm and MLP per batch, in float32 whatever the model dtype (like `patching.direct_logits`, whose
  unpatched logit it shares).
- `reference_edge_logits`: one explicit hooked forward of the whole prompt per edge: a pre-hook adds delta to
  the input of the receiver's norm at END only, and every head and MLP of the later layers is overwritten at
  END with its reference value (`hooks.patch_end`). Slow and obviously correct; the closed form is tested
  against it.

An MLP in the sender's own layer counts: it reads the residual after that layer's attention block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from tqdm.auto import tqdm

from arithmech.intervention.hooks import hooks, patch_end
from arithmech.model.loading import LoadedModel
from arithmech.interp.patching import EndState, float_copy, float_norm, unembed_scores
from arithmech.data.arithmetic import encode
from arithmech.interp.nodes import Head


@dataclass
class EdgeLogits:
    """Answer logits, float32. logit_o: [n] unpatched; logit_p: [n, n_senders, n_receivers] with the edge
    sender -> receiver patched, NaN where the receiver MLP lies before the sender's layer."""

    logit_o: torch.Tensor
    logit_p: torch.Tensor


def _check(lm: LoadedModel, state: EndState, senders: Sequence[Head], receivers: Sequence[int]) -> None:
    if state.mlp_in is None:
        raise ValueError("edges need the residual entering each MLP block: collect(..., mlp_inputs=True)")
    for layer, head in senders:
        if not (0 <= layer < lm.n_layers and 0 <= head < lm.n_heads):
            raise ValueError(f"sender head ({layer}, {head}) out of range for {lm.n_layers} x {lm.n_heads} heads")
    for layer in receivers:
        if not 0 <= layer < lm.n_layers:
            raise ValueError(f"receiver MLP layer {layer} out of range for {lm.n_layers} layers")


def sender_deltas(lm: LoadedModel, ref: EndState, cf: EndState, senders: Sequence[Head], rows) -> torch.Tensor:
    """Each sender's residual-stream change at END, W_O[:, s] (z_cf - z_ref), float32 [len(rows), n_senders,
    d_model] (rows: the samples' indices)."""
    out = []
    for layer, head in senders:
        w = lm.o_proj(layer).weight.float().view(lm.d_model, lm.n_heads, lm.head_dim)[:, head]  # [d, head_dim]
        dz = cf.heads[rows, layer, head].float() - ref.heads[rows, layer, head].float()  # [b, head_dim]
        out.append(dz.to(w.device) @ w.T)  # o_proj's bias, if any, cancels in the difference
    return torch.stack(out, 1)


@torch.no_grad()
def edge_logits(lm: LoadedModel, ref: EndState, cf: EndState, answer_ids: torch.Tensor, senders: Sequence[Head],
                receivers: Sequence[int], *, batch_size: int = 64) -> EdgeLogits:
    """The closed form (module docstring) for every sender x receiver pair with receiver layer >= sender layer.
    ref, cf: END states of the same prompts' reference and counterfactual (ref with `mlp_in`)."""
    senders, receivers = [(int(l), int(h)) for l, h in senders], [int(r) for r in receivers]
    _check(lm, ref, senders, receivers)
    n = len(answer_ids)
    norm = float_norm(lm)
    dev = lm.final_norm.weight.device
    batches = [torch.arange(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    logit_o = torch.empty(n)
    for rows in batches:  # the same closed form at zero change (`patching.direct_logits`' logit_o)
        base, _ = unembed_scores(lm, norm(ref.resid[rows].to(dev, torch.float32)[:, None]), answer_ids[rows], None)
        logit_o[rows] = base[:, 0].cpu()
    logit_p = torch.full((n, len(senders), len(receivers)), float("nan"))
    for j, r in enumerate(receivers):
        live = [i for i, (l, _) in enumerate(senders) if l <= r]
        if not live:
            continue
        mlp_norm, mlp = float_copy(lm.mlp_norm(r)), float_copy(lm.mlp(r))  # one receiver's copy at a time
        for rows in batches:
            deltas = sender_deltas(lm, ref, cf, [senders[i] for i in live], rows).to(dev)  # [b, S_live, d]
            x = ref.mlp_in[rows, r].to(dev, torch.float32)[:, None]  # [b, 1, d]
            inputs = torch.cat([x, x + deltas], 1)  # [b, 1 + S_live, d]; column 0 unpatched
            out = mlp(mlp_norm(inputs))
            changed = ref.resid[rows].to(dev, torch.float32)[:, None] + (out[:, 1:] - out[:, :1])  # [b, S_live, d]
            scores, _ = unembed_scores(lm, norm(changed), answer_ids[rows], None)
            logit_p[rows[:, None], torch.tensor(live)[None], j] = scores.cpu()
        del mlp_norm, mlp
    return EdgeLogits(logit_o, logit_p)


@torch.no_grad()
def reference_edge_logits(lm: LoadedModel, texts: list[str], answer_ids: torch.Tensor, ref: EndState, cf: EndState,
                          senders: Sequence[Head], receivers: Sequence[int], *, batch_size: int = 16) -> EdgeLogits:
    """One hooked forward of the whole prompt per edge and batch (module docstring): the definition, for testing
    and benchmarking `edge_logits`. logit_o is the unhooked forward's answer logit."""
    senders, receivers = [(int(l), int(h)) for l, h in senders], [int(r) for r in receivers]
    _check(lm, ref, senders, receivers)
    n = len(texts)
    logit_o = torch.empty(n)
    logit_p = torch.full((n, len(senders), len(receivers)), float("nan"))
    for start in tqdm(range(0, n, batch_size), desc="reference edges", leave=False):
        enc = encode(lm.tokenizer, texts[start : start + batch_size], lm.device)
        rows = torch.arange(start, start + enc["input_ids"].shape[0])
        answers = answer_ids[rows].to(lm.device)

        def answer_logit() -> torch.Tensor:
            logits = lm.model(**enc, logits_to_keep=1).logits[:, -1].float()
            return logits.gather(1, answers[:, None])[:, 0].cpu()

        logit_o[rows] = answer_logit()
        deltas = sender_deltas(lm, ref, cf, senders, rows)  # [b, S, d]
        for j, r in enumerate(receivers):
            # every node of the later layers frozen at END to its reference value
            later = range(r + 1, lm.n_layers)
            all_heads = torch.ones(len(rows), lm.n_heads, dtype=torch.bool)
            frozen_heads = {l: (all_heads, ref.heads[rows, l]) for l in later}
            frozen_mlps = {l: (torch.ones(len(rows), dtype=torch.bool), ref.mlps[rows, l]) for l in later}
            for i, (layer, _) in enumerate(senders):
                if layer > r:
                    continue

                def add_delta(module, args, delta=deltas[:, i]):
                    x = args[0].clone()
                    x[:, -1] += delta.to(x.device, x.dtype)
                    return (x, *args[1:])

                with hooks(pre=[(lm.mlp_norm(r), add_delta)]), patch_end(lm, frozen_heads, frozen_mlps):
                    logit_p[rows, i, j] = answer_logit()
    return EdgeLogits(logit_o, logit_p)
