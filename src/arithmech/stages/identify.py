"""Stage 1, identify (the paper's path patching): rule entry points from the prepared model to the key
components."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from arithmech.data.arithmetic import SPLITS, build_prompts, select_samples, split_pairs
from arithmech.interp import effects as fx
from arithmech.io import provenance, read_parquet_meta, write_html_table, write_parquet, write_safetensors

if TYPE_CHECKING:  # annotations only: the rules import torch where they run the model
    import torch

    from arithmech.interp.patching import EndState


def run_prepare_model(*, source: dict, out_dir: str | Path, model_cache: str | None = None,
                      model: str | None = None, lock: str | Path | None = None) -> None:
    """Prepare model `model` from its config `source` into `out_dir`; a Hub source downloads into `model_cache`
    (config key `run.model_cache`; None: huggingface_hub's own cache) at the commit the lock file `lock` pinned
    (`arithmech.hub_lock`), or pins the one it resolves to."""
    from arithmech.model.loading import prepare_model

    prepare_model(source, out_dir, model_cache=model_cache, model=model, lock=lock)


def run_build_pairs(*, model_dir, task: str, prompts: dict, compute: dict, seed: int, out_pairs, out_dropped) -> None:
    """All candidate pairs of `task`, checked against the model (first token and full greedy answer), split
    into identification and validation pairs by operand pair; writes kept and dropped samples. The kept
    pairs' counterfactual prompts are checked too: how often they still give the answer (the leak) goes
    into the table (cf_correct_first_token, cf_correct_full) and its metadata."""
    from arithmech.intervention.generation import check_answers
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    candidates = build_prompts(lm.tokenizer, task, prompts, seed)
    checked = check_answers(lm, list(candidates["prompt"]), candidates["answer"], candidates["answer_token_id"],
                            batch_size=compute["batch_size"], desc=f"check {task}")
    kept, dropped = select_samples(candidates, checked, prompts["keep_only_correct"], prompts["splits"], seed)
    for split in SPLITS:
        if not (kept["split"] == split).any():
            raise RuntimeError(
                f"{task}: no {split} pair is left of {len(candidates)} candidates after prompts.keep_only_correct="
                f"{prompts['keep_only_correct']}; widen prompts.operands, change prompts.splits.validation_share, "
                "or set prompts.keep_only_correct: false"
            )
    cf = check_answers(lm, list(kept["cf_prompt"]), kept["answer"], kept["answer_token_id"],
                       batch_size=compute["batch_size"], desc=f"leak {task}")
    kept = kept.assign(cf_full_answer=cf["full_answer"].to_numpy(),
                       cf_correct_first_token=cf["correct_first_token"].to_numpy(),
                       cf_correct_full=cf["correct_full"].to_numpy())
    meta = stage_meta(model_dir, "build_pairs", task=task, prompts=prompts, seed=seed)
    meta["counts"] = {"candidates": len(candidates), "kept": len(kept),
                      **dropped["drop_reason"].value_counts().to_dict(),
                      **{f"kept_{s}": int((kept["split"] == s).sum()) for s in SPLITS}}
    meta["accuracy"] = {"first_token": float(checked["correct_first_token"].mean()),
                        "full": float(checked["correct_full"].mean())}
    meta["leak"] = {s: {"first_token": float(part["cf_correct_first_token"].mean()),
                        "full": float(part["cf_correct_full"].mean()), "n": len(part)}
                    for s, part in kept.groupby("split")}
    print(f"{task}: accuracy {meta['accuracy']}; leak {meta['leak']}; counts {meta['counts']}")
    write_parquet(kept, out_pairs, meta)
    write_parquet(dropped, out_dropped, meta)


def run_cache_activations(*, model_dir, pairs_path, compute: dict, out_path) -> None:
    """Node outputs at END for the identification pairs' reference and counterfactual prompts, plus the
    counterfactual means that mean ablation uses: at END over all of them (`cf_mean_*`, [1, ...]) and per
    template at every position counted back from END (`cf_template_*`, `means.GroupedMean`)."""
    import torch

    from arithmech.interp.activations import cache_tensors
    from arithmech.interp.patching import collect
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    pairs = split_pairs(pd.read_parquet(pairs_path), "identification", str(pairs_path))
    answers = torch.tensor(pairs["answer_token_id"].to_numpy())
    ref, _ = collect(lm, list(pairs["prompt"]), answers, compute["batch_size"], desc="reference")
    cf, grouped = collect(lm, list(pairs["cf_prompt"]), answers, compute["batch_size"],
                          groups=pairs["template_id"].tolist(), desc="counterfactual")
    tensors = cache_tensors(ref, cf, grouped, answers, torch.tensor(pairs["sample_id"].to_numpy()))
    meta = stage_meta(model_dir, "cache_activations", compute=compute,
                      pairs=read_parquet_meta(pairs_path).get("params_hash"))
    meta["dtype"] = str(lm.dtype)
    write_safetensors(tensors, out_path, meta)


def load_states(cache_path) -> tuple[EndState, EndState, torch.Tensor, torch.Tensor]:
    """(reference, counterfactual, answer_ids [n], sample_ids [n]) from a cache file (`activations.cache_states`)."""
    from safetensors.torch import load_file

    from arithmech.interp.activations import cache_states

    return cache_states(load_file(str(cache_path)))


def cache_meta(cache_path) -> dict:
    from safetensors import safe_open

    with safe_open(str(cache_path), "pt") as f:
        return json.loads((f.metadata() or {}).get("arithmech", "{}"))


def run_patch_layers(*, model_dir, layers: list[int] | None, patching: dict, compute: dict, pairs_paths: list,
                     cache_paths: list, out_paths: list) -> None:
    """Patch every node of `layers` (None: all of the model's), for each task (one pairs/cache/output path per
    task): per sample and node, logit_o, logit_p, relative effect (and probabilities when
    `patching.with_probs`, for the metric prob_change). `patching`: mode (direct or total), with_probs,
    copies_per_forward (total mode). Each task's table holds its layers' rows in layer order, each layer
    computed alone, so one table of all layers equals the per-layer tables concatenated.

    All tasks share one job so the model is loaded once: on a CPU a job's start-up (importing torch and
    transformers, about 5 s) costs far more than direct mode's closed form for every layer (milliseconds),
    so the workflow runs direct mode as one job for all layers (`patch_all_layers`) and total mode as one
    job per layer (`patch_layer`), which a cluster runs in parallel."""
    from arithmech.interp.patching import direct_logits, effects_frame, total_logits
    from arithmech.model.loading import load_stage_model, stage_meta

    lm = load_stage_model(model_dir, compute)
    layers = list(range(lm.n_layers)) if layers is None else [int(l) for l in layers]
    for layer in layers:
        if not 0 <= layer < lm.n_layers:
            raise ValueError(f"layer {layer} out of range: the model has {lm.n_layers} layers")
    with_probs = patching["with_probs"]
    for pairs_path, cache_path, out_path in zip(pairs_paths, cache_paths, out_paths, strict=True):
        ref, cf, answers, sample_ids = load_states(cache_path)
        texts = None
        if patching["mode"] != "direct":
            pairs = split_pairs(pd.read_parquet(pairs_path, columns=["sample_id", "prompt", "split"]), "identification",
                                str(pairs_path))
            if pairs["sample_id"].tolist() != sample_ids.tolist():
                raise ValueError(f"{cache_path} does not hold the identification pairs of {pairs_path}; re-run it")
            texts = list(pairs["prompt"])
        frames = []
        for layer in layers:
            if texts is None:
                out = direct_logits(lm, ref, cf, answers, [layer], batch_size=compute["batch_size"],
                                    with_logprobs=with_probs)
            else:
                out = total_logits(lm, texts, answers, cf, [layer], batch_size=compute["batch_size"],
                                   copies_per_forward=patching["copies_per_forward"], with_logprobs=with_probs)
            # logit_o from the same float32 computation as logit_p, not the forward's ref.logits (bf16 on a GPU)
            frames.append(effects_frame(lm, sample_ids.tolist(), [layer], out.logit_o, out.logit_p,
                                        logprob_o=out.logprob_o,
                                        logprob_p=out.logprob_p))
        table = pd.concat(frames, ignore_index=True)
        fx.check_finite(table, f"patching for {out_path}",
                        fx.pair_labels(pd.read_parquet(pairs_path, columns=["sample_id", "a", "b"])))
        cache_hash = cache_meta(cache_path).get("params_hash")
        meta = stage_meta(model_dir, "patch_layers", layers=layers, patching=patching, cache=cache_hash)
        write_parquet(table, out_path, meta)


def run_aggregate_effects(*, model: str, task: str, layer_paths, pairs_path, metric: str, key_rules: dict, seed: int,
                          out_effects, out_key, out_key_html) -> None:
    """Mean effect per node over samples (the `metric`), its bootstrap interval and selection stability
    (resampling operand pairs: a pair's templates are correlated), and the key components the rules select.
    The effects' metadata counts the samples the metric left out (logit_o <= 0 for relative_logit)."""
    patching = pd.concat([pd.read_parquet(p) for p in layer_paths], ignore_index=True)
    n_samples = patching["sample_id"].nunique()
    clusters = fx.pair_labels(pd.read_parquet(pairs_path, columns=["sample_id", "a", "b"]))
    fx.check_finite(patching, f"{model}, {task}", clusters)  # names the operand pairs too
    patching = fx.usable_rows(patching, metric)  # warns once; aggregate and bootstrap then find nothing to drop
    boot = key_rules["bootstrap"]
    uncertainty = fx.bootstrap(
        patching, metric, head_rule=key_rules["heads"], mlp_rule=key_rules["mlps"], clusters=clusters,
        resamples=boot["resamples"], confidence=boot["confidence"], seed=seed,
    )
    effects = fx.aggregate(patching, metric).merge(uncertainty.drop(columns=fx.NODE), on="node", how="left")
    key = fx.key_components(effects, key_rules["heads"], key_rules["mlps"])
    meta = provenance(stage="aggregate_effects", model=model, task=task, metric=metric, key_components=key_rules,
                      seed=seed)
    meta["excluded_nonpositive_logit_o"] = n_samples - patching["sample_id"].nunique()
    write_parquet(effects, out_effects, meta)
    write_parquet(key, out_key, meta)
    write_html_table(key, out_key_html, f"{model}, {task}: key components ({metric})")


def run_summarize_key_components(
    *, model: str, tasks: list[str], effects_paths, key_paths, out_table, out_html, out_png
) -> None:
    from arithmech.report import plots

    effects = {t: pd.read_parquet(p) for t, p in zip(tasks, effects_paths)}
    keys = {t: pd.read_parquet(p) for t, p in zip(tasks, key_paths)}
    summary = fx.shared_summary(effects, keys)
    write_parquet(summary, out_table, provenance(stage="summarize_key_components", model=model, tasks=tasks))
    write_html_table(summary, out_html, f"{model}: key components shared across operators")
    plots.shared_heatmap(summary, tasks, f"{model}: key components across operators (* = key)", out_png)


def run_plot_effects(*, model: str, task: str, metric: str, effects_path, key_path, out_png) -> None:
    """The heatmap of mean patching effects per head and MLP, key components outlined."""
    from arithmech.report import plots

    effects, key = pd.read_parquet(effects_path), pd.read_parquet(key_path)
    n_key = int((key["component"] == "head").sum())
    share = 100 * n_key / max(1, int((effects["component"] == "head").sum()))
    title = (f"{model}, {task}: path patching at END ({metric}); {n_key} key heads ({share:.1f}%) outlined,\n"
             f"labelled with the % of bootstrap resamples that select them (dashed: under {100 * plots.STABLE:.0f}%)")
    plots.effects_heatmap(effects, key, title, out_png)
