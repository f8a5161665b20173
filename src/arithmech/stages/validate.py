"""Stage 2, validate (the paper's mean-ablation knockout): rule entry points for the knockout curves and
the transfer of each operator's key heads to other data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from arithmech.data.arithmetic import split_pairs
from arithmech.data.formatting import non_math_prompts, svamp_prompts
from arithmech.interp.effects import operand_pairs
from arithmech.interp.nodes import nodes_text
from arithmech.intervention.batching import COPIES_PER_FORWARD
from arithmech.io import write_parquet


def knockout_node_sets(effects: pd.DataFrame, key: pd.DataFrame, ablation: dict, *, n_layers: int, n_heads: int,
                       seed: int, top_k: list[int] | None = None, random_k: list[int] | None = None) -> list[tuple]:
    """The knockout rule's node sets, each (curve, seed, k, heads, mlps): the top k heads by patching effect
    (k = 0..K, K = ablation.max_heads, or the given `top_k`); two random controls over `ablation.random_seeds`
    draws each, k random heads drawn uniformly among the others (`random_heads`) and k drawn in the layers of
    the top k (`random_layer_matched`), for the given `random_k` (default `ablation.random_k`, capped at K);
    the key MLPs."""
    from arithmech.interp.nodes import layer_matched_heads, random_heads, ranked_heads

    ranked = ranked_heads(effects)
    K = min(ablation["max_heads"], len(ranked))
    ranked = ranked[:K]
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
    import torch
    from safetensors.torch import load_file

    from arithmech.data.answers import answer_tokens
    from arithmech.data.datasets import subsample
    from arithmech.interp.ablation import answers_correct, cache_means, set_answers
    from arithmech.model.loading import load_stage_model, stage_meta

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
            max_new_tokens=answer_tokens(lm.tokenizer, scored["answer"]), batch_size=compute["batch_size"],
            copies=COPIES_PER_FORWARD,
        ).tokens
        first_correct = tokens[..., 0] == answers[None]  # [n_sets, n]
        full_correct = answers_correct(lm.tokenizer, tokens, scored["answer"])  # [n_sets, n]
        first, full = first_correct.float().mean(1).numpy(), full_correct.mean(1)
        rows = [
            {"curve": c, "seed": sd, "k": k,
             "nodes": nodes_text(hs, ms),
             "accuracy": float(a), "full_accuracy": float(f)}
            for (c, sd, k, hs, ms), a, f in zip(sets, first, full)
        ]
        tables.append(pd.DataFrame(rows).assign(n=len(texts), positions=positions, split="validation"))
        item_tables.append(knockout_items(sets, scored, first_correct.numpy(), full_correct)
                           .assign(positions=positions))
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
        "cluster": np.tile(operand_pairs(scored), len(sets)),
        "first_correct": first_correct.reshape(-1), "full_correct": full_correct.reshape(-1),
    })


def transfer_targets(
    lm, *, tasks, pairs_paths, svamp_path, non_math_path, transfer: dict, prompts_cfg: dict, seed: int
) -> list[dict]:
    """The data sets the key heads are knocked out on: every operator's kept pairs, the other number
    formats of every operator, SVAMP (direct answers) and the non-math control (BIG-bench qa_wikidata).
    Each: name, kind, texts, golds (numbers, or lists of accepted strings), answer_ids (first answer token,
    operator pairs only), max_new_tokens, clusters (per text: its operand pair "a,b", or its item index in the
    source data, the unit a paired interval resamples)."""
    import torch

    from arithmech.data.answers import answer_tokens
    from arithmech.data.arithmetic import format_prompts
    from arithmech.data.datasets import subsample

    targets = []
    for task, path in zip(tasks, pairs_paths, strict=True):
        pairs = subsample(split_pairs(pd.read_parquet(path), "validation", str(path)), transfer["max_samples"], seed)
        targets.append({
            "name": task, "kind": "operator", "texts": list(pairs["prompt"]), "golds": list(pairs["answer"]),
            "answer_ids": torch.tensor(pairs["answer_token_id"].to_numpy()),
            "max_new_tokens": answer_tokens(lm.tokenizer, pairs["answer"]),
            "clusters": list(operand_pairs(pairs)),
        })
    fmt_cfg = transfer["formats"]
    for fmt in ("multi_digit", "decimal"):
        for task in tasks:
            df = format_prompts(task, fmt, fmt_cfg[fmt], prompts_cfg, n=fmt_cfg["n"], seed=seed)
            targets.append({
                "name": f"{task} {fmt.replace('_', '-')}", "kind": fmt, "texts": list(df["prompt"]),
                "golds": list(df["gold"]), "answer_ids": None,
                "max_new_tokens": answer_tokens(lm.tokenizer, df["answer"]),
                "clusters": list(operand_pairs(df)),
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
    from safetensors.torch import load_file

    from arithmech.data.answers import decided_answers, qa_correct
    from arithmech.interp.ablation import answers_correct, greedy_end_sets
    from arithmech.interp.nodes import layer_matched_heads
    from arithmech.intervention.means import AlignedMean
    from arithmech.model.loading import load_stage_model, stage_meta

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
    for target in transfer_targets(lm, tasks=tasks, pairs_paths=pairs_paths, svamp_path=svamp_path,
                                    non_math_path=non_math_path, transfer=transfer, prompts_cfg=prompts_cfg,
                                    seed=seed):
        # numbers compared by value (an answer stops once its score is decided); the non-math answers by text
        non_math = target["kind"] == "non_math"
        judge = qa_correct if non_math else None
        result = greedy_end_sets(
            lm, target["texts"], [s["nodes"] for s in sets], set_means=set_means,
            max_new_tokens=target["max_new_tokens"],
            batch_size=compute["batch_size"], copies_per_forward=transfer.get("copies_per_forward", COPIES_PER_FORWARD),
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
                "nodes": nodes_text(s["nodes"]), "target": target["name"],
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


def run_plot_knockout(*, model: str, task: str, knockout_path, key_path, out_png) -> None:
    """Knockout curves: accuracy against the number of top heads ablated, random heads, key MLPs."""
    from arithmech.report import plots

    table, key = pd.read_parquet(knockout_path), pd.read_parquet(key_path)
    n_key = int((key["component"] == "head").sum())
    # one panel per position set (each titled there); held-out pairs only
    split = ", ".join(dict.fromkeys(table["split"]))
    plots.knockout_curves(table, n_key, f"{model}, {task}: mean-ablation knockout ({split} pairs)", out_png)


def run_plot_transfer(*, model: str, transfer_path, out_html, out_png) -> None:
    """The transfer matrix (retained accuracy per source operator and target set) as a table and heatmap."""
    from arithmech.io import write_html_table
    from arithmech.report import plots

    table = pd.read_parquet(transfer_path)
    write_html_table(plots.transfer_summary(table), out_html, f"{model}: knockout transfer (retained accuracy, %)")
    plots.transfer_heatmap(table, f"{model}: key heads of one operator knocked out on other data", out_png)
