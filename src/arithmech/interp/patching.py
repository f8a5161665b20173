"""Path patching at the END position: how much each attention head and MLP carries the operator.

For every node (a query head or an MLP) the counterfactual output at END replaces the reference output,
and the ground-truth answer logit is read off. Three implementations of the same quantity:

- `direct_logits` (the paper's Algorithm 1, every other node keeps its reference value): then the only
  path from the node to the logits is the residual stream, so the patched final residual is the
  reference one plus the node's change, delta = W_O[:, head] (z_cf - z_ref) (or mlp_cf - mlp_ref) in the
  Llama block (`head_deltas`, `mlp_deltas`: through the norm between them and the residual stream where
  the architecture has one, `Architecture.attn_out_norm` / `mlp_out_norm`, exact as well). That
  is pushed through the model's own final norm and the answer's unembedding row, for all heads and
  samples at once, from two captured forwards. The closed form runs in float32 whatever the model dtype,
  and the unpatched logit_o is the same closed form at zero change, not the forward's own logit.
- `total_logits` (downstream recomputed): an END-position patch changes nothing at earlier positions, so
  the reference prefix's keys and values are reused and only the END token is recomputed, for many
  patched copies per forward; and a patch at layer l changes nothing below l, so each copy runs END
  through layers l..L-1 only, from the reference residual entering layer l.
- `reference_logits`: one explicit hooked forward of the whole prompt per node, in either mode. Slow and
  obviously correct; the fast paths are tested against it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import NamedTuple

import pandas as pd
import torch
from tqdm.auto import tqdm

from arithmech.data.arithmetic import encode
from arithmech.intervention.batching import COPIES_PER_FORWARD
from arithmech.intervention.hooks import capture, patch_end
from arithmech.intervention.kvcache import PrefixCopies, end_copies, prefix_cache
from arithmech.intervention.means import GroupedMean
from arithmech.model.loading import LoadedModel


@dataclass
class EndState:
    """Node outputs at END for a set of prompts (n = number of prompts).

    heads:  [n, n_layers, n_heads, head_dim]   per-head input of o_proj
    mlps:   [n, n_layers, d_model]             MLP outputs
    resid:  [n, d_model]                       final residual (input of the final norm)
    logits: [n]                                logit of the answer token
    logprobs: [n]                              log-probability of the answer token
    predicted: [n]                             argmax token id
    """

    heads: torch.Tensor
    mlps: torch.Tensor
    resid: torch.Tensor
    logits: torch.Tensor
    logprobs: torch.Tensor
    predicted: torch.Tensor


def nodes_of(lm: LoadedModel, layers: list[int]) -> list[tuple[int, int | None]]:
    """Node order used everywhere: per layer, heads 0..H-1 then the MLP (head None)."""
    return [(l, h) for l in layers for h in [*range(lm.n_heads), None]]


@torch.no_grad()
def collect(
    lm: LoadedModel,
    texts: list[str],
    answer_ids: torch.Tensor,
    batch_size: int,
    *,
    desc: str = "forward",
    groups: list[int] | None = None,
) -> tuple[EndState, GroupedMean | None]:
    """Run `texts` in left-padded batches and capture every node at END; and, with `groups` (one group id
    0..G-1 per text), each group's mean at every position its prompts reach (`GroupedMean`)."""
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in EndState.__dataclass_fields__}
    grouped = None  # per group: [heads sum [P, L, H, D], mlps sum [P, L, d], counts [P]], P growing
    for start in tqdm(range(0, len(texts), batch_size), desc=desc, leave=False):
        enc = encode(lm.tokenizer, texts[start : start + batch_size], lm.device)
        answers = answer_ids[start : start + batch_size].to(lm.device)
        with capture(lm, end_only=groups is None) as cap:
            logits = lm.model(**enc, logits_to_keep=1).logits[:, -1].float()
        heads, mlps, resid = cap.stacked_heads(), cap.stacked_mlps(), cap.resid_final
        if groups is not None:
            grouped = _add_group_sums(grouped, heads, mlps, enc["attention_mask"], groups[start : start + batch_size])
            heads, mlps, resid = heads[:, -1], mlps[:, -1], resid[:, -1]
        logprobs = logits.log_softmax(-1)
        parts["heads"].append(heads.cpu())
        parts["mlps"].append(mlps.cpu())
        parts["resid"].append(resid.cpu())
        parts["logits"].append(logits.gather(1, answers[:, None])[:, 0].cpu())
        parts["logprobs"].append(logprobs.gather(1, answers[:, None])[:, 0].cpu())
        parts["predicted"].append(logits.argmax(-1).cpu())
    state = EndState(**{k: torch.cat(v) for k, v in parts.items()})
    return state, (_group_means(grouped, max(groups) + 1) if groups is not None else None)


def _add_group_sums(grouped, heads, mlps, mask, groups):
    """Add one batch (heads [B, S, L, H, D], mlps [B, S, L, d], left-padded mask [B, S]) to the per-group
    sums, END-aligned: offset j is position S-1-j; padding adds nothing."""
    grouped = grouped or {}
    valid = mask.flip(1).float()  # [B, S], offset order
    h = heads.flip(1).float() * valid[..., None, None, None]
    m = mlps.flip(1).float() * valid[..., None, None]
    for g in sorted(set(groups)):
        rows = torch.tensor([i for i, x in enumerate(groups) if x == g], device=h.device)
        add = [h[rows].sum(0).cpu(), m[rows].sum(0).cpu(), valid[rows].sum(0).cpu()]
        old = grouped.get(g)
        if old is not None:  # grow both to the longer length, then add
            n = max(old[2].shape[0], add[2].shape[0])
            pad = lambda t: torch.nn.functional.pad(t, (0, 0) * (t.dim() - 1) + (0, n - t.shape[0]))  # noqa: E731
            add = [pad(a) + pad(o) for a, o in zip(add, old)]
        grouped[g] = add
    return grouped


def _group_means(grouped, n_groups: int) -> GroupedMean:
    """GroupedMean from per-group sums, padded to the longest group (count 0 past a group's length)."""
    n = max(c.shape[0] for _, _, c in grouped.values())
    some = next(iter(grouped.values()))
    heads = torch.zeros(n_groups, n, *some[0].shape[1:])
    mlps = torch.zeros(n_groups, n, *some[1].shape[1:])
    counts = torch.zeros(n_groups, n)
    for g, (h, m, c) in grouped.items():
        k = c.shape[0]
        counts[g, :k] = c
        heads[g, :k] = h / c.clamp_min(1)[:, None, None, None]
        mlps[g, :k] = m / c.clamp_min(1)[:, None, None]
    return GroupedMean(heads, mlps, counts)


class PatchedLogits(NamedTuple):
    """Answer scores, float32, unpatched (o) and with one node at a time patched (p, nodes in `nodes_of`
    order). logit_o, logprob_o: [n_samples]; logit_p, logprob_p: [n_samples, n_nodes]. The log-probs are
    None unless asked for. logit_o comes from the same computation as logit_p at zero change, so their
    difference holds no rounding of a different path."""

    logit_o: torch.Tensor
    logit_p: torch.Tensor
    logprob_o: torch.Tensor | None
    logprob_p: torch.Tensor | None


def head_deltas(lm: LoadedModel, layer: int, z_ref: torch.Tensor, z_cf: torch.Tensor,
                heads: list[int] | None = None) -> torch.Tensor:
    """Residual-stream change when one head of `layer` at a time (`heads`, default all) takes its value in z_cf
    instead of z_ref (both [B, H, head_dim], every other head at z_ref) -> [B, len(heads), d_model], float32.
    In the Llama block that is W_O[:, h] (z_cf - z_ref)[h] (o_proj's bias, if any, cancels in a difference);
    with a norm between o_proj and the residual stream (`LoadedModel.attn_out_norm`) it is that norm of o_proj's
    output with the head changed minus that norm of the reference output, through a float32 copy of the norm."""
    heads = list(range(lm.n_heads)) if heads is None else heads
    w = lm.o_proj(layer).weight.float().view(lm.d_model, lm.n_heads, lm.head_dim)[:, heads]  # [d, k, head_dim]
    z_ref = z_ref.to(w.device, torch.float32)
    linear = torch.einsum("bhk,dhk->bhd", z_cf.to(w.device, torch.float32)[:, heads] - z_ref[:, heads], w)
    post = lm.attn_out_norm(layer)
    if post is None:
        return linear
    out_ref = torch.nn.functional.linear(z_ref.flatten(1), lm.o_proj(layer).weight.float(),
                                         None if lm.o_proj(layer).bias is None else lm.o_proj(layer).bias.float())
    post = float_copy(post)
    return post(out_ref[:, None] + linear) - post(out_ref)[:, None]


def mlp_deltas(lm: LoadedModel, layer: int, out_ref: torch.Tensor, out_cf: torch.Tensor) -> torch.Tensor:
    """Residual-stream change when `layer`'s MLP outputs out_cf instead of out_ref ([..., d_model]), float32: their
    difference in the Llama block, else through a float32 copy of the norm after the MLP
    (`LoadedModel.mlp_out_norm`)."""
    out_ref, out_cf = out_ref.float(), out_cf.float()
    post = lm.mlp_out_norm(layer)
    if post is None:
        return out_cf - out_ref
    post = float_copy(post).to(out_ref.device)
    return post(out_cf) - post(out_ref)


def float_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A float32 copy of one of the model's modules (the model is left as it is): a closed form then rounds
    nothing to the model dtype. A norm is d_model numbers and one MLP a few percent of the model, so a copy
    per call costs little."""
    module = copy.deepcopy(module).float()
    if hasattr(module, "_hf_hook"):  # a model spread over GPUs: the copy stays on its device, without the hook
        from accelerate.hooks import remove_hook_from_module

        remove_hook_from_module(module, recurse=True)
    return module


def float_norm(lm: LoadedModel) -> torch.nn.Module:
    """A float32 copy of the model's final norm."""
    return float_copy(lm.final_norm)


def _float_unembed(lm: LoadedModel, with_logprobs: bool) -> torch.Tensor | None:
    """The whole unembedding [V, d] in float32 when log-probs are wanted (made once per call), else None."""
    return lm.unembed.weight.float() if with_logprobs else None


def unembed_scores(lm: LoadedModel, normed: torch.Tensor, answer_ids: torch.Tensor, full: torch.Tensor | None):
    """Unembedding of final-normed residuals [B, N, d] in float32 -> answer logits [B, N] (and log-probs
    [B, N] when `full`, the float32 unembedding of `_float_unembed`, is given; else None). Without it only
    the answers' rows of the unembedding are read, not the whole vocabulary."""
    unembed = lm.unembed
    normed, answer_ids = normed.to(unembed.weight.device, torch.float32), answer_ids.to(unembed.weight.device)
    bias = unembed.bias.float() if unembed.bias is not None else None
    if full is None:
        rows = unembed.weight[answer_ids].float()  # [B, d]
        logits = torch.einsum("bnd,bd->bn", normed, rows)
        if bias is not None:
            logits = logits + bias[answer_ids][:, None]
        return logits, None
    scores = torch.nn.functional.linear(normed, full, bias)  # [B, N, V]
    index = answer_ids[:, None, None].expand(-1, scores.shape[1], 1)
    return scores.gather(-1, index)[..., 0], scores.log_softmax(-1).gather(-1, index)[..., 0]


@torch.no_grad()
def direct_logits(
    lm: LoadedModel,
    ref: EndState,
    cf: EndState,
    answer_ids: torch.Tensor,
    layers: list[int],
    *,
    batch_size: int = 64,
    with_logprobs: bool = False,
) -> PatchedLogits:
    """Answer logit (and log-prob) with one node at a time patched to its counterfactual END value and all
    other nodes frozen at their reference values, and unpatched (logit_o: the same closed form at zero
    change). All in float32 whatever the model dtype: in bf16 a logit near 20 is rounded to 0.125, more
    than most effects."""
    norm, full = float_norm(lm), _float_unembed(lm, with_logprobs)
    dev = lm.final_norm.weight.device
    out_logits, out_lp = [], []
    for start in range(0, len(answer_ids), batch_size):
        sl = slice(start, start + batch_size)
        deltas = []
        for layer in layers:
            deltas.append(head_deltas(lm, layer, ref.heads[sl, layer], cf.heads[sl, layer]).to(dev))
            deltas.append(mlp_deltas(lm, layer, ref.mlps[sl, layer], cf.mlps[sl, layer]).to(dev)[:, None])
        base = ref.resid[sl].to(dev, torch.float32)[:, None]  # [B, 1, d]
        resid = torch.cat([base, base + torch.cat(deltas, 1)], 1)  # [B, 1 + N, d]; column 0 unpatched
        logits, lp = unembed_scores(lm, norm(resid), answer_ids[sl], full)
        out_logits.append(logits.cpu())
        out_lp.append(lp.cpu() if lp is not None else None)
    return _split_unpatched(torch.cat(out_logits), torch.cat(out_lp) if with_logprobs else None)


def _split_unpatched(logits: torch.Tensor, lp: torch.Tensor | None) -> PatchedLogits:
    """Scores [n, 1 + n_nodes] with the unpatched one in column 0 (log-probs likewise, or None) -> PatchedLogits."""
    if lp is None:
        return PatchedLogits(logits[:, 0], logits[:, 1:], None, None)
    return PatchedLogits(logits[:, 0], logits[:, 1:], lp[:, 0], lp[:, 1:])


def _node_patches(lm, nodes, values: EndState, rows: torch.Tensor, base: EndState | None):
    """Patches for `patch_end` in which row i patches node nodes[i % len(nodes)] with `values`.

    rows: [R] index of the sample each row belongs to. With `base`, every other node of every layer is
    frozen at `base` (direct mode); without, only the patched node is touched (total mode)."""
    n_rows, dev = len(rows), lm.device
    which = torch.arange(n_rows) % len(nodes)
    heads, mlps = {}, {}
    layers = range(lm.n_layers) if base is not None else sorted({l for l, _ in nodes})
    for layer in layers:
        h_mask = torch.zeros(n_rows, lm.n_heads, dtype=torch.bool)
        m_mask = torch.zeros(n_rows, dtype=torch.bool)
        for i, (l, h) in enumerate(nodes):
            if l == layer:
                if h is None:
                    m_mask[which == i] = True
                else:
                    h_mask[which == i, h] = True
        if base is None:
            heads[layer] = (h_mask.to(dev), values.heads[rows, layer].to(dev))
            mlps[layer] = (m_mask.to(dev), values.mlps[rows, layer].to(dev))
        else:
            hv = torch.where(h_mask[..., None], values.heads[rows, layer], base.heads[rows, layer])
            mv = torch.where(m_mask[:, None], values.mlps[rows, layer], base.mlps[rows, layer])
            all_h = torch.ones(n_rows, lm.n_heads, dtype=torch.bool, device=dev)
            heads[layer] = (all_h, hv.to(dev))
            mlps[layer] = (torch.ones(n_rows, dtype=torch.bool, device=dev), mv.to(dev))
    return heads, mlps


def _scores(logits: torch.Tensor, answers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = logits.float()
    idx = answers[:, None]
    return logits.gather(1, idx)[:, 0], logits.log_softmax(-1).gather(1, idx)[:, 0]


def end_forward(lm: LoadedModel, enc: dict[str, torch.Tensor], prefix, copies: int, *,
                inputs_embeds: torch.Tensor | None = None, output_hidden_states: bool = False):
    """The model body's output at END (`LoadedModel.body`: last_hidden_state after the final norm, no
    unembedding) for `copies` copies of every row (row i * copies + j is copy j of row i), computing only the
    END token on top of `prefix` (left untouched: `repeated_cache`). `inputs_embeds` [batch, 1, d_model],
    repeated like the rows, replaces END's embedding (inside `layers_from`: the residual entering the first
    layer run). `prefix` may be a `kvcache.PrefixCopies`, whose copies serve forward after forward. Hooks
    active around the call act on the copies."""
    inputs = end_copies(enc, prefix, copies)
    if inputs_embeds is not None:
        del inputs["input_ids"]
        inputs["inputs_embeds"] = inputs_embeds.repeat_interleave(copies, 0)
    return lm.body(**inputs, output_hidden_states=output_hidden_states)


@torch.no_grad()
def total_logits(
    lm: LoadedModel,
    texts: list[str],
    answer_ids: torch.Tensor,
    cf: EndState,
    layers: list[int],
    *,
    batch_size: int = 16,
    copies_per_forward: int = COPIES_PER_FORWARD,
    with_logprobs: bool = False,
    nodes: list[tuple[int, int | None]] | None = None,
) -> PatchedLogits:
    """Answer logit (and log-prob) with one node patched to its counterfactual END value and everything
    downstream recomputed, and unpatched (logit_o: the unpatched END forward, through the same float32
    unembedding as the patched copies). The nodes are every node of `layers` (`nodes_of`), or the given
    `nodes` [(layer, head or None for the MLP)] in their order (`layers` then unused).

    Per batch: the prefix (all but END) runs once and END once more, unpatched, for the residual stream
    entering every layer. A node of layer l changes nothing below l, so its patched copies run END through
    layers l..L-1 only (`LoadedModel.layers_from`), from that residual on the prefix cache, copied once for
    all forwards (`kvcache.PrefixCopies`); the copies of one layer's nodes share a forward (up to
    `copies_per_forward` rows). Without log-probs only the answers' unembedding rows are applied
    (`LoadedModel.body`), not the whole vocabulary."""
    nodes = nodes_of(lm, layers) if nodes is None else [(int(l), None if h is None else int(h)) for l, h in nodes]
    full = _float_unembed(lm, with_logprobs)
    out_logits, out_lp = [], []
    by_layer: dict[int, list[int]] = {}  # layer -> indices into `nodes`
    for i, (l, _) in enumerate(nodes):
        by_layer.setdefault(l, []).append(i)
    for start in tqdm(range(0, len(texts), batch_size), desc="total", leave=False):
        enc = encode(lm.tokenizer, texts[start : start + batch_size], lm.device)
        n = enc["input_ids"].shape[0]
        answers = answer_ids[start : start + n].to(lm.device)
        prefix = prefix_cache(lm, enc)
        plain = end_forward(lm, enc, prefix, 1, output_hidden_states=True)
        resid = plain.hidden_states  # [L+1] x [n, 1, d]
        lo, lp = unembed_scores(lm, plain.last_hidden_state, answers, full)  # [n, 1]
        del plain  # and its copy of the prefix cache: only the residuals are needed on
        prefix_copies = PrefixCopies(prefix, room=1)  # copied once per number of copies, not per forward
        logit_out = torch.empty(n, 1 + len(nodes))  # column 0 unpatched, then the nodes
        lp_out = torch.empty(n, 1 + len(nodes))
        logit_out[:, :1] = lo.cpu()
        if with_logprobs:
            lp_out[:, :1] = lp.cpu()
        chunk = max(1, copies_per_forward // n)  # copies of the batch per forward, at least one
        for layer, idx in sorted(by_layer.items()):
            for c0 in range(0, len(idx), chunk):
                cols = idx[c0 : c0 + chunk]
                part, k = [nodes[i] for i in cols], len(cols)
                rows = torch.arange(start, start + n).repeat_interleave(k)  # row b*k + j patches part[j]
                heads, mlps = _node_patches(lm, part, cf, rows, base=None)
                with patch_end(lm, heads, mlps), lm.layers_from(layer):
                    normed = end_forward(lm, enc, prefix_copies, k, inputs_embeds=resid[layer]).last_hidden_state
                lo, lp = unembed_scores(lm, normed, answers.repeat_interleave(k), full)  # [n*k, 1]
                logit_out[:, [1 + c for c in cols]] = lo.view(n, k).cpu()
                if with_logprobs:
                    lp_out[:, [1 + c for c in cols]] = lp.view(n, k).cpu()
        del prefix, prefix_copies  # this batch's caches, before the next batch's prefix forward
        out_logits.append(logit_out)
        out_lp.append(lp_out)
    return _split_unpatched(torch.cat(out_logits), torch.cat(out_lp) if with_logprobs else None)


@torch.no_grad()
def reference_logits(
    lm: LoadedModel,
    texts: list[str],
    answer_ids: torch.Tensor,
    ref: EndState,
    cf: EndState,
    *,
    layers: list[int],
    mode: str,
    batch_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One full hooked forward per node: the definition, for testing and benchmarking the fast paths.
    mode 'direct' freezes every other node at END to its reference value; 'total' leaves them free."""
    if mode not in ("direct", "total"):
        raise ValueError(f"mode must be 'direct' or 'total', got {mode!r}")
    nodes = nodes_of(lm, layers)
    out_logits, out_lp = [], []
    for start in tqdm(range(0, len(texts), batch_size), desc=f"reference {mode}", leave=False):
        enc = encode(lm.tokenizer, texts[start : start + batch_size], lm.device)
        n = enc["input_ids"].shape[0]
        rows = torch.arange(start, start + n)
        answers = answer_ids[start : start + n].to(lm.device)
        cols_lo, cols_lp = [], []
        for node in nodes:
            # `which` indexes nodes by row modulo len(nodes): a one-node list patches every row.
            heads, mlps = _node_patches(lm, [node], cf, rows, base=ref if mode == "direct" else None)
            with patch_end(lm, heads, mlps):
                lo, lp = _scores(lm.model(**enc, logits_to_keep=1).logits[:, -1], answers)
            cols_lo.append(lo.cpu())
            cols_lp.append(lp.cpu())
        out_logits.append(torch.stack(cols_lo, 1))
        out_lp.append(torch.stack(cols_lp, 1))
    return torch.cat(out_logits), torch.cat(out_lp)


def effects_frame(
    lm: LoadedModel,
    sample_ids: list[int],
    layers: list[int],
    logit_o: torch.Tensor,
    logit_p: torch.Tensor,
    *,
    logprob_o: torch.Tensor | None = None,
    logprob_p: torch.Tensor | None = None,
) -> pd.DataFrame:
    """Long table, one row per (sample, node): logit_o, logit_p and the paper's relative effect
    (logit_p - logit_o) / logit_o, plus prob_o / prob_p when log-probs are given.
    logit_o, logprob_o: [n_samples]; logit_p, logprob_p: [n_samples, n_nodes]."""
    nodes = nodes_of(lm, layers)
    n_s, n_n = logit_p.shape
    frame = pd.DataFrame(
        {
            "sample_id": torch.tensor(sample_ids).repeat_interleave(n_n).numpy(),
            "layer": [l for l, _ in nodes] * n_s,
            "head": pd.array([h for _, h in nodes] * n_s, dtype="Int64"),
            "component": ["mlp" if h is None else "head" for _, h in nodes] * n_s,
            "logit_o": logit_o.double().repeat_interleave(n_n).numpy(),
            "logit_p": logit_p.double().reshape(-1).numpy(),
        }
    )
    frame["rel_effect"] = (frame["logit_p"] - frame["logit_o"]) / frame["logit_o"]
    if logprob_o is not None and logprob_p is not None:
        frame["prob_o"] = logprob_o.double().exp().repeat_interleave(n_n).numpy()
        frame["prob_p"] = logprob_p.double().exp().reshape(-1).numpy()
    return frame
