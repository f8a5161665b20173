"""Circuit discovery: the smallest set of heads and MLPs that keeps a target share of the model's behaviour,
found by exact greedy pruning at node level (ACDC, Conmy et al. 2023, with nodes instead of edges), along a ranking
of the nodes.

The trials. A circuit C keeps some nodes (query heads and MLPs); every other node is ablated on the teacher-forced
protocol (`teacher_forcing.TailTrials`: END and every answer position, position-matched values). A continuous
measure m averaged over the scored items (`protocol.PRUNE_MEASURES`, config `circuit.discover.tf_measure`) gives the
faithfulness (m(C) - m(empty)) / (m(M) - m(empty)) (`faithfulness`; M the full model). The search reads the trials
through `mean`, `start_circuit`, `try_drop` and `attribution` only.

The order (`node_ranking`): the nodes by |attribution| on the whole model, largest first. Not by signed attribution:
a node that pushes against the answer is part of the behaviour too (two-sided acceptance counts overshoot as
unfaithful), and ranked last it is missing from every small circuit of the ranking. On SmolLM2-135M's addition
(teacher-forced, mean ablation) the top nodes by signed attribution kept 0.55-0.62 of full answers at 5-50% of the
nodes, by |attribution| 0.81-0.88; attribution recomputed on the circuit left as nodes drop
(`TailTrials.attribution(kept=...)`, rounds of a quarter of the nodes) did no better at 19 times the gradients
(`benchmarks/discover_order.py`; docs/circuit.md). The attribution is integrated gradients of the measure along
every node's path from its ablated value to its own (`ig_path`: the midpoint alphas and the circuit's gates), summing
to m(M) - m(empty); on a circuit C (`kept`) the path runs from the empty circuit to C.

The pruning (`prune`) takes the ranking. First the smallest prefix of it (the top k nodes) that keeps the highest
target is found by bisection over k (about log2(nodes) trials); the nodes below it leave together in that one
checked trial. Then nodes are visited least important first (the ranking reversed); a node is dropped when the
circuit without it keeps the target faithfulness (two-sided, as the discover rule prunes: |1 - f| <= 1 - target).
Sweeps repeat over the nodes still kept until one drops nothing, so the result is minimal: dropping any one of its
nodes leaves the target (`Pruned.minimal` says whether that was reached within `max_passes`). The targets run from
the highest down, each starting from the circuit of the one above: the circuits nest, and a lower target costs a
sweep over the few nodes still kept rather than over the model. The prefix makes the search cheaper (a sweep over
the prefix, not the model) and ties the circuits to the ranking whose prefixes are the CPR curve
(`teacher_forcing.cpr_cmd`). A trial that drops one node of layer l runs from layer l on (`try_drop`), from the
current circuit's residual entering l. On models with more than `max_trials` nodes only the top `max_trials` of the
ranking get a trial of their own (the rest leave together in one checked trial).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from arithmech.interp.nodes import node_label

MLP = -1  # the head number of an MLP node

Node = tuple[int, int]  # (layer, head), head MLP (-1) for the layer's MLP


def all_nodes(n_layers: int, n_heads: int) -> list[Node]:
    """Every node in column order: the heads layer by layer, then the MLPs (the order `mean_ablate` takes)."""
    return [(l, h) for l in range(n_layers) for h in range(n_heads)] + [(l, MLP) for l in range(n_layers)]


def rank_correlation(x, y) -> float:
    """Spearman's rank correlation (Pearson's on average ranks)."""
    rx, ry = (pd.Series(np.asarray(v, dtype=float)).rank().to_numpy() for v in (x, y))
    return float(np.corrcoef(rx, ry)[0, 1])


def faithfulness(m, m_full: float, m_empty: float):
    """(m - m(empty)) / (m(M) - m(empty)), elementwise."""
    return (np.asarray(m, dtype=float) - m_empty) / (m_full - m_empty)


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
    """(ranking, attribution): every node index by |attribution| (`attribution(steps)` of `trials`, a
    `teacher_forcing.TailTrials`), largest first, ties by index; and the attribution [nodes] (module docstring)."""
    attribution = trials.attribution(steps)
    return np.argsort(-np.abs(attribution), kind="stable"), attribution


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


def prune(trials, targets: Sequence[float], *, ranking: Sequence[int],
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
