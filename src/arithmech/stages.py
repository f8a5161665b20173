"""One function per workflow rule: read inputs, call the library, write outputs atomically with provenance.

Rule scripts only map Snakemake's input/output/params onto these, so every stage can also be run (and
tested) without Snakemake.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from . import effects as fx
from .config import EVAL_DATASETS
from .io import config_hash, provenance, read_parquet_meta, write_html_table, write_parquet, write_safetensors
from .models import SOURCE_FILE, LoadedModel, load_model, prepare_model
from .patching import AlignedMean, EndState, collect, direct_logits, effects_frame, total_logits
from .prompts import build_prompts, select_samples


def seed_everything(seed: int, threads: int | None = None) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def job(smk):
    """Set up a rule script: stderr/stdout (tqdm progress included) to the rule's log, seeds and threads
    from the rule; a failure's traceback goes to the log before Snakemake reports it."""
    log = open(smk.log[0], "w", buffering=1) if smk.log else None
    with contextlib.ExitStack() as stack:
        if log is not None:
            stack.enter_context(log)
            stack.enter_context(contextlib.redirect_stderr(log))
            stack.enter_context(contextlib.redirect_stdout(log))
        seed_everything(smk.params.get("seed", 0), smk.threads)
        try:
            yield
        except BaseException:
            traceback.print_exc(file=sys.stderr)
            raise


def model_record(model_dir: str | Path) -> dict:
    return json.loads((Path(model_dir) / SOURCE_FILE).read_text())


def _meta(model_dir, stage: str, **params) -> dict:
    record = model_record(model_dir)
    return provenance(
        stage=stage,
        model_source=record["source"],
        model_sha256=record.get("sha256"),
        model_revision=record.get("revision"),
        params_hash=config_hash(params),
        params=params,
    )


def _load(model_dir, compute: dict) -> LoadedModel:
    return load_model(model_dir, device=compute["device"], dtype=compute["dtype"])


def run_prepare_model(source: dict, out_dir: str | Path) -> None:
    prepare_model(source, out_dir)


def run_build_pairs(model_dir, task: str, prompts: dict, compute: dict, seed: int, out_pairs, out_dropped) -> None:
    """All candidate pairs of `task`, checked against the model; writes kept and dropped samples."""
    lm = _load(model_dir, compute)
    candidates = build_prompts(lm.tokenizer, task, prompts, seed)
    answers = torch.tensor(candidates["answer_token_id"].to_numpy())
    state, _ = collect(lm, list(candidates["prompt"]), answers, compute["batch_size"], desc=f"check {task}")
    kept, dropped = select_samples(
        candidates, state.predicted.tolist(), prompts["max_samples"], prompts["keep_only_correct"], seed
    )
    if kept.empty:
        raise RuntimeError(
            f"{task}: the model answered none of the {len(candidates)} prompts correctly; "
            "check prompts.templates / n_shots, or set prompts.keep_only_correct: false"
        )
    meta = _meta(model_dir, "build_pairs", task=task, prompts=prompts, seed=seed)
    meta["counts"] = {"candidates": len(candidates), "kept": len(kept), **dropped["drop_reason"].value_counts().to_dict()}
    meta["accuracy"] = float(state.predicted.eq(answers).float().mean())
    print(f"{task}: first-token accuracy {meta['accuracy']:.3f}; counts {meta['counts']}")
    write_parquet(kept, out_pairs, meta)
    write_parquet(dropped, out_dropped, meta)


STATE_FIELDS = ("heads", "mlps", "resid", "logits", "logprobs", "predicted")


def run_cache_activations(model_dir, pairs_path, compute: dict, out_path) -> None:
    """Node outputs at END for reference and counterfactual prompts, plus the counterfactual means
    (at END and aligned back from END over the shortest prompt) that mean ablation uses."""
    lm = _load(model_dir, compute)
    pairs = pd.read_parquet(pairs_path)
    answers = torch.tensor(pairs["answer_token_id"].to_numpy())
    ref, _ = collect(lm, list(pairs["prompt"]), answers, compute["batch_size"], desc="reference")
    n_aligned = min(len(lm.tokenizer(t)["input_ids"]) for t in pairs["cf_prompt"])
    cf, mean = collect(
        lm, list(pairs["cf_prompt"]), answers, compute["batch_size"], aligned_positions=n_aligned, desc="counterfactual"
    )
    tensors = {f"ref_{k}": getattr(ref, k) for k in STATE_FIELDS}
    tensors |= {f"cf_{k}": getattr(cf, k) for k in STATE_FIELDS}
    tensors |= {
        "answer_ids": answers,
        "sample_ids": torch.tensor(pairs["sample_id"].to_numpy()),
        "cf_mean_heads": mean.heads,  # [n_aligned, L, H, head_dim]; index 0 is END
        "cf_mean_mlps": mean.mlps,  # [n_aligned, L, d_model]
    }
    meta = _meta(model_dir, "cache_activations", compute=compute, pairs=read_parquet_meta(pairs_path).get("params_hash"))
    meta["dtype"] = str(lm.dtype)
    write_safetensors(tensors, out_path, meta)


def load_states(cache_path) -> tuple[EndState, EndState, torch.Tensor, torch.Tensor]:
    """(reference, counterfactual, answer_ids [n], sample_ids [n]) from a cache file."""
    t = load_file(str(cache_path))
    ref = EndState(**{k: t[f"ref_{k}"] for k in STATE_FIELDS})
    cf = EndState(**{k: t[f"cf_{k}"] for k in STATE_FIELDS})
    return ref, cf, t["answer_ids"], t["sample_ids"]


def cache_meta(cache_path) -> dict:
    with safe_open(str(cache_path), "pt") as f:
        return json.loads((f.metadata() or {}).get("arithmech", "{}"))


def run_patch_layer(
    model_dir, layer: int, patching: dict, compute: dict, pairs_paths: list, cache_paths: list, out_paths: list
) -> None:
    """Patch every node of `layer`, for each task (one pairs/cache/output path per task): per sample and
    node, logit_o, logit_p, relative effect (and probabilities if the metric needs them).

    All tasks share one job so the model is loaded once per layer: on a CPU the job's start-up costs far
    more than the closed form itself, and a cluster still runs the layers in parallel."""
    lm = _load(model_dir, compute)
    if not 0 <= layer < lm.n_layers:
        raise ValueError(f"layer {layer} out of range: the model has {lm.n_layers} layers")
    with_probs = patching["metric"] == "prob_change"
    for pairs_path, cache_path, out_path in zip(pairs_paths, cache_paths, out_paths, strict=True):
        ref, cf, answers, sample_ids = load_states(cache_path)
        if patching["mode"] == "direct":
            logit_p, logprob_p = direct_logits(lm, ref, cf, answers, [layer], compute["batch_size"], with_probs)
        else:
            texts = list(pd.read_parquet(pairs_path, columns=["prompt"])["prompt"])
            logit_p, logprob_p = total_logits(
                lm, texts, answers, cf, [layer], compute["batch_size"], patching["copies_per_forward"]
            )
        frame = effects_frame(
            lm, sample_ids.tolist(), [layer], ref.logits, logit_p,
            ref.logprobs if with_probs else None, logprob_p if with_probs else None,
        )
        cache_hash = cache_meta(cache_path).get("params_hash")
        meta = _meta(model_dir, "patch_layer", layer=layer, patching=patching, cache=cache_hash)
        write_parquet(frame, out_path, meta)


def run_aggregate_effects(
    model: str, task: str, layer_paths, metric: str, key_rules: dict, out_effects, out_png, out_key, out_key_html
) -> None:
    from . import plots  # seaborn/matplotlib load slowly; only the plotting stages need them

    patching = pd.concat([pd.read_parquet(p) for p in layer_paths], ignore_index=True)
    effects = fx.aggregate(patching, metric)
    key = fx.key_components(effects, key_rules["heads"], key_rules["mlps"])
    meta = provenance(stage="aggregate_effects", model=model, task=task, metric=metric, key_components=key_rules)
    write_parquet(effects, out_effects, meta)
    write_parquet(key, out_key, meta)
    write_html_table(key, out_key_html, f"{model}, {task}: key components ({metric})")
    n_key = int((key["component"] == "head").sum())
    share = 100 * n_key / max(1, int((effects["component"] == "head").sum()))
    plots.effects_heatmap(
        effects, key, f"{model}, {task}: path patching at END ({metric}); {n_key} key heads ({share:.1f}%) outlined", out_png
    )


def run_summarize_key_components(
    model: str, tasks: list[str], effects_paths, key_paths, out_table, out_html, out_png
) -> None:
    from . import plots

    effects = {t: pd.read_parquet(p) for t, p in zip(tasks, effects_paths)}
    keys = {t: pd.read_parquet(p) for t, p in zip(tasks, key_paths)}
    summary = fx.shared_summary(effects, keys)
    write_parquet(summary, out_table, provenance(stage="summarize_key_components", model=model, tasks=tasks))
    write_html_table(summary, out_html, f"{model}: key components shared across operators")
    plots.shared_heatmap(summary, tasks, f"{model}: key components across operators (* = key)", out_png)


def analysis_heads(key_path, effects_path, fallback: int) -> tuple[list[tuple[int, int]], str]:
    """The heads to analyse and how they were chosen: the key heads in rank order ('key'), or, when the
    rule selected none, the `fallback` heads of most negative mean effect ('top')."""
    key = pd.read_parquet(key_path)
    key = key[key["component"] == "head"].sort_values("rank", kind="stable")
    if len(key):
        return [(int(l), int(h)) for l, h in zip(key["layer"], key["head"])], "key"
    effects = pd.read_parquet(effects_path)
    top = effects[effects["component"] == "head"].sort_values("mean_effect", kind="stable").head(fallback)
    return [(int(l), int(h)) for l, h in zip(top["layer"], top["head"])], "top"


def run_analyze(
    model: str, task: str, model_dir, pairs_path, key_path, effects_path, analysis: dict, compute: dict, seed: int,
    out_roles, out_probes, out_roles_png, out_example_png, out_probes_png,
) -> None:
    """Explain the key heads and the MLPs on up to `analysis.max_samples` pairs (a seeded draw): the
    attention of each key head from END on each token role, an example prompt with its attention, and the
    MLP probes (cosine of MLP input/output/change with the unembedding rows of A, B and the answer C)."""
    from . import plots
    from .analysis import attention_rows, first_role_tokens, mlp_probes, role_attention, token_roles

    lm = _load(model_dir, compute)
    pairs = pd.read_parquet(pairs_path)
    if len(pairs) > analysis["max_samples"]:
        pairs = pairs.sample(n=analysis["max_samples"], random_state=seed).sort_values("sample_id", kind="stable")
    pairs = pairs.reset_index(drop=True)
    texts = list(pairs["prompt"])
    heads, selection = analysis_heads(key_path, effects_path, analysis["fallback_heads"])
    labels = [f"L{l}H{h}" for l, h in heads]
    chosen = "key heads" if selection == "key" else f"no key heads: top {len(heads)} heads by patching effect"
    meta = _meta(model_dir, "analyze", task=task, analysis=analysis, seed=seed, heads=labels, selection=selection,
                 pairs=read_parquet_meta(pairs_path).get("params_hash"))
    roles = [token_roles(lm.tokenizer, row["prompt"], row) for row in pairs.to_dict("records")]
    rows = attention_rows(lm, texts, heads, compute["batch_size"])
    table = role_attention(rows, roles)
    rank = {hd: i + 1 for i, hd in enumerate(heads)}
    table.insert(0, "node", [f"L{l}H{h}" for l, h in zip(table["layer"], table["head"])])
    table = table.assign(rank=[rank[(l, h)] for l, h in zip(table["layer"], table["head"])], selection=selection,
                         task=task)
    write_parquet(table, out_roles, meta)
    n = len(texts)
    plots.role_attention_heatmap(
        table, f"{model}, {task}: attention from END by token role ({chosen}; mean of {n} prompts)", out_roles_png
    )
    example = pairs.iloc[0]
    ids = lm.tokenizer(example["prompt"])["input_ids"]
    plots.attention_example(
        [lm.tokenizer.decode([i]) for i in ids], rows.row(0).numpy(), labels, roles[0],
        f"{model}, {task}: attention from END, sample {example['sample_id']} ({chosen})", out_example_png,
    )
    probes = mlp_probes(
        lm, texts, first_role_tokens(lm.tokenizer, pairs, "operand_a"), first_role_tokens(lm.tokenizer, pairs, "operand_b"),
        pairs["answer_token_id"].tolist(), compute["batch_size"], analysis["n_random"], seed,
    ).assign(task=task)
    write_parquet(probes, out_probes, meta)
    plots.mlp_probe_lines(
        probes, f"{model}, {task}: MLP vectors at END against the unembedding of A, B and the answer C "
        f"(mean of {n} prompts)", out_probes_png,
    )


def answer_tokens(tokenizer, answers) -> int:
    """Greedy steps that read every answer in full: the longest answer's tokens (after the prompt's trailing
    space) plus one, so that "1" followed by "2" is read as 12, not 1."""
    return 1 + max(len(tokenizer(" " + str(a), add_special_tokens=False)["input_ids"]) for a in answers)


def _set_answers(lm, texts, head_sets, mlp_sets, means, positions, max_new_tokens, batch_size, copies):
    """Greedy answer tokens [n_sets, n, max_new_tokens] with each node set mean-ablated: END positions on
    the prefix-cache fast path (each answer stops once its number is settled, which leaves its score as it
    is), aligned positions with one ablated generation per set (the reference)."""
    from .ablation import greedy_end_sets, mean_ablate
    from .evaluation import greedy_generate, settled_number

    if positions == "end":
        return greedy_end_sets(lm, texts, head_sets, means, max_new_tokens, mlp_sets, None, batch_size, copies,
                               settled=settled_number(lm.tokenizer)).tokens
    return torch.stack([
        greedy_generate(lm, texts, max_new_tokens, batch_size, mean_ablate(lm, hs, ms, means, positions))
        for hs, ms in zip(head_sets, mlp_sets)
    ])


def _answers_correct(tokenizer, tokens: torch.Tensor, golds, judge=None) -> np.ndarray:
    """[n_sets, n] bool: whether each decoded greedy answer matches its gold, by `judge(text, gold)`
    (default `evaluation.answer_correct`: the first number, compared by value)."""
    from .evaluation import answer_correct

    judge = judge or answer_correct
    golds = list(golds)
    texts = tokenizer.batch_decode(tokens.flatten(0, 1), skip_special_tokens=True)
    flat = [judge(t, golds[i % len(golds)]) for i, t in enumerate(texts)]
    return np.array(flat, dtype=bool).reshape(tokens.shape[:2])


def knockout_node_sets(effects: pd.DataFrame, key: pd.DataFrame, ablation: dict, n_layers: int, n_heads: int,
                       seed: int) -> list[tuple]:
    """The knockout rule's node sets, each (curve, seed, k, heads, mlps): the top k heads by patching effect
    (k = 0..K, K = ablation.max_heads), k random other heads over `ablation.random_seeds` draws, the key MLPs."""
    from .ablation import random_heads

    heads = effects[effects["component"] == "head"].sort_values("mean_effect", kind="stable")
    K = min(ablation["max_heads"], len(heads))
    ranked = [(int(l), int(h)) for l, h in zip(heads["layer"][:K], heads["head"][:K])]
    sets = [("top_heads", -1, k, ranked[:k], []) for k in range(K + 1)]
    for s in range(ablation["random_seeds"]):
        drawn = random_heads(n_layers, n_heads, K, seed=seed * 1000 + s, exclude=ranked)
        sets += [("random_heads", s, k, drawn[:k], []) for k in range(1, K + 1)]
    key_mlps = [int(l) for l in key.loc[key["component"] == "mlp", "layer"]]
    return sets + [("key_mlps", -1, len(key_mlps), [], key_mlps)]


def run_knockout(
    model: str, task: str, model_dir, pairs_path, cache_path, effects_path, key_path,
    ablation: dict, compute: dict, seed: int, out_table, out_png,
) -> None:
    """Mean-ablation knockout: accuracy with the top k heads (by patching effect) knocked out, k = 0..max_heads,
    against as many random heads over several seeds, and with the key MLPs knocked out. Both the first
    answer token (`accuracy`, what path patching measured) and the full greedy answer (`full_accuracy`)."""
    from . import plots

    lm = _load(model_dir, compute)
    pairs = pd.read_parquet(pairs_path)
    texts, answers = list(pairs["prompt"]), torch.tensor(pairs["answer_token_id"].to_numpy())
    cache = load_file(str(cache_path))
    means = AlignedMean(cache["cf_mean_heads"], cache["cf_mean_mlps"])
    key = pd.read_parquet(key_path)
    sets = knockout_node_sets(pd.read_parquet(effects_path), key, ablation, lm.n_layers, lm.n_heads, seed)
    tokens = _set_answers(
        lm, texts, [s[3] for s in sets], [s[4] for s in sets], means, ablation["positions"],
        answer_tokens(lm.tokenizer, pairs["answer"]), compute["batch_size"], 256,
    )
    first = (tokens[..., 0] == answers[None]).float().mean(1).numpy()
    full = _answers_correct(lm.tokenizer, tokens, pairs["answer"]).mean(1)
    rows = [
        {"curve": c, "seed": sd, "k": k,
         "nodes": " ".join([f"L{l}H{h}" for l, h in hs] + [f"L{l}MLP" for l in ms]),
         "accuracy": float(a), "full_accuracy": float(f)}
        for (c, sd, k, hs, ms), a, f in zip(sets, first, full)
    ]
    table = pd.DataFrame(rows).assign(n=len(texts), positions=ablation["positions"])
    meta = _meta(model_dir, "knockout", task=task, ablation=ablation, seed=seed)
    write_parquet(table, out_table, meta)
    n_key = int((key["component"] == "head").sum())
    plots.knockout_curves(table, n_key, f"{model}, {task}: mean-ablation knockout at {ablation['positions']}", out_png)


def _transfer_targets(
    lm, tasks, pairs_paths, svamp_path, non_math_path, transfer: dict, prompts_cfg: dict, seed: int
) -> list[dict]:
    """The data sets the key heads are knocked out on: every operator's kept pairs, the other number
    formats of every operator, SVAMP (direct answers) and the non-math control (BIG-bench qa_wikidata).
    Each: name, kind, texts, golds (numbers, or lists of accepted strings), answer_ids (first answer token,
    operator pairs only), max_new_tokens."""
    from .data import load_bigbench_generation, load_svamp, subsample
    from .prompts import format_prompts, question_prompts

    targets = []
    for task, path in zip(tasks, pairs_paths, strict=True):
        pairs = subsample(pd.read_parquet(path), transfer["max_samples"], seed)
        targets.append({
            "name": task, "kind": "operator", "texts": list(pairs["prompt"]), "golds": list(pairs["answer"]),
            "answer_ids": torch.tensor(pairs["answer_token_id"].to_numpy()),
            "max_new_tokens": answer_tokens(lm.tokenizer, pairs["answer"]),
        })
    fmt_cfg = transfer["formats"]
    for fmt in ("multi_digit", "decimal"):
        for task in tasks:
            df = format_prompts(task, fmt, fmt_cfg[fmt], prompts_cfg, fmt_cfg["n"], seed)
            targets.append({
                "name": f"{task} {fmt.replace('_', '-')}", "kind": fmt, "texts": list(df["prompt"]),
                "golds": list(df["gold"]), "answer_ids": None,
                "max_new_tokens": answer_tokens(lm.tokenizer, df["answer"]),
            })
    sv = transfer["svamp"]
    svamp = load_svamp(svamp_path).assign(answer=lambda d: [f"{g:g}" for g in d["gold"]], index=lambda d: d.index)
    keep = subsample(svamp, sv["n"], seed)
    targets.append({
        "name": "SVAMP", "kind": "svamp", "golds": list(keep["gold"]), "answer_ids": None,
        "texts": question_prompts(list(svamp["question"]), list(svamp["answer"]), sv["n_shots"], seed, keep["index"]),
        "max_new_tokens": answer_tokens(lm.tokenizer, keep["answer"]),
    })
    nm = transfer["non_math"]
    qa = load_bigbench_generation(non_math_path).assign(index=lambda d: d.index)
    keep = subsample(qa, nm["n"], seed)
    texts = question_prompts(list(qa["input"]), [t[0] for t in qa["targets"]], nm["n_shots"], seed, keep["index"],
                             question_prefix="", answer_prefix="", separator="\n")
    targets.append({
        "name": Path(non_math_path).parent.name, "kind": "non_math", "texts": texts, "golds": list(keep["targets"]),
        "answer_ids": None, "max_new_tokens": nm["max_new_tokens"],
    })
    return targets


def run_transfer(
    model: str, model_dir, tasks: list[str], pairs_paths, cache_paths, key_paths, svamp_path, non_math_path,
    transfer: dict, prompts_cfg: dict, compute: dict, seed: int, out_table, out_html, out_png,
) -> None:
    """Do the key heads of one operator matter for the others, other number formats, SVAMP, and not for
    non-math questions? For each source task X, X's key heads are mean-ablated (with X's counterfactual
    mean, at END and every generated position) on every target set, against as many random heads
    (`transfer.random_seeds` draws, same mean); greedy answers are scored against the gold answers.
    `retained` is the share of the items the unablated model gets right that stay right (the paper's
    "accuracy after knockout" on data filtered to correct answers)."""
    from . import plots
    from .ablation import greedy_end_sets, random_heads
    from .evaluation import qa_correct, settled_number

    lm = _load(model_dir, compute)
    # the empty set ablates nothing; any mean will do
    sets = [{"source": "none", "heads": "none", "seed": -1, "nodes": [], "mean": tasks[0]}]
    means = {}
    for task, cache_path, key_path in zip(tasks, cache_paths, key_paths, strict=True):
        cache = load_file(str(cache_path))
        means[task] = AlignedMean(cache["cf_mean_heads"], cache["cf_mean_mlps"])
        key = pd.read_parquet(key_path)
        key_heads = [(int(l), int(h)) for l, h in key.loc[key["component"] == "head", ["layer", "head"]].to_numpy()]
        sets.append({"source": task, "heads": "key", "seed": -1, "nodes": key_heads, "mean": task})
        for s in range(transfer["random_seeds"]):
            drawn = random_heads(lm.n_layers, lm.n_heads, len(key_heads), seed=seed * 1000 + s, exclude=key_heads)
            sets.append({"source": task, "heads": "random", "seed": s, "nodes": drawn, "mean": task})
    set_means = [means[s["mean"]] for s in sets]
    rows = []
    for target in _transfer_targets(lm, tasks, pairs_paths, svamp_path, non_math_path, transfer, prompts_cfg, seed):
        # numbers compared by value (an answer stops once its number is settled); the non-math answers by text
        non_math = target["kind"] == "non_math"
        judge = qa_correct if non_math else None
        result = greedy_end_sets(
            lm, target["texts"], [s["nodes"] for s in sets], set_means, target["max_new_tokens"],
            batch_size=compute["batch_size"], settled=None if non_math else settled_number(lm.tokenizer),
        )
        correct = _answers_correct(lm.tokenizer, result.tokens, target["golds"], judge)  # [n_sets, n]
        base = correct[0]
        first = None
        if target["answer_ids"] is not None:
            first = (result.first_tokens == target["answer_ids"][None]).float().mean(1).numpy()
        for i, s in enumerate(sets):
            rows.append({
                "source": s["source"], "heads": s["heads"], "seed": s["seed"], "n_heads": len(s["nodes"]),
                "nodes": " ".join(f"L{l}H{h}" for l, h in s["nodes"]), "target": target["name"],
                "target_kind": target["kind"], "n": len(base), "n_base_correct": int(base.sum()),
                "accuracy": float(correct[i].mean()), "base_accuracy": float(base.mean()),
                "retained": float(correct[i][base].mean()) if base.any() else float("nan"),
                "first_token_accuracy": float(first[i]) if first is not None else float("nan"),
            })
        print(f"{target['name']}: base {base.mean():.3f} on {len(base)}")
    table = pd.DataFrame(rows)
    meta = _meta(model_dir, "transfer", tasks=tasks, transfer=transfer, prompts=prompts_cfg, seed=seed)
    write_parquet(table, out_table, meta)
    write_html_table(plots.transfer_summary(table), out_html, f"{model}: knockout transfer (retained accuracy, %)")
    plots.transfer_heatmap(table, f"{model}: key heads of one operator knocked out on other data", out_png)



# ---------------------------------------------------------------------------------------------------
# Stage 4: precise SFT against full fine-tuning, and the evaluation (the paper's Table 1)

TRAINED_FILE = "trained.safetensors"  # precise, random_heads, lora: the deltas
FULL_DIR = "model"  # full: a whole HF model directory
STATS_FILE = "stats.json"


def select_finetune_nodes(method: str, effects_paths: dict, finetune: dict, n_layers: int, n_heads: int,
                          seed: int) -> tuple[list, list]:
    """(heads, mlp layers) a head method trains: precise, the top `finetune.heads` heads (and top
    `finetune.mlps` MLPs) by patching effect averaged over the tasks; random_heads, as many heads drawn at
    random (seeded) among the others, and no MLPs."""
    from .ablation import random_heads

    ranked, ranked_mlps = ranked_nodes(effects_paths)
    n = finetune["heads"]
    if n > len(ranked):
        raise ValueError(f"config key 'finetune.heads': {n} heads asked for, the model has {len(ranked)}")
    top = ranked[:n]
    if method == "random_heads":
        return random_heads(n_layers, n_heads, n, seed=seed, exclude=top), []
    return top, ranked_mlps[: finetune["mlps"]]


def ranked_nodes(effects_paths: dict) -> tuple[list[tuple[int, int]], list[int]]:
    """Every head as (layer, head) and every MLP layer, ranked by patching effect averaged over the tasks
    whose effects tables are given (most negative first)."""
    effects = {t: pd.read_parquet(p) for t, p in effects_paths.items()}
    heads = [(int(l), int(h)) for l, h in fx.rank_across_tasks(effects, "head")[["layer", "head"]].to_numpy()]
    return heads, fx.rank_across_tasks(effects, "mlp")["layer"].astype(int).tolist()


def finetune_examples(lm, data: dict, seed: int) -> list[tuple[str, str]]:
    """(prompt, target) pairs from GSM8K train: the question in the configured style, the worked solution
    ending "The answer is N." as the target (zero-shot: the model learns the format, not from examples)."""
    from .data import load_gsm8k, math_prompts, subsample

    train = subsample(load_gsm8k(data["file"]), data["n"], seed)
    frame = math_prompts(train, (), data["style"], lm.tokenizer)
    return list(zip(frame["prompt"], frame["target"]))


def fitting_examples(tokenizer, examples: list[tuple[str, str]], max_length: int) -> list[tuple[str, str]]:
    """The examples whose prompt, target and eos fit in `max_length` tokens (no truncated question)."""
    def n_tokens(text):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    fit = [(p, t) for p, t in examples if n_tokens(p) + n_tokens(t) + 2 <= max_length]  # + bos/eos
    print(f"{len(fit)} of {len(examples)} training examples fit in max_length={max_length} tokens")
    if not fit:
        raise ValueError(f"config key 'finetune.train.max_length': no training example fits in {max_length} tokens")
    return fit


def run_finetune(model: str, model_dir, method: str, effects_paths: dict, data_path, finetune: dict, compute: dict,
                 seed: int, out_dir, checkpoint_root) -> None:
    """Fine-tune with one method and save what was trained into `out_dir`: the deltas (`trained.safetensors`)
    or, for full, a model directory (`model/`), plus `stats.json` (trainable parameters, step times, peak
    memory, losses). A killed job resumes from `checkpoint_root/<method>-<hash of the settings>`."""
    from .finetune import parse_method, prepare, train

    lm = _load(model_dir, compute)
    spec: dict = {"method": method}
    if method in ("precise", "random_heads"):
        heads, mlps = select_finetune_nodes(method, effects_paths, finetune, lm.n_layers, lm.n_heads, seed)
        spec |= {"heads": [list(h) for h in heads], "mlp_layers": mlps, "train_kv": finetune["train_kv"],
                 "grad_scale": finetune["grad_scale"], "delta_dtype": "float32" if lm.dtype != torch.float32 else "model"}
    elif method == "lora":
        spec["lora"] = finetune["lora"]
    parse_method(spec)  # fail on a bad method before loading data
    train_cfg = {**finetune["train"], "lr": finetune["lr"][method], "seed": seed}
    examples = finetune_examples(lm, {**finetune["data"], "file": data_path}, seed)
    examples = fitting_examples(lm.tokenizer, examples, train_cfg["max_length"])
    settings = {"spec": spec, "train": train_cfg, "data": finetune["data"], "model": model_record(model_dir).get("sha256")}
    checkpoints = Path(checkpoint_root) / f"{method}-{config_hash(settings)[:12]}"
    ft = prepare(lm, spec, seed)
    start = time.perf_counter()
    stats = train(ft, examples, train_cfg, checkpoint_dir=checkpoints)
    meta = _meta(model_dir, "finetune", method=method, settings=settings)
    record = save_training_run(ft=ft, stats=stats, wall_s=time.perf_counter() - start, out_dir=out_dir,
                               checkpoints=checkpoints, meta=meta,
                               record={"n_examples": len(examples), "spec": spec, "train": train_cfg})
    print(f"{method}: {stats.n_trainable} trainable parameters, {record['mean_step_s']:.2f} s/step, "
          f"final loss {stats.losses[-1]:.3f}")


def save_training_run(*, ft, stats, wall_s: float, out_dir, checkpoints, meta: dict, record: dict,
                      write_extra=None) -> dict:
    """Write a finished training run into `out_dir` atomically (built in a temporary sibling, renamed into
    place): what was trained (`trained.safetensors`, or `model/` for full), whatever `write_extra(tmp_dir)`
    adds, and `stats.json` (the TrainStats, `record`, wall time, mean step time, artifact bytes, provenance,
    model size, device and dtype). Then remove the run's checkpoints: a rerun starts afresh. Returns the
    stats record."""
    from .finetune import save_trained

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_trained(ft, tmp / (FULL_DIR if ft.method.name == "full" else TRAINED_FILE), {"provenance": meta})
    if write_extra is not None:
        write_extra(tmp)
    full = {**stats.to_dict(), **record, "wall_s_this_run": wall_s,
            "mean_step_s": float(np.mean(stats.step_times_s)) if stats.step_times_s else float("nan"),
            "artifact_bytes": _tree_bytes(tmp), "provenance": meta, "n_parameters": ft.lm.describe()["n_parameters"],
            "device": str(ft.lm.device), "dtype": str(ft.lm.dtype)}
    (tmp / STATS_FILE).write_text(json.dumps(full, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    shutil.rmtree(checkpoints, ignore_errors=True)
    return full


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def load_finetuned(model_dir, finetune_dir, compute: dict) -> LoadedModel:
    """The base model (finetune_dir None) or a fine-tuned one, ready for evaluation (no hooks)."""
    from .finetune import load_trained

    if finetune_dir is None:
        return _load(model_dir, compute)
    finetune_dir = Path(finetune_dir)
    trained = finetune_dir / FULL_DIR if (finetune_dir / FULL_DIR).is_dir() else finetune_dir / TRAINED_FILE
    return load_trained(model_dir, trained, device=compute["device"], dtype=compute["dtype"])


def run_evaluate(model: str, model_dir, method: str, finetune_dir, data_paths: dict, evaluation: dict,
                 compute: dict, seed: int, out_paths: dict) -> None:
    """Evaluate one model (base or fine-tuned by `method`) on every data set: per-item rows per data set
    (math: id, prompt, output, extracted, gold, correct; choice: prediction, correct; perplexity: one row)."""
    from . import data as ds
    from . import evaluation as ev

    lm = load_finetuned(model_dir, finetune_dir, compute)
    bs = evaluation["batch_size"]
    shots = ds.few_shot_examples(ds.load_gsm8k(data_paths["gsm8k_train"]), evaluation["n_shots"], seed)
    for name in EVAL_DATASETS:
        cfg, path = evaluation[name], data_paths[name]
        if name in ("gsm8k", "svamp"):
            items = ds.subsample((ds.load_gsm8k if name == "gsm8k" else ds.load_svamp)(path), cfg["n"], seed)
            items = ds.math_prompts(items.drop(columns=["solution"], errors="ignore"), shots, evaluation["style"],
                                    lm.tokenizer)
            rows = ev.evaluate_generation(lm, items, cfg["max_new_tokens"], bs, progress=f"{method} {name}")
        elif name in ("social_iqa", "strategyqa"):
            items = ds.subsample(ds.load_bigbench_choice(path), cfg["n"], seed)
            rows = ev.evaluate_choice(lm, items, bs, progress=f"{method} {name}")
        elif name == "qa_wikidata":
            items = ds.subsample(ds.load_bigbench_generation(path), cfg["n"], seed)
            rows = ev.evaluate_qa_generation(lm, items, cfg["max_new_tokens"], bs, progress=f"{method} {name}")
        else:
            result = ev.perplexity(lm, ds.load_text(path), cfg["max_length"], cfg["stride"], cfg["max_tokens"],
                                   progress=f"{method} {name}")
            rows = pd.DataFrame([result])
        rows = rows.assign(method=method, dataset=name)
        meta = _meta(model_dir, "evaluate", method=method, dataset=name, evaluation=evaluation, seed=seed)
        write_parquet(rows, out_paths[name], meta)
        if "correct" in rows:
            print(f"{method} {name}: accuracy {rows['correct'].mean():.3f} on {len(rows)}")
        else:
            print(f"{method} {name}: perplexity {rows['perplexity'].iloc[0]:.2f}")


def eval_summary(eval_paths: dict, stats_paths: dict, confidence: float) -> pd.DataFrame:
    """The paper's Table 1: one row per method (base first), per data set the accuracy with its Wilson
    interval (WikiText-2: perplexity), and the training cost: trainable parameters, mean step time, train
    wall time, peak memory, optimizer state and saved artifact sizes."""
    from .evaluation import accuracy_interval

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
                row |= {f"{name}_ppl": float(frame["perplexity"].iloc[0]), f"{name}_tokens": int(frame["n_tokens"].iloc[0])}
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
        }
        rows.append(row)
    return pd.DataFrame(rows)


def markdown_table(summary: pd.DataFrame, datasets: list[str]) -> str:
    """Table 1 as Markdown: accuracies as 'value [low, high]', perplexity, trainable parameters, step time."""
    head = ["method", *[d for d in datasets if d != "wikitext"], "WikiText-2 ppl", "trainable params", "s/step",
            "train s", "peak MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in summary.to_dict("records"):
        cells = [r["method"]]
        cells += [f"{r[d]:.1f} [{r[d + '_low']:.1f}, {r[d + '_high']:.1f}]" for d in datasets if d != "wikitext"]
        cells += [f"{r.get('wikitext_ppl', float('nan')):.2f}", f"{r['trainable_params']:,}",
                  f"{r['mean_step_s']:.2f}", f"{r['train_time_s']:.0f}", f"{r['peak_memory_mb']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_summarize_eval(model: str, methods: list[str], eval_paths: dict, stats_paths: dict, confidence: float,
                       out_table, out_md, out_html, out_png) -> None:
    from . import plots
    from .io import atomic_path

    summary = eval_summary(eval_paths, stats_paths, confidence)
    datasets = list(next(iter(eval_paths.values())))
    meta = provenance(stage="summarize_eval", model=model, methods=methods, confidence=confidence)
    write_parquet(summary, out_table, meta)
    with atomic_path(out_md) as tmp:
        Path(tmp).write_text(f"# {model}: base vs fine-tuned (accuracy %, {100 * confidence:.0f}% Wilson intervals)\n\n"
                             + markdown_table(summary, datasets))
    write_html_table(summary, out_html, f"{model}: evaluation of every fine-tuning method")
    plots.eval_summary(summary, [d for d in datasets if d != "wikitext"],
                       f"{model}: accuracy after fine-tuning on GSM8K ({100 * confidence:.0f}% intervals)", out_png)
