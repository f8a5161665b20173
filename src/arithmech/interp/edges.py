"""Head -> MLP edges on the teacher-forced protocol: how much of a head's effect reaches the answer through each
MLP, and edge circuits. EAP-IG as Hanna et al. 2024 (and MIB) score edges. Every row is a prompt (END last)
followed by its gold answer tokens, left-padded, all of one tail length T = 1 + n_answer_tokens (END and each
answer token); the tail's next-token predictions are read against targets [n, T] (the answer tokens, then a
terminator). A node outside a circuit is ablated at every tail position with per-row values (`AlignedMean` with a
leading row axis: heads [n, T, L, H, D], mlps [n, T, L, d], index 0 = the last position, as `hooks.patch_tail`);
positions before END keep their values. The measure (`TAIL_MEASURES`), per row: `logprob`, the targets'
log-probabilities summed over the tail; `kl`, minus KL(model || circuit) summed over the tail (0 for the model).

An edge s -> r (sender head s = (layer, head); receiver the MLP of a layer r >= the sender's, or the logits) is
ablated when the receiver's input, and only it, sees the sender's ablated value instead of its output at the tail
positions: the receiver reads the residual stream minus W_O[:, s] (z_s - z_s_ablated) there. The receiver's input
is the input of its norm (`LoadedModel.mlp_norm`; `final_norm` for the logits), so the skip connection around the
MLP and every other reader of the stream still see the sender. The edge's effect is m(model) - m(model without
the edge), positive where the edge helps (`exact_edge_effects`, one hooked forward per edge). `eap_ig_edges`
estimates it to first order for every edge at once:

    score(s -> r) = sum over tail positions t of  delta_s[t] . mean over alpha of dm/dx_r[t] (alpha),
    delta_s[t] = W_O[:, s] (z_s[t] - z_s_ablated[t])    (the real o_proj weight's slice, z_s from the model's run)

dm/dx_r is the gradient with respect to the receiver's input alone (a zero tensor added to its norm's input, not
the residual stream, whose gradient also holds the skip connection), averaged over `steps` points alpha =
(k + 0.5) / steps (midpoint rule) of a path:
  path="nodes"  the path of the ranking's integrated gradients (`teacher_forcing.tail_gated`), over the whole
                tail: every head's and MLP's tail output is ablated + alpha (output - ablated). The gradient is the
                model's own at that point: the interpolation is a constant offset on each node's output (alpha is not
                differentiated), so near alpha = 1 it is the full model's gradient, and where the ablated values
                are close to the outputs the score tends to the exact edge effect.
  path="model"  no path: the gradient of the model itself (alpha = 1; EAP, Syed et al. 2023), one forward and
                backward. On SmolLM2-135M (addition, 6 prompts resampled within the template, 18 heads x 6 MLPs) it
                ranks the exact single-edge effects with Spearman 0.99, where path "nodes" reaches 0.46: that path
                runs down to every node ablated, far from the model whose edges are removed one at a time. Which
                ranking makes the better circuit is for `edge_size_curve` to say.
  path="edge"   each edge's own path, a check: only the receiver's input moves, by -(1 - alpha) delta_s, the rest
                is the model. The score is then the integral of the edge effect's derivative along a line, which
                tends to the exact effect as steps grow. One forward per edge and step: small models only.

Where the architecture puts a norm between o_proj and the residual stream (Gemma 3), delta_s is the attention
block's output minus its output with s alone ablated, and an edge circuit's receiver reads the residual minus, per
sender layer, that output minus the output with all its dropped senders of the layer ablated together: the same
definitions, exact through the norm. An MLP in the sender's own layer counts: it reads the residual after that layer's
attention block.

`edge_circuit_measure` scores sets of kept edges exactly (every other edge among the senders and receivers ablated
at once, each receiver seeing the ablated value of every sender whose edge to it is not kept; nodes and all other
paths as in the model). `top_edges` and `node_ranked_edges` give edge sets of a given size by EAP-IG or by node
scores, and `edge_size_curve` scores both at the same sizes: the edge circuit against the node circuit.
`path_cuts` cuts a set of senders' edges into the MLPs, into the logits or both: the edges rule's test of "the key
heads act through the MLPs".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from arithmech.interp.nodes import Head, all_nodes, key_nodes, ranked_heads
from arithmech.interp.patching import float_copy, head_deltas
from arithmech.intervention.hooks import capture, hooks
from arithmech.intervention.kvcache import end_copies, prefix_cache
from arithmech.intervention.means import AlignedMean
from arithmech.model.loading import LoadedModel


def _check_ranges(lm: LoadedModel, senders: Sequence[Head], receivers: Sequence[int]) -> None:
    """Every sender head and receiver MLP layer lies inside the model (a ValueError naming the first that does not)."""
    for layer, head in senders:
        if not (0 <= layer < lm.n_layers and 0 <= head < lm.n_heads):
            raise ValueError(f"sender head ({layer}, {head}) out of range for {lm.n_layers} x {lm.n_heads} heads")
    for layer in receivers:
        if not 0 <= layer < lm.n_layers:
            raise ValueError(f"receiver MLP layer {layer} out of range for {lm.n_layers} layers")



TAIL_MEASURES = ("logprob", "kl")
PATHS = ("nodes", "model", "edge")


@dataclass
class EdgeScores:
    """Per-row edge effects or their estimates, float64 on the CPU: mlp [n, n_senders, n_receivers], NaN where the
    receiver MLP lies before the sender's layer; direct [n, n_senders], the head -> logits edges (None where not
    asked for). Average over rows (dim 0) for a ranking."""

    mlp: torch.Tensor
    direct: torch.Tensor | None = None


def tail_batch(lm: LoadedModel, sequences) -> dict[str, torch.Tensor]:
    """A left-padded batch on the model's device with `data.arithmetic.encode`'s keys (input_ids, attention_mask,
    position_ids: [n, seq]), from such a batch (position ids are made from the mask where missing) or from token
    id lists (padded here with the tokenizer's pad id). Refuses a batch whose last position is padding."""
    if isinstance(sequences, Mapping):
        if "input_ids" not in sequences or "attention_mask" not in sequences:
            raise ValueError(f"a tail batch needs input_ids and attention_mask; got {sorted(sequences)}")
        enc = {k: sequences[k].to(lm.device) for k in ("input_ids", "attention_mask", "position_ids") if k in sequences}
    else:
        seqs = [[int(t) for t in seq] for seq in sequences]
        if not seqs or min(len(seq) for seq in seqs) == 0:
            raise ValueError("sequences must be a non-empty list of non-empty token id lists")
        width = max(len(seq) for seq in seqs)
        ids = torch.full((len(seqs), width), int(lm.tokenizer.pad_token_id), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, width - len(seq) :], mask[i, width - len(seq) :] = torch.tensor(seq), 1
        enc = {"input_ids": ids.to(lm.device), "attention_mask": mask.to(lm.device)}
    if not bool(enc["attention_mask"][:, -1].all()):
        raise ValueError("a tail batch must be left-padded: the last position of every row is a real token")
    if "position_ids" not in enc:
        enc["position_ids"] = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return enc


def tail_measure(logits: torch.Tensor, targets: torch.Tensor, measure: str,
                 reference: torch.Tensor | None = None) -> torch.Tensor:
    """The measure per row [n] (`TAIL_MEASURES`) from the tail's logits [n, T, vocab] and targets [n, T]; kl
    needs the model's own tail log-probabilities `reference` [n, T, vocab]."""
    lp = logits.float().log_softmax(-1)
    if measure == "logprob":
        return lp.gather(-1, targets[..., None])[..., 0].sum(-1)
    if measure == "kl":
        return -(reference.exp() * (reference - lp)).sum((-2, -1))
    raise ValueError(f"the edge measure must be one of {', '.join(TAIL_MEASURES)}; got {measure!r}")


@dataclass
class _Tail:
    """One checked batch: enc, targets [n, T], the ablated values in time order (tail index T - 1 = the last
    position; heads [n, T, L, H, D], mlps [n, T, L, d], on the model's device), the model's own tail head outputs
    `clean` [n, T, L, H, D], its measure `m_clean` [n], for kl its tail log-probabilities `reference`
    [n, T, vocab] (None for logprob), and `prefix`, the keys and values of the positions before the tail
    (`kvcache.prefix_cache`; None where the tail is the whole sequence)."""

    enc: dict
    targets: torch.Tensor
    heads: torch.Tensor
    mlps: torch.Tensor
    clean: torch.Tensor
    m_clean: torch.Tensor
    reference: torch.Tensor | None
    prefix: object | None = None

    @property
    def n(self) -> int:
        return self.targets.shape[0]

    @property
    def T(self) -> int:
        return self.targets.shape[1]

    def repeat(self, c: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """The batch, targets and reference with each row repeated c times (row i * c + j: row i, copy j)."""
        return {k: v.repeat_interleave(c, 0) for k, v in self.enc.items()}, *self._repeated(c)

    def copies(self, c: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """As `repeat`, but the inputs run the T tail positions alone on a copy of the prefix's keys and values
        (`kvcache.end_copies`; the whole sequence where the tail is all of it)."""
        return end_copies(self.enc, self.prefix, c, tail=self.T), *self._repeated(c)

    def _repeated(self, c: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        reference = None if self.reference is None else self.reference.repeat_interleave(c, 0)
        return self.targets.repeat_interleave(c, 0), reference


def _senders_receivers(lm: LoadedModel, senders, receivers) -> tuple[list[Head], list[int]]:
    senders, receivers = [(int(l), int(h)) for l, h in senders], [int(r) for r in receivers]
    _check_ranges(lm, senders, receivers)
    if not senders:
        raise ValueError("edges need at least one sender head")
    return senders, receivers


@torch.no_grad()
def _tail(lm: LoadedModel, sequences, targets, ablated: AlignedMean, measure: str) -> _Tail:
    """Check the inputs against the contract (module docstring) and run the model once on them."""
    if measure not in TAIL_MEASURES:
        raise ValueError(f"the edge measure must be one of {', '.join(TAIL_MEASURES)}; got {measure!r}")
    enc = tail_batch(lm, sequences)
    n, seq = enc["input_ids"].shape
    targets = torch.as_tensor(targets, dtype=torch.long).to(lm.device)
    if targets.dim() != 2 or targets.shape[0] != n:
        raise ValueError(f"targets must be [rows, tail] = [{n}, T]; got {tuple(targets.shape)}")
    T = targets.shape[1]
    if not 1 <= T <= seq or not bool(enc["attention_mask"][:, -T:].all()):
        raise ValueError(f"the tail of {T} positions (targets' second axis) must lie inside every row's tokens")
    L, H, D, d = lm.n_layers, lm.n_heads, lm.head_dim, lm.d_model
    if tuple(ablated.heads.shape) != (n, T, L, H, D) or tuple(ablated.mlps.shape) != (n, T, L, d):
        raise ValueError(f"ablated values must be per row and tail position: heads [{n}, {T}, {L}, {H}, {D}] and mlps "
                         f"[{n}, {T}, {L}, {d}]; got {tuple(ablated.heads.shape)} and {tuple(ablated.mlps.shape)}")
    # nothing is ablated before the tail: its keys and values are kept for forwards over the tail alone
    prefix = None if T == seq else prefix_cache(lm, enc, tail=T)
    with capture(lm, end_only=False) as cap:
        logits = lm.model(**end_copies(enc, prefix, 1, tail=T), logits_to_keep=T).logits
    reference = logits.float().log_softmax(-1) if measure == "kl" else None
    return _Tail(enc, targets, ablated.heads.flip(1).to(lm.device), ablated.mlps.flip(1).to(lm.device),
                 cap.stacked_heads()[:, -T:], tail_measure(logits, targets, measure, reference), reference, prefix)


def _row_batches(lm: LoadedModel, sequences, targets, ablated: AlignedMean, batch_size: int | None) -> list[tuple]:
    """(batch, targets, ablated values) of consecutive rows, at most batch_size each (None: all in one)."""
    enc = tail_batch(lm, sequences)
    n = enc["input_ids"].shape[0]
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    size = n if batch_size is None else batch_size
    targets = torch.as_tensor(targets, dtype=torch.long)
    if targets.dim() != 2 or targets.shape[0] != n:
        raise ValueError(f"targets must be [rows, tail] = [{n}, T]; got {tuple(targets.shape)}")
    if ablated.heads.shape[:1] != (n,) or ablated.mlps.shape[:1] != (n,):
        raise ValueError(f"ablated values must be per row and tail position, heads [{n}, T, L, H, D] and mlps "
                         f"[{n}, T, L, d]; got {tuple(ablated.heads.shape)} and {tuple(ablated.mlps.shape)}")
    return [({k: v[s : s + size] for k, v in enc.items()}, targets[s : s + size],
             AlignedMean(ablated.heads[s : s + size], ablated.mlps[s : s + size])) for s in range(0, n, size)]


def _o_proj_slices(lm: LoadedModel, senders: Sequence[Head]) -> torch.Tensor:
    """The senders' columns of their layers' real o_proj weights, float32 [n_senders, d_model, head_dim]."""
    return torch.stack([lm.o_proj(l).weight.float().view(lm.d_model, lm.n_heads, lm.head_dim)[:, h].to(lm.device)
                        for l, h in senders])


def _tail_deltas(lm: LoadedModel, tail: _Tail, senders: Sequence[Head]) -> torch.Tensor:
    """delta_s[t] = W_O[:, s] (z_s[t] - z_s_ablated[t]), float32 [n, n_senders, T, d_model] (o_proj's bias, if any,
    cancels in the difference). Where a norm stands between o_proj and the residual stream (`head_linear` false) it
    is that block's output minus its output with s alone ablated, the other heads at their values in the model's
    run (`patching.head_deltas`)."""
    layers, heads = torch.tensor([l for l, _ in senders]), torch.tensor([h for _, h in senders])
    if lm.arch.head_linear:
        dz = tail.clean[:, :, layers, heads].float() - tail.heads[:, :, layers, heads].float()  # [n, T, S, D]
        return torch.einsum("ntsk,sdk->nstd", dz, _o_proj_slices(lm, senders))
    n, T = tail.n, tail.T
    out = [-head_deltas(lm, l, tail.clean[:, :, l].flatten(0, 1), tail.heads[:, :, l].flatten(0, 1), [h])[:, 0]
           for l, h in senders]  # minus (ablated - model) = model - ablated
    return torch.stack([delta.to(lm.device).view(n, T, lm.d_model) for delta in out], 1)


def _receiver_modules(lm: LoadedModel, receivers: Sequence[int], direct: bool) -> list:
    """The norms whose inputs are the receivers' inputs: each receiver MLP's, then the final norm (the logits)."""
    return [lm.mlp_norm(r) for r in receivers] + ([lm.final_norm] if direct else [])


def _shift_tail(T: int, shift: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    """A forward pre-hook that replaces its input's last T positions x by shift(x) (a new tensor, autograd-safe)."""

    def fn(module, args):
        x = args[0]
        return (torch.cat([x[:, :-T], shift(x[:, -T:])], 1), *args[1:])

    return fn


def _node_path_hooks(lm: LoadedModel, tail: _Tail, alpha: torch.Tensor, c: int) -> tuple[list, list]:
    """Hooks that set every head's and MLP's tail output to ablated + alpha (output - ablated), with the offset
    detached (path "nodes"); alpha [rows]: one per row of the repeated batch (c copies of each row)."""
    H, D, T = lm.n_heads, lm.head_dim, tail.T
    heads, mlps = tail.heads.repeat_interleave(c, 0), tail.mlps.repeat_interleave(c, 0)

    def head_hook(layer):
        def shift(x):
            z = x.reshape(*x.shape[:2], H, D)
            ablated = heads[:, :, layer].to(x.device, x.dtype)  # a spread model's layers are on several devices
            a = alpha.to(x.device, x.dtype)[:, None, None, None]
            return (z + ((a - 1) * (z - ablated)).detach()).reshape(x.shape)

        return _shift_tail(T, shift)

    def mlp_hook(layer):
        def fn(module, args, output):
            ablated = mlps[:, :, layer].to(output.device, output.dtype)
            a = alpha.to(output.device, output.dtype)[:, None, None]
            end = output[:, -T:]
            return torch.cat([output[:, :-T], end + ((a - 1) * (end - ablated)).detach()], 1)

        return fn

    return ([(lm.o_proj(l), head_hook(l)) for l in range(lm.n_layers)],
            [(lm.mlp(l), mlp_hook(l)) for l in range(lm.n_layers)])


def _midpoints(steps: int) -> torch.Tensor:
    if steps < 1:
        raise ValueError(f"IG steps must be >= 1; got {steps}")
    return (torch.arange(steps, dtype=torch.float32) + 0.5) / steps


def eap_ig_edges(lm: LoadedModel, sequences, targets, ablated: AlignedMean, senders: Sequence[Head],
                 receivers: Sequence[int], *, steps: int = 8, direct: bool = False, measure: str = "logprob",
                 path: str = "nodes", batch_size: int | None = None) -> EdgeScores:
    """EAP-IG scores (module docstring) of every edge sender -> receiver MLP (receiver layer >= the sender's) and,
    with `direct`, sender -> logits, per row.

    sequences: a left-padded batch (`data.arithmetic.encode`) or token id lists, every row a prompt and its gold
    answer tokens; targets [n, T]: what the tail's T positions should predict; ablated: per-row values, heads
    [n, T, L, H, D], mlps [n, T, L, d] (index 0 = the last position); steps: IG points (midpoint rule); path:
    "nodes" (every node interpolated, one forward and backward of n * steps rows), "model" (the model's own
    gradient, steps unused) or "edge" (each edge's own path, a check; one forward and backward of n * steps *
    n_senders rows per receiver); batch_size: rows per forward
    (None: all; memory grows with rows * steps, rows * steps * n_senders for path "edge")."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {', '.join(PATHS)}; got {path!r}")
    _midpoints(steps)
    senders, receivers = _senders_receivers(lm, senders, receivers)
    parts = [_eap_ig_batch(lm, *batch, senders, receivers, steps, direct, measure, path)
             for batch in _row_batches(lm, sequences, targets, ablated, batch_size)]
    return EdgeScores(torch.cat([p.mlp for p in parts]), torch.cat([p.direct for p in parts]) if direct else None)


def _eap_ig_batch(lm, sequences, targets, ablated, senders, receivers, steps, direct, measure, path) -> EdgeScores:
    alphas, steps = (torch.ones(1), 1) if path == "model" else (_midpoints(steps), steps)
    tail = _tail(lm, sequences, targets, ablated, measure)
    deltas = _tail_deltas(lm, tail, senders)  # [n, S, T, d]
    modules = _receiver_modules(lm, receivers, direct)
    limits = receivers + ([lm.n_layers] if direct else [])  # a receiver reads senders of its layer and below
    layers = torch.tensor([l for l, _ in senders])
    scores = torch.full((tail.n, len(senders), len(modules)), float("nan"), dtype=torch.float64)
    n, T, d = tail.n, tail.T, lm.d_model
    if path in ("nodes", "model"):
        enc, targets_c, reference = tail.repeat(steps)
        probes = [torch.zeros(n * steps, T, d, dtype=lm.dtype, device=lm.device, requires_grad=True) for _ in modules]
        pre, post = _node_path_hooks(lm, tail, alphas.repeat(n), steps) if path == "nodes" else ([], [])
        pre += [(m, _shift_tail(T, lambda x, p=p: x + p.to(x.device))) for m, p in zip(modules, probes)]
        with torch.enable_grad(), hooks(pre, post):
            m = tail_measure(lm.model(**enc, logits_to_keep=T).logits, targets_c, measure, reference)
            grads = torch.autograd.grad(m.sum(), probes)
        for j, (grad, limit) in enumerate(zip(grads, limits)):
            live = torch.nonzero(layers <= limit)[:, 0]
            mean_grad = grad.float().view(n, steps, T, d).mean(1)  # [n, T, d]
            scores[:, live, j] = torch.einsum("nstd,ntd->ns", deltas[:, live], mean_grad).double().cpu()
    else:
        for j, (module, limit) in enumerate(zip(modules, limits)):
            live = torch.nonzero(layers <= limit)[:, 0]
            if not len(live):
                continue
            c = len(live) * steps  # copies of each row: (sender, step)
            enc, targets_c, reference = tail.repeat(c)
            probe = torch.zeros(n * c, T, d, dtype=lm.dtype, device=lm.device, requires_grad=True)
            back = (1 - alphas.to(deltas.device))[None, :, None, None]  # [1, steps, 1, 1]
            shift = (-back * deltas[:, live, None]).reshape(n * c, T, d)  # row (i, sender, step): -(1 - alpha) delta
            hook = _shift_tail(T, lambda x: x + shift.to(x.device, x.dtype) + probe.to(x.device))
            with torch.enable_grad(), hooks(pre=[(module, hook)]):
                m = tail_measure(lm.model(**enc, logits_to_keep=T).logits, targets_c, measure, reference)
                (grad,) = torch.autograd.grad(m.sum(), [probe])
            mean_grad = grad.float().view(n, len(live), steps, T, d).mean(2)
            scores[:, live, j] = (deltas[:, live] * mean_grad).sum((-2, -1)).double().cpu()
    return EdgeScores(scores[:, :, : len(receivers)], scores[:, :, -1] if direct else None)


@torch.no_grad()
def exact_edge_effects(lm: LoadedModel, sequences, targets, ablated: AlignedMean, senders: Sequence[Head],
                       receivers: Sequence[int], *, direct: bool = False, measure: str = "logprob",
                       batch_size: int | None = None) -> EdgeScores:
    """The definition `eap_ig_edges` estimates, per row (arguments and result as there): m(model) - m(model with
    the one edge ablated), the receiver's norm reading the residual minus delta_s at the tail (a pre-hook on the
    real module), everything else the model. One forward of rows * n_senders rows per receiver."""
    senders, receivers = _senders_receivers(lm, senders, receivers)
    parts = [_exact_batch(lm, *batch, senders, receivers, direct, measure)
             for batch in _row_batches(lm, sequences, targets, ablated, batch_size)]
    return EdgeScores(torch.cat([p.mlp for p in parts]), torch.cat([p.direct for p in parts]) if direct else None)


def _exact_batch(lm, sequences, targets, ablated, senders, receivers, direct, measure) -> EdgeScores:
    tail = _tail(lm, sequences, targets, ablated, measure)
    deltas = _tail_deltas(lm, tail, senders)
    modules = _receiver_modules(lm, receivers, direct)
    limits = receivers + ([lm.n_layers] if direct else [])
    layers = torch.tensor([l for l, _ in senders])
    effects = torch.full((tail.n, len(senders), len(modules)), float("nan"), dtype=torch.float64)
    for j, (module, limit) in enumerate(zip(modules, limits)):
        live = torch.nonzero(layers <= limit)[:, 0]
        if not len(live):
            continue
        enc, targets_c, reference = tail.repeat(len(live))
        shift = deltas[:, live].reshape(tail.n * len(live), tail.T, lm.d_model)
        with hooks(pre=[(module, _shift_tail(tail.T, lambda x: x - shift.to(x.device, x.dtype)))]):
            m = tail_measure(lm.model(**enc, logits_to_keep=tail.T).logits, targets_c, measure, reference)
        effects[:, live, j] = (tail.m_clean[:, None] - m.view(tail.n, len(live))).double().cpu()
    return EdgeScores(effects[:, :, : len(receivers)], effects[:, :, -1] if direct else None)


@torch.no_grad()
def edge_circuit_measure(lm: LoadedModel, sequences, targets, ablated: AlignedMean, senders: Sequence[Head],
                         receivers: Sequence[int], kept, *, kept_direct=None, measure: str = "logprob",
                         batch_size: int | None = None) -> np.ndarray:
    """The measure [c, n] (float64) of c edge circuits: kept [c, n_senders, n_receivers] bool (or [n_senders,
    n_receivers] for one) marks the kept head -> MLP edges; every other edge among senders x receivers is ablated,
    all at once: at the tail, receiver r's norm reads the residual minus W_O[:, s] (z_s - z_s_ablated) summed over
    the senders s of layer <= r whose edge to r is not kept, z_s the sender's output in the same forward (so a
    sender downstream of an ablated edge passes on its changed output). Entries where the receiver lies before
    the sender are ignored. kept_direct [c, n_senders] (optional) does the same for head -> logits (the final
    norm's input); without it those edges are all kept. Nodes and every other path run as in the model. All
    edges kept gives the model's own measure. The prefix before the tail runs once per batch, then one T-token
    forward of rows * c copies on its keys and values (batch_size: rows per forward)."""
    senders, receivers = _senders_receivers(lm, senders, receivers)
    kept = torch.as_tensor(np.asarray(kept), dtype=torch.bool)
    kept = kept[None] if kept.dim() == 2 else kept
    S, R = len(senders), len(receivers)
    if kept.dim() != 3 or tuple(kept.shape[1:]) != (S, R):
        raise ValueError(f"kept edges must be [circuits, {S} senders, {R} receivers]; got {tuple(kept.shape)}")
    c = kept.shape[0]
    if kept_direct is not None:
        kept_direct = torch.as_tensor(np.asarray(kept_direct), dtype=torch.bool)
        kept_direct = kept_direct[None] if kept_direct.dim() == 1 else kept_direct
        if tuple(kept_direct.shape) != (c, S):
            raise ValueError(f"kept direct edges must be [{c} circuits, {S} senders]; got {tuple(kept_direct.shape)}")
        kept = torch.cat([kept, kept_direct[:, :, None]], 2)
    parts = [_circuit_batch(lm, *batch, senders, receivers, kept, kept_direct is not None, measure)
             for batch in _row_batches(lm, sequences, targets, ablated, batch_size)]
    return np.concatenate(parts, 1)


def _circuit_batch(lm, sequences, targets, ablated, senders, receivers, kept, direct, measure) -> np.ndarray:
    tail = _tail(lm, sequences, targets, ablated, measure)
    c = kept.shape[0]
    modules = _receiver_modules(lm, receivers, direct)
    limits = receivers + ([lm.n_layers] if direct else [])
    H, D, T = lm.n_heads, lm.head_dim, tail.T
    w = _o_proj_slices(lm, senders)  # [S, d, D]
    # every circuit's copy runs its T tail positions on the prefix's keys and values (the slow reference in the
    # tests runs whole sequences)
    enc, targets_c, reference = tail.copies(c)
    layers, heads = torch.tensor([l for l, _ in senders]), torch.tensor([h for _, h in senders])
    ablated_z = tail.heads.repeat_interleave(c, 0)[:, :, layers, heads].float()  # [n*c, T, S, D]
    dropped = (~kept).repeat(tail.n, 1, 1).to(lm.device)  # [n*c, S, R(+1)], row i * c + j: row i, circuit j
    live: dict[int, torch.Tensor] = {}  # layer -> this forward's tail head outputs [n*c, T, H, D]

    def record(layer):
        def fn(module, args):
            live[layer] = args[0][:, -T:].reshape(-1, T, H, D)

        return fn

    def receiver_hook(j, limit):
        use = torch.nonzero(layers <= limit)[:, 0]  # senders this receiver reads: already run in this forward

        def shift(x):
            if not len(use):
                return x
            if not lm.arch.head_linear:
                return x - _removed_through_norm(use, j).to(x.device, x.dtype)
            z = torch.stack([live[senders[i][0]][:, :, senders[i][1]].to(w.device) for i in use.tolist()], 2)
            drop = dropped[:, use, j].float()  # [n*c, S_use]
            removed = torch.einsum("btsk,sdk,bs->btd", z.float() - ablated_z[:, :, use], w[use], drop)
            return x - removed.to(x.device, x.dtype)

        return _shift_tail(T, shift)

    def _removed_through_norm(use, j):
        """A norm after o_proj: per sender layer, the attention block's output minus its output with this
        receiver's dropped senders of that layer ablated together (float32 copies of o_proj and the norm)."""
        removed = 0
        for layer in sorted({senders[i][0] for i in use.tolist()}):
            z = live[layer].float()  # [n*c, T, H, D]
            mask = torch.zeros(z.shape[0], H, dtype=torch.bool, device=z.device)
            for i in use.tolist():
                if senders[i][0] == layer:
                    mask[:, senders[i][1]] |= dropped[:, i, j].to(z.device)
            ablated_layer = tail.heads.repeat_interleave(c, 0)[:, :, layer].to(z.device, torch.float32)
            z_cut = torch.where(mask[:, None, :, None], ablated_layer, z)
            write = writers[layer]
            removed = removed + write(z.flatten(2)) - write(z_cut.flatten(2))
        return removed

    writers = {} if lm.arch.head_linear else {
        l: torch.nn.Sequential(float_copy(lm.o_proj(l)), float_copy(lm.attn_out_norm(l)))
        for l in sorted(set(layers.tolist()))}

    pre = [(lm.o_proj(l), record(l)) for l in sorted(set(layers.tolist()))]
    pre += [(m, receiver_hook(j, limit)) for j, (m, limit) in enumerate(zip(modules, limits))]
    with hooks(pre=pre):
        m = tail_measure(lm.model(**enc, logits_to_keep=T).logits, targets_c, measure, reference)
    return m.view(tail.n, c).T.double().cpu().numpy()


def top_edges(scores, k: int, *, absolute: bool = True) -> np.ndarray:
    """The k edges of largest score (|score| with `absolute`, as EAP-IG circuits are usually built), bool [n_senders,
    n_receivers]; scores [n_senders, n_receivers] (e.g. `EdgeScores.mlp.mean(0)`), NaN where no edge exists (never
    chosen). Ties go to the earlier sender, then receiver."""
    scores = np.asarray(scores, dtype=float)
    valid = np.flatnonzero(~np.isnan(scores.ravel()))
    if not 0 <= k <= len(valid):
        raise ValueError(f"k must be between 0 and the {len(valid)} edges; got {k}")
    values = np.abs(scores.ravel()[valid]) if absolute else scores.ravel()[valid]
    chosen = valid[np.argsort(-values, kind="stable")[:k]]
    out = np.zeros(scores.size, dtype=bool)
    out[chosen] = True
    return out.reshape(scores.shape)


def node_ranked_edges(node_scores, senders: Sequence[Head], receivers: Sequence[int], n_layers: int, n_heads: int,
                      k: int, *, absolute: bool = True) -> np.ndarray:
    """The k head -> MLP edges that a node circuit growing by node score takes in first, bool [n_senders,
    n_receivers]: nodes ranked by score (|score| with `absolute`; node_scores [nodes], columns
    `nodes.all_nodes(n_layers, n_heads)`, e.g. `TailTrials.attribution`), an edge entering when its later
    endpoint does (ties: the earlier endpoint's rank, then sender, then receiver). Where the top-n node circuit
    holds exactly k such edges, this is that circuit's edge set, so it compares with `top_edges` at equal size."""
    nodes = all_nodes(n_layers, n_heads)
    node_scores = np.asarray(node_scores, dtype=float)
    if node_scores.shape != (len(nodes),):
        raise ValueError(f"node scores must be [{len(nodes)}] (nodes.all_nodes); got {node_scores.shape}")
    values = np.abs(node_scores) if absolute else node_scores
    rank = {node: r for r, node in enumerate(nodes[i] for i in np.argsort(-values, kind="stable"))}
    edges = [(max(rank[s], rank[(r, -1)]), min(rank[s], rank[(r, -1)]), i, j)
             for i, s in enumerate(senders) for j, r in enumerate(receivers) if r >= s[0]]
    if not 0 <= k <= len(edges):
        raise ValueError(f"k must be between 0 and the {len(edges)} edges; got {k}")
    out = np.zeros((len(senders), len(receivers)), dtype=bool)
    for *_, i, j in sorted(edges)[:k]:
        out[i, j] = True
    return out


def _n_edges(senders: Sequence[Head], receivers: Sequence[int]) -> int:
    return sum(r >= l for l, _ in senders for r in receivers)


def _size_masks(lm: LoadedModel, edge_scores, node_scores, senders, receivers, sizes) -> np.ndarray:
    """[2 + 2 len(sizes), S, R]: every edge, no edge, then per size the EAP-IG ranking's and the node ranking's."""
    n_edges, S, R = _n_edges(senders, receivers), len(senders), len(receivers)
    for k in sizes:
        if not 0 <= int(k) <= n_edges:
            raise ValueError(f"sizes must lie between 0 and the {n_edges} edges; got {k}")
    masks = [np.ones((S, R), dtype=bool), np.zeros((S, R), dtype=bool)]
    for k in sizes:
        masks += [top_edges(edge_scores, int(k)),
                  node_ranked_edges(node_scores, senders, receivers, lm.n_layers, lm.n_heads, int(k))]
    return np.stack(masks)


def _curve_rows(means: np.ndarray, sizes: Sequence[int]) -> pd.DataFrame:
    full, empty = float(means[0]), float(means[1])
    return pd.DataFrame([{"ranking": ranking, "edges": int(k), "measure": float(means[2 + 2 * i + j]),
                          "faithfulness": (float(means[2 + 2 * i + j]) - empty) / (full - empty)
                          if full != empty else float("nan")}
                         for i, k in enumerate(sizes) for j, ranking in enumerate(("eap_ig", "nodes"))])


def edge_size_curve(lm: LoadedModel, sequences, targets, ablated: AlignedMean, senders: Sequence[Head],
                    receivers: Sequence[int], edge_scores, node_scores, sizes: Sequence[int], *,
                    measure: str = "logprob", batch_size: int | None = None) -> pd.DataFrame:
    """The edge circuit against the node circuit at equal size: for each k of `sizes`, the k head -> MLP edges of
    largest |EAP-IG score| (`top_edges`; edge_scores [n_senders, n_receivers], e.g. `EdgeScores.mlp.mean(0)`) and
    the k a node circuit takes in first (`node_ranked_edges`; node_scores [nodes] as `nodes.all_nodes`), each
    scored exactly (`edge_circuit_measure`, every other edge among senders x receivers ablated, head -> logits
    kept). One row per (ranking, k): ranking ("eap_ig" or "nodes"), edges (k), measure (mean over rows) and
    faithfulness (m - m(no edge)) / (m(every edge) - m(no edge))."""
    masks = _size_masks(lm, edge_scores, node_scores, senders, receivers, sizes)
    m = edge_circuit_measure(lm, sequences, targets, ablated, senders, receivers, masks, measure=measure,
                             batch_size=batch_size).mean(1)
    return _curve_rows(m, sizes)


EDGE_SHARES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # shares of the head -> MLP edges along the curve


def items_edge_curve(lm: LoadedModel, ranked_on: tuple, scored_on: tuple, senders: Sequence[Head],
                     receivers: Sequence[int], node_scores, *, shares: Sequence[float] = EDGE_SHARES, steps: int = 8,
                     measure: str = "logprob", batch_size: int | None = None) -> pd.DataFrame:
    """`edge_size_curve` on teacher-forced items of any answer lengths: ranked_on and scored_on are (items, values)
    (`teacher_forcing.TailItems`, `teacher_forcing.TailValues`), so the edges can be chosen on one set of pairs
    and scored on another. The EAP-IG scores (path "nodes") averaged over the ranked_on items (node_scores: the
    node ranking's, from the same items), and at each share of the senders x receivers head -> MLP edges (at
    least one edge) the two rankings' circuits scored exactly on every scored_on item. Rows as
    `edge_size_curve`'s, with share and n_edges."""
    from arithmech.interp.teacher_forcing import tail_batches

    senders, receivers = _senders_receivers(lm, senders, receivers)

    def batches(items):
        return tail_batches(lm, items, batch_size or len(items))

    (rank_items, rank_values), (items, values) = ranked_on, scored_on
    summed = sum(eap_ig_edges(lm, b.enc, b.targets, rank_values.rows(b.rows, b.T), senders, receivers, steps=steps,
                              measure=measure, batch_size=batch_size).mlp.sum(0) for b in batches(rank_items))
    scores = (summed / len(rank_items)).numpy()
    n_edges = _n_edges(senders, receivers)
    sizes = [max(1, int(np.ceil(share * n_edges - 1e-9))) for share in shares]
    masks = _size_masks(lm, scores, node_scores, senders, receivers, sizes)
    m = np.concatenate([edge_circuit_measure(lm, b.enc, b.targets, values.rows(b.rows, b.T), senders, receivers,
                                             masks, measure=measure, batch_size=batch_size)
                        for b in batches(items)], 1)
    return _curve_rows(m.mean(1), sizes).assign(share=np.repeat(list(shares), 2), n_edges=n_edges)


# The key heads' paths to the answer, cut one kind at a time (`path_cuts`): which of the senders' edges each cut
# ablates, as (edges into every MLP kept, edges into the logits kept).
PATH_CUTS = {"model": (True, True), "via_mlps": (False, True), "direct": (True, False), "both": (False, False)}


def path_cuts(lm: LoadedModel, items, values, senders: Sequence[Head], *, measure: str = "logprob",
              batch_size: int | None = None) -> dict[str, np.ndarray]:
    """Per teacher-forced item (`teacher_forcing.TailItems`, ablation values `teacher_forcing.TailValues`), the
    measure with the senders' edges cut exactly (`edge_circuit_measure`): into every MLP of their layer or later
    ("via_mlps"), into the logits ("direct"), both, or none ("model"). Returns {cut: [n_items]} in item order:
    what "the heads act through the MLPs" asks, edge by edge and on the same protocol as the circuits."""
    from arithmech.interp.teacher_forcing import tail_batches

    senders = [(int(l), int(h)) for l, h in senders]
    receivers = list(range(min(l for l, _ in senders), lm.n_layers))
    kept = torch.tensor([[[mlp] * len(receivers)] * len(senders) for mlp, _ in PATH_CUTS.values()])
    kept_direct = torch.tensor([[direct] * len(senders) for _, direct in PATH_CUTS.values()])
    out = np.full((len(PATH_CUTS), len(items)), np.nan)
    for batch in tail_batches(lm, items, batch_size or len(items)):
        out[:, batch.rows] = edge_circuit_measure(lm, batch.enc, batch.targets, values.rows(batch.rows, batch.T),
                                                  senders, receivers, kept, kept_direct=kept_direct,
                                                  measure=measure, batch_size=batch_size)
    return dict(zip(PATH_CUTS, out))


# ------------------------------------------------------------------------------------------- the edges rule
def edge_senders(effects: pd.DataFrame, keys: Mapping[str, pd.DataFrame], n_top: int) -> list[Head]:
    """The sender heads of one operator: its top `n_top` heads by effect (`nodes.ranked_heads` of its effects
    table) and every operator's key heads (`keys`: operator -> key-component table), in the operator's effect
    order."""
    union = {h for key in keys.values() for h in key_nodes(key)[0]}
    return [h for i, h in enumerate(ranked_heads(effects)) if i < n_top or h in union]
