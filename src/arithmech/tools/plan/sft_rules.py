"""Cost functions of the rules that fine-tune and evaluate (finetune, evaluate, the study): training steps
over the examples the job keeps, greedy and teacher-forced scoring of the evaluation sets, the study's
formats and off-target sets. Each takes (setting, model, job) and returns the job's `Cost`.

    finetune(setting, setting.models["llama2-7b"], Job("finetune", (("model", "llama2-7b"), ("method", "full"))))
"""

from __future__ import annotations

import math

from arithmech.data.answers import answer_sentence
from arithmech.data.eval_sets import REGISTRY
from arithmech.data.formatting import math_example, qa_prompt
from arithmech.intervention.batching import SHARED_PREFIX_MIN_TOKENS
from arithmech.tools.cluster import job_resources
from arithmech.tools.plan.costmodel import (
    CUDA_CONTEXT_BYTES,
    HOST_BASE_BYTES,
    Model,
    Work,
    choice_scoring,
    expected_longest,
    forward_flops,
    forwards,
    generation,
    inference_bytes,
    rank_batch,
    scoring,
    trained_params,
    training,
    training_bytes,
    training_steps,
)
from arithmech.tools.plan.dryrun import Job
from arithmech.tools.plan.errors import PlanError
from arithmech.tools.plan.jobcost import Cost, Setting, gpu_cost
from arithmech.tools.plan.workload import (
    SetStats,
    choice_stats,
    data_path,
    gsm8k_examples,
    read_records,
    sample_records,
    svamp_questions,
)


def _millions(count: float) -> str:
    return f"{count / 1e9:.3g}e9" if count >= 1e9 else f"{count / 1e6:.3g}M"


def finetune_lengths(s: Setting, m: Model) -> list[tuple[int, int]]:
    """(tokens, target tokens) of every GSM8K training example as fine-tuning encodes it (prompt with BOS,
    " " + solution, eos; chat style: the template's headers) that fits in max_length: the job drops the
    others (`sft.training.fitting_examples`), and so fails when none fits."""
    data, max_length = s.config["finetune"]["data"], s.config["finetune"]["train"]["max_length"]
    examples = gsm8k_examples(data_path(data["file"], root=s.root))
    if data["n"] is not None:
        examples = examples[:data["n"]]
    chat = m.tokens.chat.tokens(2) if data["style"] == "chat" else 0
    pairs = [math_example(q, sol) for q, sol in examples]  # plain style; chat adds its template's tokens
    prompts = m.tokens.counts([prompt for prompt, _ in pairs])
    targets = m.tokens.counts([target for _, target in pairs], special=False)
    lengths = [(p + t + 1 + chat, t + 1) for p, t in zip(prompts, targets) if p + t + 1 + chat <= max_length]
    if not lengths:
        raise PlanError(f"config key 'finetune.train.max_length': no training example of {data['file']} fits in "
                        f"{max_length} tokens of {m.name}'s tokenizer (the finetune job would fail)")
    return lengths


def finetune(s: Setting, m: Model, job: Job) -> Cost:
    """Fine-tuning on GSM8K train with one method: forward and backward of every step's examples, padded to
    the longest of each micro-batch."""
    cfg, method = s.config["finetune"], job.get("method")
    train = cfg["train"]
    lengths = s.memo(("finetune", m.name), lambda: finetune_lengths(s, m))
    steps, sequences = training_steps(train, examples=len(lengths))
    padded = expected_longest([n for n, _ in lengths], train["batch_size"])
    targets = sum(t for _, t in lengths) / len(lengths)
    trained, full = trained_params(m.shape, method=method, heads=cfg["heads"], train_kv=cfg["train_kv"],
                                   mlps=cfg["mlps"] if method == "precise" else 0, lora=cfg["lora"])
    work = training(m, sequences=sequences, seq=padded, logits=targets, trained=trained, full=full, steps=steps,
                    batch=train["batch_size"], optimizer=train["optimizer"])
    longest = max(n for n, _ in lengths)
    ranks = training_ranks(m, job)
    batch = rank_batch(train, ranks)
    gpu = training_bytes(m.shape, weights=m.weight_bytes, trained=trained, full=full, batch=batch,
                         seq=longest, logits=batch * max(t for _, t in lengths),
                         dtype_bytes=m.dtype_bytes, optimizer=train["optimizer"], ranks=ranks)
    return Cost(work=work, gpu_bytes=gpu + CUDA_CONTEXT_BYTES, host_bytes=m.weight_bytes + HOST_BASE_BYTES,
                note=f"{steps} steps x {sequences // steps} examples x {padded:.0f} tokens, "
                     f"{_millions(trained)} trained{parallel_note(full, ranks)}", ranks=ranks)


def training_ranks(m: Model, job: Job) -> int:
    """The processes a training job runs: one per GPU of its rule's resources (`sft.distributed`); one on the CPU
    (`gpus: 0`)."""
    return max(1, int(job_resources(m.resources, job.rule).get("gpus", 1)))


def parallel_note(full: bool, ranks: int) -> str:
    return "" if ranks == 1 else f", {ranks} ranks ({'FSDP2 shards' if full else 'data parallel'})"


def _solved_shot(question: str, answer: str) -> str:
    """One solved few-shot block as `qa_prompt` writes it ("Question: q\\nAnswer: a\\n\\n"): a one-shot
    prompt less the prompt of its (empty) question."""
    return qa_prompt("", [(question, answer)]).removesuffix(qa_prompt(""))


def _math_prompt(s: Setting, m: Model) -> tuple[float, float]:
    """(shared few-shot prefix, own tokens) of a math question: `evaluation.n_shots` solved GSM8K train
    examples, then "Question: ...\\nAnswer:" (chat style: the template's headers per message)."""
    cfg = s.config["evaluation"]
    examples = s.memo(("shots", m.name), lambda: gsm8k_examples(data_path(s.config["finetune"]["data"]["file"],
                                                                          root=s.root)))
    n, chat = cfg["n_shots"], cfg["style"] == "chat"
    template = m.tokens.chat.tokens(2 * n) if chat else 0  # the shots' messages and the prompt's fixed part
    own = m.tokens.chat.per_message if chat else 0  # the question's message
    shot = m.tokens.mean([_solved_shot(q, a) for q, a in sample_records(examples)], special=False)
    return 1 + template + n * shot, own


def evaluate(s: Setting, m: Model, job: Job) -> Cost:
    """One model (base or fine-tuned) on one evaluation set, by the set's kind: math (greedy solutions after
    few-shot examples, `max_new_tokens` steps), choice (log-likelihood of every choice), qa (greedy short
    answers), perplexity (sliding windows)."""
    name, bs, sh = job.get("dataset"), s.config["evaluation"]["batch_size"], m.shape
    cfg, stats, kind = s.config["evaluation"][name], s.eval_set(m, name), REGISTRY[name].kind
    n = stats.items if cfg.get("n") is None else min(cfg["n"], stats.items)
    if kind == "math":
        prefix, chat = _math_prompt(s, m)
        own, steps = stats.question + chat, cfg["max_new_tokens"]
        shared = prefix if prefix >= SHARED_PREFIX_MIN_TOKENS else 0
        work = generation(m, rows=n, prompt=prefix + own, steps=steps, batch=bs, shared=shared)
        act = inference_bytes(sh, rows=bs, seq=own, kv=prefix + own + steps, logits=bs, dtype_bytes=m.dtype_bytes)
        note = f"{n} items x {steps} steps after {prefix:.0f} shared tokens"
    elif kind == "choice":
        work = choice_scoring(m, items=n, context=stats.question, choices=stats.choices, choice=stats.choice,
                              batch=bs)
        rows = bs * stats.choices
        act = inference_bytes(sh, rows=rows, seq=stats.choice, kv=stats.question + stats.choice,
                              logits=rows * stats.choice, dtype_bytes=m.dtype_bytes)
        note = f"{n} items x {stats.choices:.3g} choices"
    elif kind == "qa":
        steps = cfg["max_new_tokens"]
        work = generation(m, rows=n, prompt=stats.question, steps=steps, batch=bs)
        act = inference_bytes(sh, rows=bs, seq=stats.question, kv=stats.question + steps, logits=bs,
                              dtype_bytes=m.dtype_bytes)
        note = f"{n} items x {steps} steps"
    else:
        work, act, note = _perplexity(m, stats, cfg)
    return gpu_cost(m, work=work, activations=act, note=note)


def _perplexity(m: Model, stats: SetStats, cfg: dict) -> tuple[Work, float, str]:
    """Sliding-window perplexity: the first window `max_length` tokens, then one window per `stride` tokens,
    each a forward of max_length tokens with the logits of its new ones."""
    length, stride = cfg["max_length"], cfg["stride"]
    n = stats.text if cfg.get("max_tokens") is None else min(cfg["max_tokens"], stats.text)
    windows = 1 + math.ceil(max(0.0, n - length) / stride)
    work = Work(windows * forward_flops(m.shape, new=length, logits=stride + 1)) + forwards(m, windows)
    act = inference_bytes(m.shape, rows=1, seq=length, kv=length, logits=length, dtype_bytes=m.dtype_bytes)
    return work, act, f"{n:.0f} tokens in {windows} windows of {length}"


def _format_tokens(s: Setting, m: Model, name: str) -> tuple[float, float, float]:
    """(shared few-shot prefix, own prompt, target) tokens of a study format's items (`design.build_items`):
    `study.n_shots` solved lines, the query line, the answer and the separator's end ("68.")."""
    from arithmech.data.arithmetic import render
    from arithmech.sft.design import answer
    from arithmech.sft.study_config import Format, study_formats

    fmt = Format.from_config(name, study_formats(s.config["study"], name)[name])
    sep = s.config["prompts"]["shot_separator"]
    a, b = fmt.a_range[1] * (fmt.b_range[1] if fmt.task == "division" else 1), fmt.b_range[1]
    line, result = render(fmt.template, a=a, op=fmt.operator, b=b).text, str(answer(fmt.task, a, b))
    shots = (line + result + sep) * s.config["study"]["n_shots"]
    end = sep.rstrip("\n") or sep
    tokens = m.tokens
    return tokens.count(shots), tokens.count(line, special=False), tokens.count(result + end, special=False)


def _trained_format(s: Setting, m: Model) -> str:
    """The trained format's name: study.train_format, or with `auto` (chosen only once the base model is
    measured) the candidate with the most tokens, so that the plan errs on the side of cost."""
    from arithmech.sft.study_config import AUTO

    study = s.config["study"]
    if study["train_format"] != AUTO:
        return study["train_format"]
    return s.memo(("trained format", m.name), lambda: max(
        study["format_choice"]["candidates"], key=lambda name: sum(_format_tokens(s, m, name))))


def study_format(s: Setting, m: Model, job: Job) -> Cost:
    """The base model on `format_choice.items` validation items of every candidate (and of a named format
    that is no candidate), teacher-forced, one shared few-shot prefix per format."""
    from arithmech.sft.study_config import measured_formats

    study, bs, sh = s.config["study"], s.batch(), m.shape
    n = study["format_choice"]["items"]
    work, longest = Work(), 0.0
    names = list(measured_formats(study))
    for name in names:
        prefix, own, target = _format_tokens(s, m, name)
        work += scoring(m, items=n, shared=prefix, rest=own + target, targets=target, batch=bs)
        longest = max(longest, prefix + own + target)
    act = inference_bytes(sh, rows=bs, seq=longest, kv=longest, logits=bs * 4, dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act, note=f"{len(names)} formats x {n} items")


def study_train(s: Setting, m: Model, job: Job) -> Cost:
    """One study run: training on the trained format's train split, with its validation split and a test
    subset scored (teacher-forced) at every learning-curve point."""
    study, arm = s.config["study"], job.get("arm")
    train, sh = study["train"], m.shape
    prefix, own, target = _format_tokens(s, m, _trained_format(s, m))
    steps, sequences = training_steps(train, examples=study["splits"]["train"])
    trained, full = trained_params(sh, method=arm, heads=study["heads"], train_kv=study["kv"] == "shared",
                                   mlps=study["mlps"] if arm == "precise_mlp" else 0, lora=study["lora"])
    seq = prefix + own + target
    work = training(m, sequences=sequences, seq=seq, logits=target, trained=trained, full=full, steps=steps,
                    batch=train["batch_size"], optimizer=train["optimizer"])
    points = math.ceil(steps / study["curve"]["every"])
    scored = study["splits"]["validation"] + study["curve"]["test_items"]
    work += scoring(m, items=scored, shared=prefix, rest=own + target, targets=target, batch=s.batch()).times(points)
    ranks = training_ranks(m, job)
    batch = rank_batch(train, ranks)
    gpu = training_bytes(sh, weights=m.weight_bytes, trained=trained, full=full, batch=batch, seq=seq,
                         logits=batch * target, dtype_bytes=m.dtype_bytes, optimizer=train["optimizer"], ranks=ranks)
    return Cost(work=work, gpu_bytes=gpu + CUDA_CONTEXT_BYTES, host_bytes=m.weight_bytes + HOST_BASE_BYTES,
                note=f"{steps} steps x {sequences // steps} items, {_millions(trained)} trained"
                     f"{parallel_note(full, ranks)}; {points} curve points", ranks=ranks)


def study_evaluate(s: Setting, m: Model, job: Job) -> Cost:
    """One study model on every format's test items (teacher-forced) and, for the base model and chosen runs
    (or all with off_target.runs: all), the off-target sets; a trained model is compared with the base
    model, which is loaded too."""
    study, bs, sh = s.config["study"], s.batch(), m.shape
    arm, run = job.get("arm"), job.get("run")
    from arithmech.sft.study_config import study_formats

    work, items, longest = Work(), 0, 0.0
    trained = _trained_format(s, m)
    for name in study_formats(study, trained):
        n = study["splits"]["test"] if name == trained else study["transfer_test"]
        prefix, own, target = _format_tokens(s, m, name)
        work += scoring(m, items=n, shared=prefix, rest=own + target, targets=target, batch=bs)
        items, longest = items + n, max(longest, prefix + own + target)
    act = inference_bytes(sh, rows=bs, seq=longest, kv=longest, logits=bs * 4, dtype_bytes=m.dtype_bytes)
    note = f"{items} test items"
    if study["off_target"]["runs"] == "all" or run in ("base", "chosen"):
        off, off_act = _off_target(s, m, compare=arm != "base")
        work, act, note = work + off, max(act, off_act), note + " + off-target sets"
    return gpu_cost(m, work=work, activations=act, models=1 if arm == "base" else 2, note=note)


def _off_target(s: Setting, m: Model, *, compare: bool) -> tuple[Work, float]:
    """The study's off-target scores (`sft.scoring.off_target_rows`): GSM8K and SVAMP solutions
    teacher-forced, two choice sets, qa_wikidata answers, WikiText-2 windows (with the base model's too when
    `compare`)."""
    cfg, bs, sh, tokens = s.config["study"]["off_target"], s.batch(), m.shape, m.tokens
    files = {name: data_path(path, root=s.root) for name, path in cfg["files"].items()}
    chat = tokens.chat.tokens(2) if cfg["style"] == "chat" else 0
    gsm = s.memo(("gsm8k test", m.name), lambda: gsm8k_examples(files["gsm8k"]))
    solved = tokens.mean(["".join(math_example(q, a)) for q, a in sample_records(gsm)]) + chat
    work = scoring(m, items=min(cfg["gsm8k_n"], len(gsm)), shared=0, rest=solved, targets=solved / 2, batch=bs)
    svamp = svamp_questions(files["svamp"])
    asked = tokens.mean(["".join(math_example(q, answer_sentence(a))) for q, a in sample_records(svamp)]) + chat
    work += scoring(m, items=min(cfg["svamp_n"], len(svamp)), shared=0, rest=asked, targets=8, batch=bs)
    for name in ("social_iqa", "strategyqa"):
        st = s.memo(("choice", m.name, name),
                    lambda: choice_stats(read_records(files[name]), tokens=tokens, source=name))
        work += choice_scoring(m, items=min(cfg[f"{name}_n"], st.items), context=st.question, choices=st.choices,
                               choice=st.choice, batch=bs)
    qa = tokens.mean([r["input"] for r in sample_records(read_records(files["qa_wikidata"]))])
    work += generation(m, rows=cfg["qa_wikidata_n"], prompt=qa, steps=cfg["qa_max_new_tokens"], batch=bs)
    window = cfg["wikitext"]["window"]
    windows = math.ceil(cfg["wikitext"]["max_tokens"] / window)
    wikitext = Work(windows * forward_flops(sh, new=window, logits=window)) + forwards(m, windows)
    work += wikitext.times(2 if compare else 1)
    act = inference_bytes(sh, rows=bs, seq=solved, kv=solved, logits=bs * solved / 2, dtype_bytes=m.dtype_bytes)
    return work, max(act, inference_bytes(sh, rows=1, seq=window, kv=window, logits=3 * window,
                                          dtype_bytes=m.dtype_bytes))


