"""Rule entry points of the precise-SFT study (`arithmech.sft.design`): choose the trained format, build the
items, train one run, choose an arm's lr, score one model, summarise. Keyword-only, so a script cannot swap
two paths silently."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from arithmech.interp.nodes import ranked_nodes
from arithmech.io import atomic_path, config_hash, provenance, write_html_page, write_json, write_parquet
from arithmech.model.loading import load_stage_model, model_record, stage_meta
from arithmech.report.tables import (
    HEAD_SET_COLUMNS,
    format_display,
    format_markdown,
    head_sets_markdown,
    precision_markdown,
    selection_markdown,
    study_markdown,
)
from arithmech.sft import design as sd
from arithmech.sft import study_config
from arithmech.sft.runs import load_finetuned, train_and_save
from arithmech.sft.scoring import off_target_rows

VAL_FILE = "val.parquet"


def _identify_pairs(pairs_paths: dict) -> dict[str, set]:
    return {task: set(zip(*(pd.read_parquet(p)[c].astype(int) for c in ("a", "b"))))
            for task, p in pairs_paths.items()}


FORMAT_COLUMNS = ["format", "task", "template", "operator", "a", "b", "pairs", "eligible", "n", "correct",
                  "exact_match", "ci_low", "ci_high", "in_band", "distance", "chosen", "nearest", "reason"]


def run_study_format(*, model_dir, pairs_paths: dict, study: dict, prompts: dict, compute: dict, seed: int,
                     out_table) -> None:
    """Measure the base model's greedy exact match on every candidate format (`study.train_format: auto`)
    or on the named format, and choose the trained format (`design.choose_format`).
    formats.parquet: one row per measured format (FORMAT_COLUMNS; `a` and `b` the operand ranges as text,
    `pairs` the operand pairs left after the identify stage's, the Wilson interval at `study.confidence`);
    the choice is in its metadata under `choice`, in formats.choice.json beside it (`study_config.read_choice`, which
    the workflow reads while it plans) and in the log."""
    import time

    import torch

    from arithmech.stats import accuracy_interval

    start = time.perf_counter()
    identify = _identify_pairs(pairs_paths)
    lm = load_stage_model(model_dir, compute)
    need = sd.needed_pairs(study)
    rows = []
    for name, fmt in study_config.measured_formats(study).items():
        items = sd.measurement_items(lm.tokenizer, fmt, identify, study, prompts["shot_separator"], seed)
        pool = len(sd.format_pool(fmt, identify))
        row = {"format": name, "task": fmt.task, "template": fmt.template, "operator": fmt.operator,
               "a": f"{fmt.a_range[0]}-{fmt.a_range[1]}", "b": f"{fmt.b_range[0]}-{fmt.b_range[1]}", "pairs": pool,
               "eligible": items is not None, "n": 0, "correct": 0, "exact_match": np.nan, "ci_low": np.nan,
               "ci_high": np.nan, "reason": ""}
        if items is None:
            row["reason"] = (f"not measured: too few operand pairs ({pool} left after the identify stage's, "
                             f"{need} needed by study.splits and study.n_shots)")
        else:
            with torch.no_grad():
                correct = _score(lm, items, compute["batch_size"])["correct"].to_numpy(bool)
            est, low, high = accuracy_interval(correct, study["confidence"])
            row |= {"n": len(correct), "correct": int(correct.sum()), "exact_match": est, "ci_low": low,
                    "ci_high": high}
        rows.append(row)
        print(f"{name}: " + ("not measured (too few operand pairs)" if items is None else
                             f"exact match {row['exact_match']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}] "
                             f"on {row['n']} items"), flush=True)
    table, choice = sd.choose_format(pd.DataFrame(rows), study["base_band"], study["train_format"])
    table = table[FORMAT_COLUMNS]
    seconds = time.perf_counter() - start
    print(table.drop(columns=["template"]).to_string(index=False))
    print(("Chose " if choice["chosen"] else "No format chosen: ") + choice["reason"]
          + f" ({seconds:.1f} s)")
    meta = stage_meta(model_dir, "study_format", study=study, seed=seed)
    meta["choice"] = choice
    write_parquet(table, out_table, meta)
    write_json(choice, study_config.choice_path(out_table))


def run_study_items(*, model_dir, pairs_paths: dict, study: dict, prompts: dict, seed: int, out_items) -> None:
    """All study items (train/validation/test of the trained format, test of the others), the identify
    stage's operand pairs left out. `study.train_format` is the format's name (an `auto` choice resolved)."""
    from arithmech.model.loading import LoadedModel, resolve_model_dir

    if study["train_format"] in (None, study_config.AUTO):
        raise ValueError("study_items: no trained format was chosen (rule study_format found none inside "
                         "study.base_band; see results/{model}/finetune/study/formats.parquet)")
    identify = _identify_pairs(pairs_paths)
    tokenizer = LoadedModel.load_tokenizer(resolve_model_dir(model_dir))
    items = sd.build_items(tokenizer, study, identify, prompts["shot_separator"], seed)
    summary = sd.format_summary(items)
    print(summary.to_string(index=False))
    used = {k: study[k] for k in ("formats", "train_format", "splits", "transfer_test", "n_shots")}
    meta = stage_meta(model_dir, "study_items", study=used, seed=seed,
                      identify_pairs={t: len(p) for t, p in identify.items()}, summary=summary.to_dict("records"))
    write_parquet(items, out_items, meta)


def _score(lm, items: pd.DataFrame, batch_size: int, progress=None) -> pd.DataFrame:
    """Greedy exact match (teacher-forced, `scoring.score_targets`) and answer NLL per item."""
    from arithmech.sft.scoring import score_targets

    scores = score_targets(lm, items["prompt"].tolist(), items["target"].tolist(), batch_size, progress)
    return pd.DataFrame({"item": items["pair"].to_numpy(), "cluster": items["pair"].to_numpy(),
                         "correct": scores["greedy_match"].to_numpy(), "nll": scores["nll"].to_numpy(),
                         "n_tokens": scores["n_tokens"].to_numpy()})


def _answers(lm, items: pd.DataFrame, batch_size: int) -> np.ndarray:
    """Each item's greedy answer (`design.greedy_answer` of a continuation as many tokens long as the longest
    target), for the collapse check of the lr choice (`design.select_lr`)."""
    from arithmech.intervention.generation import generate_texts

    n = max(len(lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in items["target"])
    texts = generate_texts(lm, items["prompt"].tolist(), n, batch_size, progress=None)
    return np.array([sd.greedy_answer(t) for t in texts], dtype=object)


def run_lr(run: str, study: dict, arm: str, selection_path) -> float:
    kind, index = study_config.parse_run(run)
    if kind == "lr":
        return float(study["lr_grid"][arm][index])
    return float(sd.read_json(selection_path)["lr"])


def run_seed(run: str, seed: int) -> int:
    kind, index = study_config.parse_run(run)
    return seed + index if kind == "seed" else seed


def run_study_train(*, model_dir, items_path, effects_paths: dict, arm: str, run: str, study: dict, compute: dict,
                    seed: int, selection_path, out_dir, checkpoint_root, discover_paths: dict | None = None) -> None:
    """Train one run (module docstring of `arithmech.sft.design`) and save what was trained, `stats.json`
    (with the learning-curve points and, for a head arm, its heads' overlap with precise's: `design.head_overlap`)
    and the final validation scores (`val.parquet`). A killed job resumes from
    `checkpoint_root/<arm>-<run>-<hash of the settings>`. The circuit arms read the discover rule's tables
    (`discover_paths`, task -> results/{model}/discover/{task}.parquet)."""
    import torch

    from arithmech.sft.methods import HEAD_METHODS, parse_method

    lm = load_stage_model(model_dir, compute)
    items = pd.read_parquet(items_path)
    fmt = items[items["format"] == sd.trained_format(items)]
    train_items, val = fmt[fmt["split"] == "train"], fmt[fmt["split"] == "validation"]
    curve_test = fmt[fmt["split"] == "test"].head(study["curve"]["test_items"])
    effects = {t: pd.read_parquet(p) for t, p in effects_paths.items()} if arm in HEAD_METHODS else {}
    by_effect, mlps = ranked_nodes(effects) if effects else ([], [])
    heads, union, circuit_note = by_effect, set(), None
    if arm in ("circuit", "circuit_disjoint"):
        if not discover_paths:
            raise ValueError(f"study arm {arm!r} needs the discover rule's tables (results/{{model}}/discover/{{task}}"
                             ".parquet); none was given")
        discovered = {t: pd.read_parquet(p) for t, p in discover_paths.items()}
        union = sd.discovered_union(discovered)
        if arm == "circuit":
            heads, circuit_note = sd.circuit_ranking(by_effect, discovered, study["heads"])
        else:
            circuit_note = sd.circuit_disjoint_note(by_effect, union, study["heads"])
        if circuit_note:
            warnings.warn(circuit_note, stacklevel=2)
    spec = sd.arm_method(arm, run, study, ranked_heads=heads, ranked_mlps=mlps, n_layers=lm.n_layers,
                         n_heads=lm.n_heads, seed=seed, circuit_heads=union,
                         weakest_heads=sd.weakest_heads(effects) if arm == "low_effect" else ())
    parse_method(spec)
    # how much of this arm's head set precise (the top study.heads by effect) trains too; none for full and lora
    head_sets = sd.head_overlap(spec["heads"], by_effect[: study["heads"]]) if "heads" in spec else {}
    lr = run_lr(run, study, arm, selection_path)
    train_cfg = {**study["train"], "lr": lr, "seed": run_seed(run, seed)}
    bs = compute["batch_size"]
    last_val: dict = {}

    def evaluate(step: int) -> dict:
        scored = _score(lm, val, bs)
        last_val[step] = scored
        test = _score(lm, curve_test, bs)
        return {"val_accuracy": float(scored["correct"].mean()), "test_accuracy": float(test["correct"].mean()),
                "val_nll": float(scored["nll"].sum() / scored["n_tokens"].sum()), "test_items": len(test)}

    # for the collapse check: a grid run's validation answers, and the base model's (before training) in the grid's
    # first run alone (every grid run has the same base model and items)
    grid_run = study_config.parse_run(run)[0] == "lr"
    with torch.no_grad():
        base_answers = _answers(lm, val, bs) if run == "lr0" else None

    def final_val(stats) -> dict[str, pd.DataFrame]:
        with torch.no_grad():
            scored = last_val.get(stats.steps)
            if scored is None:  # resumed after the last step: score again
                scored = _score(lm, val, bs)
            if grid_run:
                scored = scored.assign(answer=_answers(lm, val, bs))
        return {VAL_FILE: scored if base_answers is None else scored.assign(base_answer=base_answers)}

    settings = {"spec": spec, "train": train_cfg,
                "items": config_hash(fmt[["split", "prompt", "target"]].values.tolist()),
                "model": model_record(model_dir).get("sha256")}
    examples = list(zip(train_items["prompt"], train_items["target"]))
    stats, record, tables = train_and_save(
        lm, spec=spec, train_cfg=train_cfg, examples=examples, settings=settings, run_name=f"{arm}-{run}",
        checkpoint_root=checkpoint_root, out_dir=out_dir, model_dir=model_dir, stage="study_train",
        meta_params={"arm": arm, "run": run}, append_eos=False, evaluate=evaluate,
        evaluate_every=study["curve"]["every"], final_tables=final_val,
        record={"arm": arm, "run": run, "lr": lr, "seed": train_cfg["seed"], "n_examples": len(examples), "spec": spec,
                "train": train_cfg, **head_sets, **({"circuit_note": circuit_note} if circuit_note else {})},
    )
    print(f"{arm} {run}: lr {lr:g}, {stats.n_trainable} trained parameters, {record['mean_step_s']:.2f} s/step, "
          f"validation exact match {tables[VAL_FILE]['correct'].mean():.3f}")


def run_study_select(*, arm: str, study: dict, run_dirs: dict, out_path) -> None:
    """Choose `arm`'s lr: the grid run with the best validation exact match among those that did not collapse
    (`design.select_lr`, by `study.collapse`)."""
    from arithmech.sft.runs import STATS_FILE

    vals = {run: pd.read_parquet(Path(d) / VAL_FILE) for run, d in run_dirs.items()}
    losses = {run: sd.read_json(Path(d) / STATS_FILE)["losses"] for run, d in run_dirs.items()}
    choice = sd.select_lr(vals, list(study["lr_grid"][arm]), losses, study["collapse"])
    choice |= {"arm": arm, "criterion": "validation exact match, ties to the lower answer NLL, among the runs that "
                                        "did not collapse",
               "provenance": provenance(stage="study_select", arm=arm)}
    write_json(choice, out_path)
    print(pd.DataFrame(choice["grid"]).to_string(index=False))
    print(f"{arm}: " + (f"chose {choice['run']} (lr {choice['lr']:g})" if choice["chosen"] else "chose no lr")
          + (f"; {choice['note']}" if choice["note"] else ""))
    if choice["note"]:
        warnings.warn(f"study arm {arm}: {choice['note']}", stacklevel=2)


def chosen_dir(selection_path, grid_dirs: dict) -> Path:
    return Path(grid_dirs[sd.read_json(selection_path)["run"]])


def run_study_evaluate(*, model_dir, items_path, arm: str, run: str, run_dir, study: dict, data_paths: dict,
                       compute: dict, seed: int, out_path) -> None:
    """Score one model (base when run_dir is None) on every format's test items and the off-target sets
    (with `off_target.runs: chosen`, only the base model and each arm's chosen run get the off-target sets).
    Long format, one row per scored item or WikiText window: dataset, kind (arithmetic, nll, choice,
    divergence), item, cluster (the operand pair for arithmetic), correct, nll, n_tokens, kl, ref_nll."""
    import torch

    lm = load_finetuned(model_dir, run_dir, compute)
    base = None if run_dir is None else load_stage_model(model_dir, compute)
    items = pd.read_parquet(items_path)
    tests = items[items["split"] == "test"]
    bs = compute["batch_size"]
    frames = []
    with torch.no_grad():
        for fmt, part in tests.groupby("format", sort=False):
            scored = _score(lm, part, bs, progress=f"{arm} {run} {fmt}")
            frames.append(scored.assign(dataset=fmt, kind="arithmetic"))
            print(f"{arm} {run} {fmt}: exact match {scored['correct'].mean():.3f} on {len(scored)}")
        if study["off_target"]["runs"] == "all" or run in ("base", "chosen"):
            frames += off_target_rows(lm, base, study["off_target"], data_paths, seed=seed, batch_size=bs)
    rows = pd.concat(frames, ignore_index=True)
    rows["correct"] = rows["correct"].astype(float)  # NaN where a kind has no correctness
    meta = stage_meta(model_dir, "study_evaluate", arm=arm, run=run, off_target=study["off_target"], seed=seed)
    write_parquet(rows, out_path, meta)


STUDY_COLUMNS = ["arm", "run", "accuracy", "accuracy_low", "accuracy_high", "test_n"]
COMPARISON_COLUMNS = ["arm_a", "arm_b", "metric", "dataset", "difference", "ci_low", "ci_high", "p_value", "p_holm",
                      "test", "n_items"]


def run_study_summary(*, model: str, study: dict, formats_path, items_path, selection_paths: dict, eval_paths: dict,
                      stats_paths: dict, seed: int, out_study, out_comparisons, out_md, out_html, out_png,
                      out_curves, operands: dict | None = None) -> None:
    """study.parquet (one row per scored model), comparisons.parquet (arm against arm), the Markdown and
    HTML table, the accuracy figure and the learning curves. study.md also lists every head arm's overlap with
    precise (`head_sets_markdown`) and, given `operands` (prompts.operands, where the heads were found), whether
    the study trains on that operand range (`design.operand_range_note`). When rule study_format chose no format
    (`items_path` None), the same files say that the study could not run and why (`write_not_run`)."""
    from arithmech.report import plots

    formats, choice = pd.read_parquet(formats_path), study_config.read_choice(formats_path)
    if items_path is None:
        write_not_run(model=model, study=study, formats=formats, choice=choice, out_study=out_study,
                      out_comparisons=out_comparisons, out_md=out_md, out_html=out_html, out_png=out_png,
                      out_curves=out_curves)
        return
    selections = {arm: sd.read_json(p) for arm, p in selection_paths.items()}
    # an arm whose every lr collapsed has no result: its scored models are left out of every table and comparison
    unmeasured = [arm for arm, sel in selections.items() if not sel["chosen"]]
    rows = sd.per_item({key: pd.read_parquet(p) for key, p in eval_paths.items() if key[0] not in unmeasured})
    fmt = sd.trained_format(pd.read_parquet(items_path, columns=["format", "split"]))
    table = sd.model_rows(rows, fmt, study["confidence"], study["bootstrap"], seed)
    # the scored models' training records: `chosen` is the grid run its arm's selection names
    records = {(arm, run): sd.read_json(p) for (arm, run), p in stats_paths.items()}
    records |= {(arm, "chosen"): records[(arm, sel["run"])] for arm, sel in selections.items()}
    records = {key: rec for key, rec in records.items() if key in set(zip(rows["arm"], rows["run"]))}
    extra = []
    for arm, run in zip(table["arm"], table["run"]):
        rec = records.get((arm, run), {})
        sel = selections.get(arm, {})
        extra.append({"trained_run": sel.get("run") if run == "chosen" else (run if arm != "base" else ""),
                      "lr": rec.get("lr", np.nan), "seed": rec.get("seed", np.nan),
                      "draw": study_config.parse_run(run)[1] if run.startswith("draw") else 0,
                      "steps": rec.get("steps", 0), "trainable_params": rec.get("n_trainable", 0),
                      "mean_step_s": rec.get("mean_step_s", np.nan),
                      "train_time_s": float(np.sum(rec["step_times_s"])) if rec else np.nan,
                      "peak_memory_mb": rec["peak_memory_bytes"] / 2**20 if rec else np.nan,
                      "optimizer_state_mb": rec["optimizer_state_bytes"] / 2**20 if rec else np.nan,
                      "artifact_mb": rec["artifact_bytes"] / 2**20 if rec else np.nan,
                      "final_loss": rec["losses"][-1] if rec else np.nan,
                      "model_dtype": rec.get("model_dtype", ""), "master_dtype": rec.get("master_dtype", ""),
                      **{k: rec.get(k, np.nan) for k in HEAD_SET_COLUMNS},
                      **sd.selection_columns(selections.get(arm))})
    table = pd.concat([table, pd.DataFrame(extra)], axis=1)
    # the arms with no result keep one row that says why (`lr_note`), with no number
    table = pd.concat([table, pd.DataFrame([{"arm": arm, "run": "chosen", **sd.selection_columns(selections[arm])}
                                            for arm in unmeasured])], ignore_index=True) if unmeasured else table
    measured = table[table["measured"]]
    comp = sd.comparisons(rows, fmt, study["confidence"], study["bootstrap"], seed)
    grid = sd.selection_table(selections)
    curves = sd.curves(records)
    base_acc = (float(table.loc[table["arm"] == "base", "accuracy"].iloc[0]) if (table["arm"] == "base").any()
                else np.nan)
    low, high = study["base_band"]
    in_band = bool(low <= base_acc <= high)
    if not in_band:
        print(f"WARNING: the base model's exact match on the {fmt!r} test set is {base_acc:.3f}, outside "
              f"study.base_band [{low}, {high}]: choose another study.train_format")
    meta = provenance(stage="study_summary", model=model, ran=True, train_format=fmt, base_accuracy=base_acc,
                      base_in_band=in_band, format_choice=choice,
                      selections={a: {k: s[k] for k in ("run", "lr", "chosen", "edge", "note", "grid")}
                                  for a, s in selections.items()})
    write_parquet(table, out_study, meta)
    write_parquet(comp, out_comparisons, meta)
    range_note = sd.operand_range_note(sd.trained_format_row(formats, fmt), operands, study) if operands else ""
    with atomic_path(out_md) as tmp:
        Path(tmp).write_text(study_markdown(model, measured, comp, fmt, study["confidence"]) + "\n"
                             + selection_markdown(grid, study["collapse"]) + "\n"
                             + head_sets_markdown(measured, study) + "\n"
                             + (f"## Operand range\n\n{range_note}\n\n" if range_note else "")
                             + precision_markdown(measured) + "\n"
                             + format_markdown(format_display(formats), choice,
                                               auto=choice["train_format"] == study_config.AUTO))
    write_html_page([("Scored models", table, range_note),
                     ("Learning-rate grids", grid, "collapsed runs are never chosen (study.collapse)"),
                     ("The trained format", format_display(formats), choice["reason"])],
                    out_html, f"{model}: precise-SFT study (trained on {fmt})")
    plots.study_accuracy(measured, fmt, f"{model}: exact match after training on {fmt}", out_png)
    plots.study_curves(curves, f"{model}: learning curves on {fmt}", out_curves)


def write_not_run(*, model: str, study: dict, formats: pd.DataFrame, choice: dict, out_study, out_comparisons,
                  out_md, out_html, out_png, out_curves) -> None:
    """The study's outputs when it could not run (no candidate format inside `study.base_band`): empty
    tables whose metadata says why (`ran: false`, `reason`), and a Markdown page, an HTML page and two
    figures that say so."""
    from arithmech.report import plots

    reason = f"The precise-SFT study could not run: {choice['reason']}."
    print(f"WARNING: {reason}")
    meta = provenance(stage="study_summary", model=model, ran=False, reason=reason, train_format=None,
                      format_choice=choice)
    write_parquet(pd.DataFrame({c: pd.Series(dtype=object if c in ("arm", "run") else float) for c in STUDY_COLUMNS}),
                  out_study, meta)
    write_parquet(pd.DataFrame({c: pd.Series(dtype=object if c in ("arm_a", "arm_b", "metric", "dataset", "test")
                                             else float) for c in COMPARISON_COLUMNS}), out_comparisons, meta)
    with atomic_path(out_md) as tmp:
        Path(tmp).write_text(f"# {model}: precise-SFT study\n\n**{reason}**\n\n"
                             + format_markdown(format_display(formats), choice,
                                               auto=choice["train_format"] == study_config.AUTO))
    write_html_page([("The study could not run", pd.DataFrame({"reason": [reason]}), ""),
                     ("The trained format", format_display(formats), "")],
                    out_html, f"{model}: precise-SFT study (not run)")
    for path in (out_png, out_curves):
        plots.message_figure(f"{model}: precise-SFT study not run", reason, path)
