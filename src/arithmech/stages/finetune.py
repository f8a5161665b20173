"""Stage 4 on GSM8K (the paper's recipe, configs/paper.yaml): rule entry points to fine-tune with one
method, evaluate one model on one data set, and summarise (the paper's Table 1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from arithmech.data.eval_sets import REGISTRY
from arithmech.interp.nodes import ranked_nodes
from arithmech.io import provenance, write_html_table, write_parquet
from arithmech.model.loading import load_stage_model, model_record, stage_meta
from arithmech.sft.runs import load_finetuned, train_and_save
from arithmech.sft.training import finetune_examples, fitting_examples


def run_finetune(*, model: str, model_dir, method: str, effects_paths: dict, data_path, finetune: dict, compute: dict,
                 seed: int, out_dir, checkpoint_root) -> None:
    """Fine-tune with one method and save what was trained into `out_dir`: the deltas (`trained.safetensors`),
    for lora a PEFT adapter directory (`adapter/`), for full a model directory (`model/`), plus `stats.json`
    (trainable parameters, step times, peak memory, losses). A killed job resumes from
    `checkpoint_root/<method>-<hash of the settings>`."""
    from arithmech.sft.methods import HEAD_METHODS, parse_method, select_nodes

    lm = load_stage_model(model_dir, compute)
    spec: dict = {"method": method}
    if method in HEAD_METHODS:
        ranked, ranked_mlps = ranked_nodes({t: pd.read_parquet(p) for t, p in effects_paths.items()})
        heads, mlps = select_nodes(method, ranked, ranked_mlps, heads=finetune["heads"], mlps=finetune["mlps"],
                                   n_layers=lm.n_layers, n_heads=lm.n_heads, seed=seed, section="finetune")
        spec |= {"heads": [list(h) for h in heads], "mlp_layers": mlps, "train_kv": finetune["train_kv"],
                 "grad_scale": finetune["grad_scale"]}  # float32 deltas: `Method.delta_dtype`
    elif method == "lora":
        spec["lora"] = finetune["lora"]
    parse_method(spec)  # fail on a bad method before loading data
    train_cfg = {**finetune["train"], "lr": finetune["lr"][method], "seed": seed}
    examples = finetune_examples(lm, {**finetune["data"], "file": data_path}, seed)
    examples = fitting_examples(lm.tokenizer, examples, train_cfg["max_length"])
    settings = {"spec": spec, "train": train_cfg, "data": finetune["data"],
                "model": model_record(model_dir).get("sha256")}
    stats, record, _ = train_and_save(
        lm, spec=spec, train_cfg=train_cfg, examples=examples, settings=settings, run_name=method,
        checkpoint_root=checkpoint_root, out_dir=out_dir, model_dir=model_dir, stage="finetune",
        meta_params={"method": method}, record={"n_examples": len(examples), "spec": spec, "train": train_cfg},
    )
    print(f"{method}: {stats.n_trainable} trainable parameters, {record['mean_step_s']:.2f} s/step, "
          f"final loss {stats.losses[-1]:.3f}")


def run_evaluate(*, model: str, model_dir, method: str, dataset: str, finetune_dir, data_path, shots_path,
                 evaluation: dict, compute: dict, seed: int, out_path) -> None:
    """Evaluate one model (base or fine-tuned by `method`) on one data set of the registry
    (`arithmech.data.eval_sets`), scored by its kind: per-item rows (math: id, prompt, output, extracted, gold,
    correct; choice: prediction, correct; qa: output, correct; perplexity: one row). `evaluation`: style and
    batch_size, n_shots for the math sets (solved GSM8K train examples from `shots_path`), and the data
    set's own settings under its name."""
    from arithmech.data import datasets
    from arithmech.data.formatting import math_prompts
    from arithmech.sft import scoring

    spec = REGISTRY.get(dataset)
    if spec is None:
        raise ValueError(f"unknown evaluation data set {dataset!r}; expected one of {list(REGISTRY)}")
    lm = load_finetuned(model_dir, finetune_dir, compute)
    bs, cfg, progress = evaluation["batch_size"], evaluation[dataset], f"{method} {dataset}"
    if spec.kind == "math":
        shots = datasets.few_shot_examples(datasets.load_gsm8k(shots_path), evaluation["n_shots"], seed)
        items = datasets.subsample(spec.load(data_path), cfg["n"], seed)
        items = math_prompts(items.drop(columns=["solution"], errors="ignore"), shots, evaluation["style"],
                             lm.tokenizer)
        rows = scoring.evaluate_generation(lm, items, cfg["max_new_tokens"], bs, progress=progress)
    elif spec.kind == "choice":
        items = datasets.subsample(spec.load(data_path), cfg["n"], seed)
        rows = scoring.evaluate_choice(lm, items, bs, progress=progress)
    elif spec.kind == "qa":
        items = datasets.subsample(spec.load(data_path), cfg["n"], seed)
        rows = scoring.evaluate_qa_generation(lm, items, cfg["max_new_tokens"], bs, progress=progress)
    else:
        result = scoring.perplexity(lm, spec.load(data_path), max_length=cfg["max_length"], stride=cfg["stride"],
                                    max_tokens=cfg["max_tokens"], progress=progress)
        rows = pd.DataFrame([result])
    rows = rows.assign(method=method, dataset=dataset)
    meta = stage_meta(model_dir, "evaluate", method=method, dataset=dataset, evaluation=evaluation, seed=seed)
    write_parquet(rows, out_path, meta)
    if "correct" in rows:
        print(f"{method} {dataset}: accuracy {rows['correct'].mean():.3f} on {len(rows)}")
    else:
        print(f"{method} {dataset}: perplexity {rows['perplexity'].iloc[0]:.2f}")


def eval_summary(eval_paths: dict, stats_paths: dict, confidence: float) -> pd.DataFrame:
    """The paper's Table 1: one row per method (base first), per data set the accuracy with its Wilson
    interval (WikiText-2: perplexity), and the training cost: trainable parameters, mean step time, train
    wall time, peak memory, optimizer state and saved artifact sizes, and the precision it trained in (the
    model's dtype, the dtype the optimizer updated)."""
    from arithmech.stats import accuracy_interval

    rows = []
    for method, paths in eval_paths.items():
        row: dict = {"method": method}
        for name, path in paths.items():
            frame = pd.read_parquet(path)
            if "correct" in frame:
                acc, low, high = accuracy_interval(frame["correct"].to_numpy(), confidence)
                row |= {f"{name}": 100 * acc, f"{name}_low": 100 * low, f"{name}_high": 100 * high,
                        f"{name}_n": len(frame)}
            else:
                row |= {f"{name}_ppl": float(frame["perplexity"].iloc[0]),
                        f"{name}_tokens": int(frame["n_tokens"].iloc[0])}
        stats = json.loads(Path(stats_paths[method]).read_text()) if method in stats_paths else None
        row |= {
            "trainable_params": stats["n_trainable"] if stats else 0,
            "trainable_share": stats["n_trainable"] / stats["n_parameters"] if stats else 0.0,
            "train_steps": stats["steps"] if stats else 0,
            "mean_step_s": stats["mean_step_s"] if stats else float("nan"),
            "train_time_s": float(np.sum(stats["step_times_s"])) if stats else float("nan"),
            "peak_memory_mb": stats["peak_memory_bytes"] / 2**20 if stats else float("nan"),
            "peak_memory_kind": stats["peak_memory_kind"] if stats else "",
            "optimizer_state_mb": stats["optimizer_state_bytes"] / 2**20 if stats else float("nan"),
            "artifact_mb": stats["artifact_bytes"] / 2**20 if stats else float("nan"),
            "final_loss": stats["losses"][-1] if stats else float("nan"),
            # the precision each method trained in (runs saved before these were recorded: "")
            "model_dtype": stats.get("model_dtype", "") if stats else "",
            "master_dtype": stats.get("master_dtype", "") if stats else "",
        }
        rows.append(row)
    return pd.DataFrame(rows)


def accuracy_sets(datasets: list[str]) -> list[str]:
    """The sets scored by accuracy (all but the perplexity ones), in order."""
    return [d for d in datasets if REGISTRY[d].kind != "perplexity"]


def run_summarize_eval(*, model: str, methods: list[str], eval_paths: dict, stats_paths: dict, confidence: float,
                       out_table, out_md, out_html, out_png) -> None:
    from arithmech.io import atomic_path
    from arithmech.report import plots
    from arithmech.report.tables import eval_markdown

    summary = eval_summary(eval_paths, stats_paths, confidence)
    datasets = list(next(iter(eval_paths.values())))
    meta = provenance(stage="summarize_eval", model=model, methods=methods, confidence=confidence)
    write_parquet(summary, out_table, meta)
    with atomic_path(out_md) as tmp:
        Path(tmp).write_text(f"# {model}: base vs fine-tuned (accuracy %, {100 * confidence:.0f}% Wilson intervals)\n\n"
                             + eval_markdown(summary, accuracy_sets(datasets)))
    write_html_table(summary, out_html, f"{model}: evaluation of every fine-tuning method")
    plots.eval_summary(summary, accuracy_sets(datasets),
                       f"{model}: accuracy after fine-tuning on GSM8K ({100 * confidence:.0f}% intervals)", out_png)
