"""Mean ablation of heads and MLPs: does the model still calculate without the key components?

A node (a query head or an MLP) is mean-ablated by replacing its output (a head's slice of the o_proj
input; the MLP module's output) with the mean of that output over the COUNTERFACTUAL prompts of the
identification pairs, counted back from END (`means.AlignedMean`, index 0 = END). The counterfactual
mean keeps everything a node does on arithmetic-shaped text except what depends on the operator, so a drop
in accuracy is attributable to the operation rather than to pushing the residual stream off-distribution
(as zero ablation would).

Positions (`positions=`, the mechanism):
  "end"      only the last position of every forward. On a prompt that is END, the one position whose
             output is read (the answer's first token) and the only position path patching patched. In
             greedy generation with a KV cache every later forward is the single new token, so each newly
             generated position is ablated too, once, with the END mean, and its cached keys/values are the
             ablated ones.
  "aligned"  every one of the last P positions, P = the length of the given mean, each with the mean at
             the same offset from END; positions further back are left untouched. (On a prompt shorter than
             P the surplus values land on left padding, which no real token attends to, or fall off the
             start of the sequence, so they change nothing.) In generation each new token gets the END mean.

The knockout rule's position sets (`ablation.positions`, stages.validate): "end" is the mechanism above
with the END mean over all counterfactuals; "all" is Wang et al.'s mean ablation (IOI): every prompt gets
"aligned" with the mean over the counterfactuals of ITS OWN template (`means.GroupedMean`), so a
position meets the mean of the same token slot of the same template, never of another template or shot
count. With zero-shot counterfactuals (the default) those means cover the query line, whose tokens align
exactly within a template (single-digit operands; a null word of the operator word's token count); the
few-shot lines before it have no counterfactual and are left as they are.

What the paper fixes and what it leaves open. Zhang et al. identify the key heads by path patching at END
(here `patching`, the paper's Algorithm 1) and validate them by knocking them out with mean ablation,
comparing the accuracy drop with that of knocking out random heads; the positions at which a knocked-out
head's output is replaced are not pinned down, so both settings are run. "end" is the headline because it
ablates exactly the (node, position) pairs whose effect was measured when the nodes were selected, so the
validation tests the same claim the identification made (the heads move operand/operator information INTO
the last position). "all" is a stronger, different intervention: it also removes what the heads write at
the operand and operator positions, which path patching at END never measured.

Knockout curves: `knockout` ablates the first k of a ranked head list for k = 0..K in ONE forward per
batch, by stacking K+1 copies of the batch and giving copy k a per-row mask that ablates heads[:k]. It
runs every position of every copy and takes either `positions`: the REFERENCE.

The fast path (what the rules run, for both position sets): an ablation of the last P positions (P = 1
for "end") changes nothing before them, so `greedy_end_sets` runs the prefix (all tokens but those P) once
per batch with a KV cache and then only the last P tokens, and each later generated token, for many
ablated copies (`patching.total_logits` uses the same trick for END). With zero-shot counterfactuals the
per-template means of "all" cover the query line, so the few-shot lines are the shared prefix. Its first
step is the first-token knockout of any head sets (tested against `knockout`); its later steps are the
full greedy answers (tested against `generation.greedy_generate` inside `mean_ablate`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from arithmech.data.arithmetic import encode
from arithmech.interp.nodes import Head
from arithmech.intervention.batching import COPIES_PER_FORWARD
from arithmech.intervention.decoding import Hooks, greedy_decode
from arithmech.intervention.hooks import patch_tail
from arithmech.intervention.kvcache import end_copies, prefix_cache
from arithmech.intervention.means import AlignedMean, GroupedMean
from arithmech.model.loading import LoadedModel

POSITIONS = ("end", "aligned")


def _check_nodes(lm: LoadedModel, heads: Sequence[Head], mlps: Sequence[int]) -> None:
    for layer, head in heads:
        if not (0 <= layer < lm.n_layers and 0 <= head < lm.n_heads):
            raise ValueError(f"head ({layer}, {head}) out of range for {lm.n_layers} layers x {lm.n_heads} heads")
    for layer in mlps:
        if not 0 <= layer < lm.n_layers:
            raise ValueError(f"MLP layer {layer} out of range for {lm.n_layers} layers")


def _check_shared_mean(means: AlignedMean) -> None:
    if means.heads.dim() != 4:
        raise ValueError("knockout takes a shared mean (heads [P, L, H, D]), not per-row values")


def ablation_patches(
    lm: LoadedModel,
    heads: Sequence[Head],
    mlps: Sequence[int],
    means: AlignedMean,
    *,
    positions: str = "end",
    row_masks: torch.Tensor | None = None,
) -> tuple[dict, dict]:
    """The `hooks.patch_tail` arguments of a mean ablation (see `mean_ablate`)."""
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {', '.join(POSITIONS)}; got {positions!r}")
    heads, mlps = [tuple(map(int, h)) for h in heads], [int(m) for m in mlps]
    _check_nodes(lm, heads, mlps)
    n_nodes = len(heads) + len(mlps)
    if row_masks is not None:
        row_masks = torch.as_tensor(row_masks, dtype=torch.bool)
        if row_masks.dim() != 2 or row_masks.shape[1] != n_nodes:
            raise ValueError(f"row_masks must be [batch, {n_nodes}] (heads then MLPs); got {tuple(row_masks.shape)}")
        row_masks = row_masks.to(lm.device)
    mh, mm = means.heads, means.mlps
    per_row_h, per_row_m = mh.dim() == 5, mm.dim() == 4  # a leading batch axis: per-row values
    n_pos = 1 if positions == "end" else mh.shape[-4]
    dev, dtype = lm.device, lm.dtype

    head_patches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in sorted({l for l, _ in heads}):
        cols = [(j, h) for j, (l, h) in enumerate(heads) if l == layer]
        if row_masks is None:
            mask = torch.zeros(lm.n_heads, dtype=torch.bool, device=dev)
            for _, h in cols:
                mask[h] = True
        else:
            mask = torch.zeros(row_masks.shape[0], lm.n_heads, dtype=torch.bool, device=dev)
            for j, h in cols:
                mask[:, h] |= row_masks[:, j]
        values = mh[:, :n_pos, layer] if per_row_h else mh[:n_pos, layer]
        head_patches[layer] = (mask, values.to(dev, dtype))
    mlp_patches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in sorted(set(mlps)):
        cols = [len(heads) + j for j, l in enumerate(mlps) if l == layer]
        mask = torch.ones((), dtype=torch.bool, device=dev) if row_masks is None else row_masks[:, cols].any(1)
        values = mm[:, :n_pos, layer] if per_row_m else mm[:n_pos, layer]
        mlp_patches[layer] = (mask, values.to(dev, dtype))
    return head_patches, mlp_patches


@contextmanager
def mean_ablate(
    lm: LoadedModel,
    heads: Sequence[Head],
    mlps: Sequence[int],
    means: AlignedMean,
    *,
    positions: str = "end",
    row_masks: torch.Tensor | None = None,
) -> Iterator[None]:
    """Replace the outputs of `heads` [(layer, head)] and `mlps` [layer] with the counterfactual mean during
    every forward inside the block.

    means: AlignedMean, heads [P, L, H, D] and mlps [P, L, d] (index 0 = END); a leading batch axis
        ([B, P, L, H, D], [B, P, L, d]) gives per-row values instead (B = the forward's batch).
    positions: "end" or "aligned" (module docstring).
    row_masks: optional bool [B, len(heads) + len(mlps)]; column j says whether row b ablates node j (heads
        first, then MLPs, in the given order). Default: every row ablates every node.
    An empty node list registers no hooks at all."""
    head_patches, mlp_patches = ablation_patches(lm, heads, mlps, means, positions=positions, row_masks=row_masks)
    with patch_tail(lm, head_patches, mlp_patches):
        yield


def ablation_hooks(
    lm: LoadedModel,
    heads: Sequence[Head],
    mlps: Sequence[int],
    means: AlignedMean,
    *,
    positions: str = "end",
    row_masks: torch.Tensor | None = None,
) -> Hooks:
    """`decoding.Hooks` of `mean_ablate` whose per-row values (a leading batch axis of `means`) and
    `row_masks` [N, nodes] are numbered like the rows the hooks are called with: a forward over rows r
    ablates with means[r] and row_masks[r]. Without per-row values or masks, every forward alike."""
    per_row_h, per_row_m = means.heads.dim() == 5, means.mlps.dim() == 4

    def hooks(rows: torch.Tensor):
        values = AlignedMean(means.heads[rows] if per_row_h else means.heads,
                             means.mlps[rows] if per_row_m else means.mlps)
        return mean_ablate(lm, heads, mlps, values, positions=positions,
                           row_masks=None if row_masks is None else row_masks[rows])

    return hooks


@dataclass
class Knockout:
    """First-token results with the first k heads of a ranking ablated, k = 0..K (row k of each tensor).

    predicted: [K+1, n] greedy token ids;  answer_logits: [K+1, n];  accuracy: [K+1]"""

    predicted: torch.Tensor
    answer_logits: torch.Tensor
    accuracy: np.ndarray


@torch.no_grad()
def knockout(
    lm: LoadedModel,
    texts: list[str],
    answer_ids: torch.Tensor,
    ranked_heads: Sequence[Head],
    *,
    K: int,
    means: AlignedMean,
    positions: str = "end",
    batch_size: int = 8,
) -> Knockout:
    """Knockout curve with everything kept. `batch_size` counts TEXTS per forward; each forward runs
    (K+1) * batch_size rows (copy k of the batch, rows k*b..k*b+b-1, ablates ranked_heads[:k])."""
    ranked_heads = list(ranked_heads)
    if not 0 <= K <= len(ranked_heads):
        raise ValueError(f"K must be in 0..{len(ranked_heads)} (the number of ranked heads); got {K}")
    _check_shared_mean(means)
    answer_ids = torch.as_tensor(answer_ids)
    texts = list(texts)
    copies = K + 1
    preds, logits_out = [], []
    for start in range(0, len(texts), batch_size):
        enc = encode(lm.tokenizer, texts[start : start + batch_size], lm.device)
        b = enc["input_ids"].shape[0]
        rep = {k: v.repeat(copies, 1) for k, v in enc.items()}  # copy k = rows k*b .. k*b+b-1
        k_of_row = torch.arange(copies).repeat_interleave(b)  # [copies * b]
        row_masks = torch.arange(K)[None, :] < k_of_row[:, None]  # [copies * b, K]
        with mean_ablate(lm, ranked_heads[:K], [], means, positions=positions, row_masks=row_masks):
            logits = lm.model(**rep, logits_to_keep=1).logits[:, -1].float()
        answers = answer_ids[start : start + b].to(logits.device).repeat(copies)
        preds.append(logits.argmax(-1).view(copies, b).cpu())
        logits_out.append(logits.gather(1, answers[:, None])[:, 0].view(copies, b).cpu())
    predicted = torch.cat(preds, 1) if preds else torch.zeros(copies, 0, dtype=torch.long)
    answer_logits = torch.cat(logits_out, 1) if logits_out else torch.zeros(copies, 0)
    accuracy = (predicted == answer_ids[None]).float().mean(1).numpy().astype(float)
    return Knockout(predicted, answer_logits, accuracy)


@dataclass
class GreedyKnockout:
    """Greedy answers with each node set mean-ablated at END and at every generated position.

    tokens:              [n_sets, n, max_new_tokens] token ids; the pad id after a row's end-of-sequence
    first_answer_logits: [n_sets, n] logit of the answer's first token at END (NaN without `answer_ids`)"""

    tokens: torch.Tensor
    first_answer_logits: torch.Tensor

    @property
    def first_tokens(self) -> torch.Tensor:
        """[n_sets, n]: the greedy token at END (the first-token knockout of each set)."""
        return self.tokens[..., 0]


@torch.no_grad()
def greedy_end_sets(
    lm: LoadedModel,
    texts: list[str],
    head_sets: Sequence[Sequence[Head]],
    *,
    max_new_tokens: int,
    means: AlignedMean | None = None,
    set_means: Sequence[AlignedMean] | None = None,
    mlp_sets: Sequence[Sequence[int]] | None = None,
    answer_ids: torch.Tensor | None = None,
    batch_size: int = 16,
    copies_per_forward: int = COPIES_PER_FORWARD,
    settled: Callable[[int, list[int]], bool] | None = None,
    positions: str = "end",
) -> GreedyKnockout:
    """Greedy generation of `max_new_tokens` tokens with node set s (head_sets[s] and mlp_sets[s]) mean-
    ablated at END (or, positions="aligned", at the prompt's last P positions, P = the mean's length) and at
    each generated position: what `generation.greedy_generate` does inside `mean_ablate(..., positions)`,
    for many sets at once.

    The prompt minus its ablated tail (END, or the last P positions) runs once per batch, as the ablation
    changes nothing before it, and each chunk of c = max(1, copies_per_forward // b) sets continues from a
    copy of that prefix cache with the tail and then one token per forward (row i*c + j is text i with set j
    of the chunk). Where the batch is no longer than P, every copy runs the whole prompt. A row stops at its
    end-of-sequence token, or as soon as `settled(i, its tokens so far)` is true, i the index of its text in
    `texts` (`answers.decided_answers`: when its score cannot change any more, right or wrong); its later
    tokens are the pad id, and it leaves the forwards.

    Give exactly one of `means`, one AlignedMean shared by every set, and (positions "end" only) `set_means`,
    one per set (set s is ablated with set_means[s]'s END values: e.g. each task's key heads with that task's
    counterfactual mean, all sharing one prefix pass).
    Returns GreedyKnockout (tokens [n_sets, n, max_new_tokens]; `first_tokens` [n_sets, n])."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {', '.join(POSITIONS)}; got {positions!r}")
    if (means is None) == (set_means is None):
        raise ValueError("greedy_end_sets: give exactly one of means (shared by every set) and set_means (one per set)")
    per_set = set_means is not None
    if per_set and positions != "end":
        raise ValueError("greedy_end_sets: one mean per set only with positions='end'")
    if per_set:
        if len(set_means) != len(head_sets):
            raise ValueError(f"{len(head_sets)} head sets but {len(set_means)} means")
        for m in set_means:
            _check_shared_mean(m)
        # END values of every set's mean: heads [n_sets, 1, L, H, D], mlps [n_sets, 1, L, d]
        set_heads = torch.stack([m.heads[:1] for m in set_means])
        set_mlps = torch.stack([m.mlps[:1] for m in set_means])
    else:
        _check_shared_mean(means)
    head_sets = [[(int(l), int(h)) for l, h in hs] for hs in head_sets]
    mlp_sets = [[int(m) for m in ms] for ms in (mlp_sets or [[] for _ in head_sets])]
    if len(mlp_sets) != len(head_sets):
        raise ValueError(f"{len(head_sets)} head sets but {len(mlp_sets)} MLP sets")
    heads = list(dict.fromkeys(h for hs in head_sets for h in hs))  # every node any set ablates
    mlps = list(dict.fromkeys(m for ms in mlp_sets for m in ms))
    _check_nodes(lm, heads, mlps)
    col = {("h", h): j for j, h in enumerate(heads)} | {("m", m): len(heads) + j for j, m in enumerate(mlps)}
    n_sets = len(head_sets)
    set_masks = torch.zeros(n_sets, len(col), dtype=torch.bool)  # [n_sets, heads + mlps]
    for s, (hs, ms) in enumerate(zip(head_sets, mlp_sets)):
        set_masks[s, [col[("h", h)] for h in hs] + [col[("m", m)] for m in ms]] = True
    texts = list(texts)
    out = torch.full((n_sets, len(texts), max_new_tokens), lm.tokenizer.pad_token_id, dtype=torch.long)
    first = torch.full((n_sets, len(texts)), float("nan"))
    tail = 1 if positions == "end" else means.heads.shape[0]  # the positions the ablation reaches
    for start in range(0, len(texts), batch_size):
        enc = encode(lm.tokenizer, texts[start : start + batch_size], lm.device)
        b, S = enc["input_ids"].shape
        if positions == "end" and S < 2:
            raise ValueError("greedy_end_sets needs prompts of at least two tokens (a prefix and END)")
        prefix = prefix_cache(lm, enc, tail) if tail < S else None
        chunk = max(1, copies_per_forward // b)
        for s0 in range(0, n_sets, chunk):
            c = min(chunk, n_sets - s0)
            row_set = torch.arange(s0, s0 + c).repeat(b)  # row i*c + j is text start + i with set s0 + j
            values = AlignedMean(set_heads[row_set], set_mlps[row_set]) if per_set else means  # per-row END values
            hooks = ablation_hooks(lm, heads, mlps, values, positions=positions, row_masks=set_masks[row_set])

            def first_logits(step, rows, logits):  # called within this iteration
                if step == 0 and answer_ids is not None:
                    answers = torch.as_tensor(answer_ids)[start : start + b].to(logits.device)
                    picked = logits.gather(1, answers.repeat_interleave(c)[:, None])[:, 0]
                    first[s0 : s0 + c, start : start + b] = picked.view(b, c).T.cpu()

            def stop(row, ids):  # row i*c + j holds text start + i
                return settled(start + row // c, ids)

            inputs = end_copies(enc, prefix, c, tail, room=tail + max_new_tokens - 1)  # the last token is not run
            gen = greedy_decode(  # [b * c, max_new_tokens]
                lm, **inputs, max_new_tokens=max_new_tokens, hooks=hooks, stop=None if settled is None else stop,
                on_logits=first_logits,
            )
            del inputs  # this chunk's cache copies, before the next chunk makes its own
            out[s0 : s0 + c, start : start + b] = gen.view(b, c, -1).transpose(0, 1)
    return GreedyKnockout(out, first)


def set_answers(lm, texts, golds, *, head_sets, mlp_sets, means: AlignedMean | GroupedMean, positions: str,
                max_new_tokens: int, batch_size: int, copies: int, template_ids=None,
                answer_ids: torch.Tensor | None = None) -> GreedyKnockout:
    """Greedy answers (tokens [n_sets, n, max_new_tokens]) and, with `answer_ids`, the answer's first-token logit
    at END ([n_sets, n]), with each node set mean-ablated at the knockout rule's `positions`: "end" (END and
    every generated position, with the AlignedMean `means`, on the prefix-cache fast path) or "all" (Wang et
    al.'s mean ablation: every position, each prompt with its template's mean in the GroupedMean `means` at the
    same offset from END, and every generated position with its template's END mean; all sets at once per
    template, sharing the prefix the template's mean does not reach). Either way an answer stops as soon as its
    score against its gold is decided, right or wrong (`answers.decided_answers`), which leaves the score as it
    is."""
    from arithmech.data.answers import decided_answers

    golds = list(golds)
    work = {"mlp_sets": mlp_sets, "max_new_tokens": max_new_tokens, "batch_size": batch_size,
            "copies_per_forward": copies}
    if positions == "end":
        return greedy_end_sets(lm, texts, head_sets, means=means, answer_ids=answer_ids,
                               settled=decided_answers(lm.tokenizer, golds), **work)
    template_ids = np.asarray(template_ids)
    tokens = torch.empty(len(head_sets), len(texts), max_new_tokens, dtype=torch.long)
    first = torch.full((len(head_sets), len(texts)), float("nan"))
    for t in np.unique(template_ids):
        if t >= len(means.counts) or means.counts[t, 0] == 0:
            raise ValueError(f"template {t} has no identification pair, so no mean to ablate its prompts with")
        rows = np.flatnonzero(template_ids == t)
        out = greedy_end_sets(
            lm, [texts[i] for i in rows], head_sets, means=means.group(int(t)), positions="aligned",
            answer_ids=None if answer_ids is None else torch.as_tensor(answer_ids)[torch.as_tensor(rows)],
            settled=decided_answers(lm.tokenizer, [golds[i] for i in rows]), **work,
        )
        tokens[:, torch.as_tensor(rows)], first[:, torch.as_tensor(rows)] = out.tokens, out.first_answer_logits
    return GreedyKnockout(tokens, first)


def answers_correct(tokenizer, tokens: torch.Tensor, golds, judge=None) -> np.ndarray:
    """[n_sets, n] bool: whether each decoded greedy answer matches its gold, by `judge(text, gold)`
    (default `answers.answer_correct`: the first number, compared by value)."""
    from arithmech.data.answers import answer_correct

    judge = judge or answer_correct
    golds = list(golds)
    texts = tokenizer.batch_decode(tokens.flatten(0, 1), skip_special_tokens=True)
    flat = [judge(t, golds[i % len(golds)]) for i, t in enumerate(texts)]
    return np.array(flat, dtype=bool).reshape(tokens.shape[:2])


def transfer_targets(
    lm: LoadedModel, *, tasks, pairs_paths, svamp_path, non_math_path, transfer: dict, prompts_cfg: dict, seed: int
) -> list[dict]:
    """The transfer rule's data sets, the key heads knocked out on each: every operator's kept pairs, the other
    number formats of every operator, SVAMP (direct answers) and the non-math control (BIG-bench qa_wikidata).
    Each: name, kind, texts, golds (numbers, or lists of accepted strings), answer_ids (first answer token,
    operator pairs only), max_new_tokens, clusters (per text: its operand pair "a,b", or its item index in the
    source data, the unit a paired interval resamples). `lm`: a loaded model, for its tokenizer."""
    import pandas as pd

    from arithmech.data.answers import answer_tokens
    from arithmech.data.arithmetic import format_prompts, split_pairs
    from arithmech.data.datasets import subsample
    from arithmech.data.formatting import non_math_prompts, svamp_prompts
    from arithmech.interp.effects import operand_pairs
    from arithmech.interp.protocol import transfer_sets

    pairs_of = dict(zip(tasks, pairs_paths, strict=True))
    targets = []
    for kind, task in transfer_sets(tasks):
        if kind == "operator":
            path = pairs_of[task]
            pairs = split_pairs(pd.read_parquet(path), "validation", str(path))
            pairs = subsample(pairs, transfer["max_samples"], seed)
            targets.append({
                "name": task, "kind": kind, "texts": list(pairs["prompt"]), "golds": list(pairs["answer"]),
                "answer_ids": torch.tensor(pairs["answer_token_id"].to_numpy()),
                "max_new_tokens": answer_tokens(lm.tokenizer, pairs["answer"]),
                "clusters": list(operand_pairs(pairs)),
            })
        elif kind == "svamp":
            keep, texts = svamp_prompts(svamp_path, transfer["svamp"], seed)
            targets.append({
                "name": "SVAMP", "kind": kind, "golds": list(keep["gold"]), "answer_ids": None, "texts": texts,
                "max_new_tokens": answer_tokens(lm.tokenizer, keep["answer"]),
                "clusters": [str(i) for i in keep["index"]],
            })
        elif kind == "non_math":
            keep, texts = non_math_prompts(non_math_path, transfer["non_math"], seed)
            targets.append({
                "name": Path(non_math_path).parent.name, "kind": kind, "texts": texts,
                "golds": list(keep["targets"]), "answer_ids": None,
                "max_new_tokens": transfer["non_math"]["max_new_tokens"], "clusters": [str(i) for i in keep["index"]],
            })
        else:  # a number format
            fmt_cfg = transfer["formats"]
            df = format_prompts(task, kind, fmt_cfg[kind], prompts_cfg, n=fmt_cfg["n"], seed=seed)
            targets.append({
                "name": f"{task} {kind.replace('_', '-')}", "kind": kind, "texts": list(df["prompt"]),
                "golds": list(df["gold"]), "answer_ids": None,
                "max_new_tokens": answer_tokens(lm.tokenizer, df["answer"]),
                "clusters": list(operand_pairs(df)),
            })
    return targets
