"""Stage 2, validate (the paper's mean-ablation knockout): rule entry points for the knockout curves and
the transfer of each operator's key heads to other data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file

from ..io import write_parquet
from ..ablation import GreedyKnockout
from ..means import AlignedMean, GroupedMean
from ..prompts import split_pairs
from .common import load_stage_model, stage_meta

COPIES = 256  # transfer.copies_per_forward where a config leaves it out


def cache_means(cache: dict, positions: str) -> AlignedMean | GroupedMean:
    """The counterfactual means a node set is ablated with at the knockout rule's `positions`, from an
    activations cache: "end", the END mean over all identification counterfactuals; "all", each template's
    mean at every offset from END (`means.GroupedMean`)."""
    if positions == "end":
        return AlignedMean(cache["cf_mean_heads"], cache["cf_mean_mlps"])
    return GroupedMean(cache["cf_template_heads"], cache["cf_template_mlps"], cache["cf_template_counts"])


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
    from ..ablation import greedy_end_sets
    from ..answers import decided_answers

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
    from ..answers import answer_correct

    judge = judge or answer_correct
    golds = list(golds)
    texts = tokenizer.batch_decode(tokens.flatten(0, 1), skip_special_tokens=True)
    flat = [judge(t, golds[i % len(golds)]) for i, t in enumerate(texts)]
    return np.array(flat, dtype=bool).reshape(tokens.shape[:2])


def knockout_node_sets(effects: pd.DataFrame, key: pd.DataFrame, ablation: dict, *, n_layers: int, n_heads: int,
                       seed: int, top_k: list[int] | None = None, random_k: list[int] | None = None) -> list[tuple]:
    """The knockout rule's node sets, each (curve, seed, k, heads, mlps): the top k heads by patching effect
    (k = 0..K, K = ablation.max_heads, or the given `top_k`); two random controls over `ablation.random_seeds`
    draws each, k random heads drawn uniformly among the others (`random_heads`) and k drawn in the layers of
    the top k (`random_layer_matched`), for the given `random_k` (default `ablation.random_k`, capped at K);
    the key MLPs."""
    from ..controls import layer_matched_heads, random_heads

    heads = effects[effects["component"] == "head"].sort_values("mean_effect", kind="stable")
    K = min(ablation["max_heads"], len(heads))
    ranked = [(int(l), int(h)) for l, h in zip(heads["layer"][:K], heads["head"][:K])]
    tops = range(K + 1) if top_k is None else sorted({min(k, K) for k in top_k})
    ks = sorted({min(k, K) for k in (ablation["random_k"] if random_k is None else random_k)} - {0})
    sets = [("top_heads", -1, k, ranked[:k], []) for k in tops]
    for s in range(ablation["random_seeds"]):
        drawn = random_heads(n_layers, n_heads, K, seed=seed * 1000 + s, exclude=ranked)
        sets += [("random_heads", s, k, drawn[:k], []) for k in ks]
    for s in range(ablation["random_seeds"]):
        drawn = layer_matched_heads(ranked, n_heads, seed=seed * 1000 + 500 + s, n_layers=n_layers)
        sets += [("random_layer_matched", s, k, drawn[:k], []) for k in ks]
    key_mlps = [int(l) for l in key.loc[key["component"] == "mlp", "layer"]]
    return sets + [("key_mlps", -1, len(key_mlps), [], key_mlps)]


def run_knockout(
    *, model: str, task: str, model_dir, pairs_path, cache_path, effects_path, key_path,
    ablation: dict, compute: dict, seed: int, out_table, out_items,
) -> None:
    """Mean-ablation knockout on the VALIDATION pairs (operand pairs that played no part in ranking the heads
    or in the means): accuracy with the top k heads (by patching effect) knocked out, k = 0..max_heads,
    against random heads (uniform and layer-matched, several draws, at k in `ablation.random_k`), and with the
    key MLPs knocked out; for each of `ablation.positions` ("end", "all": see `set_answers`; "all" on a seeded
    draw of `ablation.all_positions_samples` pairs, the top heads at k in 0 and `ablation.random_k`, its
    random controls at k = max_heads only, as each set is a full forward of every prompt). Both the first answer
    token (`accuracy`, what path patching measured) and the full greedy answer (`full_accuracy`); `out_items`
    holds every set's per-item correctness (`knockout_items`), for paired comparisons."""
    from ..answers import answer_tokens
    from ..data import subsample

    lm = load_stage_model(model_dir, compute)
    pairs = split_pairs(pd.read_parquet(pairs_path), "validation", str(pairs_path))
    cache = load_file(str(cache_path))
    key = pd.read_parquet(key_path)
    effects = pd.read_parquet(effects_path)
    tables, item_tables = [], []
    for positions in ablation["positions"]:
        scored, top_k, random_k = pairs, None, None
        if positions == "all":  # each set is a full forward of every prompt: fewer prompts and sets
            scored = subsample(pairs, ablation["all_positions_samples"], seed).reset_index(drop=True)
            top_k, random_k = [0, *ablation["random_k"]], [ablation["max_heads"]]
        sets = knockout_node_sets(effects, key, ablation, n_layers=lm.n_layers, n_heads=lm.n_heads, seed=seed,
                                  top_k=top_k, random_k=random_k)
        texts, answers = list(scored["prompt"]), torch.tensor(scored["answer_token_id"].to_numpy())
        tokens = set_answers(
            lm, texts, scored["answer"], template_ids=scored["template_id"], head_sets=[s[3] for s in sets],
            mlp_sets=[s[4] for s in sets], means=cache_means(cache, positions), positions=positions,
            max_new_tokens=answer_tokens(lm.tokenizer, scored["answer"]), batch_size=compute["batch_size"], copies=256,
        ).tokens
        first_correct = tokens[..., 0] == answers[None]  # [n_sets, n]
        full_correct = answers_correct(lm.tokenizer, tokens, scored["answer"])  # [n_sets, n]
        first, full = first_correct.float().mean(1).numpy(), full_correct.mean(1)
        rows = [
            {"curve": c, "seed": sd, "k": k,
             "nodes": " ".join([f"L{l}H{h}" for l, h in hs] + [f"L{l}MLP" for l in ms]),
             "accuracy": float(a), "full_accuracy": float(f)}
            for (c, sd, k, hs, ms), a, f in zip(sets, first, full)
        ]
        tables.append(pd.DataFrame(rows).assign(n=len(texts), positions=positions, split="validation"))
        item_tables.append(knockout_items(sets, scored, first_correct.numpy(), full_correct).assign(positions=positions))
    meta = stage_meta(model_dir, "knockout", task=task, ablation=ablation, seed=seed)
    write_parquet(pd.concat(tables, ignore_index=True), out_table, meta)
    write_parquet(pd.concat(item_tables, ignore_index=True), out_items, meta)


def knockout_items(sets: list[tuple], scored: pd.DataFrame, first_correct: np.ndarray,
                   full_correct: np.ndarray) -> pd.DataFrame:
    """One row per node set and scored item: curve, seed, k, sample_id, cluster (the operand pair "a,b": the
    unit a paired interval resamples), first_correct and full_correct ([n_sets, n] bool flattened set-major)."""
    n = len(scored)
    return pd.DataFrame({
        "curve": np.repeat([s[0] for s in sets], n), "seed": np.repeat([s[1] for s in sets], n),
        "k": np.repeat([s[2] for s in sets], n), "sample_id": np.tile(scored["sample_id"].to_numpy(), len(sets)),
        "cluster": np.tile((scored["a"].astype(str) + "," + scored["b"].astype(str)).to_numpy(), len(sets)),
        "first_correct": first_correct.reshape(-1), "full_correct": full_correct.reshape(-1),
    })


def _transfer_targets(
    lm, *, tasks, pairs_paths, svamp_path, non_math_path, transfer: dict, prompts_cfg: dict, seed: int
) -> list[dict]:
    """The data sets the key heads are knocked out on: every operator's kept pairs, the other number
    formats of every operator, SVAMP (direct answers) and the non-math control (BIG-bench qa_wikidata).
    Each: name, kind, texts, golds (numbers, or lists of accepted strings), answer_ids (first answer token,
    operator pairs only), max_new_tokens, clusters (per text: its operand pair "a,b", or its item index in the
    source data, the unit a paired interval resamples)."""
    from ..data import subsample
    from ..answers import answer_tokens
    from ..prompts import format_prompts

    targets = []
    for task, path in zip(tasks, pairs_paths, strict=True):
        pairs = subsample(split_pairs(pd.read_parquet(path), "validation", str(path)), transfer["max_samples"], seed)
        targets.append({
            "name": task, "kind": "operator", "texts": list(pairs["prompt"]), "golds": list(pairs["answer"]),
            "answer_ids": torch.tensor(pairs["answer_token_id"].to_numpy()),
            "max_new_tokens": answer_tokens(lm.tokenizer, pairs["answer"]),
            "clusters": list(pairs["a"].astype(str) + "," + pairs["b"].astype(str)),
        })
    fmt_cfg = transfer["formats"]
    for fmt in ("multi_digit", "decimal"):
        for task in tasks:
            df = format_prompts(task, fmt, fmt_cfg[fmt], prompts_cfg, n=fmt_cfg["n"], seed=seed)
            targets.append({
                "name": f"{task} {fmt.replace('_', '-')}", "kind": fmt, "texts": list(df["prompt"]),
                "golds": list(df["gold"]), "answer_ids": None,
                "max_new_tokens": answer_tokens(lm.tokenizer, df["answer"]),
                "clusters": list(df["a"].astype(str) + "," + df["b"].astype(str)),
            })
    keep, texts = svamp_prompts(svamp_path, transfer["svamp"], seed)
    targets.append({
        "name": "SVAMP", "kind": "svamp", "golds": list(keep["gold"]), "answer_ids": None, "texts": texts,
        "max_new_tokens": answer_tokens(lm.tokenizer, keep["answer"]), "clusters": [str(i) for i in keep["index"]],
    })
    keep, texts = non_math_prompts(non_math_path, transfer["non_math"], seed)
    targets.append({
        "name": Path(non_math_path).parent.name, "kind": "non_math", "texts": texts, "golds": list(keep["targets"]),
        "answer_ids": None, "max_new_tokens": transfer["non_math"]["max_new_tokens"],
        "clusters": [str(i) for i in keep["index"]],
    })
    return targets


def svamp_prompts(path, cfg: dict, seed: int) -> tuple[pd.DataFrame, list[str]]:
    """The transfer's SVAMP items (`cfg`: transfer.svamp; a seeded draw of n, with `answer` and `index`)
    and their few-shot direct-answer prompts (shots drawn from the whole set). `make plan` reads the
    prompts' lengths from here too."""
    from ..data import load_svamp, subsample
    from ..formatting import question_prompts

    svamp = load_svamp(path).assign(answer=lambda d: [f"{g:g}" for g in d["gold"]], index=lambda d: d.index)
    keep = subsample(svamp, cfg["n"], seed)
    texts = question_prompts(list(svamp["question"]), list(svamp["answer"]), cfg["n_shots"], seed, items=keep["index"])
    return keep, texts


def non_math_prompts(path, cfg: dict, seed: int) -> tuple[pd.DataFrame, list[str]]:
    """The transfer's non-math items (`cfg`: transfer.non_math; a seeded draw of n of a BIG-bench
    generation task, with `index`) and their few-shot prompts, as `svamp_prompts`."""
    from ..data import load_bigbench_generation, subsample
    from ..formatting import question_prompts

    qa = load_bigbench_generation(path).assign(index=lambda d: d.index)
    keep = subsample(qa, cfg["n"], seed)
    texts = question_prompts(list(qa["input"]), [t[0] for t in qa["targets"]], cfg["n_shots"], seed,
                             items=keep["index"], question_prefix="", answer_prefix="", separator="\n")
    return keep, texts


def run_transfer(
    *, model: str, model_dir, tasks: list[str], pairs_paths, cache_paths, key_paths, svamp_path, non_math_path,
    transfer: dict, prompts_cfg: dict, compute: dict, seed: int, out_table, out_items,
) -> None:
    """Do the key heads of one operator matter for the others, other number formats, SVAMP, and not for
    non-math questions? For each source task X, X's key heads are mean-ablated (with X's counterfactual
    mean, at END and every generated position) on every target set, against as many random heads in the
    same layers (`transfer.random_seeds` layer-matched draws, same mean); the operators' own pairs are their
    validation pairs; greedy answers are scored against the gold answers.
    `retained` is the share of the items the unablated model gets right that stay right (the paper's
    "accuracy after knockout" on data filtered to correct answers). `out_items`: every set's correctness per
    item (source, heads, seed, target, target_kind, item, cluster, correct), for paired comparisons."""
    from ..ablation import greedy_end_sets
    from ..controls import layer_matched_heads
    from ..answers import decided_answers, qa_correct

    lm = load_stage_model(model_dir, compute)
    # the empty set ablates nothing; any mean will do
    sets = [{"source": "none", "heads": "none", "seed": -1, "nodes": [], "mean": tasks[0]}]
    means = {}
    for task, cache_path, key_path in zip(tasks, cache_paths, key_paths, strict=True):
        cache = load_file(str(cache_path))
        means[task] = AlignedMean(cache["cf_mean_heads"], cache["cf_mean_mlps"])
        key = pd.read_parquet(key_path)
        key_heads = [(int(l), int(h)) for l, h in key.loc[key["component"] == "head", ["layer", "head"]].to_numpy()]
        sets.append({"source": task, "heads": "key", "seed": -1, "nodes": key_heads, "mean": task})
        for s in range(transfer["random_seeds"]):
            drawn = layer_matched_heads(key_heads, lm.n_heads, seed=seed * 1000 + s, n_layers=lm.n_layers)
            sets.append({"source": task, "heads": "random", "seed": s, "nodes": drawn, "mean": task})
    set_means = [means[s["mean"]] for s in sets]
    rows, items = [], []
    for target in _transfer_targets(lm, tasks=tasks, pairs_paths=pairs_paths, svamp_path=svamp_path,
                                    non_math_path=non_math_path, transfer=transfer, prompts_cfg=prompts_cfg,
                                    seed=seed):
        # numbers compared by value (an answer stops once its score is decided); the non-math answers by text
        non_math = target["kind"] == "non_math"
        judge = qa_correct if non_math else None
        result = greedy_end_sets(
            lm, target["texts"], [s["nodes"] for s in sets], set_means=set_means,
            max_new_tokens=target["max_new_tokens"],
            batch_size=compute["batch_size"], copies_per_forward=transfer.get("copies_per_forward", COPIES),
            settled=None if non_math else decided_answers(lm.tokenizer, target["golds"]),
        )
        correct = answers_correct(lm.tokenizer, result.tokens, target["golds"], judge)  # [n_sets, n]
        base = correct[0]
        first = None
        if target["answer_ids"] is not None:
            first = (result.first_tokens == target["answer_ids"][None]).float().mean(1).numpy()
        for i, s in enumerate(sets):
            rows.append({
                "source": s["source"], "heads": s["heads"], "seed": s["seed"], "n_heads": len(s["nodes"]),
                "nodes": " ".join(f"L{l}H{h}" for l, h in s["nodes"]), "target": target["name"],
                "target_kind": target["kind"], "n": len(base), "n_base_correct": int(base.sum()),
                "accuracy": float(correct[i].mean()), "base_accuracy": float(base.mean()),
                "retained": float(correct[i][base].mean()) if base.any() else float("nan"),
                "first_token_accuracy": float(first[i]) if first is not None else float("nan"),
            })
        n = len(base)
        items.append(pd.DataFrame({
            "source": np.repeat([s["source"] for s in sets], n), "heads": np.repeat([s["heads"] for s in sets], n),
            "seed": np.repeat([s["seed"] for s in sets], n), "target": target["name"], "target_kind": target["kind"],
            "item": np.tile(np.arange(n), len(sets)), "cluster": np.tile(target["clusters"], len(sets)),
            "correct": correct.reshape(-1),
        }))
        print(f"{target['name']}: base {base.mean():.3f} on {len(base)}")
    table = pd.DataFrame(rows)
    meta = stage_meta(model_dir, "transfer", tasks=tasks, transfer=transfer, prompts=prompts_cfg, seed=seed)
    write_parquet(table, out_table, meta)
    write_parquet(pd.concat(items, ignore_index=True), out_items, meta)
