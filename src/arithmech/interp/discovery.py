"""Circuit discovery: the smallest set of heads and MLPs that keeps a target share of the model's behaviour,
found by exact greedy pruning at node level (ACDC, Conmy et al. 2023, with nodes instead of edges).

A circuit C keeps some nodes (query heads and MLPs); every other node is mean-ablated at END exactly as the
`circuit` rule does it (`ablation.mean_ablate(positions="end")` with the END mean of the identification
counterfactuals, `activations.cache_means(cache, "end")`). A continuous measure m, averaged over the scored pairs,
gives the faithfulness (m(C) - m(empty)) / (m(M) - m(empty)) (as `sufficiency.faithfulness`; M the full model).

The measure (`MEASURES`, config `circuit.discover.measure`). Not the raw answer logit: mean-ablating most of
SmolLM2-135M lifts every digit's logit together, so a pruning on the answer logit kept a circuit with 196% of
the logit and no first-token accuracy above the constant predictor (measured on addition, 40 pairs). The choices:
  logit_diff  the answer's first-token logit minus the mean logit of the OTHER candidate answers' first tokens
              (every distinct answer first token among the scored pairs). A shift shared by every digit
              cancels, so only what tells the right answer from the other answers counts. The default: it is
              the quantity a greedy answer depends on among the answers the task can have.
  logprob     the answer's log-probability at END. Normalised over the whole vocabulary, it still rewards a
              circuit that moves mass from non-digits onto every digit alike.
  kl          minus the KL divergence of END's next-token distribution from the full model's (0 for the
              model itself). It asks the circuit to reproduce the whole distribution, non-answer tokens
              included, which is more than the task needs and dominated by the bulk of the vocabulary.
docs/circuit.md gives what each measure kept on the default model.

Why it is cheap and exact. An ablation at END changes nothing at earlier positions, so the prompt minus END
runs once per batch with a KV cache (`kvcache.prefix_cache`) and every trial is one END-token forward on
copies of it (`EndTrials`, the trick of `patching.total_logits` and `ablation.greedy_end_sets`); independent
trials (every target's candidate circuit, single-node effects, a brute-force enumeration) run as copies of
the batch in one forward. A pruning trial differs from the current circuit in one node of layer l: it runs
from layer l on, from the current circuit's END residual entering l (`EndTrials.try_drop`), so a trial costs
the layers from its node's on. `reference_measure` is the slow reference: whole prompts under `mean_ablate`.

The order (`node_ranking`): the nodes by |attribution| on the whole model, largest first. Not by signed attribution:
a node that pushes against the answer is part of the behaviour too (two-sided acceptance counts overshoot as
unfaithful), and ranked last it is missing from every small circuit of the ranking. On SmolLM2-135M's addition
(teacher-forced, mean ablation) the top nodes by signed attribution kept 0.55-0.62 of full answers at 5-50% of the
nodes, by |attribution| 0.81-0.88; attribution recomputed on the circuit left as nodes drop
(`EndTrials.attribution(kept=...)`, rounds of a quarter of the nodes) did no better at 19 times the gradients
(`benchmarks/discover_order.py`; docs/circuit.md).

The pruning (`prune`) takes the ranking. First the smallest prefix of it (the top k nodes) that keeps the highest
target is found by bisection over k (about log2(nodes) trials); the nodes below it leave together in that one
checked trial. Then nodes are visited least important first (the ranking reversed); a node is dropped when the
circuit without it keeps the target faithfulness. Sweeps repeat over the nodes still kept until one drops nothing,
so the result is minimal: dropping any one of its nodes falls below the target (`Pruned.minimal` says whether
that was reached within `max_passes`). The targets run from the highest down, each starting from the circuit of
the one above: the circuits nest, and a lower target costs a sweep over the few nodes still kept rather than over
the model. The prefix makes the search cheaper (a sweep over the prefix, not the model) and ties the circuits to
the ranking whose prefixes are the CPR curve (`teacher_forcing.cpr_cmd`).

Attribution (`EndTrials.attribution`): integrated gradients of the measure along each node's path from its
mean to its reference value. Every node's END output is gated, mean + g (output - mean), so g = 1 everywhere
is the model and g = 0 the empty circuit; the attribution of node v is the integral of dm/dg_v along
g = alpha (all nodes together), alpha 0 -> 1 (midpoint rule). They sum to m(M) - m(empty). On a circuit C
(`kept`) the gates of the nodes outside it stay 0, the path runs from the empty circuit to C, and C's nodes'
attributions sum to m(C) - m(empty). On models with more than `max_trials` nodes only the top `max_trials` of
the ranking get a trial of their own (the rest leave together in one checked trial).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import torch

from arithmech.data.arithmetic import encode
from arithmech.interp.nodes import node_label
from arithmech.intervention.batching import COPIES_PER_FORWARD
from arithmech.intervention.hooks import hooks
from arithmech.intervention.kvcache import PrefixCopies, end_copies, prefix_cache
from arithmech.intervention.means import AlignedMean
from arithmech.model.loading import LoadedModel

MEASURES = ("logit_diff", "logprob", "kl")
MLP = -1  # the head number of an MLP node

Node = tuple[int, int]  # (layer, head), head MLP (-1) for the layer's MLP


def all_nodes(n_layers: int, n_heads: int) -> list[Node]:
    """Every node in column order: the heads layer by layer, then the MLPs (the order `mean_ablate` takes)."""
    return [(l, h) for l in range(n_layers) for h in range(n_heads)] + [(l, MLP) for l in range(n_layers)]


def item_measure(logits: torch.Tensor, answers: torch.Tensor, measure: str, *, candidates: torch.Tensor | None = None,
                 reference: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row measure [rows] from END logits [rows, vocab]: `MEASURES`. candidates: the answer first-token ids
    (logit_diff); reference: the full model's END log-probabilities [rows, vocab] (kl)."""
    logits = logits.float()
    if measure == "logprob":
        return logits.log_softmax(-1).gather(1, answers[:, None])[:, 0]
    if measure == "logit_diff":
        others = (candidates[None, :] != answers[:, None]).float()  # [rows, C]
        mean_others = (logits[:, candidates] * others).sum(1) / others.sum(1)
        return logits.gather(1, answers[:, None])[:, 0] - mean_others
    if measure == "kl":
        lp = logits.log_softmax(-1)
        return -(reference.exp() * (reference - lp)).sum(-1)
    raise ValueError(f"circuit.discover.measure must be one of {', '.join(MEASURES)}; got {measure!r}")


def rank_correlation(x, y) -> float:
    """Spearman's rank correlation (Pearson's on average ranks)."""
    rx, ry = (pd.Series(np.asarray(v, dtype=float)).rank().to_numpy() for v in (x, y))
    return float(np.corrcoef(rx, ry)[0, 1])


def faithfulness(m, m_full: float, m_empty: float):
    """(m - m(empty)) / (m(M) - m(empty)), elementwise."""
    return (np.asarray(m, dtype=float) - m_empty) / (m_full - m_empty)


@contextmanager
def gated(lm: LoadedModel, gates: torch.Tensor, means: AlignedMean) -> Iterator[None]:
    """Every node's output at the last position of each forward becomes mean + g (output - mean), g = gates[row,
    node] (columns as `all_nodes`): g = 1 leaves the model as it is, g = 0 mean-ablates the node."""
    H, D, L = lm.n_heads, lm.head_dim, lm.n_layers
    mh, mm = means.heads[0], means.mlps[0]  # END: [L, H, D], [L, d]

    def head_hook(layer):
        g = gates[:, layer * H : (layer + 1) * H]  # [rows, H]

        def fn(module, args):
            x = args[0]
            B, S = x.shape[:2]
            mean = mh[layer].to(x.device, x.dtype)
            end = x[:, -1].view(B, H, D)
            new = mean + g.to(x.device, x.dtype)[:, :, None] * (end - mean)
            return (torch.cat([x[:, :-1], new.reshape(B, 1, H * D)], 1), *args[1:])

        return fn

    def mlp_hook(layer):
        g = gates[:, L * H + layer]  # [rows]

        def fn(module, args, output):
            mean = mm[layer].to(output.device, output.dtype)
            new = mean + g.to(output.device, output.dtype)[:, None] * (output[:, -1] - mean)
            return torch.cat([output[:, :-1], new[:, None]], 1)

        return fn

    pre = [(lm.o_proj(l), head_hook(l)) for l in range(L)]
    post = [(lm.mlp(l), mlp_hook(l)) for l in range(L)]
    with hooks(pre, post):
        yield


class EndTrials:
    """The measure of many circuits on one set of prompts, each trial an END-token forward on the prompts'
    shared prefix caches (module docstring).

    texts, answer_ids: the scored prompts and their answers' first token ids;  means: the END mean
    (`activations.cache_means(cache, "end")`);  measure: one of `MEASURES`;  batch_size: prompts per prefix cache.
    Columns of every kept mask: `all_nodes(lm.n_layers, lm.n_heads)`."""

    def __init__(self, lm: LoadedModel, texts: Sequence[str], answer_ids, means: AlignedMean, *, measure: str,
                 batch_size: int = 64, copies_per_forward: int = COPIES_PER_FORWARD):
        if measure not in MEASURES:
            raise ValueError(f"circuit.discover.measure must be one of {', '.join(MEASURES)}; got {measure!r}")
        self.lm, self.means, self.measure = lm, means, measure
        self.nodes = all_nodes(lm.n_layers, lm.n_heads)
        self.heads = [n for n in self.nodes if n[1] != MLP]
        self.mlps = [l for l, h in self.nodes if h == MLP]
        self.copies_per_forward = copies_per_forward
        answers = torch.tensor(np.asarray(answer_ids), dtype=torch.long)
        self.n_items = len(answers)
        self.candidates = torch.tensor(sorted(set(answers.tolist())), device=lm.device)
        if measure == "logit_diff" and len(self.candidates) < 2:
            raise ValueError("circuit.discover.measure logit_diff needs at least two distinct answer first tokens "
                             f"among the scored pairs; these have only {self.candidates.tolist()}")
        # logit_diff reads only the candidates' unembedding rows: answers become indices into them
        self.columns = self.candidates if measure == "logit_diff" else None
        if self.columns is not None:
            answers = torch.searchsorted(self.candidates.cpu(), answers)
        self.batches = []  # [enc, prefix copies, answers, END residual entering each layer, reference log-probs]
        for start in range(0, len(texts), batch_size):
            enc = encode(lm.tokenizer, list(texts[start : start + batch_size]), lm.device)
            if enc["input_ids"].shape[1] < 2:
                raise ValueError("circuit discovery needs prompts of at least two tokens (a prefix and END)")
            with torch.no_grad():
                prefix = PrefixCopies(prefix_cache(lm, enc), room=1)
                plain = lm.body(**end_copies(enc, prefix, 1), output_hidden_states=True)
                reference = None
                if measure == "kl":
                    reference = self._unembed(plain.last_hidden_state[:, -1]).float().log_softmax(-1)
            self.batches.append([enc, prefix, answers[start : start + batch_size].to(lm.device),
                                 plain.hidden_states, reference])
        if self.columns is not None:
            self.candidates = torch.arange(len(self.columns), device=lm.device)

    def _unembed(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab], or [rows, candidates] for logit_diff, from the final norm's output [rows, d]."""
        if self.columns is None:
            return self.lm.unembed(normed)
        return normed @ self.lm.unembed.weight[self.columns].T

    @torch.no_grad()
    def _logits(self, batch, kept: torch.Tensor, *, start: int | None = None, base=None, states: bool = False):
        """END logits (`_unembed`) of c circuits (kept [c, nodes]), row i * c + j = prompt i with circuit j. Below
        the lowest layer any circuit ablates, END's residual is the model's own: the forward starts there
        (`LoadedModel.layers_from`, from the residual entering that layer). `start` and `base` (the END residual
        entering each layer, [b, 1, d] per layer, of a circuit that differs from every one of `kept` only from
        layer `start` on) start it elsewhere; with `states`, also the residuals entering layers start.. (c = 1)."""
        from arithmech.interp.ablation import mean_ablate

        enc, prefix, _, resid, _ = batch
        b, c = enc["input_ids"].shape[0], kept.shape[0]
        if start is None:
            ablated = [self.nodes[i][0] for i in torch.nonzero((~kept).any(0))[:, 0].tolist()]
            start = min(ablated, default=self.lm.n_layers - 1)
        base = resid if base is None else base
        inputs = end_copies(enc, prefix, c)
        del inputs["input_ids"]
        with mean_ablate(self.lm, self.heads, self.mlps, self.means, positions="end",
                         row_masks=(~kept).repeat(b, 1)), self.lm.layers_from(start):
            out = self.lm.body(**inputs, inputs_embeds=base[start].repeat_interleave(c, 0),
                               output_hidden_states=states)
        logits = self._unembed(out.last_hidden_state[:, -1])
        if not states:
            return logits
        return logits, out.hidden_states[: self.lm.n_layers - start]  # entering layers start .. L-1

    def _measure(self, batch, logits: torch.Tensor, c: int) -> torch.Tensor:
        ref = None if batch[4] is None else batch[4].repeat_interleave(c, 0)
        return item_measure(logits, batch[2].repeat_interleave(c), self.measure, candidates=self.candidates,
                            reference=ref)

    def start_circuit(self, kept: np.ndarray) -> list:
        """The END residuals entering every layer under circuit `kept` (bool [nodes]), per batch, for `try_drop`."""
        row = torch.as_tensor(np.asarray(kept), dtype=torch.bool)[None]
        bases = []
        for batch in self.batches:
            _, states = self._logits(batch, row, start=0, states=True)
            bases.append(list(states))
        return bases

    def try_drop(self, kept: np.ndarray, node: int, bases: list) -> tuple[float, list]:
        """The measure (mean over prompts) of circuit `kept` without `node`, computed from `node`'s layer on, on the
        residuals `bases` of circuit `kept` (`start_circuit`): below that layer the two circuits agree. Returns it
        and the new circuit's residuals (what `bases` becomes if the drop is kept)."""
        trial = np.asarray(kept, dtype=bool).copy()
        trial[node] = False
        row = torch.as_tensor(trial)[None]
        layer, total, new = self.nodes[node][0], 0.0, []
        for batch, base in zip(self.batches, bases):
            logits, states = self._logits(batch, row, start=layer, base=base, states=True)
            total += float(self._measure(batch, logits, 1).double().sum())
            new.append(base[:layer] + list(states))
        return total / self.n_items, new

    def per_item(self, kept) -> np.ndarray:
        """The measure of every circuit on every prompt, [c, n_items] (kept: bool [c, nodes])."""
        kept = torch.as_tensor(np.asarray(kept), dtype=torch.bool)
        if kept.dim() != 2 or kept.shape[1] != len(self.nodes):
            raise ValueError(f"kept masks must be [circuits, {len(self.nodes)}]; got {tuple(kept.shape)}")
        out = []
        for batch in self.batches:
            b = batch[0]["input_ids"].shape[0]
            chunk = max(1, self.copies_per_forward // b)
            parts = []
            for s0 in range(0, kept.shape[0], chunk):
                part = kept[s0 : s0 + chunk]
                c = part.shape[0]
                m = self._measure(batch, self._logits(batch, part), c)
                parts.append(m.view(b, c).T.cpu())
            out.append(torch.cat(parts, 0))
        return torch.cat(out, 1).double().numpy()

    def mean(self, kept) -> np.ndarray:
        """The measure of every circuit, averaged over the prompts: [c]."""
        return self.per_item(kept).mean(1)

    def attribution(self, steps: int = 8, kept=None) -> np.ndarray:
        """Integrated gradients of the measure (mean over prompts) for every node, [nodes] (module docstring); on
        circuit `kept` (bool [nodes], default the model) the path runs from the empty circuit to it and the nodes
        outside it get 0."""
        alphas, kept = ig_path(steps, kept, len(self.nodes))
        total = torch.zeros(len(self.nodes), dtype=torch.float64)
        for enc, prefix, answers, _, reference in self.batches:
            b = enc["input_ids"].shape[0]
            gates = (alphas[:, None] * kept[None]).to(self.lm.device).requires_grad_()
            with torch.enable_grad():
                inputs = end_copies(enc, prefix.prefix, steps, room=0)  # a fresh cache that autograd may keep
                with gated(self.lm, gates.repeat(b, 1), self.means):
                    logits = self._unembed(self.lm.body(**inputs).last_hidden_state[:, -1])
                ref = None if reference is None else reference.repeat_interleave(steps, 0)
                m = item_measure(logits, answers.repeat_interleave(steps), self.measure, candidates=self.candidates,
                                 reference=ref)
                (grad,) = torch.autograd.grad(m.sum(), gates)
            total += grad.sum(0).double().cpu()
        return (total * kept.double() / steps / self.n_items).numpy()


def ig_path(steps: int, kept, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The midpoint alphas [steps] of an integrated-gradients path and the circuit's gates at alpha 1, float [n]
    (`kept`; None: every node)."""
    if steps < 1:
        raise ValueError(f"circuit.discover.ig_steps must be >= 1; got {steps}")
    kept = torch.ones(n) if kept is None else torch.as_tensor(np.asarray(kept, dtype=bool)).float()
    if kept.shape != (n,):
        raise ValueError(f"a kept mask must have {n} entries; got {tuple(kept.shape)}")
    return (torch.arange(steps, dtype=torch.float32) + 0.5) / steps, kept


def node_ranking(trials, steps: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(ranking, attribution): every node index by |attribution| (`attribution(steps)` of `trials`, an `EndTrials` or
    a `teacher_forcing.TailTrials`), largest first, ties by index; and the attribution [nodes] (module docstring)."""
    attribution = trials.attribution(steps)
    return np.argsort(-np.abs(attribution), kind="stable"), attribution


@torch.no_grad()
def reference_measure(lm: LoadedModel, texts: Sequence[str], answer_ids, means: AlignedMean, kept, *, measure: str,
                      ) -> np.ndarray:
    """The slow reference of `EndTrials.per_item`: every circuit's measure [c, n_items] from whole prompts run one
    at a time under `ablation.mean_ablate(positions="end")` with everything outside the circuit listed."""
    from arithmech.interp.ablation import mean_ablate

    nodes = all_nodes(lm.n_layers, lm.n_heads)
    answers = torch.tensor(np.asarray(answer_ids), dtype=torch.long, device=lm.device)
    candidates = torch.tensor(sorted(set(answers.tolist())), device=lm.device)
    out = np.zeros((len(kept), len(texts)))
    for i, text in enumerate(texts):
        enc = encode(lm.tokenizer, [text], lm.device)
        ref = lm.model(**enc).logits[:, -1].float().log_softmax(-1) if measure == "kl" else None
        for j, mask in enumerate(kept):
            heads = [n for n, k in zip(nodes, mask) if not k and n[1] != MLP]
            mlps = [n[0] for n, k in zip(nodes, mask) if not k and n[1] == MLP]
            with mean_ablate(lm, heads, mlps, means, positions="end"):
                logits = lm.model(**enc).logits[:, -1]
            out[j, i] = float(item_measure(logits, answers[i : i + 1], measure, candidates=candidates,
                                           reference=ref)[0])
    return out


@dataclass
class Pruned:
    """One target's pruned circuit. kept: bool [nodes] (columns `all_nodes`); faithfulness: of the measure on the
    scored prompts; trials: circuits measured for this target; minimal: the last sweep dropped nothing (every kept
    node was tried against the final circuit)."""

    target: float
    kept: np.ndarray
    faithfulness: float
    trials: int
    minimal: bool

    def heads(self, nodes: Sequence[Node]) -> list[tuple[int, int]]:
        return [n for n, k in zip(nodes, self.kept) if k and n[1] != MLP]

    def mlps(self, nodes: Sequence[Node]) -> list[int]:
        return [n[0] for n, k in zip(nodes, self.kept) if k and n[1] == MLP]


def prune(trials: EndTrials, targets: Sequence[float], *, ranking: Sequence[int],
          attribution: np.ndarray | None = None, max_trials: int | None = None, max_passes: int = 3,
          candidates: Sequence[int] | None = None, two_sided: bool = False) -> tuple[list[Pruned], pd.DataFrame]:
    """Greedy node pruning (module docstring) at every target, the highest first from the smallest prefix of
    `ranking` (node indices, most important first: `node_ranking`) that keeps it, each lower one from the circuit
    of the one above (so the circuits nest, and a lower target costs only a sweep over the nodes still kept). Visits
    run least important first; at each target sweeps repeat until one drops nothing or `max_passes` sweeps ran.
    candidates: the node indices that may be dropped (default: all; the others stay). max_trials: at most this
    many candidates (the top of the ranking) get a trial of their own. two_sided: a circuit is accepted when
    |1 - f| <= 1 - target (overshoot is not free, as MIB reports |1 - f|); else when f >= target. attribution:
    recorded in the path (NaN without it).

    Returns the pruned circuits (in the order of `targets`; `Pruned.trials` counts the prefix's bisection too) and
    the path: one row per visit (target, pass, visit, node, layer, head, rank (0: the top of the ranking),
    attribution, tried, dropped, faithfulness after the visit, nodes_kept)."""
    nodes = trials.nodes
    n = len(nodes)
    if sorted(int(i) for i in ranking) != list(range(n)):
        raise ValueError(f"the ranking must hold every node index 0..{n - 1} once")
    ends = trials.mean(np.array([[True] * n, [False] * n]))
    m_full, m_empty = float(ends[0]), float(ends[1])
    if m_full == m_empty:
        raise ValueError("the full model and the empty circuit have the same measure: faithfulness is undefined")
    cand = set(range(n)) if candidates is None else {int(i) for i in candidates}
    rank = np.empty(n, dtype=int)
    rank[np.asarray(ranking, dtype=int)] = np.arange(n)
    attribution = np.full(n, np.nan) if attribution is None else np.asarray(attribution, dtype=float)

    def accepted(f: float, target: float) -> bool:
        return abs(1 - f) <= 1 - target if two_sided else f >= target

    def with_prefix(k: int) -> np.ndarray:
        keep = np.ones(n, dtype=bool)
        keep[ranked[k:]] = False
        return keep

    ranked = [int(i) for i in ranking if int(i) in cand]
    top = max(float(t) for t in targets)
    lo, hi, searched = -1, len(ranked), 0  # bisection: the prefix of hi nodes keeps the target (all of them: f = 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        searched += 1
        if accepted(float(faithfulness(trials.mean(with_prefix(mid)[None]), m_full, m_empty)[0]), top):
            hi = mid
        else:
            lo = mid
    size = hi if max_trials is None else min(hi, max_trials)
    untried = ranked[size:]  # checked together in one trial at the first target
    order = ranked[:size][::-1]
    kept, current, rows = np.ones(n, dtype=bool), 1.0, []
    results = {}
    for target in sorted({float(t) for t in targets}, reverse=True):
        visit, trial_count = 0, searched if target == top else 0

        def record(p, i, tried, dropped):
            nonlocal visit
            rows.append({"target": target, "pass": p, "visit": visit, "node": node_label(*nodes[i]),
                         "layer": nodes[i][0], "head": nodes[i][1], "rank": int(rank[i]),
                         "attribution": float(attribution[i]),
                         "tried": tried, "dropped": bool(dropped), "faithfulness": float(current),
                         "nodes_kept": int(kept.sum())})
            visit += 1

        if untried and kept[untried].all():  # the bounded nodes: one trial, at the first target
            trial = kept.copy()
            trial[untried] = False
            f = float(faithfulness(trials.mean(trial[None]), m_full, m_empty)[0])
            trial_count += 1
            if accepted(f, target):
                kept, current = trial, f
            for i in untried:
                record(0, i, False, accepted(f, target))
        minimal, bases = False, trials.start_circuit(kept)
        for p in range(1, max_passes + 1):
            changed = False
            for i in [i for i in order if kept[i]]:
                m, new = trials.try_drop(kept, i, bases)
                f = float(faithfulness(m, m_full, m_empty))
                trial_count += 1
                if accepted(f, target):
                    kept, current, changed, bases = kept.copy(), f, True, new
                    kept[i] = False
                record(p, i, True, accepted(f, target))
            if not changed:
                minimal = True
                break
        results[target] = Pruned(target, kept.copy(), float(current), trial_count, minimal)
    return [results[float(t)] for t in targets], pd.DataFrame(rows)
