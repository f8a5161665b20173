"""Rule entry points that draw the figures of the identify and validate stages from their tables.

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
    title = f"{model}, {task}: path patching at END ({metric}); {n_key} key heads ({share:.1f}%) outlined"
    plots.effects_heatmap(effects, key, title, out_png)


def run_plot_knockout(*, model: str, task: str, knockout_path, key_path, out_png) -> None:
    """Knockout curves: accuracy against the number of top heads ablated, random heads, key MLPs."""
    table, key = pd.read_parquet(knockout_path), pd.read_parquet(key_path)
    n_key = int((key["component"] == "head").sum())
    positions = table["positions"].iloc[0]
    plots.knockout_curves(table, n_key, f"{model}, {task}: mean-ablation knockout at {positions}", out_png)


def run_plot_transfer(*, model: str, transfer_path, out_html, out_png) -> None:
    """The transfer matrix (retained accuracy per source operator and target set) as a table and heatmap."""
    table = pd.read_parquet(transfer_path)
    write_html_table(plots.transfer_summary(table), out_html, f"{model}: knockout transfer (retained accuracy, %)")
    plots.transfer_heatmap(table, f"{model}: key heads of one operator knocked out on other data", out_png)
