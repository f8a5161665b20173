"""Rule entry points of the precise-SFT study (`arithmech.study`): build the items, train one run, choose
an arm's lr, score one model, summarise. Keyword-only, so a script cannot swap two paths silently."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import study as sd
from ..io import atomic_path, config_hash, provenance, write_html_table, write_json, write_parquet
from .common import load_finetuned, load_stage_model, model_record, stage_meta, train_and_save
from .finetune import ranked_nodes

VAL_FILE = "val.parquet"


def run_study_items(*, model_dir, pairs_paths: dict, study: dict, prompts: dict, seed: int, out_items) -> None:
    """All study items (train/validation/test of the trained format, test of the others), the identify
    stage's operand pairs left out."""
    from ..models import LoadedModel, resolve_model_dir

    identify = {task: set(zip(*(pd.read_parquet(p)[c].astype(int) for c in ("a", "b"))))
                for task, p in pairs_paths.items()}
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
    from ..scoring import score_targets

    scores = score_targets(lm, items["prompt"].tolist(), items["target"].tolist(), batch_size, progress)
    return pd.DataFrame({"item": items["pair"].to_numpy(), "cluster": items["pair"].to_numpy(),
                         "correct": scores["greedy_match"].to_numpy(), "nll": scores["nll"].to_numpy(),
                         "n_tokens": scores["n_tokens"].to_numpy()})


def run_lr(run: str, study: dict, arm: str, selection_path) -> float:
    kind, index = sd.parse_run(run)
    if kind == "lr":
        return float(study["lr_grid"][arm][index])
    return float(sd.read_json(selection_path)["lr"])


def run_seed(run: str, seed: int) -> int:
    kind, index = sd.parse_run(run)
    return seed + index if kind == "seed" else seed


def run_study_train(*, model_dir, items_path, effects_paths: dict, arm: str, run: str, study: dict, compute: dict,
                    seed: int, selection_path, out_dir, checkpoint_root) -> None:
    """Train one run (module docstring of `arithmech.study`) and save what was trained, `stats.json`
    (with the learning-curve points) and the final validation scores (`val.parquet`). A killed job resumes
    from `checkpoint_root/<arm>-<run>-<hash of the settings>`."""
    import torch

    from ..finetune_config import HEAD_METHODS, parse_method

    lm = load_stage_model(model_dir, compute)
    items = pd.read_parquet(items_path)
    fmt = items[items["format"] == study["train_format"]]
    train_items, val = fmt[fmt["split"] == "train"], fmt[fmt["split"] == "validation"]
    curve_test = fmt[fmt["split"] == "test"].head(study["curve"]["test_items"])
    heads, mlps = ranked_nodes(effects_paths) if arm in sd.HEAD_ARMS else ([], [])
    spec = sd.arm_method(arm, run, study, ranked_heads=heads, ranked_mlps=mlps, n_heads=lm.n_heads, seed=seed)
    if spec["method"] in HEAD_METHODS and lm.dtype != torch.float32:
        spec["delta_dtype"] = "float32"
    parse_method(spec)
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

    def final_val(stats) -> dict[str, pd.DataFrame]:
        scored = last_val.get(stats.steps)
        if scored is None:  # resumed after the last step: score again
            with torch.no_grad():
                scored = _score(lm, val, bs)
        return {VAL_FILE: scored}

    settings = {"spec": spec, "train": train_cfg, "items": config_hash(fmt[["split", "prompt", "target"]].values.tolist()),
                "model": model_record(model_dir).get("sha256")}
    examples = list(zip(train_items["prompt"], train_items["target"]))
    stats, record, tables = train_and_save(
        lm, spec=spec, train_cfg=train_cfg, examples=examples, settings=settings, run_name=f"{arm}-{run}",
        checkpoint_root=checkpoint_root, out_dir=out_dir, model_dir=model_dir, stage="study_train",
        meta_params={"arm": arm, "run": run}, append_eos=False, evaluate=evaluate,
        evaluate_every=study["curve"]["every"], final_tables=final_val,
        record={"arm": arm, "run": run, "lr": lr, "seed": train_cfg["seed"], "n_examples": len(examples), "spec": spec,
                "train": train_cfg},
    )
    print(f"{arm} {run}: lr {lr:g}, {stats.n_trainable} trained parameters, {record['mean_step_s']:.2f} s/step, "
          f"validation exact match {tables[VAL_FILE]['correct'].mean():.3f}")


def run_study_select(*, arm: str, study: dict, run_dirs: dict, out_path) -> None:
    """Choose `arm`'s lr: the grid run with the best validation exact match (`study.select_lr`)."""
    vals = {run: pd.read_parquet(Path(d) / VAL_FILE) for run, d in run_dirs.items()}
    choice = sd.select_lr(vals, list(study["lr_grid"][arm]))
    choice |= {"arm": arm, "criterion": "validation exact match, ties to the lower answer NLL",
               "provenance": provenance(stage="study_select", arm=arm)}
    write_json(choice, out_path)
    print(f"{arm}: chose {choice['run']} (lr {choice['lr']:g}); grid {choice['grid']}")


def chosen_dir(selection_path, grid_dirs: dict) -> Path:
    return Path(grid_dirs[sd.read_json(selection_path)["run"]])


def _off_target_rows(lm, base, study: dict, data_paths: dict, *, seed: int, bs: int) -> list[pd.DataFrame]:
    from .. import data as ds
    from .. import scoring
    from ..formatting import math_prompts

    cfg, frames = study["off_target"], []
    style = cfg["style"]
    gsm = ds.subsample(ds.load_gsm8k(data_paths["gsm8k"]), cfg["gsm8k_n"], seed)
    gsm = math_prompts(gsm, (), style, lm.tokenizer)
    svamp = ds.subsample(ds.load_svamp(data_paths["svamp"]), cfg["svamp_n"], seed)
    svamp["solution"] = [f"The answer is {g:g}." for g in svamp["gold"]]
    svamp = math_prompts(svamp, (), style, lm.tokenizer)
    for name, frame in (("gsm8k", gsm), ("svamp", svamp)):
        s = scoring.score_targets(lm, frame["prompt"].tolist(), frame["target"].tolist(), bs, progress=f"{name} NLL")
        ids = frame["id"].astype(str).to_numpy()
        frames.append(pd.DataFrame({"dataset": name, "kind": "nll", "item": ids, "cluster": ids,
                                    "nll": s["nll"].to_numpy(), "n_tokens": s["n_tokens"].to_numpy()}))
    for name in ("social_iqa", "strategyqa"):
        items = ds.subsample(ds.load_bigbench_choice(data_paths[name]), cfg[f"{name}_n"], seed)
        rows = scoring.evaluate_choice(lm, items, bs, progress=name)
        frames.append(pd.DataFrame({"dataset": name, "kind": "choice", "item": rows["id"], "cluster": rows["id"],
                                    "correct": rows["correct"].to_numpy()}))
    items = ds.subsample(ds.load_bigbench_generation(data_paths["qa_wikidata"]), cfg["qa_wikidata_n"], seed)
    rows = scoring.evaluate_qa_generation(lm, items, cfg["qa_max_new_tokens"], bs, progress="qa_wikidata")
    frames.append(pd.DataFrame({"dataset": "qa_wikidata", "kind": "choice", "item": rows["id"], "cluster": rows["id"],
                                "correct": rows["correct"].to_numpy()}))
    wt = cfg["wikitext"]
    div = scoring.divergence_windows(lm, base, ds.load_text(data_paths["wikitext"]), max_tokens=wt["max_tokens"],
                                     window=wt["window"], progress="WikiText-2 KL")
    ids = div["window"].astype(str).to_numpy()
    frames.append(div.drop(columns="window").assign(dataset="wikitext", kind="divergence", item=ids, cluster=ids))
    return frames


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
            frames += _off_target_rows(lm, base, study, data_paths, seed=seed, bs=bs)
    rows = pd.concat(frames, ignore_index=True)
    rows["correct"] = rows["correct"].astype(float)  # NaN where a kind has no correctness
    meta = stage_meta(model_dir, "study_evaluate", arm=arm, run=run, off_target=study["off_target"], seed=seed)
    write_parquet(rows, out_path, meta)


def run_study_summary(*, model: str, study: dict, items_path, selection_paths: dict, eval_paths: dict,
                      stats_paths: dict, seed: int, out_study, out_comparisons, out_md, out_html, out_png,
                      out_curves) -> None:
    """study.parquet (one row per scored model), comparisons.parquet (arm against arm), the Markdown and
    HTML table, the accuracy figure and the learning curves."""
    from .. import plots

    rows = sd.per_item({key: pd.read_parquet(p) for key, p in eval_paths.items()})
    fmt = study["train_format"]
    table = sd.model_rows(rows, fmt, study["confidence"], study["bootstrap"], seed)
    selections = {arm: sd.read_json(p) for arm, p in selection_paths.items()}
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
                      "draw": sd.parse_run(run)[1] if run.startswith("draw") else 0,
                      "steps": rec.get("steps", 0), "trainable_params": rec.get("n_trainable", 0),
                      "mean_step_s": rec.get("mean_step_s", np.nan),
                      "train_time_s": float(np.sum(rec["step_times_s"])) if rec else np.nan,
                      "peak_memory_mb": rec["peak_memory_bytes"] / 2**20 if rec else np.nan,
                      "optimizer_state_mb": rec["optimizer_state_bytes"] / 2**20 if rec else np.nan,
                      "artifact_mb": rec["artifact_bytes"] / 2**20 if rec else np.nan,
                      "final_loss": rec["losses"][-1] if rec else np.nan})
    table = pd.concat([table, pd.DataFrame(extra)], axis=1)
    comp = sd.comparisons(rows, fmt, study["confidence"], study["bootstrap"], seed)
    curves = sd.curves(records)
    base_acc = float(table.loc[table["arm"] == "base", "accuracy"].iloc[0]) if (table["arm"] == "base").any() else np.nan
    low, high = study["base_band"]
    in_band = bool(low <= base_acc <= high)
    if not in_band:
        print(f"WARNING: the base model's exact match on the {fmt!r} test set is {base_acc:.3f}, outside "
              f"study.base_band [{low}, {high}]: choose another study.train_format")
    meta = provenance(stage="study_summary", model=model, train_format=fmt, base_accuracy=base_acc,
                      base_in_band=in_band, selections={a: {k: s[k] for k in ("run", "lr", "grid")}
                                                        for a, s in selections.items()})
    write_parquet(table, out_study, meta)
    write_parquet(comp, out_comparisons, meta)
    with atomic_path(out_md) as tmp:
        Path(tmp).write_text(study_markdown(model, table, comp, fmt, study["confidence"]))
    write_html_table(table, out_html, f"{model}: precise-SFT study (trained on {fmt})")
    plots.study_accuracy(table, fmt, f"{model}: exact match after training on {fmt}", out_png)
    plots.study_curves(curves, f"{model}: learning curves on {fmt}", out_curves)


def study_markdown(model: str, table: pd.DataFrame, comp: pd.DataFrame, fmt: str, confidence: float) -> str:
    """The study's tables in Markdown: per model, then the comparisons of exact match and KL."""
    pct = f"{100 * confidence:.0f}%"
    transfer = [c for c in table.columns if c.startswith("transfer_") and not c.endswith(("_low", "_high"))]
    head = ["arm", "run", "lr", f"{fmt} exact match [{pct}]", *[c[len("transfer_"):] for c in transfer],
            "KL to base (nats/token)", "WikiText ppl", "GSM8K NLL", "SVAMP NLL", "social_iqa", "strategyqa",
            "qa_wikidata", "trained params", "s/step"]
    lines = [f"# {model}: precise-SFT study, trained on `{fmt}`\n", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]

    def f(x, spec):
        return "" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)

    for r in table.to_dict("records"):
        cells = [r["arm"], r["run"], f(r.get("lr"), ".0e"),
                 f"{100 * r['accuracy']:.1f} [{100 * r['accuracy_low']:.1f}, {100 * r['accuracy_high']:.1f}]"]
        cells += [f(100 * r[c], ".1f") for c in transfer]
        cells += [f(r.get("kl_to_base"), ".4f"), f(r.get("perplexity"), ".2f"), f(r.get("gsm8k_nll"), ".3f"),
                  f(r.get("svamp_nll"), ".3f")]
        cells += [f(100 * r[c], ".1f") if c in r else "" for c in ("social_iqa", "strategyqa", "qa_wikidata")]
        cells += [f"{int(r.get('trainable_params') or 0):,}", f(r.get("mean_step_s"), ".2f")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", f"## Comparisons (a - b on the same items; {pct} intervals resample operand pairs, items or windows)",
              "", "| a | b | metric | difference | interval | p | p (Holm) | test |", "|---|---|---|---|---|---|---|---|"]
    for r in comp.to_dict("records"):
        scale = 100 if r["metric"] in ("accuracy", "social_iqa", "strategyqa", "qa_wikidata") or \
            r["metric"].startswith("transfer_") else 1
        lines.append(f"| {r['arm_a']} | {r['arm_b']} | {r['metric']} | {scale * r['difference']:+.3g} | "
                     f"[{scale * r['ci_low']:+.3g}, {scale * r['ci_high']:+.3g}] | {r['p_value']:.3g} | "
                     f"{r['p_holm']:.3g} | {r['test']} |")
    return "\n".join(lines) + "\n"
