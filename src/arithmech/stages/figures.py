"""Rule entry points that draw the figures of the identify, validate and analyze stages from their tables.

Separate rules from the ones that compute the tables, so that a change to a figure (arithmech.plots)
re-draws it without re-running the model jobs, or anything downstream of their tables. Torch-free."""

from __future__ import annotations

import pandas as pd

from .. import plots
from ..io import write_html_table


def run_plot_effects(*, model: str, task: str, metric: str, effects_path, key_path, out_png) -> None:
    """The heatmap of mean patching effects per head and MLP, key components outlined."""
    effects, key = pd.read_parquet(effects_path), pd.read_parquet(key_path)
    n_key = int((key["component"] == "head").sum())
    share = 100 * n_key / max(1, int((effects["component"] == "head").sum()))
    title = (f"{model}, {task}: path patching at END ({metric}); {n_key} key heads ({share:.1f}%) outlined,\n"
             f"labelled with the % of bootstrap resamples that select them (dashed: under {100 * plots.STABLE:.0f}%)")
    plots.effects_heatmap(effects, key, title, out_png)


def run_plot_knockout(*, model: str, task: str, knockout_path, key_path, out_png) -> None:
    """Knockout curves: accuracy against the number of top heads ablated, random heads, key MLPs."""
    table, key = pd.read_parquet(knockout_path), pd.read_parquet(key_path)
    n_key = int((key["component"] == "head").sum())
    # one panel per position set (each titled there); held-out pairs only
    split = ", ".join(dict.fromkeys(table["split"]))
    plots.knockout_curves(table, n_key, f"{model}, {task}: mean-ablation knockout ({split} pairs)", out_png)


def run_plot_transfer(*, model: str, transfer_path, out_html, out_png) -> None:
    """The transfer matrix (retained accuracy per source operator and target set) as a table and heatmap."""
    table = pd.read_parquet(transfer_path)
    write_html_table(plots.transfer_summary(table), out_html, f"{model}: knockout transfer (retained accuracy, %)")
    plots.transfer_heatmap(table, f"{model}: key heads of one operator knocked out on other data", out_png)


def run_plot_analysis(*, model: str, task: str, roles_path, example_path, probes_path, out_roles_png,
                      out_example_png, out_probes_png) -> None:
    """The analyze stage's figures: attention from END by token role per head, the attention on one example
    prompt, and the MLP probes against the unembedding of A, B and the answer C (the `paper` variant)."""
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


def run_plot_circuit(*, model: str, task: str, table_path, edges_path, levels: list[float], out_curve,
                     out_graph, out_heatmap) -> None:
    """The circuit stage's figures: faithfulness against the number of top heads kept, the key heads' graph
    through the MLPs, and the senders x paths heatmap of the edges."""
    table, edges = pd.read_parquet(table_path), pd.read_parquet(edges_path)
    plots.faithfulness_curve(table, levels, f"{model}, {task}: how much of the behaviour a circuit keeps", out_curve)
    n = int(edges["n"].iloc[0])
    plots.circuit_graph(edges, f"{model}, {task}: key heads -> MLPs -> answer logit (n = {n} validation pairs)",
                        out_graph)
    plots.edge_heatmap(edges, f"{model}, {task}: each sender head's effect by path (n = {n} validation pairs)",
                       out_heatmap)
