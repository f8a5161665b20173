"""Cost functions of the rules that find and test the mechanism (identify, validate, analyze, circuit):
the prompts' answers, the activation cache, patching, the knockout and transfer ablations, the attention
analysis, the circuits and their edges. Each takes (setting, model, job) and returns the job's `Cost`.

    knockout(setting, setting.models["llama2-7b"], Job("knockout", (("model", "llama2-7b"), ("task", "addition"))))
"""

from __future__ import annotations

import math

from arithmech.interp.protocol import operator_share
from arithmech.intervention.batching import COPIES_PER_FORWARD
from arithmech.tools.plan.costmodel import (
    LOGIT_BYTES,
    Model,
    Work,
    forward_flops,
    forwards,
    generation,
    inference_bytes,
    kv_bytes,
    set_generation,
)
from arithmech.tools.plan.dryrun import Job
from arithmech.tools.plan.jobcost import Cost, Setting, gpu_cost
from arithmech.tools.plan.shapes import Shape
from arithmech.tools.plan.workload import TaskPrompts, data_path, longest_text, svamp_questions


def build_pairs(s: Setting, m: Model, job: Job) -> Cost:
    """Greedy answers of every candidate prompt (the correct-only filter), then of the kept pairs'
    counterfactuals (the leak)."""
    p, bs = s.prompts(m, job.get("task")), s.batch()
    kept = p.identification + p.validation
    work = (generation(m, rows=p.candidates, prompt=p.ref_tokens, steps=p.answer_steps, batch=bs)
            + generation(m, rows=kept, prompt=p.cf_tokens, steps=p.answer_steps, batch=bs))
    seq = max(p.ref_tokens, p.cf_tokens)
    act = inference_bytes(m.shape, rows=bs, seq=seq, kv=seq + p.answer_steps, logits=bs, dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act,
                    note=f"{p.candidates} prompts x {p.answer_steps} steps, then {kept} counterfactuals")


def cache_bytes(shape: Shape, p: TaskPrompts, *, dtype_bytes: int) -> float:
    """The activation cache file of one task (its layout: `interp.activations`): per identification pair and
    prompt (reference, counterfactual) every head's and MLP's END output and the final residual in the model's
    dtype; per template the float32 counterfactual means at every position (the longest counterfactual's)."""
    per_state = shape.n_layers * (shape.d_attn + shape.d_model) + shape.d_model
    states = 2 * p.identification * per_state * dtype_bytes
    means = p.templates * p.cf_longest * shape.n_layers * (shape.d_attn + shape.d_model) * 4
    return states + means


def cache_activations(s: Setting, m: Model, job: Job) -> Cost:
    """Two forwards per identification pair (reference, counterfactual), capturing every node at END, and for
    the counterfactual at every position (the template means, summed in float32)."""
    p, bs, sh = s.prompts(m, job.get("task")), s.batch(), m.shape
    work = Work(p.identification * (forward_flops(sh, new=p.ref_tokens) + forward_flops(sh, new=p.cf_tokens)))
    work += forwards(m, 2 * math.ceil(p.identification / bs))
    captured = bs * p.cf_longest * sh.n_layers * (sh.d_attn + sh.d_model) * (m.dtype_bytes + 8)
    act = captured + inference_bytes(sh, rows=bs, seq=p.cf_longest, kv=p.cf_longest, logits=bs,
                                     dtype_bytes=m.dtype_bytes)
    size = cache_bytes(sh, p, dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act, loaded=size,
                    note=f"2 x {p.identification} forwards; cache file {size / 1e9:.2f} GB")


def patch_all_layers(s: Setting, m: Model, job: Job) -> Cost:
    """Direct mode: the closed form on the cached END states, no forward (the two forwards per pair are
    cache_activations'): per sample and layer the heads' changes through W_O (2 d d_attn) and every node's
    final norm and answer logit (a few d each; with prob_change the whole unembedding)."""
    sh, bs = m.shape, s.batch()
    with_probs = s.config["patching"]["metric"] == "prob_change"
    nodes = sh.n_heads + 1
    per_layer = 2 * sh.d_model * sh.d_attn + nodes * (6 * sh.d_model + (2 * sh.d_model * sh.vocab if with_probs else 0))
    samples = sum(s.prompts(m, t).identification for t in s.config["run"]["tasks"])
    act = bs * nodes * sh.d_model * 4 * 3 + (bs * nodes * sh.vocab * LOGIT_BYTES if with_probs else 0)
    largest = max(cache_bytes(sh, s.prompts(m, t), dtype_bytes=m.dtype_bytes) for t in s.config["run"]["tasks"])
    return gpu_cost(m, work=Work(samples * sh.n_layers * per_layer), activations=act, loaded=largest,
                    note=f"closed form, {samples} samples x {sh.n_layers * nodes} nodes (forwards: cache_activations)")


def patch_layer(s: Setting, m: Model, job: Job) -> Cost:
    """Total mode, one layer l of every task: per identification pair the prompt once (prefix and END), then
    each of the layer's nodes patched: END through layers l..L-1 on the prefix cache, its answer logit."""
    sh, bs = m.shape, s.batch()
    layer, copies = int(job.get("layer")), s.config["patching"]["copies_per_forward"]
    depth, nodes = sh.n_layers - layer, sh.n_heads + 1
    chunk = max(1, copies // bs)
    work, longest = Work(), 0.0
    for task in s.config["run"]["tasks"]:
        p = s.prompts(m, task)
        per_copy = (2 * sh.body_params * depth / sh.n_layers + 4 * depth * sh.d_attn * p.ref_tokens
                    + 2 * sh.d_model)
        batches = math.ceil(p.identification / bs)
        copies_cache = p.identification * nodes * kv_bytes(m, p.ref_tokens) * depth / sh.n_layers
        work += Work(p.identification * (forward_flops(sh, new=p.ref_tokens) + nodes * per_copy), copies_cache)
        work += forwards(m, batches * (2 + math.ceil(nodes / chunk) * depth / sh.n_layers))
        longest = max(longest, p.ref_tokens)
    rows = bs * min(chunk, nodes)
    act = inference_bytes(sh, rows=rows, seq=1, kv=longest + 1, logits=0, dtype_bytes=m.dtype_bytes)
    act += inference_bytes(sh, rows=bs, seq=longest, kv=longest, logits=0, dtype_bytes=m.dtype_bytes)
    largest = max(cache_bytes(sh, s.prompts(m, t), dtype_bytes=m.dtype_bytes) for t in s.config["run"]["tasks"])
    return gpu_cost(m, work=work, activations=act, loaded=largest,
                    note=f"layer {layer}: {nodes} nodes x identification pairs, END through {depth} layers")


def set_bytes(m: Model, *, batch: int, prompt: float, tail: float, steps: float,
              copies: int = COPIES_PER_FORWARD) -> float:
    """GPU memory of `ablation.greedy_end_sets` beyond the weights: the batch's prefix cache, and its
    batch x max(1, copies // batch) rows, each a copy of its text's cache with room for the answer, running
    the tail with its logits; and one layer of those copies again, as rows that have ended leave: a layer's
    kept rows are gathered into new buffers before its old ones are freed (`kvcache.RoomyLayer`)."""
    rows = batch * max(1, copies // batch)
    prefix = kv_bytes(m, batch * prompt)
    leaving = kv_bytes(m, rows * (prompt + steps)) / m.shape.n_layers
    return prefix + leaving + inference_bytes(m.shape, rows=rows, seq=min(tail, prompt), kv=prompt + steps,
                                              logits=rows, dtype_bytes=m.dtype_bytes)


def knockout_sets(ablation: dict, *, n_layers: int, n_heads: int) -> tuple[int, int]:
    """How many node sets the knockout rule scores at positions end and all: its own sets
    (`interp.nodes.knockout_node_sets`) on a stand-in ranking of every head and one key MLP (how many there are
    does not depend on which heads rank first)."""
    import pandas as pd

    from arithmech.interp.nodes import knockout_node_sets

    heads = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    effects = pd.DataFrame({"component": "head", "layer": [l for l, _ in heads], "head": [h for _, h in heads],
                            "mean_effect": [-1.0 - i for i in range(len(heads))]})
    key = pd.DataFrame({"component": ["mlp"], "layer": [0], "head": [-1]})
    return tuple(len(knockout_node_sets(effects, key, ablation, n_layers=n_layers, n_heads=n_heads, seed=0,
                                        positions=positions)) for positions in ("end", "all"))


def knockout(s: Setting, m: Model, job: Job) -> Cost:
    """Greedy answers of the validation pairs with each node set mean-ablated at END and generated positions
    (prefix cache), and of a draw of them with each set ablated at every position (per template)."""
    p, bs, ablation = s.prompts(m, job.get("task")), s.batch(), s.config["ablation"]
    end_sets, all_sets = knockout_sets(ablation, n_layers=m.shape.n_layers, n_heads=m.shape.n_heads)
    common = {"prompt": p.ref_tokens, "steps": p.answer_steps, "batch": bs}
    work, parts = Work(), []
    if "end" in ablation["positions"]:
        work += set_generation(m, texts=p.validation, sets=end_sets, tail=1, **common)
        parts.append(f"{end_sets} sets x {p.validation} pairs")
    if "all" in ablation["positions"]:
        drawn = min(ablation["all_positions_samples"], p.validation)
        work += set_generation(m, texts=drawn, sets=all_sets, tail=p.cf_longest, groups=p.templates, **common)
        parts.append(f"{all_sets} x {drawn} at every position")
    act = set_bytes(m, batch=bs, prompt=p.ref_tokens, tail=p.cf_longest, steps=p.answer_steps)
    return gpu_cost(m, work=work, activations=act, loaded=cache_bytes(m.shape, p, dtype_bytes=m.dtype_bytes),
                    note="; ".join(parts) + f", {p.answer_steps} steps")


def transfer_targets(s: Setting, m: Model) -> list[dict]:
    """The transfer's target sets (`interp.ablation.transfer_targets`): texts, mean prompt tokens (and the
    longest where prompts differ in length beyond their operands) and greedy steps of each operator's
    validation pairs, both number formats of every operator, SVAMP and the non-math control."""
    from arithmech.data.arithmetic import format_extremes, render
    from arithmech.interp.protocol import transfer_sets

    cfg, prompts, tokens = s.config["transfer"], s.config["prompts"], m.tokens
    targets = []
    for kind, task in transfer_sets(s.config["run"]["tasks"]):
        if kind == "operator":
            p = s.prompts(m, task)
            targets.append({"texts": min(cfg["max_samples"], p.validation), "prompt": p.ref_tokens,
                            "steps": p.answer_steps})
        elif kind == "svamp":
            targets.append(_svamp_target(s, m))
        elif kind == "non_math":
            targets.append(_non_math_target(s, m))
        else:  # a number format, at its longest operands and answer
            first, second, answer = format_extremes(task, kind, cfg["formats"][kind])
            lines = [render(t, a=first, op=longest_text(prompts["operators"][task]), b=second).text
                     for t in prompts["templates"]]
            shot = max(lines, key=len) + answer + prompts["shot_separator"]
            counts = tokens.counts([shot * prompts["n_shots"] + line for line in lines])
            targets.append({"texts": cfg["formats"]["n"], "prompt": sum(counts) / len(counts), "longest": max(counts),
                            "steps": 1 + tokens.count(" " + answer, special=False)})
    return targets


def _svamp_target(s: Setting, m: Model) -> dict:
    """The SVAMP target: mean prompt tokens (the work) and the longest prompt (a batch is padded to its
    longest: the memory), from the very prompts the transfer job builds (`data.formatting.svamp_prompts`)."""
    from arithmech.data.formatting import svamp_prompts

    cfg = s.config["transfer"]["svamp"]
    path = data_path(cfg["file"], root=s.root)
    items = svamp_questions(path)
    keep, texts = svamp_prompts(path, cfg, s.config["seed"])
    counts = m.tokens.counts(texts)
    steps = 1 + max(m.tokens.counts([" " + a for _, a in items], special=False))
    return {"texts": len(keep), "prompt": sum(counts) / len(counts), "longest": max(counts), "steps": steps}


def _non_math_target(s: Setting, m: Model) -> dict:
    """The non-math target, as `_svamp_target` (`data.formatting.non_math_prompts`)."""
    from arithmech.data.formatting import non_math_prompts

    cfg = s.config["transfer"]["non_math"]
    keep, texts = non_math_prompts(data_path(cfg["file"], root=s.root), cfg, s.config["seed"])
    counts = m.tokens.counts(texts)
    return {"texts": len(keep), "prompt": sum(counts) / len(counts), "longest": max(counts),
            "steps": cfg["max_new_tokens"]}


def transfer(s: Setting, m: Model, job: Job) -> Cost:
    """Greedy answers of every target set with each operator's key heads and its random layer-matched draws
    ablated (and none), on the prefix cache."""
    bs, tasks = s.batch(), s.config["run"]["tasks"]
    sets = 1 + len(tasks) * (1 + s.config["transfer"]["random_seeds"])
    copies = s.config["transfer"].get("copies_per_forward", COPIES_PER_FORWARD)
    work, act, texts = Work(), 0.0, 0
    for target in transfer_targets(s, m):
        work += set_generation(m, texts=target["texts"], sets=sets, prompt=target["prompt"], tail=1,
                               steps=target["steps"], batch=bs, copies=copies)
        longest = target.get("longest", target["prompt"])  # the memory of the batch padded to its longest prompt
        act = max(act, set_bytes(m, batch=bs, prompt=longest, tail=1, steps=target["steps"], copies=copies))
        texts += target["texts"]
    largest = max(cache_bytes(m.shape, s.prompts(m, t), dtype_bytes=m.dtype_bytes) for t in tasks)
    return gpu_cost(m, work=work, activations=act, loaded=largest, note=f"{sets} sets x {texts} prompts")


def analyze(s: Setting, m: Model, job: Job) -> Cost:
    """Two forwards per analysed validation pair (attention of every head from END with its q and k
    captured, and the MLP probes)."""
    p, bs, sh = s.prompts(m, job.get("task")), s.batch(), m.shape
    n = min(s.config["analysis"]["max_samples"], p.validation)
    scores = 2 * sh.n_layers * p.ref_tokens ** 2 * sh.d_attn  # every head's scores, recomputed from q and k
    work = Work(n * (2 * forward_flops(sh, new=p.ref_tokens) + scores)) + forwards(m, 2 * math.ceil(n / bs))
    captured = bs * p.ref_tokens * sh.n_layers * (sh.d_attn + sh.d_kv) * m.dtype_bytes
    act = captured + inference_bytes(sh, rows=bs, seq=p.ref_tokens, kv=p.ref_tokens, logits=bs,
                                     dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act, note=f"2 x {n} forwards")


def edges(s: Setting, m: Model, job: Job) -> Cost:
    """`stages.circuit.run_edges` (one job for all operators): per operator the teacher-forced items of
    `edges.max_samples` validation pairs and the ablation values' pool of every identification pair (one forward
    each), then, under each ablation (`protocol.KINDS`), the key heads' path cuts (`edges.PATH_CUTS`), one whole
    forward per item each."""
    from arithmech.interp.edges import PATH_CUTS
    from arithmech.interp.protocol import KINDS

    sh, bs, cfg = m.shape, s.batch(), s.config["circuit"]["edges"]
    cuts = len(PATH_CUTS) * len(KINDS)
    work, pairs = Work(), 0
    for task in s.config["run"]["tasks"]:
        p = s.prompts(m, task)
        seq = p.ref_tokens + p.answer_steps
        n = min(cfg["max_samples"], p.validation)
        pairs += n
        work += Work((p.identification + (1 + cuts) * n) * forward_flops(sh, new=seq))
        work += forwards(m, math.ceil(p.identification / bs) + (1 + cuts) * math.ceil(n / bs))
    p = s.prompts(m, s.config["run"]["tasks"][0])
    seq = p.ref_tokens + p.answer_steps
    act = inference_bytes(sh, rows=bs, seq=seq, kv=seq, logits=bs * p.answer_steps, dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act, note=f"{pairs} pairs x {cuts} path cuts")


# The share of the nodes a discovered circuit keeps, before any run knows it (what the later sweeps revisit).
ASSUMED_CIRCUIT_SHARE = 0.2


def discover_trials(cfg: dict, shape: Shape) -> tuple[int, int]:
    """(trials of the first sweep, of every later sweep) of `teacher_forcing.prune` for a model of `shape`: one per
    visited node; the first sweep (the highest target's, from the whole model) visits every node, or
    `max_trials` of them on a model of at least that many heads; a later sweep (the highest target's again, or a
    lower target's, from the circuit above it) the nodes still kept (ASSUMED_CIRCUIT_SHARE)."""
    nodes = shape.n_layers * (shape.n_heads + 1)
    tried = min(nodes, cfg["max_trials"]) if shape.n_layers * shape.n_heads >= cfg["max_trials"] else nodes
    return tried, math.ceil(ASSUMED_CIRCUIT_SHARE * nodes)


def discover_draws(cfg: dict, p: TaskPrompts) -> tuple[int, int, int]:
    """(pruning, selection, validation) pairs of one operator (`stages.discover`): the pruning draw of at most
    `max_samples` identification pairs outside the operands held out for the choice (`selection_samples` prompts,
    at most a third of the identification pairs), the selection draw of `selection_samples` pairs outside the
    pruning draw's operands, and `validation_samples` validation pairs."""
    held = min(cfg["selection_samples"], p.identification // 3)
    n_id = min(cfg["max_samples"], p.identification - held)
    return n_id, min(cfg["selection_samples"], p.identification - n_id), min(cfg["validation_samples"], p.validation)


def tail_trial(m: Model, p: TaskPrompts) -> float:
    """FLOPs of one teacher-forced trial (`teacher_forcing.TailTrials`) of one pair: END and the answer positions
    as one forward on the prefix cache, with their unembedding."""
    tail = 1 + p.answer_steps
    return forward_flops(m.shape, new=tail, past=p.ref_tokens - 1, logits=tail)


def tail_items(m: Model, p: TaskPrompts, texts: int, *, pool: bool = False, from_pool: bool = False) -> Work:
    """Teacher-forced items of `texts` pairs: `teacher_forcing.build_items`' whole forward (the terminator), then a
    `TailTrials`' prefix cache and clean tail, about a whole forward again; the ablation values' `pool`: the first
    forward alone (capturing every node's outputs); a draw of identification pairs taken `from_pool`
    (`TailItems.of_pairs`): the second alone."""
    whole = forward_flops(m.shape, new=p.ref_tokens + p.answer_steps, logits=0)
    return Work((1 if pool or from_pool else 2) * texts * whole)


def tail_scores(m: Model, p: TaskPrompts, *, texts: int, circuits: int, batch: int) -> Work:
    """`TailTrials.scores` of `circuits` circuits on `texts` pairs: a trial (`tail_trial`) per circuit and pair,
    a batch's pairs copied for as many circuits as `COPIES_PER_FORWARD` rows hold in one forward."""
    per_batch = math.ceil(circuits / max(1, COPIES_PER_FORWARD // batch))
    return Work(texts * circuits * tail_trial(m, p)) + forwards(m, math.ceil(texts / batch) * per_batch)


def pruning(m: Model, p: TaskPrompts, cfg: dict, *, texts: int, batch: int) -> Work:
    """The attribution's integrated-gradient steps (a trial with its backward each, about 3 trials) and the
    pruning's trials (`discover_trials`: the first sweep from the visited node's layer on, half the model on
    average; then up to max_passes - 1 more sweeps at the highest target and max_passes at each lower one, the
    whole model) on `texts` pairs of one operator."""
    first, later = discover_trials(cfg, m.shape)
    sweeps = (cfg["max_passes"] - 1) + (len(cfg["targets"]) - 1) * cfg["max_passes"]
    trial = tail_trial(m, p)
    work = Work(3 * texts * cfg["ig_steps"] * trial + texts * (first * trial / 2 + sweeps * later * trial))
    return work + forwards(m, 3 * cfg["ig_steps"] * math.ceil(texts / batch) + first + sweeps * later)


def pruning_bytes(m: Model, p: TaskPrompts, texts: int, ig_steps: int) -> float:
    """GPU memory of the attribution on `texts` pairs of one operator, its largest part: every pair's
    integrated-gradient steps as rows of one trial, with their backward (about 3 times a forward's)."""
    rows = texts * ig_steps
    return 3 * inference_bytes(m.shape, rows=rows, seq=1 + p.answer_steps, kv=p.ref_tokens + p.answer_steps,
                               logits=rows * (1 + p.answer_steps), dtype_bytes=m.dtype_bytes)


def scoring_bytes(m: Model, p: TaskPrompts, *, batch: int) -> float:
    """GPU memory of `TailTrials.scores` beyond the weights: a batch's copies, `COPIES_PER_FORWARD` rows (at least
    the batch), each with its pair's prefix cache and its tail's forward and unembedding."""
    rows, tail = max(1, COPIES_PER_FORWARD // batch) * batch, 1 + p.answer_steps
    return kv_bytes(m, rows * (p.ref_tokens + p.answer_steps)) + inference_bytes(
        m.shape, rows=rows, seq=tail, kv=p.ref_tokens + p.answer_steps, logits=rows * tail,
        dtype_bytes=m.dtype_bytes)


def discover(s: Setting, m: Model, job: Job) -> Cost:
    """`stages.discover.run_discover` for one operator, teacher-forced (`tail_trial`): one forward over the
    identification pool (the ablation values); on the pruning draw (`discover_draws`) the attribution and the
    pruning (`pruning`), then the model, the empty circuit and every target's circuit under both ablations; on the
    selection draw the same circuits; on the validation draw, under both ablations, the model, the empty circuit,
    the key circuit and its random draws, every target's circuit, the chosen one's random draws and top heads, and
    the CPR rows (`teacher_forcing.SHARES`), and the sanity checks (`sanity_draws` one-node circuits and three
    more, on `sanity_samples` pairs); and the added heads' attention (one forward per validation pair)."""
    from arithmech.interp.teacher_forcing import SHARES

    p, bs, sh, cfg = s.prompts(m, job.get("task")), s.batch(), m.shape, s.config["circuit"]["discover"]
    n_id, n_sel, n_val = discover_draws(cfg, p)
    targets, draws = len(cfg["targets"]), cfg["random_draws"]
    fitted = 2 + targets  # the model, the empty circuit, every target's
    scored = fitted + (1 + draws) + (draws + 1) + len(SHARES)
    checked = min(n_val, cfg["sanity_samples"] or n_val)
    work = tail_items(m, p, p.identification, pool=True) + tail_items(m, p, n_id + n_sel, from_pool=True)
    work += tail_items(m, p, n_val) + pruning(m, p, cfg, texts=n_id, batch=bs)
    work += tail_scores(m, p, texts=n_id, circuits=2 * fitted, batch=bs)
    work += tail_scores(m, p, texts=n_sel, circuits=fitted, batch=bs)
    work += tail_scores(m, p, texts=n_val, circuits=2 * scored, batch=bs)
    # per ablation: nothing, everything and one node ablated; the position alignment once, on the checked pairs'
    # own clean outputs (a forward) and, where they are a draw, their own prefix caches
    work += tail_items(m, p, checked) + tail_scores(m, p, texts=checked, circuits=2 * (cfg["sanity_draws"] + 2) + 1,
                                                    batch=bs)
    work += Work(n_val * forward_flops(sh, new=p.ref_tokens)) + forwards(m, math.ceil(n_val / bs))
    first, later = discover_trials(cfg, sh)
    sweeps = (cfg["max_passes"] - 1) + (targets - 1) * cfg["max_passes"]
    act = max(pruning_bytes(m, p, n_id, cfg["ig_steps"]), scoring_bytes(m, p, batch=bs))
    return gpu_cost(m, work=work, activations=act,
                    note=f"{n_id} pairs x ({first} + up to {sweeps} x {later}) trials; {scored} circuits x {n_val} "
                         f"validation pairs x 2 ablations")


def discover_shared(s: Setting, m: Model, job: Job) -> Cost:
    """`stages.discover.run_discover_shared`, teacher-forced (`tail_trial`): per operator one forward over its
    identification pool (the ablation values) and the items of its pruning, selection and validation draws
    (`discover_draws`; pruning: `max_samples` pairs in all, an equal share of each operator's draw); on every
    operator's pruning draw together the attribution and the pruning (`pruning`); the model, the empty circuit and
    every target's circuit on the pruning draws (both ablations) and on the selection draws; on
    `validation_samples` validation pairs in all, an equal share of each operator's draw, under both
    ablations, the model, the empty circuit, every target's circuit, the chosen one's random draws and the CPR rows
    (`teacher_forcing.SHARES`)."""
    from arithmech.interp.teacher_forcing import SHARES

    bs, cfg, tasks = s.batch(), s.config["circuit"]["discover"], s.config["run"]["tasks"]
    fitted = 2 + len(cfg["targets"])
    scored = fitted + cfg["random_draws"] + len(SHARES)
    work, n_pruned, pairs = Work(), 0, 0
    for task in tasks:
        p = s.prompts(m, task)
        n_id, n_sel, n_val = discover_draws(cfg, p)
        n_id = min(operator_share(cfg["max_samples"], tasks), n_id)
        n_val = min(operator_share(cfg["validation_samples"], tasks), n_val)
        n_pruned, pairs = n_pruned + n_id, pairs + n_val
        work += tail_items(m, p, p.identification, pool=True) + tail_items(m, p, n_id + n_sel, from_pool=True)
        work += tail_items(m, p, n_val) + pruning(m, p, cfg, texts=n_id, batch=bs)
        work += tail_scores(m, p, texts=n_id, circuits=2 * fitted, batch=bs)
        work += tail_scores(m, p, texts=n_sel, circuits=fitted, batch=bs)
        work += tail_scores(m, p, texts=n_val, circuits=2 * scored, batch=bs)
    p = s.prompts(m, tasks[0])
    first, later = discover_trials(cfg, m.shape)
    sweeps = (cfg["max_passes"] - 1) + (len(cfg["targets"]) - 1) * cfg["max_passes"]
    act = max(pruning_bytes(m, p, min(operator_share(cfg["max_samples"], tasks), discover_draws(cfg, p)[0]),
                            cfg["ig_steps"]),  # one operator's draw at a time
              scoring_bytes(m, p, batch=bs))
    return gpu_cost(m, work=work, activations=act,
                    note=f"{n_pruned} pairs x ({first} + up to {sweeps} x {later}) trials; {scored} circuits x "
                         f"{pairs} validation pairs x 2 ablations")


def discover_union(s: Setting, m: Model, job: Job) -> Cost:
    """`stages.discover.run_discover_union`, teacher-forced (`tail_trial`): per operator one forward over its
    identification pool (the ablation values); on its share of `validation_samples` pairs in all (of the draw `discover`
    scored, `discover_draws`), under both ablations, the model, the empty circuit, the union of the key circuits, the
    union of the discovered ones and its random draws; on its pruning draw the model, the empty circuit and the union
    under both ablations (the fit gap)."""
    bs, cfg = s.batch(), s.config["circuit"]["discover"]
    sets, work, pairs = 4 + cfg["random_draws"], Work(), 0
    for task in s.config["run"]["tasks"]:
        p = s.prompts(m, task)
        n_id, _, n_val = discover_draws(cfg, p)
        n_val = min(operator_share(cfg["validation_samples"], s.config["run"]["tasks"]), n_val)
        pairs += n_val
        work += tail_items(m, p, p.identification, pool=True) + tail_items(m, p, n_val)
        work += tail_items(m, p, n_id, from_pool=True)
        work += tail_scores(m, p, texts=n_val, circuits=2 * sets, batch=bs)
        work += tail_scores(m, p, texts=n_id, circuits=2 * 3, batch=bs)
    p = s.prompts(m, s.config["run"]["tasks"][0])
    act = scoring_bytes(m, p, batch=bs)
    return gpu_cost(m, work=work, activations=act, note=f"{sets} circuits x {pairs} validation pairs x 2 ablations")


def edge_curve(s: Setting, m: Model, job: Job) -> Cost:
    """`stages.circuit.run_edge_curve` (one job for all operators): per operator a forward over every
    identification pair (the ablation values' pool); on `edges.max_samples` identification pairs the EAP-IG edge
    scores and the nodes' integrated gradients (`ig_steps` forwards with their backward each, about 3 forwards);
    on as many validation pairs the exact edge circuits: every edge, none, and two rankings at each of the
    EDGE_SHARES sizes, one whole forward each."""
    from arithmech.interp.edges import EDGE_SHARES

    sh, bs, cfg = m.shape, s.batch(), s.config["circuit"]["edges"]
    steps = s.config["circuit"]["discover"]["ig_steps"]
    circuits = 2 + 2 * len(EDGE_SHARES)
    work, pairs = Work(), 0
    for task in s.config["run"]["tasks"]:
        p = s.prompts(m, task)
        seq = p.ref_tokens + p.answer_steps
        n_id, n_val = min(cfg["max_samples"], p.identification), min(cfg["max_samples"], p.validation)
        pairs += n_val
        work += Work(p.identification * forward_flops(sh, new=seq))
        work += Work(2 * 3 * n_id * steps * forward_flops(sh, new=seq))
        work += Work(n_val * circuits * forward_flops(sh, new=seq))
        work += forwards(m, math.ceil(p.identification / bs) + 2 * steps * math.ceil(n_id / bs)
                         + circuits * math.ceil(n_val / bs))
    p = s.prompts(m, s.config["run"]["tasks"][0])
    act = 3 * inference_bytes(sh, rows=bs * steps, seq=p.ref_tokens + p.answer_steps, kv=p.ref_tokens + p.answer_steps,
                              logits=bs * steps * p.answer_steps, dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act,
                    note=f"{pairs} validation pairs x {circuits} edge circuits; EAP-IG and node IG at {steps} steps")
