"""The circuit rules' entry points on the teacher-forced protocol: the key heads' edges cut (rule edges: do they act
through the MLPs?) and the EAP-IG edge circuit against the node circuit (rule edge_curve), both scored on
VALIDATION pairs, with ablation values from the identification pairs."""

from __future__ import annotations

import pandas as pd

from arithmech.data.arithmetic import split_pairs
from arithmech.interp import protocol
from arithmech.interp.effects import operand_pairs
from arithmech.interp.nodes import key_nodes
from arithmech.io import write_parquet


def run_edges(*, model: str, model_dir, tasks: list[str], pairs_paths, key_paths, edges: dict, compute: dict,
              seed: int, out_paths) -> None:
    """For each operator, on a seeded draw of `edges.max_samples` validation pairs, on the teacher-forced protocol
    (`out_paths`, per item): the answer's log-probability with the operator's key heads' edges into the MLPs, into
    the logits, or both cut exactly (`edges.path_cuts`), under both ablations (`protocol.KINDS`, values from the
    identification pairs). One job for all operators: the model loads once."""
    from arithmech.data.datasets import subsample
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    for task, pairs_path, key_path, out_path in zip(tasks, pairs_paths, key_paths, out_paths, strict=True):
        pairs = subsample(split_pairs(pd.read_parquet(pairs_path), "validation", str(pairs_path)),
                          edges["max_samples"], seed)
        key_heads = key_nodes(pd.read_parquet(key_path))[0]
        meta = stage_meta(model_dir, "edges", task=task, edges=edges, seed=seed)
        write_parquet(_path_cut_rows(lm, pairs_path, pairs, key_heads, seed=seed, batch_size=compute["batch_size"]),
                      out_path, meta)


def run_edge_curve(*, model: str, model_dir, tasks: list[str], pairs_paths, effects_paths, key_paths, edges: dict,
                   discover: dict, compute: dict, seed: int, out_tables) -> None:
    """The edge circuit against the node circuit at equal size (`edges.items_edge_curve`), per operator on the
    teacher-forced protocol with the pruning's ablation and measure (`circuit.discover.tf_ablation`,
    `tf_measure`): the edges' EAP-IG scores and the nodes' integrated gradients (`TailTrials.attribution`) on a
    seeded draw of `edges.max_samples` identification pairs, both rankings' circuits scored exactly on as many
    validation pairs; senders the operator's top `edges.senders` heads and every operator's key heads
    (`edges.edge_senders`), receivers every MLP from the first sender's layer on. One job for every operator (its
    figure: `run_plot_edge_curve`)."""
    from arithmech.data.datasets import subsample
    from arithmech.interp import teacher_forcing as tf
    from arithmech.interp.edges import edge_senders, items_edge_curve
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    keys = {t: pd.read_parquet(p) for t, p in zip(tasks, key_paths, strict=True)}
    batch, kind, measure = compute["batch_size"], discover["tf_ablation"], discover["tf_measure"]
    for task, pairs_path, effects_path, out_table in zip(tasks, pairs_paths, effects_paths, out_tables, strict=True):
        pairs = pd.read_parquet(pairs_path)
        ident = split_pairs(pairs, "identification", str(pairs_path))
        pool = tf.build_items(lm, ident, batch_size=batch, outputs=True)
        pool_outputs = tf.tail_outputs(lm, pool, batch)
        sets = {}
        for split in ("identification", "validation"):
            items = tf.build_items(lm, subsample(split_pairs(pairs, split, str(pairs_path)), edges["max_samples"],
                                                 seed), batch_size=batch)
            sets[split] = (items, tf.ablation_values(lm, items, pool, kind, seed=seed, batch_size=batch,
                                                     pool_outputs=pool_outputs))
        senders = edge_senders(pd.read_parquet(effects_path), keys, edges["senders"])
        receivers = list(range(min(l for l, _ in senders), lm.n_layers))
        node_scores = tf.TailTrials(lm, *sets["identification"], measure=measure, batch_size=batch).attribution(
            discover["ig_steps"])
        curve = items_edge_curve(lm, sets["identification"], sets["validation"], senders, receivers, node_scores,
                                 steps=discover["ig_steps"], measure=measure, batch_size=batch)
        curve = curve.assign(task=task, kind=kind, n_items=len(sets["validation"][0]), split="validation",
                             ranked_on="identification")
        meta = stage_meta(model_dir, "edge_curve", task=task, edges=edges, discover=discover, seed=seed)
        write_parquet(curve, out_table, meta)


def run_plot_edge_curve(*, model: str, table_paths, out_png) -> None:
    """The edge curve's figure (`plots.edge_curve`): every operator's panel from `run_edge_curve`'s tables."""
    from arithmech.report import plots

    curves = pd.concat([pd.read_parquet(p) for p in table_paths], ignore_index=True)
    kind = curves["kind"].iloc[0]
    plots.edge_curve(curves, f"{model}: edge circuit vs node circuit at equal size ({kind} ablation, teacher-forced)",
                     out_png)


PATH_CUT_COLUMNS = ["sample_id", "cluster", "kind", "model", "via_mlps", "direct", "both"]


def _path_cut_rows(lm, pairs_path, scored: pd.DataFrame, key_heads, *, seed: int, batch_size: int) -> pd.DataFrame:
    """Per scored item and ablation kind: the answer's teacher-forced log-probability (`edges.path_cuts`) with the key
    heads' edges kept ('model') or cut (via_mlps, direct, both); no rows where the key-head rule chose no head."""
    from arithmech.interp import teacher_forcing as tf
    from arithmech.interp.edges import path_cuts

    if not key_heads:
        return pd.DataFrame(columns=PATH_CUT_COLUMNS)
    items = tf.build_items(lm, scored, batch_size=batch_size)
    pool = tf.build_items(lm, split_pairs(pd.read_parquet(pairs_path), "identification", str(pairs_path)),
                          batch_size=batch_size, outputs=True)
    pool_outputs = tf.tail_outputs(lm, pool, batch_size)  # captured by build_items' forward
    rows = []
    for kind in protocol.KINDS:
        values = tf.ablation_values(lm, items, pool, kind, seed=seed, batch_size=batch_size, pool_outputs=pool_outputs)
        cuts = path_cuts(lm, items, values, key_heads, batch_size=batch_size)
        rows.append(pd.DataFrame({"sample_id": items.table["sample_id"].to_numpy(),
                                  "cluster": operand_pairs(items.table),
                                  "kind": kind, **cuts}))
    return pd.concat(rows, ignore_index=True)[PATH_CUT_COLUMNS]
