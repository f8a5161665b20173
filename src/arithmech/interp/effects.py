"""From per-sample patching results to per-node effects, key components, and the cross-task summary."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from arithmech import stats
from arithmech.interp.nodes import node_label

# Each metric maps the patching table (one row per sample and node) to a per-row effect.
# More negative means the node carries more of the operation.
METRICS = {
    # The paper's: relative change of the ground-truth answer logit.
    "relative_logit": lambda d: (d["logit_p"] - d["logit_o"]) / d["logit_o"],
    "logit_diff": lambda d: d["logit_p"] - d["logit_o"],
    "prob_change": lambda d: d["prob_p"] - d["prob_o"],
}
NODE = ["layer", "head", "component"]


def metric_values(patching: pd.DataFrame, metric: str) -> pd.Series:
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}; got {metric!r}")
    if metric == "prob_change" and "prob_p" not in patching:
        raise ValueError("metric 'prob_change' needs prob_o/prob_p columns; patch with that metric configured")
    return METRICS[metric](patching)


def operand_pairs(table: pd.DataFrame) -> np.ndarray:
    """Each row's operand pair "a,b" (columns a, b): the bootstrap's cluster, the one spelling of it."""
    return (table["a"].astype(str) + "," + table["b"].astype(str)).to_numpy()


def pair_labels(pairs: pd.DataFrame) -> pd.Series:
    """sample_id -> its operand pair "a,b" (a pairs table's columns sample_id, a, b): the bootstrap's clusters."""
    return pd.Series(operand_pairs(pairs), index=pairs["sample_id"])


def check_finite(patching: pd.DataFrame, where: str, pairs: dict | pd.Series | None = None) -> None:
    """Raise a ValueError naming the samples (with their operand pair from `pairs`, sample_id -> "a,b", when
    given) and nodes whose logits or probabilities in `patching` (of `where`: a task, a file) are NaN or
    infinite: a reference value (logit_o, prob_o) once per sample, a patched one (logit_p, prob_p) per node.
    Without it a NaN surfaces far from where it arose, as a missing row of the bootstrap's table."""
    labels = pd.Series(pairs) if pairs is not None else pd.Series(dtype=object)
    found = []
    for column, per_node in (("logit_o", False), ("prob_o", False), ("logit_p", True), ("prob_p", True)):
        if column not in patching:
            continue
        bad = patching[~np.isfinite(patching[column].to_numpy(dtype=float))]
        if not per_node:
            bad = bad.drop_duplicates("sample_id")
        for row in bad.itertuples(index=False):
            pair = f" (operands {labels[row.sample_id]})" if row.sample_id in labels.index else ""
            node = f", node {node_label(row.layer, row.head)}" if per_node else " (every node)"
            found.append(f"sample {row.sample_id}{pair}{node}: {column} = {getattr(row, column)}")
    if found:
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        raise ValueError(f"{where}: non-finite values in the patching table ({shown}). The model's forward gave "
                         "them: check its weights and compute.dtype (float16 overflows; try float32 or bfloat16)")


def excluded_samples(patching: pd.DataFrame, metric: str) -> list:
    """Sample ids the metric leaves out, sorted: for relative_logit those with logit_o <= 0, where dividing
    by logit_o has no meaning (the sign of the effect flips, or it is infinite); none for other metrics."""
    if metric != "relative_logit":
        return []
    return sorted(set(patching.loc[patching["logit_o"] <= 0, "sample_id"]))


def usable_rows(patching: pd.DataFrame, metric: str) -> pd.DataFrame:
    """`patching` without the `excluded_samples` (with a warning naming how many of how many). `aggregate` and
    `bootstrap` call it too; a caller that needs both filters once first, so the warning comes once."""
    check_finite(patching, "the patching table")
    excluded = excluded_samples(patching, metric)
    if not excluded:
        return patching
    n_samples = patching["sample_id"].nunique()
    if len(excluded) == n_samples:
        raise ValueError(f"all {n_samples} samples have logit_o <= 0: metric {metric!r} means nothing here; "
                         "use patching.metric logit_diff")
    warnings.warn(f"{len(excluded)} of {n_samples} samples have logit_o <= 0 and are left out of metric {metric!r}",
                  stacklevel=3)
    return patching[~patching["sample_id"].isin(excluded)]


def aggregate(patching: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Mean, standard deviation and count of the per-sample effect for every node (without the
    `excluded_samples` of the metric).

    Returns columns node, layer, head (<NA> for MLPs), component, mean_effect, std_effect, n, metric."""
    patching = usable_rows(patching, metric)
    frame = patching.assign(effect=metric_values(patching, metric))
    out = (
        frame.groupby(NODE, dropna=False, sort=True)["effect"]
        .agg(mean_effect="mean", std_effect="std", n="count")
        .reset_index()
    )
    out["std_effect"] = out["std_effect"].fillna(0.0)
    out["metric"] = metric
    out.insert(0, "node", [node_label(l, h) for l, h in zip(out["layer"], out["head"])])
    return out.sort_values(["component", "layer", "head"], kind="stable").reset_index(drop=True)


def select(effects: pd.Series, rule: dict) -> pd.Series:
    """Boolean mask of the key nodes among `effects` (mean effects, more negative = more important).

    rule = {"rule": "threshold", "threshold": -0.05}  the paper's: mean effect below the threshold
         | {"rule": "top_k", "k": 10}                 the k most negative (only negative ones count)
         | {"rule": "relative", "z": 3.0}             below median - z * robust spread (1.4826 * MAD)
    """
    mask = select_rows(effects.to_numpy(dtype=float)[None], rule)[0]
    return pd.Series(mask, index=effects.index)


def select_rows(effects: np.ndarray, rule: dict) -> np.ndarray:
    """`select` on every row of `effects` [n_rows, n_nodes] at once (e.g. bootstrap resamples) -> bool
    [n_rows, n_nodes]. NaN effects are never selected and do not count in the median."""
    kind = rule["rule"]
    if kind == "threshold":
        return effects < rule["threshold"]
    if kind == "top_k":
        # a stable sort puts the negative effects first, most negative first, ties by position
        first = np.argsort(effects, axis=1, kind="stable")[:, : rule["k"]]
        mask = np.zeros(effects.shape, dtype=bool)
        np.put_along_axis(mask, first, True, axis=1)
        return mask & (effects < 0)
    if kind == "relative":
        median = np.nanmedian(effects, axis=1, keepdims=True)
        spread = 1.4826 * np.nanmedian(np.abs(effects - median), axis=1, keepdims=True)
        return effects < median - rule["z"] * spread
    raise ValueError(f"key_components rule must be threshold, top_k or relative; got {kind!r}")


def bootstrap(
    patching: pd.DataFrame,
    metric: str,
    head_rule: dict,
    mlp_rule: dict,
    *,
    clusters=None,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Per node, a percentile bootstrap interval of the mean effect over samples and its selection stability.

    Each resample draws as many clusters as there are, with replacement (a cluster drawn twice counts
    twice), and takes every node's mean effect over the drawn samples. `clusters` maps sample_id -> cluster
    label (a dict or Series; e.g. the operand pair "a,b", whose templates are correlated); by default each
    sample is its own cluster. stability is the share of resamples in which the component's rule
    (`select_rows`, over that resample's means of all nodes of the component) selects the node.
    The `excluded_samples` of the metric are left out first.

    Returns columns node, layer, head, component, ci_low, ci_high, stability (one row per node)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    patching = usable_rows(patching, metric)
    frame = patching.assign(effect=metric_values(patching, metric),
                            node=[node_label(l, h) for l, h in zip(patching["layer"], patching["head"])])
    wide = frame.pivot(index="sample_id", columns="node", values="effect")  # [n_samples, n_nodes]
    if wide.isna().to_numpy().any():
        raise ValueError("the patching table lacks some (sample, node) rows: every sample needs every node")
    values = wide.to_numpy(dtype=float)
    if clusters is None:
        labels = wide.index.to_numpy()
    else:
        labels = pd.Series(clusters).reindex(wide.index)
        if labels.isna().any():
            missing = list(labels.index[labels.isna()])
            raise ValueError(f"{len(missing)} sample ids have no cluster, e.g. {missing[:5]}")
        labels = labels.to_numpy()
    _, means = stats.cluster_resampled_means(values, labels, n_boot=resamples, seed=seed,
                                             sampler="multinomial")  # [resamples, n_nodes]
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2], axis=0)
    out = frame.drop_duplicates("node").set_index("node").loc[wide.columns, NODE].reset_index()
    out["ci_low"], out["ci_high"] = low, high
    out["stability"] = np.nan
    for component, rule in (("head", head_rule), ("mlp", mlp_rule)):
        cols = np.flatnonzero(out["component"].to_numpy() == component)
        if len(cols):
            out.loc[cols, "stability"] = select_rows(means[:, cols], rule).mean(0)
    return out


def describe_rule(rule: dict) -> str:
    kind = rule["rule"]
    if kind == "threshold":
        return f"mean effect < {rule['threshold']}"
    if kind == "top_k":
        return f"top {rule['k']} most negative"
    return f"mean effect < median - {rule['z']} x 1.4826 MAD"


def key_components(effects: pd.DataFrame, head_rule: dict, mlp_rule: dict) -> pd.DataFrame:
    """Key heads and key MLPs, strongest first within each component, with the share of heads that are key.

    Columns: those of `effects` plus rank (1 = most negative), rule, share_key_heads, n_heads_total."""
    parts = []
    for component, rule in (("head", head_rule), ("mlp", mlp_rule)):
        nodes = effects[effects["component"] == component]
        mask = select(nodes["mean_effect"], rule)
        chosen = nodes[np.asarray(mask)].sort_values("mean_effect", kind="stable")
        parts.append(chosen.assign(rank=np.arange(1, len(chosen) + 1), rule=describe_rule(rule)))
    out = pd.concat(parts, ignore_index=True)
    n_heads = int((effects["component"] == "head").sum())
    out["share_key_heads"] = (out["component"] == "head").sum() / n_heads if n_heads else 0.0
    out["n_heads_total"] = n_heads
    return out


def shared_summary(effects_by_task: dict[str, pd.DataFrame], key_by_task: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every node that is key for at least one task, with its mean effect and key flag per task.

    Columns: node, layer, head, component, n_tasks, tasks, then effect_<task> and key_<task> per task;
    most shared first, then by the mean effect over tasks."""
    tasks = list(effects_by_task)
    effect = pd.concat([e.assign(task=t) for t, e in effects_by_task.items()], ignore_index=True)
    effect = effect.assign(key=False)
    for task, key in key_by_task.items():
        labels = set(key["node"])
        effect.loc[(effect["task"] == task) & effect["node"].isin(labels), "key"] = True
    wide = effect.pivot(index="node", columns="task", values=["mean_effect", "key"])
    # A node absent from a task's table is not key there (pivot leaves NaN, which would read as True).
    wide["key"] = wide["key"].fillna(False).astype(bool)
    wide = wide[wide["key"].any(axis=1)]
    out = wide.index.to_frame(index=False)
    nodes = effect.drop_duplicates("node").set_index("node")
    out = out.join(nodes[NODE], on="node")
    out["n_tasks"] = wide["key"].sum(axis=1).to_numpy().astype(int)
    out["tasks"] = [",".join(t for t in tasks if wide.loc[n, ("key", t)]) for n in out["node"]]
    for t in tasks:
        out[f"effect_{t}"] = wide[("mean_effect", t)].to_numpy(dtype=float)
        out[f"key_{t}"] = wide[("key", t)].to_numpy(dtype=bool)
    mean_effect = out[[f"effect_{t}" for t in tasks]].mean(axis=1)
    order = np.lexsort((mean_effect.to_numpy(), -out["n_tasks"].to_numpy()))
    return out.iloc[order].reset_index(drop=True)
