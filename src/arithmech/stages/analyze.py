"""Stage 3, analyze: rule entry point for the key heads' attention by token role and the MLP probes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from arithmech.data.arithmetic import split_pairs
from arithmech.interp.nodes import node_label
from arithmech.io import read_parquet_meta, write_parquet


def analysis_heads(key_path, effects_path, fallback: int) -> tuple[list[tuple[int, int]], str]:
    """The heads to analyse and how they were chosen: the key heads in rank order ('key'), or, when the
    rule selected none, the `fallback` heads of most negative mean effect ('top')."""
    key = pd.read_parquet(key_path)
    key = key[key["component"] == "head"].sort_values("rank", kind="stable")
    if len(key):
        return [(int(l), int(h)) for l, h in zip(key["layer"], key["head"])], "key"
    effects = pd.read_parquet(effects_path)
    top = effects[effects["component"] == "head"].sort_values("mean_effect", kind="stable").head(fallback)
    return [(int(l), int(h)) for l, h in zip(top["layer"], top["head"])], "top"


def run_analyze(
    *, model: str, task: str, model_dir, pairs_path, key_path, effects_path, analysis: dict, compute: dict, seed: int,
    out_roles, out_roles_all, out_example, out_probes,
) -> None:
    """Explain the key heads and the MLPs on up to `analysis.max_samples` validation pairs (a seeded draw): the
    attention of each key head from END on each token role, an example prompt with its attention (one row
    per head and token: node, rank, position, token, role, attention, sample_id), and the MLP probes
    (cosine of MLP input/output/change with the unembedding rows of A, B and the answer C). `out_roles_all`
    holds the same attention by role for every head of the model (`analysed` marks the heads above), the
    baseline the key heads are compared with. The figures are drawn from these tables by
    `figures.run_plot_analysis`."""
    from arithmech.interp.analysis import attention_rows, first_role_tokens, mlp_probes, role_attention, token_roles
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    pairs = split_pairs(pd.read_parquet(pairs_path), "validation", str(pairs_path))
    if len(pairs) > analysis["max_samples"]:
        pairs = pairs.sample(n=analysis["max_samples"], random_state=seed).sort_values("sample_id", kind="stable")
    pairs = pairs.reset_index(drop=True)
    texts = list(pairs["prompt"])
    heads, selection = analysis_heads(key_path, effects_path, analysis["fallback_heads"])
    labels = [node_label(l, h) for l, h in heads]
    meta = stage_meta(model_dir, "analyze", task=task, analysis=analysis, seed=seed, heads=labels, selection=selection,
                      pairs=read_parquet_meta(pairs_path).get("params_hash"))
    roles = [token_roles(lm.tokenizer, row["prompt"], row) for row in pairs.to_dict("records")]
    # one pass over every head: the analysed heads' rows are read out of it, not computed again
    every_head = [(l, h) for l in range(lm.n_layers) for h in range(lm.n_heads)]
    rows = attention_rows(lm, texts, every_head, compute["batch_size"])
    every = role_attention(rows, roles)
    rank = {hd: i + 1 for i, hd in enumerate(heads)}
    head_rank = pd.Series([rank.get((l, h), 0) for l, h in zip(every["layer"], every["head"])], index=every.index)
    write_parquet(every.assign(analysed=head_rank > 0, selection=selection, task=task), out_roles_all, meta)
    table = every[head_rank > 0].assign(rank=head_rank).sort_values("rank", kind="stable").reset_index(drop=True)
    table.insert(0, "node", [node_label(l, h) for l, h in zip(table["layer"], table["head"])])
    table = table.assign(selection=selection, task=task)
    write_parquet(table, out_roles, meta)
    example = pairs.iloc[0]
    tokens = [lm.tokenizer.decode([i]) for i in lm.tokenizer(example["prompt"])["input_ids"]]
    weights = rows.row(0)[[every_head.index(hd) for hd in heads]].numpy()  # [heads, tokens], rank order
    write_parquet(pd.DataFrame({
        "node": np.repeat(labels, len(tokens)), "rank": np.repeat(np.arange(1, len(labels) + 1), len(tokens)),
        "position": np.tile(np.arange(len(tokens)), len(labels)), "token": tokens * len(labels),
        "role": roles[0] * len(labels), "attention": weights.reshape(-1), "sample_id": example["sample_id"],
    }), out_example, meta)
    probes = mlp_probes(
        lm, texts, first_role_tokens(lm.tokenizer, pairs, "operand_a"),
        first_role_tokens(lm.tokenizer, pairs, "operand_b"),
        pairs["answer_token_id"].tolist(), batch_size=compute["batch_size"], n_random=analysis["n_random"], seed=seed,
    ).assign(task=task)
    write_parquet(probes, out_probes, meta)


def run_plot_analysis(*, model: str, task: str, roles_path, example_path, probes_path, out_roles_png,
                      out_example_png, out_probes_png) -> None:
    """The analyze stage's figures: attention from END by token role per head, the attention on one example
    prompt, and the MLP probes against the unembedding of A, B and the answer C (the `paper` variant)."""
    from arithmech.report import plots

    roles, example, probes = (pd.read_parquet(p) for p in (roles_path, example_path, probes_path))
    labels = list(dict.fromkeys(example.sort_values(["rank", "position"], kind="stable")["node"]))
    if (roles["selection"] == "key").all():
        chosen = "key heads"
    else:
        chosen = f"no key heads: top {len(labels)} heads by patching effect"
    n = int(roles["n_texts"].iloc[0])
    plots.role_attention_heatmap(
        roles, f"{model}, {task}: attention from END by token role ({chosen}; mean of {n} prompts)", out_roles_png
    )
    first = example[example["node"] == labels[0]].sort_values("position")
    weights = example.pivot(index="node", columns="position", values="attention").loc[labels].to_numpy()
    plots.attention_example(
        first["token"].tolist(), weights, labels, first["role"].tolist(),
        title=f"{model}, {task}: attention from END, sample {first['sample_id'].iloc[0]} ({chosen})",
        path=out_example_png,
    )
    plots.mlp_probe_lines(
        probes, f"{model}, {task}: MLP vectors at END (the paper's definitions) against the unembedding of A, B "
        f"and the answer C (mean of {n} prompts)", out_probes_png,
    )
