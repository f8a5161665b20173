"""What a configuration implies before any model runs: the arithmetic prompts of each task (`TaskPrompts`,
counted as if every prompt were answered correctly) and the size and mean tokens of each evaluation set
(`SetStats`), read from the vendored data files (or, for the Hub sets, from their known sizes).

    p = task_prompts(config["prompts"], "addition", TokenCounter())
    p.candidates, p.ref_tokens, p.answer_steps
    set_stats("gsm8k", config["evaluation"]["gsm8k"], root=Path("."), tokens=TokenCounter()).items
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from arithmech.data.eval_sets import REGISTRY
from arithmech.data.formatting import choice_prompt, qa_prompt
from arithmech.tools.plan.errors import PlanError
from arithmech.tools.plan.tokens import TokenCounter


@dataclass(frozen=True)
class TaskPrompts:
    """The arithmetic prompts of one task (`arithmetic.build_prompts`), as if all were answered correctly:
    counts (candidates = templates x operator words x operand pairs, then split by operand pair and capped
    by `splits.max_samples`) and mean tokens (reference and counterfactual prompts, the longest
    counterfactual: the template means' length), and the greedy steps that read every answer."""

    candidates: int
    identification: int
    validation: int
    ref_tokens: float
    cf_tokens: float
    cf_longest: float
    answer_steps: int
    templates: int


def longest_text(values) -> str:
    """The longest of `values` as text (the first of equal length)."""
    return max((str(v) for v in values), key=len)


def task_prompts(prompts: dict, task: str, tokens: TokenCounter) -> TaskPrompts:
    """`TaskPrompts` of `task` under the config's `prompts` section; lengths from the longest operands and
    answer, each template and operator word once."""
    from arithmech.data.arithmetic import TASKS, few_shot_prefixes, operand_pairs, render

    pairs = operand_pairs(task, prompts["operands"]["min"], prompts["operands"]["max"])
    templates, words = prompts["templates"], prompts["operators"][task]
    n_val = round(prompts["splits"]["validation_share"] * len(pairs))
    per_pair, caps = len(templates) * len(words), prompts["splits"]["max_samples"]
    # the pair with the longest line (operands and answer) as the query and as every shot: the builder's own
    # prompt text (`few_shot_prefixes`), at its longest
    a, b = max(pairs, key=lambda p: len(str(p[0])) + len(str(p[1])) + len(str(TASKS[task](*p))))
    answer = longest_text(TASKS[task](x, y) for x, y in pairs)
    null, sep = longest_text(prompts["null_words"]), prompts["shot_separator"]
    shots, cf_shots = [(a, b)] * prompts["n_shots"], prompts.get("counterfactual_shots", "keep")
    ref, cf = [], []
    for template in templates:
        for word in words:
            ref_prefix, cf_prefix = few_shot_prefixes(template, task, shots, word, null, sep=sep, cf_shots=cf_shots)
            ref.append(ref_prefix + render(template, a=a, op=word, b=b).text)
            cf.append(cf_prefix + render(template, a=a, op=null, b=b).text)
    cf_counts = tokens.counts(cf)
    return TaskPrompts(
        candidates=len(pairs) * per_pair, identification=min(caps["identification"], (len(pairs) - n_val) * per_pair),
        validation=min(caps["validation"], n_val * per_pair), ref_tokens=tokens.mean(ref),
        cf_tokens=sum(cf_counts) / len(cf_counts), cf_longest=max(cf_counts),
        answer_steps=1 + tokens.count(" " + answer, special=False), templates=len(templates))


@dataclass(frozen=True)
class SetStats:
    """An evaluation set's size and mean tokens: `question` (math and qa: the question or input; choice: the
    context), `choices` and `choice` (choice: choices per item, tokens of " " + a choice), `text` (perplexity:
    the whole text), `source` (the file, or the table of Hub sets)."""

    items: int
    question: float = 0.0
    choices: float = 0.0
    choice: float = 0.0
    text: float = 0.0
    source: str = ""


# Hub splits configs/paper.yaml evaluates on: their sizes (`eval_sets.EvalSet.hub_rows`) and approximate lengths
# in characters.
HUB_SETS = {
    "mmlu": {"items": REGISTRY["mmlu"].hub_rows, "question_chars": 450, "choices": 4, "choice_chars": 35,
             "split": "cais/mmlu (all) test"},
    "commonsense_qa": {"items": REGISTRY["commonsense_qa"].hub_rows, "question_chars": 75, "choices": 5,
                       "choice_chars": 10, "split": "tau/commonsense_qa validation"},
}
SAMPLE_ITEMS = 2000  # the most items of a file whose tokens are counted (evenly spaced); counts cover all items


def read_records(path: Path) -> list:
    """The records of a vendored data file: JSON Lines, a JSON list, or a BIG-bench task's examples."""
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
    except (OSError, ValueError) as err:
        raise PlanError(f"{path}: cannot read it ({err})") from err
    return data["examples"] if isinstance(data, dict) else data


def sample_records(records: list) -> list:
    """At most `SAMPLE_ITEMS` of `records`, evenly spaced: the ones whose tokens are counted."""
    step = max(1, len(records) // SAMPLE_ITEMS)
    return records[::step][:SAMPLE_ITEMS]


def gsm8k_examples(path: Path) -> list[tuple[str, str]]:
    """(question, solution) of every GSM8K record (`data.gsm8k_solution`: "The answer is N." at the end)."""
    from arithmech.data.datasets import gsm8k_solution

    return [(r["question"], gsm8k_solution(r["answer"])[0]) for r in read_records(path)]


def svamp_questions(path: Path) -> list[tuple[str, str]]:
    """(question, answer) of every SVAMP record, as `datasets.load_svamp` and the transfer format them."""
    return [(" ".join(f"{r['Body']} {r['Question']}".split()), f"{float(r['Answer']):g}")
            for r in read_records(path)]


def set_stats(name: str, cfg: dict, *, root: Path, tokens: TokenCounter) -> SetStats:
    """`SetStats` of evaluation set `name` (its config block `cfg`): from its file, or `HUB_SETS`."""
    kind = REGISTRY[name].kind
    if cfg.get("hub") is not None:
        return _hub_stats(name, tokens=tokens)
    path = data_path(cfg["file"], root=root)
    if kind == "perplexity":
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise PlanError(f"config key 'evaluation.{name}.file': cannot read {path} ({err})") from err
        return SetStats(items=1, text=_text_tokens(text, tokens), source=str(path))
    if name == "gsm8k":
        questions = [q for q, _ in gsm8k_examples(path)]
    elif name == "svamp":
        questions = [q for q, _ in svamp_questions(path)]
    else:
        records = read_records(path)
        if kind == "choice":
            return choice_stats(records, tokens=tokens, source=str(path))
        return SetStats(items=len(records), question=tokens.mean([r["input"] for r in sample_records(records)]),
                        source=str(path))
    contexts = [qa_prompt(q) for q in sample_records(questions)]
    return SetStats(items=len(questions), question=tokens.mean(contexts, special=False), source=str(path))


def _text_tokens(text: str, tokens: TokenCounter) -> float:
    if tokens.file is None:
        return tokens.count(text)
    return sum(tokens.counts(text.splitlines(keepends=True), special=False)) + 1


def choice_stats(records: list, *, tokens: TokenCounter, source: str) -> SetStats:
    """`SetStats` of a BIG-bench choice task's examples: each context as `choice_prompt` writes it, and its
    choices, each scored as the continuation " " + choice."""
    sample = sample_records(records)
    contexts = [choice_prompt(r["input"]) for r in sample]
    choices = [" " + c for r in sample for c in r["target_scores"]]
    return SetStats(items=len(records), question=tokens.mean(contexts),
                    choices=sum(len(r["target_scores"]) for r in sample) / len(sample),
                    choice=tokens.mean(choices, special=False), source=source)


def _hub_stats(name: str, *, tokens: TokenCounter) -> SetStats:
    known = HUB_SETS.get(name)
    if known is None:
        raise PlanError(f"config key 'evaluation.{name}.hub': the plan knows no size of this Hub set; give a "
                        f"file, or add it to HUB_SETS in src/arithmech/tools/plan/workload.py")
    question = tokens.estimate(qa_prompt("x" * known["question_chars"])) + 1
    return SetStats(items=known["items"], question=question, choices=known["choices"],
                    choice=tokens.estimate(" " + "x" * known["choice_chars"]),
                    source=f"{known['split']} (size from arithmech.tools.plan.HUB_SETS, lengths approximate)")


def data_path(file: str, *, root: Path) -> Path:
    """A data file named in the config: relative paths from the workflow's directory, as the rules read it."""
    path = Path(file).expanduser()
    return path if path.is_absolute() else root / path

