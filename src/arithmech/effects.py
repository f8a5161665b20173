"""From per-sample patching results to per-node effects, key components, and the cross-task summary."""

from __future__ import annotations

import numpy as np
import pandas as pd

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


def aggregate(patching: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Mean, standard deviation and count of the per-sample effect for every node.

    Returns columns node, layer, head (<NA> for MLPs), component, mean_effect, std_effect, n, metric."""
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
    kind = rule["rule"]
    if kind == "threshold":
        return effects < rule["threshold"]
    if kind == "top_k":
        negative = effects[effects < 0]
        chosen = negative.sort_values(kind="stable").index[: rule["k"]]
        return pd.Series(effects.index.isin(chosen), index=effects.index)
    if kind == "relative":
        median = effects.median()
        spread = 1.4826 * (effects - median).abs().median()
        return effects < median - rule["z"] * spread
    raise ValueError(f"key_components rule must be threshold, top_k or relative; got {kind!r}")


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


def node_label(layer: int, head) -> str:
    """'L12H3' for a head, 'L12MLP' for an MLP."""
    return f"L{layer}MLP" if pd.isna(head) else f"L{layer}H{head}"


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


def rank_across_tasks(effects: dict[str, pd.DataFrame], component: str) -> pd.DataFrame:
    """Nodes of one component ('head' or 'mlp') ranked by their mean effect averaged over tasks (most
    negative first): the nodes that matter for arithmetic as a whole, e.g. the heads precise SFT trains.
    Returns node, layer, head, mean_effect (the average over tasks), one effect_<task> column per task."""
    if not effects:
        raise ValueError("rank_across_tasks needs the effects of at least one task")
    frames = []
    for task, frame in effects.items():
        part = frame[frame["component"] == component].set_index("node")
        frames.append(part["mean_effect"].rename(f"effect_{task}"))
    first = next(iter(effects.values()))
    nodes = first[first["component"] == component].set_index("node")[["layer", "head"]]
    table = nodes.join(pd.concat(frames, axis=1), how="inner")
    table["mean_effect"] = table[[f.name for f in frames]].mean(axis=1)
    return table.sort_values("mean_effect", kind="stable").reset_index()
