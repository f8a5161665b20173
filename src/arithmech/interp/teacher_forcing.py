"""Circuits scored teacher-forced and position-matched: the prompt, the gold answer and the full model's own
terminator are one sequence, and a circuit is judged on the next-token predictions at END and at every answer
position (the "tail"), with every node outside it ablated at those positions by values from the SAME offset.

Why. A greedy full answer under an ablation at END reads positions the END-only pruning never looked at, and
the old protocol (`ablation.greedy_end_sets`: every generated position gets the END mean) writes END's values
there. Here every tail position gets values taken at its own offset from the end of a matching run: a donor
prompt of the same template and answer length teacher-forced on its own answer ("resample", ACDC's and
EAP-IG's patching from other sequences), or the position-matched mean over a pool of such prompts ("mean",
Wang et al.'s template-position means). Positions before END keep their values (the prompt is read as is).

Items (`build_items`). Per scored pair: the prompt's ids (END last), the gold answer's ids as the tokenizer
splits them after the prompt (`arithmetic.continuation_ids`) and the terminator, the full model's greedy token
after prompt + gold answer. The terminator must end the number (`ends_number`): its text does not start with a
digit and the answer's text with it still reads as the gold (`answers.answer_correct`; "6." counts, the
few-shot lines end "z.\\n"). Pairs whose terminator does not are dropped, and counted. The tail has T = 1 +
answer tokens positions: END and each answer token; the targets [T] are the answer tokens and the terminator.
Items are grouped by T (`TailBatch`): in a left-padded batch of one T every row's tail sits at the same
offsets from the last position, which is what `hooks.patch_tail` indexes (offset 0 = the last position).

Measures (`tail_measures`, on tail logits [rows, T, vocab] and targets [rows, T]):
  correct  the full-vocabulary argmax is the target at every tail position, terminator included. With the
           same per-offset values written at END and at each generated position, a greedy answer is token
           for token prompt + gold + terminator exactly when this holds (`greedy_tail` checks it).
  logprob  the targets' summed log-probability: the pruning default, continuous and about the answer only.
  kl       KL(model || circuit) summed over the T positions (reported as -kl, so higher is better).
Faithfulness f = (m(C) - m(empty)) / (m(M) - m(empty)) (`protocol.faithfulness`).

Fast and exact (`TailTrials`): the ablation changes nothing before END, so the
prompt minus END runs once per batch with a KV cache and every circuit is a T-token forward on copies of it.
`reference_scores` is the slow reference: one item at a time, whole sequences, `patch_tail` with per-row values.

The search: the smallest set of heads and MLPs that keeps a target share of the pruning measure, found by exact
greedy pruning at node level (ACDC, Conmy et al. 2023, with nodes instead of edges) on `TailTrials`, along a
ranking of the nodes. It reads the trials through `nodes`, `mean`, `start_circuit`, `try_drop` and `attribution`
only. Several operators are pruned as one (the shared circuit) on one `TailTrials` of their items together
(`concat_items`, `concat_values`: each item keeps its own operator's ablation values, and items of one T share a
forward whatever their operator).

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
the prefix, not the model) and ties the circuits to the ranking whose prefixes are the CPR curve (`cpr_cmd`). A
trial that drops one node of layer l runs from layer l on (`try_drop`), from the current circuit's residual
entering l. On models with more than `max_trials` nodes only the top `max_trials` of the ranking get a trial of
their own (the rest leave together in one checked trial).

Scoring (`teacher_forced_table`): circuit sets (`nodes.CircuitSet`) under both ablations with the sanity checks,
faithfulness with cluster-bootstrap intervals (`protocol.faithfulness_table`). The protocol's torch-free half,
which the report reads too, is `arithmech.interp.protocol`.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import torch

from arithmech.data.answers import answer_correct
from arithmech.data.arithmetic import continuation_ids
from arithmech.interp.effects import pair_labels
from arithmech.interp.nodes import MLP, CircuitSet, Node, all_nodes, kept_masks, node_label
from arithmech.interp.protocol import KINDS, PRUNE_MEASURES, TAIL_MEASURES, faithfulness, faithfulness_table
from arithmech.intervention.batching import COPIES_PER_FORWARD
from arithmech.intervention.generation import pad_left
from arithmech.intervention.hooks import capture, hooks, patch_tail
from arithmech.intervention.kvcache import PrefixCopies, end_copies, prefix_cache
from arithmech.intervention.means import AlignedMean
from arithmech.model.loading import LoadedModel

SHARES = (0.01, 0.02, 0.05, 0.10, 0.20, 0.50, 1.0)  # MIB's CPR/CMD node shares


# --------------------------------------------------------------------------------------------------- items
@dataclass
class TailItems:
    """Teacher-forced items (module docstring). table: the kept rows of the pairs table (index reset) with
    n_answer_tokens and terminator added; prompt_ids, answer_ids: per item; terminators: [n] token ids;
    dropped: the pairs whose full-model terminator does not end the number; outputs: their `tail_outputs`, where
    `build_items` captured them in the same forward (a pool's: one forward fewer)."""

    table: pd.DataFrame
    prompt_ids: list[list[int]]
    answer_ids: list[list[int]]
    terminators: list[int]
    dropped: pd.DataFrame = field(default_factory=pd.DataFrame)
    outputs: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def tails(self) -> np.ndarray:
        """T per item: END plus the answer tokens, [n]."""
        return np.array([1 + len(a) for a in self.answer_ids], dtype=int)

    def targets(self, i: int) -> list[int]:
        return [*self.answer_ids[i], self.terminators[i]]

    def of_pairs(self, pairs: pd.DataFrame) -> "TailItems":
        """The items of `pairs` (by sample_id, in their order) that this set holds: a pool built once over every
        identification pair gives any draw of them its items with no forward of its own (the same prompt, gold
        answer and full-model terminator; a pair the pool dropped is left out, as `build_items` leaves it out), with
        their dropped pairs. May be empty."""
        at = pd.Series(np.arange(len(self)), index=self.table["sample_id"].to_numpy())
        rows = at.reindex(pairs["sample_id"].to_numpy()).dropna().astype(int).to_numpy()
        out = self.subset(rows)
        if "sample_id" in self.dropped:
            out.dropped = self.dropped[self.dropped["sample_id"].isin(pairs["sample_id"])].reset_index(drop=True)
        return out

    def subset(self, rows) -> "TailItems":
        """The items `rows` (positions, in this order), with their outputs where captured."""
        rows = np.asarray(rows, dtype=int)
        idx = torch.as_tensor(rows, dtype=torch.long)
        return TailItems(self.table.iloc[rows].reset_index(drop=True), [self.prompt_ids[i] for i in rows],
                         [self.answer_ids[i] for i in rows], [self.terminators[i] for i in rows], self.dropped,
                         None if self.outputs is None else (self.outputs[0][idx], self.outputs[1][idx]))


@dataclass
class TailBatch:
    """Items of one tail length T, left-padded: rows [b] (item indices); enc input_ids, attention_mask,
    position_ids [b, S] (prompt + answer tokens; the last T positions are the tail); targets [b, T]."""

    T: int
    rows: np.ndarray
    enc: dict
    targets: torch.Tensor


def tail_batches(lm: LoadedModel, items: TailItems, batch_size: int) -> list[TailBatch]:
    """The items grouped by T (ascending) and cut into batches of at most `batch_size`."""
    tails, out = items.tails, []
    for T in sorted(set(tails.tolist())):
        rows = np.flatnonzero(tails == T)
        for s in range(0, len(rows), batch_size):
            part = rows[s : s + batch_size]
            seqs = [items.prompt_ids[i] + items.answer_ids[i] for i in part]
            if min(len(s) for s in seqs) <= T:
                raise ValueError("teacher-forced items need a prompt of at least two tokens (a prefix and END)")
            targets = torch.tensor([items.targets(i) for i in part], dtype=torch.long, device=lm.device)
            out.append(TailBatch(T, part, pad_left(seqs, lm.tokenizer.pad_token_id, lm.device), targets))
    return out


def ends_number(tokenizer, answer_ids: Sequence[int], terminator: int, gold) -> bool:
    """Whether the terminator ends the gold number: its text does not start with a digit (or an undecoded
    partial character) and the answer's text followed by it still reads as `gold` (`answers.answer_correct`)."""
    term = tokenizer.decode([terminator], skip_special_tokens=True)
    if term[:1].isdigit() or term[:1] == "\ufffd":
        return False
    text = tokenizer.decode(list(answer_ids) + [terminator], skip_special_tokens=True)
    return answer_correct(text, gold) if term else answer_correct(text + " ", gold)


@torch.no_grad()
def build_items(lm: LoadedModel, pairs: pd.DataFrame, *, batch_size: int = 32, outputs: bool = False) -> TailItems:
    """Teacher-forced items from a pairs table (columns prompt and answer; template_id, a, b carried along):
    the prompt's and the gold answer's ids, and the full model's greedy terminator after them. Pairs whose
    terminator does not end the number (`ends_number`) are dropped (`TailItems.dropped`, reason
    'terminator_continues_number'); none kept is an error. outputs: also capture every node's tail outputs in
    the same forward (`TailItems.outputs`, what `tail_outputs` returns; for a pool of ablation values)."""
    for col in ("prompt", "answer"):
        if col not in pairs:
            raise ValueError(f"teacher-forced items need a '{col}' column in the pairs table")
    table = pairs.reset_index(drop=True)
    split = [continuation_ids(lm.tokenizer, p, str(a)) for p, a in zip(table["prompt"], table["answer"])]
    prompt_ids, answer_ids = [list(c) for c, _ in split], [list(a) for _, a in split]
    probe = TailItems(table, prompt_ids, answer_ids, [0] * len(table))  # terminators not known yet
    terminators = [0] * len(table)
    heads, mlps = _empty_outputs(lm, probe) if outputs else (None, None)
    for batch in tail_batches(lm, probe, batch_size):
        with capture(lm, end_only=False) if outputs else nullcontext() as cap:
            last = lm.model(**batch.enc, logits_to_keep=1).logits[:, -1].argmax(-1).tolist()
        for i, t in zip(batch.rows, last):
            terminators[i] = int(t)
        if outputs:
            _store_tail(cap, batch, heads, mlps)
    ok = np.array([ends_number(lm.tokenizer, a, t, g) for a, t, g in zip(answer_ids, terminators, table["answer"])],
                  dtype=bool)
    if not ok.any():
        raise ValueError(f"none of {len(table)} pairs has a full-model terminator that ends the gold number "
                         "(the model continues the number after the gold answer)")
    keep = np.flatnonzero(ok)
    kept = table.iloc[keep].reset_index(drop=True).assign(
        n_answer_tokens=[len(answer_ids[i]) for i in keep], terminator=[terminators[i] for i in keep])
    dropped = table.iloc[np.flatnonzero(~ok)].reset_index(drop=True).assign(drop_reason="terminator_continues_number")
    T_max = 1 + max(len(answer_ids[i]) for i in keep)
    return TailItems(kept, [prompt_ids[i] for i in keep], [answer_ids[i] for i in keep],
                     [terminators[i] for i in keep], dropped,
                     (heads[keep, :T_max], mlps[keep, :T_max]) if outputs else None)


def concat_items(parts: Sequence[TailItems]) -> TailItems:
    """Several item sets as one, in order (every operator's items pruned together: items of one T share a batch,
    whatever their set); the dropped pairs of every set; no captured outputs."""
    if not parts:
        raise ValueError("concat_items needs at least one item set")
    return TailItems(pd.concat([p.table for p in parts], ignore_index=True),
                     [ids for p in parts for ids in p.prompt_ids], [ids for p in parts for ids in p.answer_ids],
                     [t for p in parts for t in p.terminators],
                     pd.concat([p.dropped for p in parts], ignore_index=True))


# --------------------------------------------------------------------------------------------------- values
@dataclass
class TailValues:
    """Per-item ablation values at every tail offset (index 0 = the LAST tail position, T - 1 = END, the
    convention of `patch_tail`): heads [n, T_max, L, H, D], mlps [n, T_max, L, d]; offsets at or beyond an
    item's T are zeros and never read. donors: the pool row of each item's donor (resample) or -1 (mean)."""

    heads: torch.Tensor
    mlps: torch.Tensor
    kind: str
    donors: np.ndarray

    def rows(self, rows, T: int) -> AlignedMean:
        """Per-row values of `rows` over their T offsets: heads [b, T, L, H, D], mlps [b, T, L, d]."""
        idx = torch.as_tensor(np.asarray(rows), dtype=torch.long)
        return AlignedMean(self.heads[idx, :T], self.mlps[idx, :T])

    def to(self, device) -> "TailValues":
        """The same values on `device` (where the trials run them: moved once, not per forward)."""
        return TailValues(self.heads.to(device), self.mlps.to(device), self.kind, self.donors)

    def subset(self, rows) -> "TailValues":
        """The values of items `rows` (as `TailItems.subset`)."""
        idx = torch.as_tensor(np.asarray(rows, dtype=int), dtype=torch.long)
        return TailValues(self.heads[idx], self.mlps[idx], self.kind, self.donors[np.asarray(rows, dtype=int)])


def concat_values(parts: Sequence[TailValues]) -> TailValues:
    """The values of `concat_items`' parts, in the same order, each item its own (its operator's pool's means or
    donor: donors index each part's own pool); offsets beyond a part's T_max padded with zeros (never read)."""
    if not parts or len({p.kind for p in parts}) != 1:
        raise ValueError("concat_values needs at least one part, all of one ablation kind")
    T = max(p.heads.shape[1] for p in parts)

    def padded(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x.new_zeros(x.shape[0], T - x.shape[1], *x.shape[2:])], 1)

    return TailValues(torch.cat([padded(p.heads) for p in parts]), torch.cat([padded(p.mlps) for p in parts]),
                      parts[0].kind, np.concatenate([p.donors for p in parts]))


def _empty_outputs(lm: LoadedModel, items: TailItems) -> tuple[torch.Tensor, torch.Tensor]:
    T_max, n = int(items.tails.max()), len(items)
    return (torch.zeros(n, T_max, lm.n_layers, lm.n_heads, lm.head_dim),
            torch.zeros(n, T_max, lm.n_layers, lm.d_model))


def _store_tail(cap, batch: TailBatch, heads: torch.Tensor, mlps: torch.Tensor) -> None:
    """The batch's captured outputs at its last T positions into heads/mlps [n, T_max, ...], offset 0 = last."""
    rows, T = torch.as_tensor(batch.rows), batch.T
    heads[rows, :T] = cap.stacked_heads()[:, -T:].flip(1).float().cpu()
    mlps[rows, :T] = cap.stacked_mlps()[:, -T:].flip(1).float().cpu()


@torch.no_grad()
def tail_outputs(lm: LoadedModel, items: TailItems, batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Every node's output at each item's tail offsets, teacher-forced on its own answer with nothing ablated
    (`hooks.capture`): heads [n, T_max, L, H, D], mlps [n, T_max, L, d] (index 0 = the last tail position).
    `TailItems.outputs` where `build_items` captured them."""
    if items.outputs is not None:
        return items.outputs
    heads, mlps = _empty_outputs(lm, items)
    for batch in tail_batches(lm, items, batch_size):
        with capture(lm, end_only=False) as cap:
            lm.model(**batch.enc, logits_to_keep=1)
        _store_tail(cap, batch, heads, mlps)
    return heads, mlps


def group_keys(table: pd.DataFrame, tails: np.ndarray) -> list[tuple]:
    """The matching key of every row: (template_id, n_shots where the table has it, T)."""
    cols = [c for c in ("template_id", "n_shots") if c in table]
    if "template_id" not in cols:
        raise ValueError("position-matched ablation values need a 'template_id' column in the pairs table")
    return [(*(row[c] for c in cols), int(t)) for row, t in zip(table[cols].to_dict("records"), tails)]


def draw_donors(items: TailItems, pool: TailItems, seed: int) -> np.ndarray:
    """For each item, a pool row of the same template (and shot count) and answer token length, with another
    operand pair (a, b), drawn uniformly with `seed`; a clear error where an item has none."""
    keys, pool_keys = group_keys(items.table, items.tails), group_keys(pool.table, pool.tails)
    rng = np.random.default_rng([seed, 4301])
    by_key: dict[tuple, list[int]] = {}
    for j, k in enumerate(pool_keys):
        by_key.setdefault(k, []).append(j)
    pool_pairs = list(zip(pool.table["a"], pool.table["b"]))
    donors = np.empty(len(items), dtype=int)
    for i, (k, a, b) in enumerate(zip(keys, items.table["a"], items.table["b"])):
        eligible = [j for j in by_key.get(k, []) if pool_pairs[j] != (a, b)]
        if not eligible:
            raise ValueError(f"resample ablation: no pool prompt with template/shots/tail {k} and other operands than "
                             f"({a}, {b}); the pool has {len(by_key.get(k, []))} prompts of that key and "
                             f"{len(pool)} in all")
        donors[i] = eligible[int(rng.integers(len(eligible)))]
    return donors


def ablation_values(lm: LoadedModel, items: TailItems, pool: TailItems, kind: str, *, seed: int = 0,
                    batch_size: int = 32, pool_outputs: tuple[torch.Tensor, torch.Tensor] | None = None) -> TailValues:
    """Per-item tail values of one ablation `kind` (`KINDS`), from the `pool` items (identification pairs; the
    scored items are validation pairs): "resample", the node outputs of a donor (`draw_donors`) teacher-forced
    on its own answer, at the same offsets; "mean", the mean of the pool's outputs over the item's (template,
    shots, T) group at each offset. pool_outputs: the pool's `tail_outputs`, where the caller has them (one
    forward over the pool for both kinds)."""
    if kind not in KINDS:
        raise ValueError(f"ablation kind must be one of {', '.join(KINDS)}; got {kind!r}")
    pool_heads, pool_mlps = pool_outputs if pool_outputs is not None else tail_outputs(lm, pool, batch_size)
    if kind == "resample":
        donors = draw_donors(items, pool, seed)
        return TailValues(pool_heads[donors], pool_mlps[donors], kind, donors)
    keys, pool_keys = group_keys(items.table, items.tails), group_keys(pool.table, pool.tails)
    heads = torch.zeros(len(items), *pool_heads.shape[1:])
    mlps = torch.zeros(len(items), *pool_mlps.shape[1:])
    for k in sorted(set(keys), key=str):
        members = [j for j, pk in enumerate(pool_keys) if pk == k]
        if not members:
            raise ValueError(f"mean ablation: no pool prompt with template/shots/tail {k} ({len(pool)} in the pool)")
        mine = torch.as_tensor([i for i, ik in enumerate(keys) if ik == k])
        heads[mine] = pool_heads[members].double().mean(0).float()
        mlps[mine] = pool_mlps[members].double().mean(0).float()
    return TailValues(heads, mlps, kind, np.full(len(items), -1))


# --------------------------------------------------------------------------------------------------- measures
def tail_measures(logits: torch.Tensor, targets: torch.Tensor, reference: torch.Tensor | None = None) -> dict:
    """Per-row measures [rows] from tail logits [rows, T, vocab] and targets [rows, T] (module docstring):
    correct (bool as float), logprob, and -kl against the full model's tail log-probs `reference` [rows, T,
    vocab] (NaN without it)."""
    lp = logits.float().log_softmax(-1)
    out = {"correct": (lp.argmax(-1) == targets).all(-1).float(),
           "logprob": lp.gather(-1, targets[..., None])[..., 0].sum(-1)}
    if reference is None:
        out["kl"] = torch.full_like(out["logprob"], float("nan"))
    else:
        out["kl"] = -(reference.exp() * (reference - lp)).sum((-1, -2))
    return out


# --------------------------------------------------------------------------------------------------- scoring
@contextmanager
def tail_gated(lm: LoadedModel, gates: torch.Tensor, values: AlignedMean, T: int) -> Iterator[None]:
    """Every node's output at the last T positions becomes v + g (output - v), v the row's value at that
    offset (values heads [rows, T, L, H, D], mlps [rows, T, L, d]) and g = gates[row, node] (columns as
    `all_nodes`): g = 1 is the model, g = 0 the ablation. For integrated gradients."""
    H, D, L = lm.n_heads, lm.head_dim, lm.n_layers

    def head_hook(layer):
        def fn(module, args):
            x = args[0]
            B, S = x.shape[:2]
            g = gates[:, layer * H : (layer + 1) * H].to(x.dtype)[:, None, :, None]  # [rows, 1, H, 1]
            v = values.heads[:, :, layer].flip(1).to(x.device, x.dtype)  # [rows, T, H, D], END first
            tail = x[:, S - T :].reshape(B, T, H, D)
            return (torch.cat([x[:, : S - T], (v + g * (tail - v)).reshape(B, T, H * D)], 1), *args[1:])

        return fn

    def mlp_hook(layer):
        def fn(module, args, output):
            S = output.shape[1]
            g = gates[:, L * H + layer].to(output.dtype)[:, None, None]
            v = values.mlps[:, :, layer].flip(1).to(output.device, output.dtype)
            return torch.cat([output[:, : S - T], v + g * (output[:, S - T :] - v)], 1)

        return fn

    with hooks([(lm.o_proj(l), head_hook(l)) for l in range(L)], [(lm.mlp(l), mlp_hook(l)) for l in range(L)]):
        yield


def _repeat(values: AlignedMean, c: int) -> AlignedMean:
    return AlignedMean(values.heads.repeat_interleave(c, 0), values.mlps.repeat_interleave(c, 0))


class TailTrials:
    """Per-item measures of many circuits on teacher-forced items (module docstring), each circuit a T-token
    forward on copies of the batch's prefix cache, c circuits at a time as copies (row i * c + j = item i with
    circuit j).

    values: `ablation_values` for these items; measure: the pruning measure (`PRUNE_MEASURES`, what `per_item`,
    `mean`, `try_drop` and `attribution` return). Columns of every kept mask: `nodes.all_nodes(lm.n_layers,
    lm.n_heads)`. It offers what `prune` and `node_ranking` need (`nodes`, `mean`, `start_circuit`, `try_drop`,
    `attribution`)."""

    def __init__(self, lm: LoadedModel, items: TailItems, values: TailValues, *, measure: str = "logprob",
                 batch_size: int = 32,
                 copies_per_forward: int = COPIES_PER_FORWARD):
        if measure not in PRUNE_MEASURES:
            raise ValueError(f"the teacher-forced pruning measure must be one of {', '.join(PRUNE_MEASURES)}; "
                             f"got {measure!r}")
        self.lm, self.items = lm, items
        # on the model's device once, not per forward
        self.values = values.to(lm.device)
        self.measure, self.copies_per_forward = measure, copies_per_forward
        self.batch_size = batch_size
        self.nodes = all_nodes(lm.n_layers, lm.n_heads)
        self.heads = [n for n in self.nodes if n[1] != MLP]
        self.mlps = [l for l, h in self.nodes if h == MLP]
        self.n_items = len(items)
        self.batches = []  # [TailBatch, prefix copies, tail residual entering each layer, reference log-probs]
        with torch.no_grad():
            for batch in tail_batches(lm, items, batch_size):
                prefix = PrefixCopies(prefix_cache(lm, batch.enc, tail=batch.T), room=batch.T)
                plain = lm.body(**end_copies(batch.enc, prefix, 1, tail=batch.T), output_hidden_states=True)
                reference = lm.unembed(plain.last_hidden_state).float().log_softmax(-1)  # [b, T, vocab]
                self.batches.append([batch, prefix, plain.hidden_states, reference])
        self.model_correct = np.zeros(self.n_items)  # the full model's own teacher-forced correctness
        for batch, _, _, ref in self.batches:
            self.model_correct[batch.rows] = (ref.argmax(-1) == batch.targets).all(-1).double().cpu().numpy()

    def with_values(self, values: TailValues) -> "TailTrials":
        """The same items' trials under other ablation values: the prefix caches and their copies, the clean tail
        residuals and the reference log-probabilities do not depend on them, so they are shared, not recomputed
        (one prefix forward per batch for every ablation)."""
        other = copy.copy(self)
        other.values = values.to(self.lm.device)
        return other

    def _ablation(self, batch: TailBatch, kept: torch.Tensor):
        """`mean_ablate` of every circuit of `kept` [c, nodes] on the batch's rows repeated c times, with the
        values at the batch's T offsets (written from the last position back)."""
        from arithmech.interp.ablation import mean_ablate

        b, c = len(batch.rows), kept.shape[0]
        v = self.values.rows(batch.rows, batch.T)
        return mean_ablate(self.lm, self.heads, self.mlps, _repeat(v, c), positions="aligned",
                           row_masks=(~kept).repeat(b, 1))

    @torch.no_grad()
    def _logits(self, entry, kept: torch.Tensor, *, start: int | None = None, base=None, states: bool = False):
        """Tail logits [b * c, T, vocab] of c circuits (kept [c, nodes]): one T-token forward, from the lowest
        layer any circuit ablates (`LoadedModel.layers_from`, the residual entering it) or from `start` on
        residuals `base` (per layer [b, T, d]); with `states` also the residuals entering layers start.. (c = 1)."""
        batch, prefix, resid, _ = entry
        c, T = kept.shape[0], batch.T
        if start is None:
            ablated = [self.nodes[i][0] for i in torch.nonzero((~kept).any(0))[:, 0].tolist()]
            start = min(ablated, default=self.lm.n_layers - 1)
        base = resid if base is None else base
        inputs = end_copies(batch.enc, prefix, c, tail=T)
        del inputs["input_ids"]
        with self._ablation(batch, kept), self.lm.layers_from(start):
            out = self.lm.body(**inputs, inputs_embeds=base[start].repeat_interleave(c, 0),
                               output_hidden_states=states)
        logits = self.lm.unembed(out.last_hidden_state)
        if not states:
            return logits
        return logits, out.hidden_states[: self.lm.n_layers - start]

    def _measures(self, entry, logits: torch.Tensor, c: int) -> dict:
        batch, _, _, reference = entry
        return tail_measures(logits, batch.targets.repeat_interleave(c, 0), reference.repeat_interleave(c, 0))

    def scores(self, kept, *, hooked: bool = False) -> dict[str, np.ndarray]:
        """Every measure (`TAIL_MEASURES`) of every circuit on every item: {measure: [c, n_items]} (kept: bool
        [c, nodes]); kl is given as -KL. A circuit that keeps every node is the model: its measures come from the
        reference log-probabilities, with no forward, unless `hooked` (the 'nothing ablated' sanity check, which
        asks the hooked forward itself)."""
        kept = torch.as_tensor(np.asarray(kept), dtype=torch.bool)
        if kept.dim() != 2 or kept.shape[1] != len(self.nodes):
            raise ValueError(f"kept masks must be [circuits, {len(self.nodes)}]; got {tuple(kept.shape)}")
        out = {m: np.zeros((kept.shape[0], self.n_items)) for m in TAIL_MEASURES}
        whole = kept.all(1) & (not hooked)
        if whole.any():
            model_rows = torch.nonzero(whole)[:, 0].numpy()
            for batch, _, _, reference in self.batches:
                for m, v in tail_measures(reference, batch.targets, reference).items():
                    out[m][np.ix_(model_rows, batch.rows)] = v.double().cpu().numpy()[None]
        ablating = torch.nonzero(~whole)[:, 0]
        kept, n = kept[ablating], len(ablating)
        if n == 0:
            return out
        rows_of = ablating.numpy()  # row of `out` for each circuit still to score
        for entry in self.batches:
            b = len(entry[0].rows)
            # equal chunks, the last padded with its last circuit: every forward of the call has as many copies,
            # so the batch's prefix copies are made once (`PrefixCopies`), not once per chunk size
            pieces = -(-n // max(1, self.copies_per_forward // b))
            chunk = -(-n // pieces)
            for s0 in range(0, n, chunk):
                part = kept[s0 : s0 + chunk]
                c = part.shape[0]
                if c < chunk:
                    part = torch.cat([part, part[-1:].expand(chunk - c, -1)])
                for m, v in self._measures(entry, self._logits(entry, part), chunk).items():
                    out[m][np.ix_(rows_of[s0 : s0 + c], entry[0].rows)] = (
                        v.view(b, chunk)[:, :c].T.double().cpu().numpy())
        return out

    def per_item(self, kept) -> np.ndarray:
        """The pruning measure of every circuit on every item, [c, n_items]."""
        return self.scores(kept)[self.measure]

    def mean(self, kept) -> np.ndarray:
        """The pruning measure of every circuit, averaged over the items: [c]."""
        return self.per_item(kept).mean(1)

    def start_circuit(self, kept: np.ndarray) -> list:
        """The tail residuals entering every layer under circuit `kept` (bool [nodes]), per batch (`try_drop`)."""
        row = torch.as_tensor(np.asarray(kept), dtype=torch.bool)[None]
        return [list(self._logits(entry, row, start=0, states=True)[1]) for entry in self.batches]

    def try_drop(self, kept: np.ndarray, node: int, bases: list) -> tuple[float, list]:
        """The pruning measure (mean over items) of `kept` without `node`, run from `node`'s layer on over the
        residuals `bases` of `kept` (`start_circuit`), and the new circuit's residuals."""
        trial = np.asarray(kept, dtype=bool).copy()
        trial[node] = False
        row = torch.as_tensor(trial)[None]
        layer, total, new = self.nodes[node][0], 0.0, []
        for entry, base in zip(self.batches, bases):
            logits, states = self._logits(entry, row, start=layer, base=base, states=True)
            total += float(self._measures(entry, logits, 1)[self.measure].double().sum())
            new.append(base[:layer] + list(states))
        return total / self.n_items, new

    def attribution(self, steps: int = 8, kept=None) -> np.ndarray:
        """Integrated gradients of the pruning measure (mean over items) for every node, gates at END and every
        answer position (`tail_gated`), alpha 0 -> 1 by the midpoint rule: [nodes], summing to about
        m(M) - m(empty). On circuit `kept` (bool [nodes], default the model) the nodes outside it stay ablated
        (gate 0, attribution 0) and the attributions sum to about m(kept) - m(empty) (attribution recomputed as nodes
        drop, `benchmarks/discover_order.py`)."""
        alphas, kept = ig_path(steps, kept, len(self.nodes))
        total = torch.zeros(len(self.nodes), dtype=torch.float64)
        for batch, prefix, _, reference in self.batches:
            b = len(batch.rows)
            gates = (alphas[:, None] * kept[None]).to(self.lm.device).requires_grad_()
            with torch.enable_grad():
                inputs = end_copies(batch.enc, prefix.prefix, steps, tail=batch.T, room=0)
                with tail_gated(self.lm, gates.repeat(b, 1), _repeat(self.values.rows(batch.rows, batch.T), steps),
                                batch.T):
                    logits = self.lm.unembed(self.lm.body(**inputs).last_hidden_state)
                m = tail_measures(logits, batch.targets.repeat_interleave(steps, 0),
                                  reference.repeat_interleave(steps, 0))[self.measure]
                (grad,) = torch.autograd.grad(m.sum(), gates)
            total += grad.sum(0).double().cpu()
        return (total * kept.double() / steps / self.n_items).numpy()


# --------------------------------------------------------------------------------------------------- search
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
    `TailTrials`), largest first, ties by index; and the attribution [nodes] (module docstring: the order)."""
    attribution = trials.attribution(steps)
    return np.argsort(-np.abs(attribution), kind="stable"), attribution


@dataclass
class Pruned:
    """One target's pruned circuit. kept: bool [nodes] (columns `nodes.all_nodes`); faithfulness: of the measure on the
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
    """Greedy node pruning (module docstring: the pruning) at every target, the highest first from the smallest
    prefix of `ranking` (node indices, most important first: `node_ranking`) that keeps it, each lower one from the
    circuit of the one above (so the circuits nest, and a lower target costs only a sweep over the nodes still kept).
    Visits run least important first; at each target sweeps repeat until one drops nothing or `max_passes` sweeps ran.
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


# --------------------------------------------------------------------------------------------------- references
def _ablated_patches(lm: LoadedModel, mask, values: AlignedMean):
    """`patch_tail` arguments ablating the nodes where `mask` (bool [nodes]) is False with per-row values
    (heads [1, P, L, H, D], mlps [1, P, L, d])."""
    nodes = all_nodes(lm.n_layers, lm.n_heads)
    heads = {}
    for l in range(lm.n_layers):
        m = torch.tensor([not mask[nodes.index((l, h))] for h in range(lm.n_heads)])
        if m.any():
            heads[l] = (m, values.heads[:, :, l])
    mlps = {l: (torch.tensor(True), values.mlps[:, :, l]) for l in range(lm.n_layers)
            if not mask[nodes.index((l, MLP))]}
    return heads, mlps


@torch.no_grad()
def reference_scores(lm: LoadedModel, items: TailItems, values: TailValues, kept) -> dict:
    """The slow reference of `TailTrials.scores`: {measure: [c, n_items]}, one item and one circuit at a time: the
    whole teacher-forced sequence in one forward under `patch_tail` with the item's values at its T offsets."""
    out = {m: np.zeros((len(kept), len(items))) for m in TAIL_MEASURES}
    for i in range(len(items)):
        prompt, answer, T = items.prompt_ids[i], items.answer_ids[i], 1 + len(items.answer_ids[i])
        seq = torch.tensor([prompt + answer], device=lm.device)
        targets = torch.tensor([items.targets(i)], device=lm.device)
        ref = lm.model(input_ids=seq).logits[:, -T:].float().log_softmax(-1)
        v = values.rows([i], T)
        for j, mask in enumerate(kept):
            with patch_tail(lm, *_ablated_patches(lm, mask, v)):
                logits = lm.model(input_ids=seq).logits[:, -T:]
            for m, x in tail_measures(logits, targets, ref).items():
                out[m][j, i] = float(x[0])
    return out


@torch.no_grad()
def greedy_tail(lm: LoadedModel, items: TailItems, values: TailValues, kept) -> np.ndarray:
    """Greedy generation of T tokens per item under circuit `kept` (bool [nodes]), the node values written at
    END and at each generated position from the same offsets the teacher-forced tail uses (END: offset T - 1;
    the k-th generated token: T - 1 - k): tokens [n_items, T_max] (-1 past an item's T). It is prompt + gold +
    terminator exactly when the teacher-forced item is `correct` under the same values."""
    out = np.full((len(items), int(items.tails.max())), -1, dtype=int)
    for i in range(len(items)):
        T = 1 + len(items.answer_ids[i])
        v = values.rows([i], T)
        ids, cache = torch.tensor([items.prompt_ids[i]], device=lm.device), None
        for k in range(T):
            step_v = AlignedMean(v.heads[:, T - 1 - k : T - k], v.mlps[:, T - 1 - k : T - k])
            with patch_tail(lm, *_ablated_patches(lm, kept, step_v)):
                res = lm.model(input_ids=ids, past_key_values=cache, use_cache=True)
            cache, token = res.past_key_values, int(res.logits[0, -1].argmax())
            out[i, k], ids = token, torch.tensor([[token]], device=lm.device)
    return out


# --------------------------------------------------------------------------------------------------- checks
def constant_predictor(items: TailItems) -> float:
    """The teacher-forced accuracy of the best predictor that gives every item of a (template, shots, T) group
    (`group_keys`) the same targets: the share of items whose targets (answer tokens and terminator) are their
    group's most common. Why per group: with every node ablated no head moves information between positions,
    so each tail prediction depends on its own input token alone; END's token is the template's, so the empty
    circuit's teacher-forced answer is one chain per group, and its accuracy is at most this share (mean
    ablation; resample values vary with the donor, which no more tells it the operands)."""
    groups: dict[tuple, dict[tuple, int]] = {}
    for k, i in zip(group_keys(items.table, items.tails), range(len(items))):
        counts = groups.setdefault(k, {})
        counts[tuple(items.targets(i))] = counts.get(tuple(items.targets(i)), 0) + 1
    return float(sum(max(c.values()) for c in groups.values()) / len(items))


def check_nothing_ablated(trials: TailTrials, tol: float = 1e-4) -> dict:
    """Nothing ablated: KL 0 (so f = 1 for every measure) and the model's own teacher-forced accuracy
    (`TailTrials.model_correct`, from unhooked forwards). Returns the values; ValueError naming the check."""
    s = trials.scores(np.ones((1, len(trials.nodes)), dtype=bool), hooked=True)
    kl, acc, own = float(-s["kl"].mean()), float(s["correct"].mean()), float(trials.model_correct.mean())
    if kl > tol or abs(acc - own) > 1e-9:
        raise ValueError(f"sanity check 'nothing ablated' failed: KL {kl:.3g} (must be 0), teacher-forced accuracy "
                         f"{acc:.3f} against the model's own {own:.3f}")
    return {"nothing_kl": kl, "nothing_correct": acc, "model_correct": own}


def check_everything_ablated(trials: TailTrials, margin: float = 0.05) -> dict:
    """Everything ablated: teacher-forced correctness at most the constant predictor's (`constant_predictor`)
    plus `margin`. Returns the values; ValueError naming the check."""
    acc = float(trials.scores(np.zeros((1, len(trials.nodes)), dtype=bool))["correct"].mean())
    const = constant_predictor(trials.items)
    if acc > const + margin:
        raise ValueError(f"sanity check 'everything ablated' failed: teacher-forced accuracy {acc:.3f} above the "
                         f"constant predictor's {const:.3f} + {margin}")
    return {"empty_correct": acc, "constant_correct": const}


def check_one_node(trials: TailTrials, *, draws: int = 20, seed: int = 0, share: float = 0.95,
                   most: float = 0.75) -> dict:
    """One random node ablated (`draws` seeded draws): at least `most` of the draws keep at least `share` of the
    full model's own teacher-forced correctness (`TailTrials.model_correct`). Returns the values (one_node_kept: the
    share of draws that keep it; one_node_share: the mean share over the draws; one_node_failing: the drawn nodes
    that keep less, worst first: "L24MLP 0.31, L20H8 0.35"); ValueError naming the check.

    Why most draws, not their mean: a correct ablation of most single nodes leaves the answers alone, but a few
    nodes legitimately matter (the late MLPs and heads that write the answer; under resample ablation a donor's value
    of such a node moves the answer to the donor's), and a draw that hits one or two of them pulls the mean of 20
    draws below 0.95 by chance. A broken ablation (values tripled, as a sum for a mean, or sign-flipped) moves the
    answers whichever node it ablates: half its draws or more keep less (docs/circuit.md has the measurement)."""
    n = len(trials.nodes)
    picks = np.random.default_rng([seed, 4303]).choice(n, size=draws, replace=draws > n)
    masks = np.ones((draws, n), dtype=bool)
    masks[np.arange(draws), picks] = False
    own = float(trials.model_correct.mean())
    if own == 0:
        raise ValueError("sanity check 'one node ablated' cannot run: the full model gets no item right")
    per_draw = trials.scores(masks)["correct"].mean(1) / own
    kept = float(np.mean(per_draw >= share))
    failing = ", ".join(f"{node_label(*trials.nodes[picks[j]])} {per_draw[j]:.2f}"
                        for j in np.argsort(per_draw, kind="stable") if per_draw[j] < share)
    if kept < most:
        raise ValueError(f"sanity check 'one node ablated' failed: {kept:.0%} of {draws} single-node draws keep "
                         f"{share} of the model's teacher-forced accuracy {own:.3f} (needs {most:.0%}); the others: "
                         f"{failing}")
    return {"one_node_correct": float(per_draw.mean() * own), "one_node_share": float(per_draw.mean()),
            "one_node_kept": kept, "one_node_failing": failing}


def check_position_alignment(trials: TailTrials, tol: float = 1e-4) -> dict:
    """Every node ablated with the items' OWN clean outputs at their own offsets (`tail_outputs`) must be the
    model itself (KL 0): a value written at the wrong offset, or a tail misplaced in the padded batch, shows
    here, where the other checks need not see it. Returns the value; ValueError naming the check."""
    heads, mlps = tail_outputs(trials.lm, trials.items, trials.batch_size)
    mirror = trials.with_values(TailValues(heads, mlps, "self", np.full(len(trials.items), -1)))
    kl = float(-mirror.scores(np.zeros((1, len(trials.nodes)), dtype=bool))["kl"].mean())
    if kl > tol:
        raise ValueError(f"sanity check 'position alignment' failed: every node given its own clean values has "
                         f"KL {kl:.3g} from the model (must be 0)")
    return {"self_patch_kl": kl}


SANITY_CHECKS = ("nothing ablated", "position alignment", "everything ablated", "one node ablated")


def sanity_checks(trials: TailTrials, *, draws: int = 20, seed: int = 0, strict: bool = True,
                  checks: Sequence[str] = SANITY_CHECKS) -> dict:
    """The `checks` (default every one of `SANITY_CHECKS`), all run; their values in one dict, with 'failed': the
    failed checks' messages joined ('' when none). strict: a failed check raises a ValueError naming it (what the
    stages do; a model that cannot pass them, such as the tests' random tiny model, runs with strict False and
    gets a warning)."""
    import warnings

    unknown = set(checks) - set(SANITY_CHECKS)
    if unknown:
        raise ValueError(f"unknown sanity checks {sorted(unknown)}; known: {', '.join(SANITY_CHECKS)}")
    run = {"nothing ablated": check_nothing_ablated, "position alignment": check_position_alignment,
           "everything ablated": check_everything_ablated,
           "one node ablated": lambda t: check_one_node(t, draws=draws, seed=seed)}
    values, failed = {}, []
    for name in checks:
        try:
            values |= run[name](trials)
        except ValueError as err:
            failed.append(str(err))
    values["failed"] = "; ".join(failed)
    if failed and strict:
        raise ValueError(values["failed"])
    if failed:
        warnings.warn(values["failed"], stacklevel=2)
    return values


# --------------------------------------------------------------------------------------------------- CPR / CMD
def share_circuits(ranking: Sequence[int], shares: Sequence[float] = SHARES) -> np.ndarray:
    """Kept masks [len(shares), nodes]: the top ceil(share * nodes) nodes of `ranking` (node indices, most
    important first: `node_ranking`)."""
    ranking = np.asarray(ranking, dtype=int)
    n = len(ranking)
    masks = np.zeros((len(shares), n), dtype=bool)
    for i, s in enumerate(shares):
        if not 0 < s <= 1:
            raise ValueError(f"node shares must be in (0, 1]; got {s}")
        masks[i, ranking[: int(np.ceil(s * n - 1e-9))]] = True
    return masks


def cpr_cmd(trials: TailTrials, ranking: Sequence[int], shares: Sequence[float] = SHARES) -> pd.DataFrame:
    """Faithfulness f of the pruning measure (and of each measure) and |1 - f| at each node share (MIB's CPR and
    CMD curves: circuits of the top nodes of `ranking`): one row per share (share, n_nodes, f_<measure>,
    dev_<measure>)."""
    masks = share_circuits(ranking, shares)
    n = len(trials.nodes)
    s = trials.scores(np.vstack([np.ones(n, dtype=bool), np.zeros(n, dtype=bool), masks]))
    rows = {"share": list(shares), "n_nodes": masks.sum(1).tolist()}
    for m in TAIL_MEASURES:
        means = s[m].mean(1)
        f = faithfulness(means[2:], means[0], means[1])  # NaN where the model and the empty circuit agree
        rows[f"f_{m}"], rows[f"dev_{m}"] = f, np.abs(1 - f)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------- one call
def _strict(strict: bool | Sequence[str], kind: str) -> bool:
    return strict if isinstance(strict, bool) else kind in set(strict)


def protocol_scores(lm: LoadedModel, items: TailItems, pool: TailItems, kept, *, seed: int = 0, batch_size: int = 32,
                    sanity_draws: int = 20, strict: bool | Sequence[str] = True, pool_outputs=None,
                    sanity: bool = True, sanity_samples: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Every circuit of `kept` (bool [c, nodes]) under both ablations (`KINDS`) at END and every answer position:
    {f"{kind}_tail_{measure}": [c, n_items]} (`TAIL_MEASURES`; kl as -KL), and the sanity checks of each ablation
    ({f"{kind}_{check value}": value}; `sanity_checks` with `strict`: True for every kind, or the kinds whose
    failed check raises; the others warn and record it in their 'failed' value). pool_outputs: as
    `ablation_values`. sanity: False skips the checks (returns {}), for a caller that ran them on the same items and
    pool already. sanity_samples: the checks run on a seeded draw of at most this many of the items (None: all; the
    one-node check's 20 circuits are the costly part, and its mean over draws x items needs fewer items than the
    circuits' intervals); {kind}_n_items says how many."""
    values, checked = {}, {}
    kept = np.asarray(kept, dtype=bool)
    pool_outputs = pool_outputs if pool_outputs is not None else tail_outputs(lm, pool, batch_size)
    base = None  # one TailTrials whose prefix caches and references every ablation shares
    checked_rows = np.arange(len(items))
    if sanity_samples is not None and sanity_samples < len(items):
        checked_rows = np.sort(np.random.default_rng([seed, 4307]).choice(len(items), sanity_samples, replace=False))
    checked_base = None  # the same for the sanity checks' items, where they are a draw
    for kind in KINDS:
        tail_values = ablation_values(lm, items, pool, kind, seed=seed, batch_size=batch_size,
                                      pool_outputs=pool_outputs)
        if base is None:
            trials = base = TailTrials(lm, items, tail_values, batch_size=batch_size)
        else:
            trials = base.with_values(tail_values)
        values |= {f"{kind}_tail_{m}": v for m, v in trials.scores(kept).items()}
        if sanity:  # position alignment does not depend on the kind: checked once
            checks = [c for c in SANITY_CHECKS if c != "position alignment" or kind == KINDS[0]]
            on = trials
            if len(checked_rows) < len(items):
                drawn = tail_values.subset(checked_rows)
                if checked_base is None:
                    checked_base = TailTrials(lm, items.subset(checked_rows), drawn, batch_size=batch_size)
                on = checked_base.with_values(drawn)
            checked |= {f"{kind}_{k}": v for k, v in sanity_checks(on, draws=sanity_draws, seed=seed,
                                                                       strict=_strict(strict, kind),
                                                                       checks=checks).items()}
            checked[f"{kind}_n_items"] = len(checked_rows)
    return values, checked


def teacher_forced_table(lm, scored: pd.DataFrame, pool, sets: Sequence[CircuitSet], *, pool_outputs=None,
                         sanity_draws: int, strict, n_boot: int, seed: int, confidence: float, batch_size: int,
                         sanity: bool = True, sanity_samples: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every set on the teacher-forced protocol (`protocol_scores`: both ablations, END and every answer position,
    every measure) on the pairs `scored`, with values from the identification items `pool`
    (`build_items(..., outputs=True)`; pool_outputs: their `tail_outputs`, else computed). `sets` holds one 'model'
    and one 'empty' set; sanity: False skips the sanity checks (no sanity_* columns; for a caller that ran them on
    the same pairs and pool); sanity_samples: they run on a seeded draw of at most this many pairs
    (`protocol_scores`). Returns (table, per_item):
    table: one row per set (in order; `protocol.faithfulness_table`'s set columns), columns
    tf_<kind>_tail_<measure> (means) and faithfulness_tf_... with cluster-bootstrap intervals, tf_n_items (pairs
    scored), tf_dropped (pairs whose terminator continues the number: left out) and the sanity checks' values
    (sanity_<kind>_<value>, the same on every row);
    per_item: set_index, sample_id and the tf_... values of every set on every scored pair."""
    # outputs: the items' own clean tail outputs from the same forward, for the position-alignment check
    items = build_items(lm, scored, batch_size=batch_size, outputs=sanity)
    masks = kept_masks(sets, all_nodes(lm.n_layers, lm.n_heads))
    values, checks = protocol_scores(lm, items, pool, masks, seed=seed, pool_outputs=pool_outputs,
                                     batch_size=batch_size, sanity_draws=sanity_draws, strict=strict, sanity=sanity,
                                     sanity_samples=sanity_samples)
    values = {f"tf_{k}": np.asarray(v, dtype=float) for k, v in values.items()}
    scored_table = faithfulness_table(sets, values, pair_labels(items.table).to_numpy(), n_boot=n_boot, seed=seed,
                                      confidence=confidence)
    table = scored_table.assign(tf_n_items=len(items), tf_dropped=len(items.dropped),
                                **{f"sanity_{k}": v for k, v in checks.items()})
    ids = items.table["sample_id"].to_numpy()
    per_item = pd.DataFrame({"set_index": np.repeat(np.arange(len(sets)), len(ids)),
                             "sample_id": np.tile(ids, len(sets)),
                             **{k: v.reshape(-1) for k, v in values.items()}})
    return table, per_item
