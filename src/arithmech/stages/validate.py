"""Stage 2, validate (the paper's mean-ablation knockout): rule entry points for the knockout curves and
the transfer of each operator's key heads to other data."""

from __future__ import annotations

import numpy as np
import pandas as pd

from arithmech.data.arithmetic import split_pairs
from arithmech.interp.effects import operand_pairs
from arithmech.interp.nodes import nodes_text
from arithmech.intervention.batching import COPIES_PER_FORWARD
from arithmech.io import write_parquet


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
    from arithmech.interp.ablation import answers_correct, set_answers
    from arithmech.interp.activations import cache_means
    from arithmech.interp.nodes import knockout_node_sets
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    pairs = split_pairs(pd.read_parquet(pairs_path), "validation", str(pairs_path))
    cache = load_file(str(cache_path))
    key = pd.read_parquet(key_path)
    effects = pd.read_parquet(effects_path)
    tables, item_tables = [], []
    for positions in ablation["positions"]:
        scored = pairs
        if positions == "all":  # each set is a full forward of every prompt: fewer prompts (and sets)
            scored = subsample(pairs, ablation["all_positions_samples"], seed).reset_index(drop=True)
        sets = knockout_node_sets(effects, key, ablation, n_layers=lm.n_layers, n_heads=lm.n_heads, seed=seed,
                                  positions=positions)
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
    from arithmech.interp.ablation import answers_correct, greedy_end_sets, transfer_targets
    from arithmech.interp.activations import cache_means
    from arithmech.interp.nodes import layer_matched_heads
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    # the empty set ablates nothing; any mean will do
    sets = [{"source": "none", "heads": "none", "seed": -1, "nodes": [], "mean": tasks[0]}]
    means = {}
    for task, cache_path, key_path in zip(tasks, cache_paths, key_paths, strict=True):
        cache = load_file(str(cache_path))
        means[task] = cache_means(cache, "end")
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
