"""From key components to a circuit (`arithmech.interp.sufficiency`): rule entry points for sufficiency (keep a
circuit, mean-ablate everything else) and for the head -> MLP edges (`arithmech.interp.edges`). Both score
VALIDATION pairs, which played no part in ranking the heads or in the ablation means."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from arithmech.data.arithmetic import split_pairs
from arithmech.interp import protocol, sufficiency
from arithmech.interp.effects import operand_pairs, pair_labels
from arithmech.interp.nodes import node_label, ranked_heads
from arithmech.io import write_parquet


def run_circuit(*, model: str, task: str, model_dir, pairs_path, cache_path, effects_path, key_path, circuit: dict,
                prompts: dict, compute: dict, seed: int, out_table, out_items) -> None:
    """Sufficiency of the key components (`arithmech.interp.sufficiency`) on the validation pairs: every circuit of
    `circuit_sets` kept and everything else mean-ablated (as the knockout does) at END and every generated position
    with the END mean of the identification counterfactuals (the curves: top k heads, random draws), at every
    position with each template's mean (positions "all", the key circuits and their random draws, on a smaller
    draw of pairs), and at END with the means of counterfactuals of another `counterfactual_shots`
    (`circuit.contrast_means`, when the prompts have few-shot lines for it to differ): the older protocol's curves.
    The key circuit and its random draws on the teacher-forced protocol are the discover rule's (its validation
    table), where the circuits it finds are scored on the same pairs. Writes the faithfulness of every set
    (`out_table`) and every set's per-item measures (`out_items`)."""
    from safetensors.torch import load_file

    from arithmech.data.datasets import subsample
    from arithmech.interp.ablation import contrast_end_mean
    from arithmech.interp.activations import cache_means
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    pairs = pd.read_parquet(pairs_path)
    validation = split_pairs(pairs, "validation", str(pairs_path))
    cache = load_file(str(cache_path))
    key_heads, key_mlps = sufficiency.key_nodes(pd.read_parquet(key_path))
    common = {"ranked_heads": ranked_heads(pd.read_parquet(effects_path)), "key_heads": key_heads,
              "key_mlps": key_mlps, "n_layers": lm.n_layers, "n_heads": lm.n_heads, "grid": circuit["grid"],
              "draws": circuit["random_draws"], "band_draws": circuit["band_draws"], "seed": seed}
    end_items = subsample(validation, circuit["max_samples"], seed)
    variants = []  # (positions, means label, scored pairs, sets, means)
    for positions in circuit["positions"]:
        if positions == "end":
            variants.append(("end", "counterfactual", end_items, sufficiency.circuit_sets(**common),
                             cache_means(cache, "end")))
        else:
            scored = subsample(validation, circuit["all_positions_samples"], seed)
            variants.append(("all", "counterfactual", scored, sufficiency.circuit_sets(**common, curves=False),
                             cache_means(cache, "all")))
    contrast = circuit["contrast_means"]
    if contrast and contrast != prompts["counterfactual_shots"] and prompts["n_shots"] > 0:
        means = contrast_end_mean(lm, task=task, pairs=pairs, prompts=prompts, cf_shots=contrast, seed=seed,
                                  batch_size=compute["batch_size"])
        variants.append(("end", contrast, end_items, sufficiency.circuit_sets(**common, curves=False), means))
    tables, items = [], []
    boot = {"n_boot": circuit["bootstrap"], "seed": seed, "confidence": circuit["confidence"]}
    for positions, label, scored, sets, means in variants:
        values = sufficiency.score_sets(lm, scored, sets, means=means,
                                        positions="end" if positions == "end" else "all",
                                        batch_size=compute["batch_size"])
        clusters = pair_labels(scored).to_numpy()
        table = sufficiency.faithfulness_table(sets, values, clusters, **boot).assign(
            positions=positions, means=label, n=len(scored), split="validation",
            constant_first=sufficiency.constant_accuracy(scored["answer_token_id"]),
            constant_full=sufficiency.constant_accuracy(scored["answer"]))
        n = len(scored)
        per_item = pd.DataFrame({
            "positions": positions, "means": label,
            "curve": np.repeat([s.curve for s in sets], n), "mlps": np.repeat([s.mlps for s in sets], n),
            "k": np.repeat([s.k for s in sets], n), "seed": np.repeat([s.seed for s in sets], n),
            "sample_id": np.tile(scored["sample_id"].to_numpy(), len(sets)), "cluster": np.tile(clusters, len(sets)),
            **{sufficiency.MEASURES[m]: v.reshape(-1) for m, v in values.items()},
        })
        tables.append(table)
        items.append(per_item)
    meta = stage_meta(model_dir, "circuit", task=task, circuit=circuit, seed=seed, key_heads=len(key_heads))
    write_parquet(pd.concat(tables, ignore_index=True), out_table, meta)
    write_parquet(pd.concat(items, ignore_index=True), out_items, meta)


def run_edges(*, model: str, model_dir, tasks: list[str], pairs_paths, effects_paths, key_paths, edges: dict,
              metric: str, compute: dict, seed: int, out_tables, out_samples, out_paths) -> None:
    """For each operator, on a seeded draw of its validation pairs: each sender head's (`edges.edge_senders`) effect
    split into its total effect (downstream recomputed, `patching.total_logits`), its direct path
    (`patching.direct_logits`) and its path through every MLP of its layer or later (`edges.edge_logits`), as
    changes of the answer logit (and relative to the unpatched closed-form logit); per sample (`out_samples`) and
    aggregated with intervals and shares of the total (`sufficiency.summarize_edges`, `out_tables`), by the relative
    change for `metric` relative_logit (by the logit difference, with a warning, for an operator where no scored
    pair has a positive unpatched logit), else by the logit difference (the edges have no probabilities). And on
    the teacher-forced protocol (`out_paths`, per item): the answer's log-probability with the operator's key heads'
    edges into the MLPs, into the logits, or both cut exactly (`edges.path_cuts`), under both ablations
    (`protocol.KINDS`, values from the identification pairs). One job for all operators: the model loads
    once."""
    import torch

    from arithmech.data.datasets import subsample
    from arithmech.interp.edges import edge_logits, edge_rows, edge_senders
    from arithmech.interp.patching import collect, direct_logits, nodes_of, total_logits
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    keys = {t: pd.read_parquet(p) for t, p in zip(tasks, key_paths, strict=True)}
    batch = compute["batch_size"]
    for task, pairs_path, effects_path, out_table, out_sample, out_path in zip(
            tasks, pairs_paths, effects_paths, out_tables, out_samples, out_paths, strict=True):
        pairs = subsample(split_pairs(pd.read_parquet(pairs_path), "validation", str(pairs_path)),
                          edges["max_samples"], seed)
        texts, answers = list(pairs["prompt"]), torch.tensor(pairs["answer_token_id"].to_numpy())
        senders = edge_senders(pd.read_parquet(effects_path), keys, edges["senders"])
        receivers = list(range(min(l for l, _ in senders), lm.n_layers)) if senders else []
        ref, _ = collect(lm, texts, answers, batch, mlp_inputs=True, desc=f"{task} reference")
        cf, _ = collect(lm, list(pairs["cf_prompt"]), answers, batch, mlp_inputs=True, desc=f"{task} counterfactual")
        via = edge_logits(lm, ref, cf, answers, senders, receivers, batch_size=batch)
        layers = sorted({l for l, _ in senders})
        direct = direct_logits(lm, ref, cf, answers, layers, batch_size=batch)
        order = nodes_of(lm, layers)
        direct_p = direct.logit_p[:, [order.index(s) for s in senders]]  # [n, S]
        total = total_logits(lm, texts, answers, cf, [], nodes=senders, batch_size=batch)
        logit_o = via.logit_o.double()  # the closed form's unpatched logit, every path's denominator
        labels = [node_label(l, h) for l, h in senders]
        rows = []
        for path, change in (("total", total.logit_p.double() - total.logit_o.double()[:, None]),
                             ("direct", direct_p.double() - direct.logit_o.double()[:, None])):
            rows.append(edge_rows(pairs, labels, path, -1, change, logit_o))
        for j, r in enumerate(receivers):
            change = via.logit_p[:, :, j].double() - logit_o[:, None]
            live = [i for i, (l, _) in enumerate(senders) if l <= r]
            rows.append(edge_rows(pairs, [labels[i] for i in live], "mlp", r, change[:, live], logit_o))
        samples = pd.concat(rows, ignore_index=True)
        clusters = pair_labels(pairs)
        key_labels = [node_label(l, h) for l, h in sufficiency.key_nodes(keys[task])[0]]
        value = "rel_effect" if metric == "relative_logit" else "change"
        if value == "rel_effect" and not (logit_o > 0).any():  # e.g. a random model: the run goes on, and says so
            warnings.warn(f"{task}: no scored pair has a positive unpatched answer logit, where a relative change "
                          "means something; its edges are logit differences (value 'change', as with "
                          "patching.metric logit_diff)", stacklevel=2)
            value = "change"
        summary = sufficiency.summarize_edges(samples, clusters, key_labels, n_boot=edges["bootstrap"], seed=seed,
                                     confidence=edges["confidence"], value=value)
        meta = stage_meta(model_dir, "edges", task=task, edges=edges, metric=metric, seed=seed)
        write_parquet(summary.assign(split="validation"), out_table, meta)
        write_parquet(samples, out_sample, meta)
        key_heads = sufficiency.key_nodes(keys[task])[0]
        write_parquet(_path_cut_rows(lm, pairs_path, pairs, key_heads, seed=seed, batch_size=batch), out_path, meta)


def run_edge_curve(*, model: str, model_dir, tasks: list[str], pairs_paths, effects_paths, key_paths, edges: dict,
                   discover: dict, compute: dict, seed: int, out_tables) -> None:
    """The edge circuit against the node circuit at equal size (`edges.items_edge_curve`), per operator on the
    teacher-forced protocol with the pruning's ablation and measure (`circuit.discover.tf_ablation`,
    `tf_measure`): the edges' EAP-IG scores and the nodes' integrated gradients (`TailTrials.attribution`) on a
    seeded draw of `edges.max_samples` identification pairs, both rankings' circuits scored exactly on as many
    validation pairs; senders as the edges rule's (`edges.edge_senders`), receivers every MLP from the first sender's
    layer on. One job for every operator (its figure: `run_plot_edge_curve`)."""
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


def run_plot_circuit(*, model: str, task: str, table_path, edges_path, levels: list[float], out_curve,
                     out_graph, out_heatmap) -> None:
    """The circuit stage's figures: faithfulness against the number of top heads kept, the key heads' graph
    through the MLPs, and the senders x paths heatmap of the edges."""
    from arithmech.report import plots

    table, edges = pd.read_parquet(table_path), pd.read_parquet(edges_path)
    plots.faithfulness_curve(table, levels, f"{model}, {task}: how much of the behaviour a circuit keeps", out_curve)
    n = int(edges["n"].iloc[0])
    plots.circuit_graph(edges, f"{model}, {task}: key heads -> MLPs -> answer logit (n = {n} validation pairs)",
                        out_graph)
    plots.edge_heatmap(edges, f"{model}, {task}: each sender head's effect by path (n = {n} validation pairs)",
                       out_heatmap)
