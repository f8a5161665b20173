"""The precise-SFT study: does training only the key heads improve arithmetic as much as training more,
and does it keep what the model knew? (Zhang et al., ICML 2024, stage 4, on a target the model can move on.)

Data. Arithmetic items in named formats (`study.formats`: a task, a template, an operator word and operand
ranges), built with the workflow's prompt machinery (`arithmetic.render`, `arithmetic.split_answer`). Every item
is one operand pair; pairs are split without overlap:
  identify    the pairs the identify stage used for that task (results/{model}/pairs/{task}.parquet): never
              trained on or scored here;
  train, validation, test   of the trained format (`study.train_format`), disjoint, seeded sizes;
  test        of every other format (transfer), also disjoint from the trained format's train and
              validation pairs of the same task.

The trained format. `study.train_format` names one (a key of `study.formats` or of
`study.format_choice.candidates`; rule study_format measures it), or is `auto`: rule study_format measures
the base model's greedy exact match on every candidate (`choose_format`) and the study trains the candidate
inside `study.base_band` closest to the band's middle.
A candidate is measured on the first `format_choice.items` pairs of the validation split it would have if it
were trained, with the same few-shot prefix (`measurement_items`): the measured items are then exactly
validation items of the chosen format, and its test split is never looked at before the models are scored.

All prompts of a format share one fixed few-shot prefix (`study.n_shots` solved pairs that are in no test
split), so the shared prefix runs once. An item's target is the answer and the separator's end ("68."):
its greedy exact match is `scoring.score_targets`' greedy_match.

Arms (`study.arms`: names of `sft.methods.METHODS`, whose heads `sft.methods.select_nodes` selects): precise
(the top `study.heads` heads by patching effect averaged over the tasks: the W_Q rows and W_O columns, with
`study.kv: shared` also the K/V rows of their key/value heads), precise_mlp (the same plus the top
`study.mlps` MLP layers), circuit (as many heads, trained as precise, from the union over the operators of the
circuits the discover rule chose, ranked as precise ranks all heads: `interp.nodes.circuit_first`),
random_heads (as many heads, drawn LAYER-MATCHED: the same number in each layer as the key heads, never a key
head; `study.random_draws` draws, so the same parameter count), uniform_heads (as many heads drawn uniformly
among the others, as many draws), full and lora. Every arm's lr is chosen on the
validation split from its own grid (`study.lr_grid`), the same number of steps for all; the chosen lr is
then trained with more seeds.

The circuit arms and their controls. circuit_disjoint trains the discovered circuits' heads that are not key
heads (not among precise's top `study.heads`), strongest first, at most as many as precise: where the circuit
arm shares most of its heads with precise (both take the top of rankings that largely coincide), this arm asks
whether the heads the circuit adds matter. low_effect is the negative control: as many heads as precise, in the
key heads' layers (as random_heads), each the head of its layer with the smallest patching effect on every
operator (`weakest_heads`). "precise beats low_effect" is the study's positive control: a study that cannot
separate the key heads from the weakest heads cannot show that the circuit's heads are no better than the key
heads (`report.claims.sft_circuit_vs_precise`). Every head arm records its heads' overlap with precise's
(`head_overlap`), in its run's stats.json and in study.parquet.

The operand range. The heads and the circuits were found on the identify stage's operand pairs
(`prompts.operands`, one digit by default); the study trains another range, and says so
(`operand_range_note`): the study leaves the identify stage's pairs out, so that no head was chosen on a study
item, and one-digit operands have too few pairs for the splits.

Runs (results/{model}/finetune/study/runs/{arm}/{run}): `lr{i}` is grid point i with seed 0 (draw 0);
`seed{s}` is seed s at the chosen lr; `draw{d}` is random-head draw d (seed 0) at the chosen lr (the arms
of `sft.methods.DRAWN_METHODS`). The models scored on the test sets are the chosen grid run (`chosen`), the
seeds and the draws.

This module is pure pandas/numpy (no torch): the summary rules import it cheaply. What the Snakefile reads
(formats, run names, the recorded choice) is in `sft.study_config`, standard library only at import."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from arithmech import stats
from arithmech.sft.methods import METHODS, STUDY_METHODS, select_nodes
from arithmech.sft.study_config import AUTO, Format, parse_formats, parse_run

SPLITS = ("train", "validation", "test")
# Arm pairs compared on every metric (a - b): the study's questions.
COMPARISONS = (
    ("precise", "random_heads"),  # are the key heads special, at the same parameter count and layers?
    ("precise", "uniform_heads"),  # ... at the same parameter count, anywhere in the model?
    ("precise", "full"),  # does training 1% of the model match training all of it?
    ("precise", "lora"),
    ("precise_mlp", "precise"),  # do the key MLPs add anything?
    ("circuit", "precise"),  # is the discovered circuit a better place to train than the key heads?
    ("circuit_disjoint", "precise"),  # ... do the circuit's heads outside the key heads matter?
    ("precise", "low_effect"),  # the positive control: does the study separate the key heads from the weakest?
    ("circuit", "low_effect"),
    ("circuit_disjoint", "low_effect"),
    ("circuit", "random_heads"),
    ("circuit", "full"),
    ("precise", "base"),  # does precise SFT help at all?
    ("full", "base"),
    ("random_heads", "base"),
    ("uniform_heads", "base"),
    ("lora", "base"),
    ("precise_mlp", "base"),
    ("circuit", "base"),
    ("circuit_disjoint", "base"),
    ("low_effect", "base"),
)


def answer(task: str, a: int, b: int) -> int:
    return {"addition": a + b, "subtraction": a - b, "multiplication": a * b, "division": a // b}[task]


def _draw(pool: list, n: int, rng: np.random.Generator) -> list:
    return [pool[i] for i in rng.permutation(len(pool))[:n]]


def needed_pairs(study: dict) -> int:
    """Operand pairs the trained format needs: its three splits and the few-shot pairs."""
    return sum(study["splits"][s] for s in SPLITS) + study["n_shots"]


def format_pool(fmt: Format, identify_pairs: dict[str, set]) -> list[tuple[int, int]]:
    """The format's operand pairs without those the identify stage used for its task, in a fixed order."""
    used = identify_pairs.get(fmt.task, set())
    return [p for p in fmt.pairs() if p not in used]


def trained_draw(fmt: Format, pool: list, study: dict, seed: int) -> tuple[list, list[str], list]:
    """(pairs, their splits, the few-shot pairs) of the trained format: a seeded draw from `pool`
    (`format_pool`), train first, then validation, then test; the shots are the first train pairs."""
    sizes = study["splits"]
    need = sizes["train"] + sizes["validation"] + sizes["test"]
    if len(pool) < need + study["n_shots"]:
        raise ValueError(f"config key 'study.splits': format {fmt.name!r} has {len(pool)} operand pairs left "
                         f"after removing the identify stage's, fewer than the {need} asked for plus "
                         f"{study['n_shots']} shots")
    drawn = _draw(pool, need, np.random.default_rng([seed, 7, 0]))
    split_of = ["train"] * sizes["train"] + ["validation"] * sizes["validation"] + ["test"] * sizes["test"]
    shots = drawn[: min(study["n_shots"], sizes["train"])]
    return drawn, split_of, shots


def _item_rows(tokenizer, fmt: Format, pairs: list, splits: list[str], shots: list, separator: str) -> list[dict]:
    """One item per operand pair: the few-shot prefix of `shots`, the question, cut where the answer starts."""
    end = separator.rstrip("\n") or separator
    prefix = "".join(fmt.line(a, b) + str(answer(fmt.task, a, b)) + separator for a, b in shots)
    rows = []
    for (a, b), split in zip(pairs, splits):
        gold = answer(fmt.task, a, b)
        prompt = _prompt(tokenizer, prefix + fmt.line(a, b), str(gold))
        full = prefix + fmt.line(a, b) + str(gold) + end
        rows.append({"format": fmt.name, "task": fmt.task, "split": split, "a": a, "b": b,
                     "pair": f"{fmt.task}:{a}:{b}", "answer": gold, "prompt": prompt,
                     "target": full[len(prompt):], "shots": json.dumps(shots)})
    return rows


def build_items(tokenizer, study: dict, identify_pairs: dict[str, set], separator: str, seed: int) -> pd.DataFrame:
    """Every study item (module docstring). `identify_pairs`: task -> {(a, b)} used by the identify stage.

    Columns: format, task, split, a, b, pair ("task:a:b", the cluster for intervals), answer, prompt (ends
    where the answer starts), target (the rest of the line: "68."), shots (the few-shot pairs, JSON)."""
    formats = parse_formats(study)
    trained = formats[study["train_format"]]
    rows = []
    taken: set[tuple[str, int, int]] = set()  # the trained format's train + validation pairs
    order = [trained] + [f for f in formats.values() if f is not trained]
    for k, fmt in enumerate(order):
        if fmt is trained:
            drawn, split_of, shots = trained_draw(fmt, format_pool(fmt, identify_pairs), study, seed)
            taken |= {(fmt.task, a, b) for (a, b), s in zip(drawn, split_of) if s != "test"}
        else:
            rng = np.random.default_rng([seed, 7, k])
            pool = [p for p in format_pool(fmt, identify_pairs) if (fmt.task, *p) not in taken]
            rest = _draw(pool, len(pool), rng)
            shots, tests = rest[: study["n_shots"]], rest[study["n_shots"] : study["n_shots"] + study["transfer_test"]]
            if not tests:
                raise ValueError(f"config key 'study.formats.{fmt.name}': no operand pair is left for its test set")
            drawn, split_of = tests, ["test"] * len(tests)
        rows += _item_rows(tokenizer, fmt, drawn, split_of, shots, separator)
    return pd.DataFrame(rows)


def trained_format(items: pd.DataFrame) -> str:
    """The name of the format the items train on (the one format with a train split)."""
    names = items.loc[items["split"] == "train", "format"].unique()
    if len(names) != 1:
        raise ValueError(f"study items: expected one format with a train split, found {list(names)}")
    return str(names[0])


# ---------------------------------------------------------------------------------------------------
# Choosing the trained format (rule study_format)


def measurement_items(tokenizer, fmt: Format, identify_pairs: dict[str, set], study: dict, separator: str,
                      seed: int) -> pd.DataFrame | None:
    """The items rule study_format scores for `fmt`: the first `study.format_choice.items` pairs of the
    validation split `build_items` draws when `fmt` is trained, with the same few-shot prefix, so that the
    measured items of the chosen format are its own validation items (never its test items). None when the
    format has too few operand pairs for `study.splits` (it cannot be trained)."""
    pool = format_pool(fmt, identify_pairs)
    if len(pool) < needed_pairs(study):
        return None
    drawn, split_of, shots = trained_draw(fmt, pool, study, seed)
    validation = [p for p, s in zip(drawn, split_of) if s == "validation"][: study["format_choice"]["items"]]
    return pd.DataFrame(_item_rows(tokenizer, fmt, validation, ["validation"] * len(validation), shots, separator))


def _band_side(value: float, low: float, high: float) -> str:
    return "below" if value < low else "above" if value > high else "inside"


def _share(x: float) -> str:
    return f"{100 * x:.1f}%"


def choose_format(measured: pd.DataFrame, band, train_format: str) -> tuple[pd.DataFrame, dict]:
    """The trained format from the base model's measured exact match on each format.

    `measured`: one row per measured format in the config's order, with columns format, eligible (enough
    operand pairs for the study's splits), n and exact_match (NaN where not measured). With `train_format:
    auto` the choice is the eligible format whose exact match lies inside `band` (inclusive) closest to the
    band's middle; a tie goes to the format listed first. With none inside, nothing is chosen and the nearest
    eligible formats below and above the band are named. A named `train_format` is chosen whatever its value.

    Returns (the table with columns in_band, distance (to the band's middle), chosen, nearest and reason
    added; the choice: {"train_format", "chosen" (None when none), "band", "reason", "nearest"}).
    """
    low, high = (float(x) for x in band)
    middle = (low + high) / 2
    table = measured.reset_index(drop=True).copy()
    value = table["exact_match"].astype(float)
    measured_ok = table["eligible"].astype(bool) & value.notna()
    table["in_band"] = measured_ok & value.between(low, high)
    # rounded so that shares equally far from the middle (0.35 and 0.45 around 0.4) tie exactly
    table["distance"] = (value - middle).abs().round(9)
    table["chosen"] = False
    table["nearest"] = False
    auto = train_format == AUTO
    nearest: list[dict] = []
    if auto:
        inside = table[table["in_band"]].sort_values("distance", kind="stable")
        chosen = None if inside.empty else str(inside["format"].iloc[0])
        if chosen is None:
            for side, part, gap in (("below", table[measured_ok & (value < low)], low - value),
                                    ("above", table[measured_ok & (value > high)], value - high)):
                if len(part):
                    i = gap[part.index].sort_values(kind="stable").index[0]
                    table.loc[i, "nearest"] = True
                    nearest.append({"format": str(table.loc[i, "format"]), "exact_match": float(value[i]),
                                    "side": side})
    else:
        if train_format not in set(table["format"]):
            raise ValueError(f"choose_format: the named format {train_format!r} was not measured")
        chosen = train_format
    reasons = []
    for i, r in table.iterrows():
        name = r["format"]
        if not r["eligible"]:
            text = r.get("reason") or "too few operand pairs for study.splits"
        elif name == chosen and not auto:
            text = f"named by study.train_format; {_band_side(value[i], low, high)} the band"
        elif name == chosen:
            text = f"chosen: inside the band, closest to its middle ({middle:g})"
        elif r["in_band"]:
            ahead = table.loc[table["format"] == chosen].iloc[0] if chosen is not None else None
            tie = ahead is not None and ahead["distance"] == r["distance"]
            text = (f"inside the band, {r['distance']:.3f} from its middle"
                    + ("" if not auto else f"; {chosen} is as close and listed first" if tie
                       else f"; {chosen} is closer"))
        else:
            side = _band_side(value[i], low, high)
            text = f"{side} the band: " + ("too hard for the base model" if side == "below" else
                                           "too easy for the base model")
            if r["nearest"]:
                text += f"; the nearest {side} it"
        reasons.append(text)
    table["reason"] = reasons
    if chosen is not None:
        table.loc[table["format"] == chosen, "chosen"] = True
    n = int(table.loc[measured_ok, "n"].max()) if measured_ok.any() else 0
    if chosen is not None:
        row = table[table["chosen"]].iloc[0]
        how = ("named by study.train_format" if not auto
               else f"inside study.base_band [{low:g}, {high:g}], closest to its middle")
        if not row["eligible"]:
            reason = f"{chosen}: {how}; {row['reason']}"
        else:
            reason = f"{chosen}: base exact match {_share(row['exact_match'])} on {int(row['n'])} items, {how}"
        if not auto and row["eligible"] and not row["in_band"]:
            reason += f" (outside study.base_band [{low:g}, {high:g}])"
    elif not measured_ok.any():
        reason = ("no candidate format has enough operand pairs for study.splits and study.n_shots: give the "
                  "candidates wider operand ranges or the study smaller splits")
    else:
        near = ", ".join(f"{x['format']} {_share(x['exact_match'])} ({x['side']})" for x in nearest)
        reason = (f"no candidate format's base exact match lies inside study.base_band [{low:g}, {high:g}] "
                  f"({n} items each); nearest: {near}. Widen study.base_band, add candidates to "
                  f"study.format_choice.candidates, or name a format in study.train_format")
    choice = {"train_format": train_format, "chosen": chosen, "band": [low, high], "reason": reason,
              "nearest": nearest}
    return table, choice


def _prompt(tokenizer, text: str, answer_text: str) -> str:
    """The prompt cut so that the next token starts the answer (`arithmetic.split_answer`)."""
    from arithmech.data.arithmetic import split_answer

    prompt, _ = split_answer(tokenizer, text, answer_text)
    return prompt


def format_summary(items: pd.DataFrame) -> pd.DataFrame:
    """Items and distinct operand pairs per format and split."""
    return (items.groupby(["format", "task", "split"], sort=False)
            .agg(items=("pair", "size"), pairs=("pair", "nunique")).reset_index())


# ---------------------------------------------------------------------------------------------------
# Arms


def arm_method(arm: str, run: str, study: dict, *, ranked_heads: list, ranked_mlps: list, n_layers: int,
               n_heads: int, seed: int, circuit_heads=(), weakest_heads=()) -> dict:
    """The `sft.methods.parse_method` dict of one run of `arm` (ranked_*: nodes by patching effect, best first;
    the heads and MLPs from `sft.methods.select_nodes`; circuit_heads: the discovered circuits' heads, for
    circuit_disjoint (`discovered_union`); weakest_heads: every head weakest first, for low_effect
    (`weakest_heads`)). Every grid and seed run trains draw 0."""
    if arm not in METHODS:
        raise ValueError(f"study arm {arm!r}: expected one of {list(METHODS)}")
    kind, index = parse_run(run)
    if arm in ("full", "lora"):
        return {"method": arm, **({"lora": study["lora"]} if arm == "lora" else {})}
    heads, mlps = select_nodes(arm, ranked_heads, ranked_mlps, heads=study["heads"],
                               mlps=study["mlps"] if arm == "precise_mlp" else 0,  # the precise arm: heads alone
                               n_layers=n_layers, n_heads=n_heads, seed=seed, draw=index if kind == "draw" else 0,
                               section="study", circuit=circuit_heads, weakest=weakest_heads)
    # the study's own head arms train as precise does (their MLP layers or heads make the difference)
    return {"method": "precise" if arm in STUDY_METHODS else arm, "heads": [list(h) for h in heads],
            "mlp_layers": mlps, "train_kv": study["kv"] == "shared"}


def head_overlap(heads, key_heads) -> dict:
    """How much of a head set the precise arm trains too: {n_heads, overlap_precise (heads in both),
    jaccard_precise (|both| / |either|)}; `key_heads`: precise's heads (the top `study.heads` by effect)."""
    mine, key = {tuple(map(int, h)) for h in heads}, {tuple(map(int, h)) for h in key_heads}
    either = len(mine | key)
    return {"n_heads": len(mine), "overlap_precise": len(mine & key),
            "jaccard_precise": len(mine & key) / either if either else float("nan")}


def weakest_heads(effects: dict[str, pd.DataFrame]) -> list:
    """Every head, weakest first: ordered by its largest |patching effect| over the operators (`effects`: task ->
    its effects table), so a head counts as weak only if it is weak for every operator (a head strong in opposite
    directions on two operators would average to nothing). Ties keep the effect ranking's order. The low_effect
    arm's heads come from the front of this list."""
    from arithmech.interp.nodes import rank_across_tasks

    table = rank_across_tasks(effects, "head")
    size = table[[c for c in table.columns if c.startswith("effect_")]].abs().max(axis=1)
    order = size.sort_values(kind="stable").index
    return [(int(table.loc[i, "layer"]), int(table.loc[i, "head"])) for i in order]


def discovered_union(discovered: dict[str, pd.DataFrame]) -> set:
    """The heads of the union over operators of the circuit the discover rule chose for each (`discovered`: task
    -> its table, one row per target with `chosen` and `nodes`)."""
    from arithmech.interp.nodes import parse_nodes

    union: set = set()
    for task, table in discovered.items():
        chosen = table[table["chosen"].astype(bool)]
        if len(chosen) != 1:
            raise ValueError(f"the discover table of {task!r} marks {len(chosen)} circuits as chosen; expected one")
        union |= set(parse_nodes(chosen["nodes"].iloc[0])[0])
    return union


def circuit_disjoint_note(ranked_heads: list, union: set, n: int) -> str | None:
    """What the circuit_disjoint arm says when the discovered circuits have fewer than `n` heads outside the top
    `n` (the key heads): it trains those it has, not filled up (a fill would be heads of neither set)."""
    outside = len(set(map(tuple, union)) - {tuple(h) for h in ranked_heads[:n]})
    if outside >= n:
        return None
    return (f"the discovered circuits' union has {outside} heads outside the {n} key heads, fewer than study.heads = "
            f"{n}: the circuit_disjoint arm trains those {outside}")


def operand_range_note(trained: dict, operands: dict, study: dict) -> str:
    """Whether the study trains on the operand range the heads and circuits were found on (`operands`:
    prompts.operands, the identify stage's range), and why not when it does not. `trained`: the trained format's
    {name, task, a_range, b_range} (for division a_range is the quotient's, as prompts.operands reads it too)."""
    from arithmech.data.arithmetic import operand_pairs

    low, high = int(operands["min"]), int(operands["max"])
    (a0, a1), (b0, b1) = trained["a_range"], trained["b_range"]
    found = (f"The key heads and the discovered circuits were found on operands {low}-{high} (`prompts.operands`, the "
             f"identify stage's pairs); the study trains `{trained['name']}`, a in {a0}-{a1}, b in {b0}-{b1}")
    if a0 >= low and a1 <= high and b0 >= low and b1 <= high:
        return found + ", inside that range."
    pairs = len(operand_pairs(trained["task"], low, high))
    return (found + ". Not that range: the study leaves the identify stage's pairs out (no head was chosen on a "
            f"study item), and operands {low}-{high} give {pairs} {trained['task']} pairs in all, fewer than the "
            f"{needed_pairs(study)} the study's splits and few-shot prefix need. The study therefore asks whether "
            "the heads found on that range are the place to train arithmetic on the trained format's range.")


def circuit_ranking(ranked_heads: list, discovered: dict[str, pd.DataFrame], n: int) -> tuple[list, str | None]:
    """The circuit arm's head ranking: the heads of the union over operators of the circuit the discover rule
    chose for each (`discovered`: task -> its table, one row per target with `chosen` and `nodes`), ranked by
    patching effect as `ranked_heads` ranks all heads (`interp.nodes.circuit_first`), so that the arm's top `n`
    heads are the union's `n` strongest. Returns (ranking, a note when the union has fewer than `n` heads: the
    arm is then filled with the strongest heads outside it, and the note says how many)."""
    from arithmech.interp.nodes import circuit_first

    union = discovered_union(discovered)
    note = None
    if len(union) < n:
        note = (f"the discovered circuits' union has {len(union)} heads, fewer than study.heads = {n}: the circuit "
                f"arm trains them and the {n - len(union)} strongest heads outside it")
    return circuit_first(ranked_heads, union), note


def greedy_answer(text: str) -> str:
    """The answer a greedy continuation gives: its leading integer ("68" of "68.\n12 + 5"), else its first
    non-blank characters (what a model that stopped answering in numbers says), so two runs' answers compare."""
    match = re.match(r"\s*(-?\d+)", text)
    return match[1] if match else text.strip()[:8]


def _collapse_reasons(row: dict, collapse: dict) -> list[str]:
    """Why a grid run collapsed (empty: it did not), by `study.collapse`'s thresholds (config.yaml says why)."""
    reasons = []
    if row["val_distinct"] < collapse["distinct_ratio"] * row["base_distinct"]:
        reasons.append(f"{row['val_distinct']} distinct validation answers, fewer than {collapse['distinct_ratio']:g} "
                       f"x the base model's {row['base_distinct']}")
    if row["loss_max"] > collapse["loss_spike"] * row["loss_first"]:
        reasons.append(f"training loss {row['loss_max']:.3g} at step {row['loss_max_step']}, more than "
                       f"{collapse['loss_spike']:g} x its first step's {row['loss_first']:.3g}")
    return reasons


def select_lr(val_by_run: dict[str, pd.DataFrame], grid: list[float], losses_by_run: dict[str, list[float]],
              collapse: dict) -> dict:
    """An arm's lr: among its grid runs that did not collapse, the highest validation exact match; ties go to the
    lower mean answer NLL. A run collapsed (`_collapse_reasons`) when its greedy validation answers (`answer`)
    take fewer than `collapse.distinct_ratio` x as many distinct values as the base model's on the same items
    (`base_answer`, recorded by lr0), or its training loss (`losses_by_run`, one per step) rose above
    `collapse.loss_spike` x its first step's: a run that answers everything alike, or whose training diverged, is
    never chosen.

    Returns {"run", "lr", "chosen", "edge", "note", "grid": [one row per run: run, lr, val_accuracy, val_nll,
    val_n, val_distinct, base_distinct, loss_first, loss_max, loss_max_step, collapsed, collapse_reason]}.
    Every run collapsed: `chosen` is False, and `run`/`lr` name the best run by the same order (the workflow
    still trains and scores it; the study reports the arm as not measured, `note` says why). `edge`: "lower" or
    "upper" when the chosen lr is the grid's lowest or highest of several (the best may lie beyond), else ""."""
    table = []
    base_distinct = int(val_by_run["lr0"]["base_answer"].nunique())  # the grid's first run records the base model's
    for run, frame in val_by_run.items():
        _, i = parse_run(run)
        losses = [float(x) for x in losses_by_run[run]]
        worst = int(np.argmax(losses))
        row = {"run": run, "lr": grid[i], "val_accuracy": float(frame["correct"].mean()),
               "val_nll": float(frame["nll"].sum() / frame["n_tokens"].sum()), "val_n": len(frame),
               "val_distinct": int(frame["answer"].nunique()), "base_distinct": base_distinct,
               "loss_first": losses[0], "loss_max": losses[worst], "loss_max_step": worst + 1}
        reasons = _collapse_reasons(row, collapse)
        table.append(row | {"collapsed": bool(reasons), "collapse_reason": "; ".join(reasons)})
    order = sorted(table, key=lambda r: (r["collapsed"], -r["val_accuracy"], r["val_nll"]))
    best, chosen = order[0], not order[0]["collapsed"]
    edge, note = "", ""
    if not chosen:
        runs = "; ".join(f"lr {r['lr']:g}: {r['collapse_reason']}" for r in table)
        note = f"not measured: every learning rate of the grid collapsed ({runs})"
    elif len(set(grid)) > 1 and best["lr"] in (min(grid), max(grid)):
        edge = "lower" if best["lr"] == min(grid) else "upper"
        side = "below" if edge == "lower" else "above"
        note = f"lr {best['lr']:g} at the grid's {edge} edge: the best may lie {side}"
    collapsed = [r for r in table if r["collapsed"]]
    if chosen and collapsed:
        note = "; ".join(filter(None, [note, "collapsed, never chosen: "
                                       + ", ".join(f"lr {r['lr']:g}" for r in collapsed)]))
    return {"run": best["run"], "lr": best["lr"], "chosen": chosen, "edge": edge, "note": note, "grid": table}


SELECTION_COLUMNS = ("lr_grid", "lr_edge", "lr_collapsed", "lr_note", "measured")  # study.parquet, per arm


def selection_columns(selection: dict | None, grid: list[float] | None = None) -> dict:
    """What study.parquet says per row about its arm's lr choice (`select_lr`'s record; None: the base model):
    lr_grid (the grid's lrs), lr_edge ("lower"/"upper": the chosen lr is at that edge of the grid), lr_collapsed
    (the lrs whose runs collapsed), lr_note (`select_lr`'s note) and measured (False: every lr collapsed, the arm
    has no result)."""
    if selection is None:
        return {"lr_grid": "", "lr_edge": "", "lr_collapsed": "", "lr_note": "", "measured": True}
    rows = selection["grid"]
    return {"lr_grid": ", ".join(f"{r['lr']:g}" for r in rows), "lr_edge": selection["edge"],
            "lr_collapsed": ", ".join(f"{r['lr']:g}" for r in rows if r["collapsed"]), "lr_note": selection["note"],
            "measured": bool(selection["chosen"])}


def selection_table(selections: dict[str, dict]) -> pd.DataFrame:
    """Every grid run of every arm (`select_lr`'s records by arm): its validation scores, collapse check, and
    whether it is the arm's chosen run."""
    rows = [{"arm": arm, **r, "chosen": sel["chosen"] and r["run"] == sel["run"],
             "edge": sel["edge"] if sel["chosen"] and r["run"] == sel["run"] else ""}
            for arm, sel in selections.items() for r in sel["grid"]]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------
# Study table and comparisons


def per_item(evals: dict[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """All scored rows of every model: (arm, run) -> its eval frame, stacked with arm and run columns."""
    return pd.concat([f.assign(arm=arm, run=run) for (arm, run), f in evals.items()], ignore_index=True)


def model_rows(rows: pd.DataFrame, train_format: str, confidence: float, n_boot: int, seed: int) -> pd.DataFrame:
    """One row per scored model: exact match on every format's test set (intervals resample operand pairs),
    answer NLL per token on the trained format, off-target metrics (KL to base per token, perplexity, gold
    NLL per token on GSM8K and SVAMP solutions, non-math accuracies)."""
    out = []
    for (arm, run), frame in rows.groupby(["arm", "run"], sort=False):
        rec: dict = {"arm": arm, "run": run}
        for dataset, part in frame.groupby("dataset", sort=False):
            if part["kind"].iloc[0] == "arithmetic":
                est = stats.cluster_bootstrap(part["correct"].astype(float).to_numpy(), part["cluster"].to_numpy(),
                                              n_boot=n_boot, seed=seed, confidence=confidence)
                prefix = "accuracy" if dataset == train_format else f"transfer_{dataset}"
                rec |= {prefix: est["estimate"], f"{prefix}_low": est["ci_low"], f"{prefix}_high": est["ci_high"]}
                if dataset == train_format:
                    rec |= {"test_n": est["n_items"], "test_pairs": est["n_clusters"],
                            "answer_nll": float(part["nll"].sum() / part["n_tokens"].sum())}
            elif part["kind"].iloc[0] == "nll":
                rec[f"{dataset}_nll"] = float(part["nll"].sum() / part["n_tokens"].sum())
            elif part["kind"].iloc[0] == "choice":
                rec[dataset] = float(part["correct"].mean())
            elif part["kind"].iloc[0] == "divergence":
                n = part["n_tokens"].sum()
                rec |= {"kl_to_base": float(part["kl"].sum() / n), "perplexity": float(np.exp(part["nll"].sum() / n)),
                        "kl_tokens": int(n)}
        out.append(rec)
    return pd.DataFrame(out)


def _aligned(rows: pd.DataFrame, arm: str, dataset: str, value: str) -> pd.DataFrame:
    """Per item (cluster-labelled) value of `arm` on `dataset`, averaged over the arm's models (seeds, draws)."""
    part = rows[(rows["arm"] == arm) & (rows["dataset"] == dataset)]
    return part.groupby("item", sort=True).agg(value=(value, "mean"), cluster=("cluster", "first"),
                                                weight=("n_tokens", "first") if "n_tokens" in part else
                                                       ("item", "size"))


def comparisons(rows: pd.DataFrame, train_format: str, confidence: float, n_boot: int,
                seed: int) -> pd.DataFrame:
    """Arm against arm on the same items, for every metric (COMPARISONS that both arms of this run have).
    Exact match: difference of accuracy, McNemar's exact test when each arm is one model, else a paired
    bootstrap over operand pairs; per-token NLL and KL: paired bootstrap of the ratio estimates over items
    or windows. p_holm adjusts all p-values of the table together (one family) with Holm's method."""
    present = set(rows["arm"])
    out = []
    for a, b in COMPARISONS:
        if a not in present or b not in present:
            continue
        for dataset, part in rows[rows["arm"] == a].groupby("dataset", sort=False):
            kind = part["kind"].iloc[0]
            specs = {"arithmetic": [("correct", True,
                                     "accuracy" if dataset == train_format else f"transfer_{dataset}")],
                     "choice": [("correct", True, dataset)],
                     "nll": [("nll", False, f"{dataset}_nll")],
                     "divergence": [("kl", False, "kl_to_base"), ("nll", False, "wikitext_nll")]}[kind]
            if kind == "arithmetic" and dataset == train_format:
                specs.append(("nll", False, "answer_nll"))
            for value, binary, metric in specs:
                if metric == "kl_to_base" and "base" in (a, b):
                    continue  # the base model's KL to itself is 0 by definition
                xa, xb = _aligned(rows, a, dataset, value), _aligned(rows, b, dataset, value)
                joined = xa.merge(xb, left_index=True, right_index=True, suffixes=("", "_b"))
                weights = None if binary else joined["weight"].to_numpy(float)
                res = stats.compare(joined["value"].to_numpy(float), joined["value_b"].to_numpy(float),
                                    joined["cluster"].to_numpy(), binary=binary, weights=weights, n_boot=n_boot,
                                    seed=seed, confidence=confidence)
                out.append({"arm_a": a, "arm_b": b, "metric": metric, "dataset": dataset,
                            "n_models_a": rows[rows["arm"] == a]["run"].nunique(),
                            "n_models_b": rows[rows["arm"] == b]["run"].nunique(), **res})
    frame = pd.DataFrame(out)
    if len(frame):
        frame["p_holm"] = stats.holm(frame["p_value"].to_numpy(float))
    return frame


def curves(stats_by_run: dict[tuple[str, str], dict]) -> pd.DataFrame:
    """Learning curves: exact match on the validation split and on a fixed test subset at every evaluated
    step, per run (from the training jobs' `evaluations`)."""
    rows = []
    for (arm, run), record in stats_by_run.items():
        for point in record.get("evaluations", []):
            rows.append({"arm": arm, "run": run, **point})
    return pd.DataFrame(rows)


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


def trained_format_row(formats: pd.DataFrame, fmt: str) -> dict:
    """The trained format's name, task and operand ranges from formats.parquet (rule study_format always
    measures it): {name, task, a_range, b_range}."""
    row = formats[formats["format"] == fmt]
    if row.empty:
        raise ValueError(f"formats.parquet has no row for the trained format {fmt!r}: re-run rule study_format")
    r = row.iloc[0]
    low_a, high_a = (int(x) for x in str(r["a"]).split("-"))  # the ranges as the table writes them: "10-99"
    low_b, high_b = (int(x) for x in str(r["b"]).split("-"))
    return {"name": fmt, "task": str(r["task"]), "a_range": (low_a, high_a), "b_range": (low_b, high_b)}
