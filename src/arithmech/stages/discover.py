"""Circuit discovery on the teacher-forced protocol (`arithmech.interp.teacher_forcing`: the search and the
scoring; `arithmech.interp.protocol`: its torch-free half): rule entry points. `run_discover` prunes one operator's
circuit on its IDENTIFICATION pairs (the pairs that chose the key heads and the ablation values) and scores it on its
VALIDATION pairs against the key circuit, layer-matched random circuits of its size and the top heads by effect;
`run_discover_union` scores the union of every operator's chosen circuit and writes the summary table;
`run_plot_discover` draws the pruning path and the circuit over the key heads."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pandas as pd

from arithmech.data.arithmetic import split_pairs
from arithmech.interp import protocol
from arithmech.interp.effects import pair_labels
from arithmech.interp.nodes import (
    MLP,
    CircuitSet,
    all_nodes,
    kept_masks,
    key_nodes,
    layer_matched_heads,
    node_label,
    parse_nodes,
    ranked_heads,
)
from arithmech.io import write_parquet

SELECTION_MAX_OPERANDS = 1 / 3  # at most this share of the identification operand pairs is held out for the choice


def _held_out_operands(ident: pd.DataFrame, n: int, seed: int) -> set:
    """The identification operand pairs (a, b) held out from the pruning for the target's choice: in a seeded order,
    until their prompts number at least `n`, at most SELECTION_MAX_OPERANDS of them. By operand pair, not by prompt:
    each operand pair comes in several templates, so a draw of prompts would leave no operand pair unseen."""
    operands = list(dict.fromkeys(zip(ident["a"], ident["b"])))
    order = np.random.default_rng(seed).permutation(len(operands))
    counts = ident.groupby(["a", "b"]).size()
    held, prompts = set(), 0
    for i in order[: int(len(operands) * SELECTION_MAX_OPERANDS)]:
        if prompts >= n:
            break
        held.add(operands[i])
        prompts += int(counts[operands[i]])
    return held


def _scored_pairs(pairs: pd.DataFrame, discover: dict, seed: int, where: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(identification draw, validation draw): seeded draws of `max_samples` identification pairs whose operands are
    not held out for the target's choice (`_held_out_operands`, `selection_samples` of them; `_selection_pairs`
    draws those), and of `validation_samples` validation pairs."""
    from arithmech.data.datasets import subsample

    ident = split_pairs(pairs, "identification", where)
    held = _held_out_operands(ident, discover["selection_samples"], seed)
    ident = ident[[pair not in held for pair in zip(ident["a"], ident["b"])]]
    val = subsample(split_pairs(pairs, "validation", where), discover["validation_samples"], seed)
    return subsample(ident, discover["max_samples"], seed), val


def _selection_pairs(pairs: pd.DataFrame, ident: pd.DataFrame, n: int, seed: int, where: str) -> pd.DataFrame | None:
    """What the target is chosen on: a seeded draw of at most `n` identification pairs whose operands (a, b) the
    pruning draw `ident` does not hold; None when every identification pair shares its operands with it."""
    from arithmech.data.datasets import subsample

    rest = split_pairs(pairs, "identification", where)
    used = set(zip(ident["a"], ident["b"]))
    rest = rest[[pair not in used for pair in zip(rest["a"], rest["b"])]]
    return subsample(rest, n, seed) if len(rest) else None


# The seed offset of the key circuit's layer-matched random draws (draw d: seed * 1000 + KEY_DRAW_OFFSET + d), apart
# from the discovered circuits' draws.
KEY_DRAW_OFFSET = 700


def _identification_pool(lm, pairs: pd.DataFrame, where: str, batch: int) -> tuple:
    """(pool, pool outputs): every identification pair as teacher-forced items, read in one forward over the pool
    for its terminators and every ablation's values; any draw of identification pairs takes its items from it
    (`TailItems.of_pairs`)."""
    from arithmech.interp import teacher_forcing as tf

    pool = tf.build_items(lm, split_pairs(pairs, "identification", where), batch_size=batch, outputs=True)
    return pool, tf.tail_outputs(lm, pool, batch)


def _selection_items(pool, pairs: pd.DataFrame, ident: pd.DataFrame, discover: dict, seed: int,
                     task: str) -> tuple[pd.DataFrame | None, list | None]:
    """(selection pairs, their teacher-forced items, from the identification `pool`), or (None, None) with a warning
    when there are none (`_selection_pairs`) or none the protocol can score (no full-model terminator ending the gold
    number): the target is then chosen on the pruning pairs."""
    select = _selection_pairs(pairs, ident, discover["selection_samples"], seed, task)
    why = f"every identification pair shares its operands with the {len(ident)} pruned on"
    if select is not None:
        items = pool.of_pairs(select)
        if len(items):
            return select, items
        why = (f"none of its {len(select)} selection pairs has a full-model terminator that ends the gold number (the "
               "model continues the number after the gold answer)")
    warnings.warn(f"{task}: {why}: the target is chosen on the pruning pairs (circuit.discover.max_samples, "
                  "selection_samples)", stacklevel=3)
    return None, None


def _random_sets(curve_heads, mlps, *, n_layers, n_heads, draws, seed, label, offset: int = 900) -> list[CircuitSet]:
    """`draws` layer-matched random head sets of the circuit's size, disjoint from it, with its MLPs (mlps label
    `label`; draw d seeded seed * 1000 + offset + d: `KEY_DRAW_OFFSET` for the key circuit); none (and
    a warning) for a circuit of more than half the heads, which has no disjoint random circuit of its size (its
    random columns are then NaN)."""
    if len(curve_heads) > n_layers * n_heads - len(curve_heads):
        warnings.warn(f"a {label} circuit of {len(curve_heads)} of the {n_layers * n_heads} heads has no disjoint "
                      "random circuit of its size: no random control is scored for it", stacklevel=2)
        return []
    return [CircuitSet("random", label, len(curve_heads), d,
                       tuple(layer_matched_heads(curve_heads, n_heads, seed=seed * 1000 + offset + d,
                                                 n_layers=n_layers))
                       if curve_heads else (), tuple(mlps)) for d in range(draws)]


FLAG_GAP = 0.15  # the two ablations' full-answer faithfulness differing by more is flagged (tf_flag)


def _scored(lm, val: pd.DataFrame, pool: tuple, sets, targets, ranking, nodes, discover: dict, seed: int, batch: int,
            sanity: bool = True) -> tuple[pd.DataFrame, pd.DataFrame | None, pd.DataFrame]:
    """(the validation table, the CPR/CMD rows (None without a ranking), the per-item table) of `sets` (one 'model',
    one 'empty'; `targets`: each set's target, NaN for none) on the validation pairs `val`, teacher-forced with
    values from the identification items; pool: (those items, their `tail_outputs`). Per set
    (`teacher_forcing.teacher_forced_table` at END + answer positions): for each ablation and measure the mean and the
    faithfulness with intervals, the sanity checks' values, and `tf_flag`: the two ablations' full-answer
    faithfulness differ by more than FLAG_GAP. The CPR/CMD rows: one per node share (curve 'share', node_share; the
    top nodes of the pruning's ranking, `teacher_forcing.node_ranking`). The per-item table: one row per set and
    validation pair (curve, mlps, k, seed, target, sample_id, cluster, the tf_... values; NaN for a pair the protocol
    leaves out). sanity: False skips the sanity checks (the union: `run_discover` ran them on the same pairs and
    pool)."""
    from arithmech.interp import teacher_forcing as tf

    shares = tf.share_circuits(ranking) if ranking is not None else np.zeros((0, len(nodes)), dtype=bool)
    share_sets = [CircuitSet("share", "share", int(m.sum()), -1,
                             tuple(n for n, k in zip(nodes, m) if k and n[1] >= 0),
                             tuple(n[0] for n, k in zip(nodes, m) if k and n[1] < 0)) for m in shares]
    pool, pool_outputs = pool
    scored, per_item = tf.teacher_forced_table(
        lm, val, pool, sets + share_sets, pool_outputs=pool_outputs, sanity_draws=discover["sanity_draws"],
        strict=protocol.strict_kinds(discover["sanity"]), n_boot=discover["bootstrap"], seed=seed,
        confidence=discover["confidence"], batch_size=batch, sanity=sanity,
        sanity_samples=discover["sanity_samples"])
    table = scored.iloc[: len(sets)].reset_index(drop=True).assign(target=targets, n=len(val), split="validation")
    f = table[[f"faithfulness_tf_{kind}_tail_correct" for kind in protocol.KINDS]]
    table["tf_flag"] = (f.max(axis=1) - f.min(axis=1)) > FLAG_GAP
    rows = None
    if ranking is not None:
        rows = scored.iloc[len(sets) :].reset_index(drop=True).assign(node_share=list(tf.SHARES),
                                                                       n=int(scored["tf_n_items"].iloc[0]),
                                                                       split="validation")
    n = len(val)
    items = pd.DataFrame({
        "curve": np.repeat([s.curve for s in sets], n), "mlps": np.repeat([s.mlps for s in sets], n),
        "k": np.repeat([s.k for s in sets], n), "seed": np.repeat([s.seed for s in sets], n),
        "target": np.repeat(targets, n), "sample_id": np.tile(val["sample_id"].to_numpy(), len(sets)),
        "cluster": np.tile(pair_labels(val).to_numpy(), len(sets))})
    items = protocol.with_set_columns(items, len(sets), per_item[per_item["set_index"] < len(sets)])
    return table, rows, items


def _correct_by_kind(lm, items, pool, pool_outputs, masks, *, seed: int, batch: int, trials=None) -> dict:
    """Teacher-forced correctness of circuits `masks` (bool [c, nodes]) on `items` under each ablation kind:
    {kind: [c, n_items]}, values from the identification `pool`. trials: a `TailTrials` on these items whose prefix
    caches (and its own kind's values) are reused. Items drawn from the pool itself may lack a resample donor (a
    pool with no other prompt of their template and length): that kind's values are then NaN, with a warning."""
    from arithmech.interp import teacher_forcing as tf

    out = {}
    for kind in protocol.KINDS:
        if trials is not None and trials.values.kind == kind:
            on = trials
        else:
            try:
                values = tf.ablation_values(lm, items, pool, kind, seed=seed, batch_size=batch,
                                            pool_outputs=pool_outputs)
            except ValueError as err:
                warnings.warn(f"no {kind} ablation on the identification pairs pruned on ({err}): their "
                              f"tf_{kind}_correct_identification is NaN", stacklevel=2)
                out[kind] = np.full((len(masks), len(items)), np.nan)
                continue
            on = trials.with_values(values) if trials is not None else tf.TailTrials(lm, items, values,
                                                                                     batch_size=batch)
            trials = trials if trials is not None else on
        out[kind] = on.scores(masks)["correct"]
    return out


def _fitted(correct: dict) -> dict:
    """Full-answer faithfulness {kind: [c - 2]} of every circuit after the model and the empty circuit (the first
    two rows of each [c, n_items] of `correct`), NaN where the two agree."""
    out = {}
    for kind, values in correct.items():
        acc = values.mean(1)
        out[kind] = protocol.faithfulness(acc[2:], acc[0], acc[1])
    return out


ORDER_FLAG_COLUMNS = {kind: f"faithfulness_tf_{kind}_tail_correct" for kind in protocol.KINDS}


def order_flag(task: str, validation: pd.DataFrame, circuits: pd.DataFrame, names: list[str]) -> str:
    """The run-time check of the ranking (`teacher_forcing.node_ranking`): '' when no scored circuit beats its CPR
    curve; else one sentence per circuit (rows of `circuits`, named `names`) whose full-answer faithfulness
    interval lies above the curve (`validation`'s rows with curve 'share') at the next share holding at least its
    nodes, under either ablation, with the numbers. Such a circuit is a better answer at that size than the
    ranking's own prefix: the ranking misses it."""
    curve = validation[validation["curve"] == "share"]
    if not len(curve):
        return ""
    curve = curve.assign(size=curve["n_heads"] + curve["n_mlps"]).sort_values("size", kind="stable")
    flags = []
    for name, (_, row) in zip(names, circuits.iterrows()):
        size = int(row["n_heads"] + row["n_mlps"])
        point = curve[curve["size"] >= size]
        if not len(point):
            continue
        point = point.iloc[0]
        for kind, column in ORDER_FLAG_COLUMNS.items():
            low, value = row.get(f"{column}_low", np.nan), point.get(column, np.nan)
            if pd.notna(low) and pd.notna(value) and low > value:
                flags.append(f"{task}: the {name} ({size} nodes) keeps {row[column]:.2f} [{low:.2f}, "
                             f"{row[column + '_high']:.2f}] of full answers ({kind}), above the ranking's top "
                             f"{point['node_share']:.0%} ({int(point['size'])} nodes) at {value:.2f}")
    return "; ".join(flags)


def _circuits_of(validation: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The circuits of one operator's validation table that its order check reads: every target's discovered
    circuit and the key circuit, with their names."""
    rows = validation[(validation["curve"] == "discovered") | (validation["curve"] == "key")]
    names = [f"circuit at target {t:g}" if c == "discovered" else "key circuit"
             for c, t in zip(rows["curve"], rows["target"])]
    return rows, names


def _circuits_table(task: str, targets, pruned_on: str, pruned, found, n_nodes: int, on_ident: np.ndarray,
                    fitted: dict, *, seconds: float, n_identification: int, n_selection: int) -> pd.DataFrame:
    """One row per target: its pruned circuit (`found`, from `pruned`), the full-answer accuracy kept on the pairs the
    target is chosen on (`on_ident`: the model, the empty circuit, then each target's circuit) and on the pruning
    pairs per ablation (`fitted`: the gap's identification side)."""
    return pd.DataFrame({
        "task": task, "target": targets, "pruned_on": pruned_on,  # pruned_on: what `faithfulness` is of
        "n_heads": [len(s.heads) for s in found], "n_mlps": [len(s.mlp_layers) for s in found],
        "n_nodes": [len(s.heads) + len(s.mlp_layers) for s in found],
        "share": [(len(s.heads) + len(s.mlp_layers)) / n_nodes for s in found],
        "nodes": [s.nodes() for s in found], "faithfulness": [p.faithfulness for p in pruned],
        "full_accuracy": on_ident[2:], "model_full_accuracy": on_ident[0],
        "full_share": on_ident[2:] / on_ident[0] if on_ident[0] > 0 else np.nan,
        "minimal": [p.minimal for p in pruned], "trials": [p.trials for p in pruned], "seconds": seconds,
        "n_identification": n_identification, "n_selection": n_selection,
        **{f"tf_{kind}_correct_identification": f for kind, f in fitted.items()},
    })


def choose_target(table: pd.DataFrame, min_full_share: float) -> tuple[float, bool]:
    """(target, whether one reached the share): the smallest target whose circuit keeps at least `min_full_share`
    of the full model's full-answer accuracy on the selection pairs (`full_share`), else the largest."""
    ok = table[table["full_share"] >= min_full_share]
    if len(ok):
        return float(ok["target"].min()), True
    return float(table["target"].max()), False


def run_discover(*, model: str, task: str, model_dir, pairs_path, effects_path, key_path, discover: dict,
                 compute: dict, seed: int, out_table, out_path, out_validation, out_items, out_added) -> None:
    """Discover one operator's circuit at every `discover["targets"]` on a seeded draw of its identification pairs
    (`teacher_forcing.prune` along `teacher_forcing.node_ranking`, two-sided, on `teacher_forcing.TailTrials` with the
    `tf_ablation` values and the `tf_measure`), choose the target (`choose_target`, on a seeded draw of
    `selection_samples` identification pairs with other operands: `_selection_pairs`), and score every target's circuit
    on a seeded draw of its validation pairs against the key circuit (key heads, key MLPs), `random_draws` layer-matched
    random head sets of its size (its MLPs) and its size's top heads by effect (its MLPs), with cluster-bootstrap
    intervals. Writes the circuits (`out_table`), the pruning path (`out_path`), the validation faithfulness
    (`out_validation`) with its per-item values (`out_items`), and the added heads' direct effects and END attention by
    token role (`out_added`)."""
    from arithmech.interp import teacher_forcing as tf
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    pairs = pd.read_parquet(pairs_path)
    ident, val = _scored_pairs(pairs, discover, seed, str(pairs_path))
    effects = pd.read_parquet(effects_path)
    key_heads, key_mlps = key_nodes(pd.read_parquet(key_path))
    nodes = all_nodes(lm.n_layers, lm.n_heads)
    targets, batch, ablation = [float(t) for t in discover["targets"]], compute["batch_size"], discover["tf_ablation"]
    measure = f"tf_{ablation}_{discover['tf_measure']}"  # what the pruning's faithfulness is of

    start = time.perf_counter()
    # END and every answer position, position-matched values from the identification pairs
    pool, pool_outputs = _identification_pool(lm, pairs, str(pairs_path), batch)
    prune_items = pool.of_pairs(ident)
    if not len(prune_items):
        raise ValueError(f"{task}: none of the {len(ident)} identification pairs pruned on has a full-model terminator "
                         "that ends the gold number (the model continues the number after the gold answer)")
    tail_values = tf.ablation_values(lm, prune_items, pool, ablation, seed=seed, batch_size=batch,
                                     pool_outputs=pool_outputs)
    trials = tf.TailTrials(lm, prune_items, tail_values, measure=discover["tf_measure"],
                           batch_size=max(batch, len(prune_items)))
    ranking, attribution = tf.node_ranking(trials, discover["ig_steps"])
    max_trials = discover["max_trials"] if lm.n_layers * lm.n_heads >= discover["max_trials"] else None
    pruned, path = tf.prune(trials, targets, ranking=ranking, attribution=attribution, max_trials=max_trials,
                         max_passes=discover["max_passes"], two_sided=True)
    seconds = time.perf_counter() - start

    # full-answer accuracy kept on held-out identification pairs: what the target is chosen on
    select, select_items = _selection_items(pool, pairs, ident, discover, seed, task)
    every = tuple((l, h) for l, h in nodes if h != MLP)
    found = [CircuitSet("discovered", "discovered", len(p.heads(nodes)), -1, tuple(p.heads(nodes)),
                        tuple(p.mlps(nodes))) for p in pruned]
    base = [CircuitSet("model", "all", len(every), -1, every, tuple(range(lm.n_layers))),
            CircuitSet("empty", "none", 0, -1, (), ())]
    # teacher-forced correctness: greedy full answers under the same per-position values; `fitted`: the circuits'
    # full-answer faithfulness on the pairs they were pruned on, per ablation
    masks = kept_masks(base + found, nodes)
    correct = _correct_by_kind(lm, prune_items, pool, pool_outputs, masks, seed=seed, batch=batch, trials=trials)
    on_ident, fitted = correct[ablation].mean(1), _fitted(correct)
    if select is not None:
        on_ident = tf.TailTrials(lm, select_items, tf.ablation_values(
            lm, select_items, pool, ablation, seed=seed, batch_size=batch,
            pool_outputs=pool_outputs), batch_size=batch).scores(masks)["correct"].mean(1)
    table = _circuits_table(task, targets, measure, pruned, found, len(nodes), on_ident, fitted, seconds=seconds,
                            n_identification=len(ident), n_selection=len(ident if select is None else select))
    table.insert(table.columns.get_loc("n_selection") + 1, "selected_on",
                 "pruning pairs" if select is None else "held-out identification pairs")
    chosen, reached = choose_target(table, discover["min_full_share"])
    if not reached:
        why = (" (the full model answers none of them in full)" if on_ident[0] == 0 else
               f" (the circuits keep {', '.join(f'{x:.0%}' for x in table['full_share'])})")
        warnings.warn(f"{task}: no target's circuit keeps {discover['min_full_share']:.0%} of the full model's "
                      f"full-answer accuracy on the {table['selected_on'].iloc[0]}{why} "
                      f"(circuit.discover.min_full_share); taking the largest target, {chosen}", stacklevel=2)
    table["chosen"] = table["target"] == chosen
    table["share_reached"] = reached

    # validation: every target's circuit against the key circuit, random circuits of its size, the top heads
    ranked = ranked_heads(effects)
    # the key circuit with its layer-matched random circuits: the circuit_sufficient
    # verdict reads them here, on the protocol and pairs the discovered circuits are scored on
    key_sets = [CircuitSet("key", "key", len(key_heads), -1, tuple(key_heads), tuple(sorted(key_mlps))),
                *(_random_sets(list(key_heads), tuple(sorted(key_mlps)), n_layers=lm.n_layers, n_heads=lm.n_heads,
                               draws=discover["random_draws"], seed=seed, label="key",
                               offset=KEY_DRAW_OFFSET)
                  if key_heads else [])]
    sets, set_targets = [*base, *key_sets], [np.nan] * (2 + len(key_sets))
    for p, s in zip(pruned, found):
        # the controls (random circuits, top heads) for the chosen target's circuit, what the verdicts read; the
        # other targets' circuits alone (their summary rows have no random comparison, draws 0)
        mine = [s] if p.target != chosen else [
            s, *_random_sets(list(s.heads), s.mlp_layers, n_layers=lm.n_layers, n_heads=lm.n_heads,
                             draws=discover["random_draws"], seed=seed, label="discovered"),
            CircuitSet("top", "discovered", len(s.heads), -1, tuple(ranked[: len(s.heads)]), s.mlp_layers)]
        sets += mine
        set_targets += [p.target] * len(mine)
    validation, share_rows, items = _scored(lm, val, (pool, pool_outputs), sets, np.array(set_targets), ranking,
                                            nodes, discover, seed, batch)
    for kind in protocol.KINDS:  # what a verdict reading the items needs beside them: the failed sanity checks
        items[f"sanity_{kind}_failed"] = validation[f"sanity_{kind}_failed"].iloc[0]
    key_set = set(key_heads)
    discovered = validation["curve"] == "discovered"
    heads_of = [s.heads for s in sets]
    validation["key_kept"] = [" ".join(node_label(*h) for h in hs if h in key_set) if d else ""
                              for hs, d in zip(heads_of, discovered)]
    validation["added"] = [" ".join(node_label(*h) for h in hs if h not in key_set) if d else ""
                           for hs, d in zip(heads_of, discovered)]
    validation["key_only"] = [" ".join(node_label(*h) for h in key_heads if h not in set(hs)) if d else ""
                              for hs, d in zip(heads_of, discovered)]
    validation.insert(0, "task", task)
    validation["chosen"] = validation["target"] == chosen
    validation["measure_name"] = measure
    validation = pd.concat([validation, share_rows.assign(task=task, chosen=False)], ignore_index=True)
    flag = order_flag(task, validation, *_circuits_of(validation))
    if flag:
        warnings.warn(f"the CPR curve's ranking is beaten by a scored circuit: {flag}", stacklevel=2)
    added = _added_heads(lm, val, table, key_set, effects, batch)

    meta = stage_meta(model_dir, "discover", task=task, discover=discover, seed=seed, key_heads=len(key_heads),
                      chosen=chosen, seconds=seconds)
    write_parquet(table, out_table, meta)
    path = path.assign(task=task, chosen=path["target"] == chosen)
    write_parquet(path, out_path, meta)
    write_parquet(validation, out_validation, meta)
    write_parquet(items.assign(task=task), out_items, meta)
    write_parquet(added, out_added, meta)


def _added_heads(lm, scored: pd.DataFrame, table: pd.DataFrame, key_set: set, effects: pd.DataFrame,
                 batch_size: int) -> pd.DataFrame:
    """Per target, every discovered head that is not a key head: its direct effect and rank by effect (the
    effects table), and its END attention by token role on the scored pairs (`analysis.role_attention`, the
    analysis stage's measure), one column per role."""
    from arithmech.interp.analysis import attention_rows, role_attention, token_roles


    rows = []
    for target, nodes in zip(table["target"], table["nodes"]):
        for layer, head in parse_nodes(nodes)[0]:
            if (layer, head) not in key_set:
                rows.append({"target": target, "node": node_label(layer, head), "layer": layer, "head": head})
    added = pd.DataFrame(rows, columns=["target", "node", "layer", "head"])
    heads = effects[effects["component"] == "head"].sort_values("mean_effect", kind="stable").reset_index(drop=True)
    heads["effect_rank"] = np.arange(1, len(heads) + 1)
    added = added.merge(heads[["layer", "head", "mean_effect", "effect_rank"]], on=["layer", "head"], how="left")
    distinct = sorted(set(zip(added["layer"], added["head"])))
    if not distinct:
        return added
    roles = [token_roles(lm.tokenizer, row["prompt"], row) for row in scored.to_dict("records")]
    attention = role_attention(attention_rows(lm, list(scored["prompt"]), distinct, batch_size), roles)
    wide = attention.pivot_table(index=["layer", "head"], columns="role", values="attention").add_prefix("attention_")
    return added.merge(wide.reset_index(), on=["layer", "head"], how="left")


def _summary_row(task, target, chosen, circuit_row: pd.Series, key_row: pd.Series | None, items: pd.DataFrame,
                 n_nodes: int, pruned_on: str, discover: dict, seed: int, model_correct: float) -> dict:
    """One summary row: the circuit's size, its teacher-forced validation faithfulness and its paired difference from
    its layer-matched random circuits (`_tf_summary`), the key circuit's faithfulness; full_share: its full-answer
    accuracy under the pruning's ablation over the model's (`model_correct`)."""
    boot = {"n_boot": discover["bootstrap"], "seed": seed, "confidence": discover["confidence"]}
    row = {"task": task, "target": target, "chosen": chosen, "pruned_on": pruned_on,
           "n_heads": int(circuit_row["n_heads"]), "n_mlps": int(circuit_row["n_mlps"]),
           "share": (circuit_row["n_heads"] + circuit_row["n_mlps"]) / n_nodes}
    for kind in protocol.KINDS:  # the key circuit, scored beside it
        column = f"faithfulness_tf_{kind}_tail_correct"
        row |= {f"tf_{kind}_key_correct{suffix}": np.nan if key_row is None else float(key_row[column + suffix])
                for suffix in ("", "_low", "_high")}
    correct = float(circuit_row[f"tf_{discover['tf_ablation']}_tail_correct"])
    row["full_share"] = correct / model_correct if model_correct > 0 else np.nan
    sanity = {k: v for k, v in circuit_row.items() if str(k).startswith("sanity_") and str(k).endswith("_failed")}
    return row | _tf_summary(items, boot, {k: ("" if pd.isna(v) else str(v)) for k, v in sanity.items()})


def _tf_summary(items: pd.DataFrame, boot: dict, sanity: dict | None = None) -> dict:
    """The teacher-forced columns of a summary row (what `report.claims.circuit_faithful` reads), where the items
    carry them: per ablation kind, the circuit's full-answer (tf_<kind>_correct) and log-probability
    (tf_<kind>_logprob) faithfulness with intervals, and (circuit - its layer-matched random circuits) on full
    answers (tf_<kind>_random_diff), paired; tf_n_items: the pairs scored; draws: the random circuits (0: none, the
    difference NaN); tf_<kind>_sanity_failed: the failed
    sanity checks of that ablation ('' when none; `sanity`: the validation row's sanity_* values)."""
    row = {}
    for kind in protocol.KINDS:
        column = f"tf_{kind}_tail_correct"
        if column not in items:
            continue
        if sanity is not None:
            row[f"tf_{kind}_sanity_failed"] = sanity.get(f"sanity_{kind}_failed", "")
        for measure in ("correct", "logprob"):
            res = protocol.key_vs_random(items, mlps="discovered", curve="discovered",
                                         column=f"tf_{kind}_tail_{measure}", **boot)
            if res is None:  # no random draw of its size
                continue
            row |= {f"tf_{kind}_{measure}": res["key"], f"tf_{kind}_{measure}_low": res["key_low"],
                    f"tf_{kind}_{measure}_high": res["key_high"]}
            if measure == "correct":
                row |= {f"tf_{kind}_random_diff": res["difference"], f"tf_{kind}_random_diff_low": res["ci_low"],
                        f"tf_{kind}_random_diff_high": res["ci_high"], "tf_n_items": res["n_items"],
                        "draws": res["draws"]}
    return row


def _gap(row: dict, fitted: dict) -> dict:
    """tf_<kind>_correct_identification (`fitted`: the circuit's full-answer faithfulness on the pairs it was
    pruned on) and tf_<kind>_gap: that minus its validation faithfulness (tf_<kind>_correct); NaN where either is
    undefined (the model and the empty circuit answer alike)."""
    out = {}
    for kind in protocol.KINDS:
        fit = float(fitted.get(kind, np.nan))
        out[f"tf_{kind}_correct_identification"] = fit
        out[f"tf_{kind}_gap"] = fit - float(row.get(f"tf_{kind}_correct", np.nan))
    return out


def task_summary(task: str, table: pd.DataFrame, validation: pd.DataFrame, items: pd.DataFrame, *, n_nodes: int,
                 discover: dict, seed: int) -> list[dict]:
    """The summary rows of one operator, one per target (`run_discover`'s tables)."""
    rows = []
    key = validation[validation["curve"] == "key"]
    model_correct = float(validation.loc[validation["curve"] == "model",
                                         f"tf_{discover['tf_ablation']}_tail_correct"].iloc[0])
    flag = order_flag(task, validation, *_circuits_of(validation))
    for _, circuit in table.iterrows():
        target = circuit["target"]
        scored = validation[(validation["curve"] == "discovered") & (validation["target"] == target)].iloc[0]
        mine = items[items["curve"].isin(["model", "empty"]) | (items["target"] == target)]
        row = _summary_row(task, target, bool(circuit["chosen"]), scored, key.iloc[0] if len(key) else None, mine,
                           n_nodes, circuit["pruned_on"], discover, seed, model_correct)
        rows.append(row | _gap(row, {k: circuit.get(f"tf_{k}_correct_identification", np.nan) for k in protocol.KINDS})
                    # False: no target kept min_full_share on the identification pairs, the largest was chosen
                    | {"share_reached": bool(circuit.get("share_reached", True)), "cpr_order_flag": flag})
    # reported, never chosen on: the smallest target whose circuit keeps min_full_share on validation pairs
    keeps = [r["target"] for r in rows if r["full_share"] >= discover["min_full_share"]]
    for r in rows:
        r["smallest_target_validation"] = min(keeps) if keeps else np.nan
    return rows


def run_discover_union(*, model: str, model_dir, tasks: list[str], pairs_paths, key_paths, table_paths,
                       validation_paths, items_paths, discover: dict, compute: dict, seed: int, out_validation,
                       out_summary, shared_path=None) -> None:
    """The union of every operator's chosen circuit (and, beside it, the union of the key circuits), scored on
    `validation_samples` pairs in all (`operator_share` of each operator's draw `run_discover` scored) against
    `random_draws` layer-matched random head sets of its size with its MLPs (`out_validation`, one block of rows per
    operator and one pooled over operators, task 'union'); and the summary (`out_summary`): one row per operator and
    target from `run_discover`'s tables, and one for the union (pooled; target NaN), then the shared circuit's
    (`shared_path`: `run_discover_shared`'s summary row, with the union's sanity checks: the same pairs, pools and
    seed)."""
    from arithmech.data.datasets import subsample
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    n_nodes = len(all_nodes(lm.n_layers, lm.n_heads))
    tables = {t: pd.read_parquet(p) for t, p in zip(tasks, table_paths, strict=True)}
    pruned_on = f"tf_{discover['tf_ablation']}_{discover['tf_measure']}"  # each operator's circuit's
    heads, mlps, key_h, key_m = set(), set(), set(), set()
    for task, key_path in zip(tasks, key_paths, strict=True):
        chosen = tables[task][tables[task]["chosen"]].iloc[0]
        chosen_heads, chosen_mlps = parse_nodes(chosen["nodes"])
        heads |= set(chosen_heads)
        mlps |= set(chosen_mlps)
        kh, km = key_nodes(pd.read_parquet(key_path))
        key_h |= set(kh)
        key_m |= set(km)
    every = tuple((l, h) for l in range(lm.n_layers) for h in range(lm.n_heads))
    union = CircuitSet("discovered", "discovered", len(heads), -1, tuple(sorted(heads)), tuple(sorted(mlps)))
    sets = [CircuitSet("model", "all", len(every), -1, every, tuple(range(lm.n_layers))),
            CircuitSet("empty", "none", 0, -1, (), ()),
            CircuitSet("key", "key", len(key_h), -1, tuple(sorted(key_h)), tuple(sorted(key_m))), union,
            *_random_sets(list(union.heads), union.mlp_layers, n_layers=lm.n_layers, n_heads=lm.n_heads,
                          draws=discover["random_draws"], seed=seed, label="discovered")]
    targets = np.full(len(sets), np.nan)
    boot = {"n_boot": discover["bootstrap"], "seed": seed, "confidence": discover["confidence"]}
    blocks, all_items, fitted, flags = [], [], [], []
    nodes, batch = all_nodes(lm.n_layers, lm.n_heads), compute["batch_size"]
    for task, pairs_path, val_path in zip(tasks, pairs_paths, validation_paths, strict=True):
        pairs = pd.read_parquet(pairs_path)
        ident, val = _scored_pairs(pairs, discover, seed, str(pairs_path))
        val = subsample(val, protocol.operator_share(discover["validation_samples"], tasks), seed)
        pool, pool_outputs = _identification_pool(lm, pairs, str(pairs_path), batch)
        table, _, items = _scored(lm, val, (pool, pool_outputs), sets, targets, None, nodes, discover, seed, batch,
                                  sanity=False)
        # the union on the pairs its parts were pruned on (the gap's identification side): model, empty, union
        fitted.append(_correct_by_kind(lm, pool.of_pairs(ident), pool, pool_outputs,
                                       kept_masks(sets[:2] + [union], nodes), seed=seed,
                                       batch=batch))
        mine = table[table["curve"].isin(["discovered", "key"])]
        flags.append(order_flag(task, pd.read_parquet(val_path), mine,
                                ["union" if c == "discovered" else "union of the key circuits"
                                 for c in mine["curve"]]))
        # the sanity checks depend on the pairs, the pool and the seed only, the same as run_discover's: its
        # values, not a second run of them
        own = pd.read_parquet(val_path)
        table = table.assign(**{c: own[c].iloc[0] for c in own if c.startswith("sanity_")})
        blocks.append(table.assign(task=task))
        all_items.append(items.assign(task=task, sample_id=task + ":" + items["sample_id"].astype(str),
                                      cluster=task + ":" + items["cluster"]))
    items = pd.concat(all_items, ignore_index=True)
    # pooled over operators (each scored on its own number of pairs): every set's values side by side, on the pairs
    # the protocol kept
    wide, pooled_clusters = protocol.pooled_values(
        items, len(sets), {c: c for c in items if c.startswith("tf_") and "_tail_" in c}, groups=tasks)
    kept = ~np.isnan(np.stack(list(wide.values()))).all((0, 1))
    pooled = protocol.faithfulness_table(sets, {k: v[:, kept] for k, v in wide.items()}, pooled_clusters[kept],
                                         **boot)
    pooled = pooled.assign(task="union", target=targets, n=len(pooled_clusters), tf_n_items=int(kept.sum()),
                           split="validation")
    validation = pd.concat([*blocks, pooled], ignore_index=True)
    validation["chosen"] = True

    rows = []
    for task, val_path, items_path in zip(tasks, validation_paths, items_paths, strict=True):
        rows += task_summary(task, tables[task], pd.read_parquet(val_path), pd.read_parquet(items_path),
                             n_nodes=n_nodes, discover=discover, seed=seed)
    circuit_row = pooled[pooled["curve"] == "discovered"].iloc[0].copy()
    for column in {c for b in blocks for c in b if c.startswith("sanity_") and c.endswith("_failed")}:
        # the union's sanity: every operator's failed checks (each block ran them on its own pairs)
        circuit_row[column] = "; ".join(dict.fromkeys(f"{t}: {b[column].iloc[0]}" for t, b in zip(tasks, blocks)
                                                      if column in b and str(b[column].iloc[0])))
    key_row = pooled[pooled["curve"] == "key"].iloc[0]
    model_correct = float(pooled.loc[pooled["curve"] == "model", f"tf_{discover['tf_ablation']}_tail_correct"].iloc[0])
    row = _summary_row("union", np.nan, True, circuit_row, key_row, items, n_nodes, pruned_on, discover, seed,
                       model_correct)
    # pooled over operators: each operator's pruning pairs, per-item correctness side by side
    pooled_fit = _fitted({k: np.concatenate([f[k] for f in fitted], 1) for k in protocol.KINDS}) if fitted else {}
    rows.append(row | _gap(row, {k: v[0] for k, v in pooled_fit.items()})
                | {"smallest_target_validation": np.nan, "share_reached": np.nan,
                   "cpr_order_flag": "; ".join(f for f in flags if f)})
    if shared_path is not None:
        rows.append(pd.read_parquet(shared_path).iloc[0].to_dict()
                    | {k: v for k, v in rows[-1].items() if k.endswith("_sanity_failed")})
    meta = stage_meta(model_dir, "discover_union", tasks=tasks, discover=discover, seed=seed)
    write_parquet(validation, out_validation, meta)
    write_parquet(pd.DataFrame(rows), out_summary, meta)


def run_plot_discover(*, model: str, task: str, path_path, validation_path, key_path, out_path_png,
                      out_grid_png) -> None:
    """The discover stage's figures: the pruning path (faithfulness against nodes kept, every target) and the
    chosen circuit on the layer x head grid over the key heads (the grid's size: the path's nodes, every node
    being visited)."""
    from arithmech.report import plots

    path, validation = pd.read_parquet(path_path), pd.read_parquet(validation_path)
    key_heads, _ = key_nodes(pd.read_parquet(key_path))
    n_layers, n_heads = int(path["layer"].max()) + 1, int(path["head"].max()) + 1
    measure = validation["measure_name"].iloc[0]
    plots.pruning_path(path, f"{model}, {task}: greedy pruning on identification pairs ({measure})", out_path_png)
    chosen = validation[(validation["curve"] == "discovered") & validation["chosen"]].iloc[0]
    kept = ", ".join(f"{kind} {chosen[c]:.2f} [{chosen[c + '_low']:.2f}, {chosen[c + '_high']:.2f}]"
                     for kind, c in ORDER_FLAG_COLUMNS.items())
    plots.circuit_grid(chosen["nodes"], key_heads, n_layers, n_heads,
                       f"{model}, {task}: discovered circuit (target {chosen['target']:g}) over the key heads\n"
                       f"validation, teacher-forced full-answer faithfulness: {kept}", out_grid_png)


SHARED = "shared"  # the shared circuit's task name in the summary and its tables' pooled rows


def _shared_items(per_item: pd.DataFrame, sets, targets, clusters: pd.Series, task: str) -> pd.DataFrame:
    """`teacher_forced_table`'s per-item values of `sets` on one operator's pairs with what `key_vs_random` and
    `pooled_values` read beside them: each set's curve, mlps, k, seed and target, the item's cluster, and sample ids
    and clusters named by the operator (unique over operators)."""
    at = per_item["set_index"].to_numpy()
    return per_item.drop(columns="set_index").assign(
        curve=[sets[i].curve for i in at], mlps=[sets[i].mlps for i in at], k=[sets[i].k for i in at],
        seed=[sets[i].seed for i in at], target=np.asarray(targets)[at], task=task,
        cluster=task + ":" + clusters.loc[per_item["sample_id"]].to_numpy(),
        sample_id=task + ":" + per_item["sample_id"].astype(str))


def run_discover_shared(*, model: str, model_dir, tasks: list[str], pairs_paths, discover: dict, compute: dict,
                        seed: int, out_table, out_validation, out_items, out_summary) -> None:
    """The shared circuit: ONE circuit pruned on every operator's identification pairs together (`max_samples` in all,
    `operator_share` of each draw `run_discover` prunes on; one `teacher_forcing.TailTrials` of them all: each
    operator's items ablated with values from its own identification pool, the pruning measure their mean), at every
    target, the target chosen on the operators' selection pairs pooled (`choose_target`), and scored as an operator's
    chosen circuit is: teacher-forced on `validation_samples` pairs in all (`operator_share` of each operator's draw),
    per operator and pooled (task SHARED) under both ablations, every target's circuit, `random_draws` layer-matched
    random circuits of the chosen one's size and the CPR rows of the pooled ranking. Writes the circuits (`out_table`),
    the validation faithfulness (`out_validation`) with its per-item values (`out_items`), and the chosen circuit's
    summary row (`out_summary`: `_tf_summary`'s columns, the identification-validation gap and the order check; its
    sanity checks are `run_discover`'s, on the same pairs and pools: `run_discover_union` adds them)."""
    from arithmech.data.datasets import subsample
    from arithmech.interp import teacher_forcing as tf
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    nodes, batch = all_nodes(lm.n_layers, lm.n_heads), compute["batch_size"]
    targets, kind = [float(t) for t in discover["targets"]], discover["tf_ablation"]
    start = time.perf_counter()
    ops = []  # per operator: (task, pairs, pruning draw, validation draw, pool, pool outputs, pruning items, values)
    for task, pairs_path in zip(tasks, pairs_paths, strict=True):
        pairs = pd.read_parquet(pairs_path)
        ident, val = _scored_pairs(pairs, discover, seed, str(pairs_path))
        pool, pool_outputs = _identification_pool(lm, pairs, str(pairs_path), batch)
        # max_samples pairs in all, an equal seeded share of each operator's pruning draw (the selection below still
        # excludes the whole draw's operands)
        items = pool.of_pairs(subsample(ident, protocol.operator_share(discover["max_samples"], tasks), seed))
        if not len(items):
            raise ValueError(f"{task}: none of its identification pairs drawn for the shared circuit has a "
                             "full-model terminator that ends the gold number")
        values = tf.ablation_values(lm, items, pool, kind, seed=seed, batch_size=batch, pool_outputs=pool_outputs)
        ops.append((task, pairs, ident, val, pool, pool_outputs, items, values))
    # one trial set of every operator's items, each with its own operator's values: the pruning measure is their
    # mean (an operator weighs as many items as it kept), and items of one T share a forward whatever their operator
    pooled = tf.TailTrials(lm, tf.concat_items([op[-2] for op in ops]), tf.concat_values([op[-1] for op in ops]),
                           measure=discover["tf_measure"], batch_size=max(batch, sum(len(op[-2]) for op in ops)))
    ranking, attribution = tf.node_ranking(pooled, discover["ig_steps"])
    max_trials = discover["max_trials"] if lm.n_layers * lm.n_heads >= discover["max_trials"] else None
    pruned, _ = tf.prune(pooled, targets, ranking=ranking, attribution=attribution, max_trials=max_trials,
                      max_passes=discover["max_passes"], two_sided=True)
    seconds = time.perf_counter() - start

    every = tuple((l, h) for l, h in nodes if h != MLP)
    base = [CircuitSet("model", "all", len(every), -1, every, tuple(range(lm.n_layers))),
            CircuitSet("empty", "none", 0, -1, (), ())]
    found = [CircuitSet("discovered", "discovered", len(p.heads(nodes)), -1, tuple(p.heads(nodes)),
                        tuple(p.mlps(nodes))) for p in pruned]
    masks = kept_masks(base + found, nodes)
    correct, on_select, selected = [], [], []  # per operator: on its pruning pairs (each ablation), its selection
    for task, pairs, ident, _, pool, pool_outputs, items, _ in ops:
        correct.append(_correct_by_kind(lm, items, pool, pool_outputs, masks, seed=seed, batch=batch))
        select, select_items = _selection_items(pool, pairs, ident, discover, seed, task)
        if select is None:
            on_select.append(correct[-1][kind])
        else:
            on_select.append(tf.TailTrials(lm, select_items, tf.ablation_values(
                lm, select_items, pool, kind, seed=seed, batch_size=batch, pool_outputs=pool_outputs),
                batch_size=batch).scores(masks)["correct"])
        selected.append(len(ident if select is None else select))
    on_ident = np.concatenate(on_select, 1).mean(1)  # teacher-forced full answers on every operator's selection
    fitted = _fitted({k: np.concatenate([c[k] for c in correct], 1) for k in protocol.KINDS})
    table = _circuits_table(SHARED, targets, f"tf_{kind}_{discover['tf_measure']}", pruned, found, len(nodes),
                            on_ident, fitted, seconds=seconds, n_identification=pooled.n_items,
                            n_selection=sum(selected))
    chosen, reached = choose_target(table, discover["min_full_share"])
    if not reached:
        warnings.warn(f"no target's shared circuit keeps {discover['min_full_share']:.0%} of the full model's "
                      f"full-answer accuracy on the operators' selection pairs (circuit.discover.min_full_share): "
                      f"taking the largest target, {chosen}", stacklevel=2)
    table["chosen"] = table["target"] == chosen
    table["share_reached"] = reached

    # validation: every target's circuit, the chosen one's random circuits and the CPR rows, per operator and pooled
    best = found[targets.index(chosen)]
    sets = base + found + _random_sets(list(best.heads), best.mlp_layers, n_layers=lm.n_layers, n_heads=lm.n_heads,
                                       draws=discover["random_draws"], seed=seed, label="discovered")
    set_targets = [np.nan, np.nan, *targets] + [chosen] * (len(sets) - len(base) - len(found))
    shares = tf.share_circuits(ranking)
    sets += [CircuitSet("share", "share", int(m.sum()), -1,
                        tuple(n for n, k in zip(nodes, m) if k and n[1] != MLP),
                        tuple(n[0] for n, k in zip(nodes, m) if k and n[1] == MLP)) for m in shares]
    set_targets += [np.nan] * len(shares)
    boot = {"n_boot": discover["bootstrap"], "seed": seed, "confidence": discover["confidence"]}
    blocks, all_items = [], []
    for task, _, _, val, pool, pool_outputs, _, _ in ops:
        val = subsample(val, protocol.operator_share(discover["validation_samples"], tasks), seed)
        scored, per_item = tf.teacher_forced_table(
            lm, val, pool, sets, pool_outputs=pool_outputs, sanity_draws=discover["sanity_draws"], strict=False,
            batch_size=batch, sanity=False, **boot)
        blocks.append(scored.assign(task=task))
        all_items.append(_shared_items(per_item, sets, set_targets, pair_labels(val), task))
    items = pd.concat(all_items, ignore_index=True)
    columns = [c for c in items if c.startswith("tf_")]
    wide, clusters = protocol.pooled_values(items, len(sets), {c: c for c in columns}, groups=tasks)
    blocks.append(protocol.faithfulness_table(sets, wide, clusters, **boot).assign(
        task=SHARED, tf_n_items=len(clusters)))
    validation = pd.concat(blocks, ignore_index=True).assign(
        target=np.tile(set_targets, len(blocks)), chosen=lambda v: v["target"] == chosen,
        node_share=np.tile([np.nan] * (len(sets) - len(shares)) + list(tf.SHARES), len(blocks)))

    mine = validation[validation["task"] == SHARED]
    circuit = mine[(mine["curve"] == "discovered") & mine["chosen"]]
    flag = order_flag(SHARED, mine, circuit, [f"shared circuit at target {chosen:g}"])
    if flag:
        warnings.warn(f"the CPR curve's ranking is beaten by a scored circuit: {flag}", stacklevel=2)
    scored_items = items[items["curve"].isin(["model", "empty", "random"])
                         | ((items["curve"] == "discovered") & (items["target"] == chosen))]
    row = {"task": SHARED, "target": chosen, "chosen": True, "pruned_on": table["pruned_on"].iloc[0],
           "n_heads": len(best.heads), "n_mlps": len(best.mlp_layers),
           "share": (len(best.heads) + len(best.mlp_layers)) / len(nodes), "n_items": len(clusters),
           "draws": len(sets) - len(base) - len(found) - len(shares)} | _tf_summary(scored_items, boot)
    row |= _gap(row, {k: v[targets.index(chosen)] for k, v in fitted.items()}) | {
        "smallest_target_validation": np.nan, "share_reached": reached, "cpr_order_flag": flag}

    meta = stage_meta(model_dir, "discover_shared", tasks=tasks, discover=discover, seed=seed, chosen=chosen,
                      seconds=seconds)
    write_parquet(table, out_table, meta)
    write_parquet(validation, out_validation, meta)
    write_parquet(items, out_items, meta)
    write_parquet(pd.DataFrame([row]), out_summary, meta)
