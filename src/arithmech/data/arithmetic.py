"""Reference/counterfactual prompt pairs for the four arithmetic operators.

A reference prompt is an optional few-shot prefix of solved lines plus a query line, e.g. with 2 shots:
    "4 plus 3 is equal to 7.\n1 plus 8 is equal to 9.\n2 plus 5 is equal to "
Its counterfactual twin replaces the operator word with a null word in EVERY line (otherwise the solved
examples still name the operation). The solved answers of the few-shot lines still reveal the operation
("4 nothing 3 is equal to 7."), so `counterfactual_shots` says what the counterfactual keeps of them:
"keep" (the answers), "blank" (the lines end where their answer would start: "4 nothing 3 is equal to.")
or "zero_shot" (no few-shot lines at all). How much the counterfactual still computes (its own accuracy on
the answer, the leak) is measured by the build_pairs rule.
The prompt ends so that the next token is the answer's first token:
tokenizers that split digits and give a number's leading space its own token (LLaMA, SmolLM2) keep the
template's trailing space in the prompt; tokenizers that glue the space to the number (GPT-2 style) get the
space moved into the answer. Character spans of the query's operands and operator are recorded so later
stages can find their tokens from offsets rather than by guessing strings.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # torch is imported by the tokenizer's return_tensors; numpy and pandas by the functions that
    # use them: the config checks call operand_pairs while Snakemake parses the workflow
    import numpy as np
    import pandas as pd
    import torch

TASKS: dict[str, Callable[[int, int], int]] = {
    "addition": lambda a, b: a + b,
    "subtraction": lambda a, b: a - b,
    "multiplication": lambda a, b: a * b,
    "division": lambda a, b: a // b,
}


class PromptError(ValueError):
    """A template or tokenizer that cannot produce a prompt whose next token starts the answer."""


def operand_pairs(task: str, low: int, high: int) -> list[tuple[int, int]]:
    """All (a, b) with operands in [low, high]. Subtraction keeps a >= b (no negative answers);
    division uses a = b * q with b and q in range, so every quotient is exact."""
    values = range(low, high + 1)
    if task == "subtraction":
        return [(a, b) for a in values for b in values if a >= b]
    if task == "division":
        return [(b * q, b) for q in values for b in values if b != 0]
    if task in TASKS:
        return [(a, b) for a in values for b in values]
    raise PromptError(f"unknown task {task!r}; known: {', '.join(TASKS)}")


@dataclass(frozen=True)
class Rendered:
    text: str
    spans: dict[str, tuple[int, int]]  # field name -> (start, end) character offsets in `text`


def render(template: str, **fields: str) -> Rendered:
    """Fill `template` ({a}, {op}, {b}) and record where each field landed."""
    parts, spans, pos = [], {}, 0
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        pos += len(literal)
        if name is not None:
            if name not in fields:
                raise PromptError(f"template {template!r} has an unknown field {{{name}}}; use {{a}}, {{op}}, {{b}}")
            value = str(fields[name])
            spans[name] = (pos, pos + len(value))
            parts.append(value)
            pos += len(value)
    missing = {"a", "op", "b"} - spans.keys()
    if missing:
        raise PromptError(f"template {template!r} lacks the field(s) {sorted(missing)}")
    return Rendered("".join(parts), spans)


def split_answer(tokenizer, text: str, answer: str) -> tuple[str, int]:
    """Return (prompt, first answer token id) such that tokenize(prompt) is a prefix of
    tokenize(prompt + rest) and the next token starts the answer.

    Tries the text as is (LLaMA/SmolLM2: 'to ' -> '▁to', '▁'), then with its trailing spaces moved into
    the answer (GPT-2 style: ' 5' is one token)."""
    candidates = [(text, answer)]
    stripped = text.rstrip(" ")
    if stripped != text:
        candidates.append((stripped, text[len(stripped):] + answer))
    for prompt, rest in candidates:
        ids_prompt = tokenizer(prompt)["input_ids"]
        ids_full = tokenizer(prompt + rest)["input_ids"]
        if len(ids_full) > len(ids_prompt) and ids_full[: len(ids_prompt)] == ids_prompt:
            return prompt, ids_full[len(ids_prompt)]
    raise PromptError(f"no split of {text!r} + {answer!r} makes the next token the answer's first token")


COUNTERFACTUAL_SHOTS = ("keep", "blank", "zero_shot")


def few_shot_prefixes(template: str, task: str, shots, op: str, null: str, *, sep: str,
                      cf_shots: str) -> tuple[str, str]:
    """(the reference's, the counterfactual's) few-shot lines before a query of `template`, one line per operand
    pair of `shots`: the reference's with operator word `op` and their answers; the counterfactual's with `null`
    instead of the operator and their answers ("keep"), without them ("blank": the line ends where the answer
    would start), or none ("zero_shot"). The prompt builder and `make plan`'s prompt lengths both use it."""

    def line(x, y, word):
        return render(template, a=x, op=word, b=y).text + str(TASKS[task](x, y)) + sep

    reference = "".join(line(x, y, op) for x, y in shots)
    if cf_shots == "zero_shot":
        return reference, ""
    if cf_shots == "blank":
        return reference, "".join(render(template, a=x, op=null, b=y).text.rstrip(" ") + sep for x, y in shots)
    return reference, "".join(line(x, y, null) for x, y in shots)


def build_prompts(tokenizer, task: str, cfg: dict, seed: int) -> pd.DataFrame:
    """All reference/counterfactual pairs of one task (before checking the model's answers).

    `cfg` is the config's `prompts` section. One row per (template, operator word, a, b)."""
    import numpy as np
    import pandas as pd

    pairs = operand_pairs(task, cfg["operands"]["min"], cfg["operands"]["max"])
    sep = cfg["shot_separator"]
    cf_shots = cfg.get("counterfactual_shots", "keep")
    if cf_shots not in COUNTERFACTUAL_SHOTS:
        raise PromptError(f"prompts.counterfactual_shots must be one of {', '.join(COUNTERFACTUAL_SHOTS)}; "
                          f"got {cf_shots!r}")
    rows = []
    for t_id, template in enumerate(cfg["templates"]):
        for op_id, op in enumerate(cfg["operators"][task]):
            for a, b in pairs:
                sample = len(rows)
                rng = np.random.default_rng([seed, list(TASKS).index(task), sample])
                null = str(rng.choice(cfg["null_words"]))
                others = [p for p in pairs if p != (a, b)]
                shots = [others[i] for i in rng.choice(len(others), size=cfg["n_shots"], replace=False)]

                ref_prefix, cf_prefix = few_shot_prefixes(template, task, shots, op, null, sep=sep, cf_shots=cf_shots)
                ref_q, cf_q = render(template, a=a, op=op, b=b), render(template, a=a, op=null, b=b)
                answer = TASKS[task](a, b)
                prompt, answer_id = split_answer(tokenizer, ref_prefix + ref_q.text, str(answer))
                cf_prompt, _ = split_answer(tokenizer, cf_prefix + cf_q.text, str(answer))
                off, cf_off = len(ref_prefix), len(cf_prefix)
                rows.append(
                    {
                        "sample_id": sample,
                        "task": task,
                        "template_id": t_id,
                        "template": template,
                        "operator": op,
                        "null_word": null,
                        "a": a,
                        "b": b,
                        "answer": answer,
                        "prompt": prompt,
                        "cf_prompt": cf_prompt,
                        "answer_token_id": answer_id,
                        "answer_token": tokenizer.convert_ids_to_tokens(answer_id),
                        "n_tokens": len(tokenizer(prompt)["input_ids"]),
                        "query_start": off,
                        **{f"{k}_start": off + s for k, (s, _) in ref_q.spans.items()},
                        **{f"{k}_end": off + e for k, (_, e) in ref_q.spans.items()},
                        "cf_query_start": cf_off,
                        "cf_op_start": cf_off + cf_q.spans["op"][0],
                        "cf_op_end": cf_off + cf_q.spans["op"][1],
                    }
                )
    return pd.DataFrame(rows)


SPLITS = ("identification", "validation")
KEEP_RULES = ("full", "first_token", False)


def split_operands(df: pd.DataFrame, validation_share: float, seed: int) -> pd.Series:
    """'identification' or 'validation' for every row of `df` (columns task, a, b): the task's distinct
    operand pairs (a, b), shuffled with `seed`, give round(validation_share * n_pairs) pairs to validation and
    the rest to identification. Every template of a pair shares its split, so the validation stages score
    only operand pairs that played no part in choosing the heads or the ablation means."""
    import numpy as np
    import pandas as pd

    pairs = sorted(set(zip(df["a"], df["b"])))
    n_val = round(validation_share * len(pairs))
    if not 0 < n_val < len(pairs):
        raise PromptError(f"prompts.splits.validation_share={validation_share} leaves an empty split of the "
                          f"{len(pairs)} operand pairs")
    task = df["task"].iloc[0]
    order = np.random.default_rng([seed, list(TASKS).index(task), 7]).permutation(len(pairs))
    validation = {pairs[i] for i in order[:n_val]}
    return pd.Series(["validation" if p in validation else "identification" for p in zip(df["a"], df["b"])],
                     index=df.index)


def select_samples(
    df: pd.DataFrame, checked: pd.DataFrame, keep_only_correct: str | bool, splits: dict, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Assign every pair to a split (`split_operands`), keep the pairs the model answers correctly (the
    paper's filter), then at most `splits.max_samples[split]` of each split (a seeded draw).

    checked: `generation.check_answers` of the reference prompts, row for row.
    keep_only_correct: "full" (the whole greedy answer is the number), "first_token" (the answer's first
        token, what path patching reads) or False (keep every pair).
    Returns (kept, dropped), both with the columns of `checked`, `split` and `correct` (the answer as the
    keep rule reads it; the full answer when nothing is filtered); `dropped` adds `drop_reason`."""
    import numpy as np
    import pandas as pd

    if keep_only_correct not in KEEP_RULES:
        raise ValueError(f"prompts.keep_only_correct must be full, first_token or false; got {keep_only_correct!r}")
    df = pd.concat([df.reset_index(drop=True), checked.reset_index(drop=True)], axis=1)
    df["split"] = split_operands(df, splits["validation_share"], seed)
    df["correct"] = df["correct_first_token" if keep_only_correct == "first_token" else "correct_full"]
    wrong = ~df["correct"] if keep_only_correct else pd.Series(False, index=df.index)
    dropped, kept = [df[wrong].assign(drop_reason="wrong_answer")], []
    for i, split in enumerate(SPLITS):
        part = df[~wrong & (df["split"] == split)]
        limit = splits["max_samples"][split]
        if len(part) > limit:
            chosen = np.sort(np.random.default_rng([seed, i]).choice(len(part), size=limit, replace=False))
            over = np.ones(len(part), dtype=bool)
            over[chosen] = False
            dropped.append(part[over].assign(drop_reason="over_max_samples"))
            part = part.iloc[chosen]
        kept.append(part)
    kept = pd.concat(kept).sort_values("sample_id").reset_index(drop=True)
    return kept, pd.concat(dropped).sort_values("sample_id").reset_index(drop=True)


def split_pairs(pairs: pd.DataFrame, split: str, where: str = "pairs") -> pd.DataFrame:
    """The rows of one split (`SPLITS`) of a pairs table, in table order; a clear error when the table has
    no split column (written before splits existed: re-run build_pairs) or the split is empty."""
    if "split" not in pairs:
        raise ValueError(f"{where}: no 'split' column; the pairs table predates splits, re-run build_pairs")
    part = pairs[pairs["split"] == split].reset_index(drop=True)
    if part.empty:
        raise ValueError(f"{where}: no {split} pairs; see prompts.splits in the config")
    return part


def continuation_ids(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) whose concatenation is what the model reads: a scored choice after
    its question, a fine-tuning target after its prompt.

    The context ids are always tokenize(context) (as at inference). The continuation ids are the tail of
    tokenize(context + continuation) when that starts with the context ids: tokenized alone, a SentencePiece
    continuation (LLaMA, Mistral) would gain a word-start token (" 42" -> "▁", "▁4", "2" instead of "▁4",
    "2"). When the joint tokenization merges across the boundary (a context ending in a space), the
    continuation is tokenized on its own."""
    ctx = tokenizer(context)["input_ids"]
    full = tokenizer(context + continuation)["input_ids"]
    if len(full) > len(ctx) and full[: len(ctx)] == ctx:
        return ctx, full[len(ctx) :]
    return ctx, tokenizer(continuation, add_special_tokens=False)["input_ids"]


def encode(tokenizer, texts: list[str], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Left-padded batch with explicit position ids (so padding never shifts a sequence's positions).

    input_ids, attention_mask, position_ids: [batch, seq]; END is index -1 of every row."""
    enc = tokenizer(list(texts), padding=True, return_tensors="pt", padding_side="left")
    mask = enc["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": enc["input_ids"].to(device),
        "attention_mask": mask.to(device),
        "position_ids": positions.to(device),
    }


# ---------------------------------------------------------------------------------------------------
# Other number formats and question sets, for the transfer of knockouts (no counterfactual twins)

FORMATS = ("multi_digit", "decimal")


def _format_number(value: Decimal) -> str:
    """'3.75', '6' (not '6.0'), '0.5': the shortest exact decimal notation."""
    text = format(value.normalize(), "f")
    return text


def format_operands(task: str, fmt: str, cfg: dict, rng: np.random.Generator) -> tuple[Decimal, Decimal]:
    """One operand pair of `task` in number format `fmt`.

    multi_digit: integers in [cfg.min, cfg.max] (subtraction a >= b; division a = b * q, b and q in range).
    decimal: numbers in [cfg.min, cfg.max] with 1 or 2 decimals ("1.5 plus 2.25"); subtraction a >= b;
    multiplication a decimal times an integer in [2, 9]; division a = b * q with b a decimal and q an
    integer in [2, 9], so quotients stay exact and short."""
    if fmt == "multi_digit":
        lo, hi = int(cfg["min"]), int(cfg["max"])
        a, b = (Decimal(int(x)) for x in rng.integers(lo, hi + 1, size=2))
    elif fmt == "decimal":
        lo, hi = float(cfg["min"]), float(cfg["max"])

        def draw() -> Decimal:
            places = int(rng.integers(1, 3))
            value = Decimal(str(round(float(rng.uniform(lo, hi)), places)))
            return value if value > 0 else Decimal("0.5")

        a, b = draw(), draw()
        if task in ("multiplication", "division"):
            b = Decimal(int(rng.integers(2, 10)))
    else:
        raise PromptError(f"unknown number format {fmt!r}; known: {', '.join(FORMATS)}")
    if task == "subtraction" and a < b:
        a, b = b, a
    if task == "division":
        a, b = (a * b, a) if fmt == "decimal" else (a * b, b)  # dividend = divisor * quotient
    return a, b


def format_extremes(task: str, fmt: str, cfg: dict) -> tuple[str, str, str]:
    """The longest texts `format_operands` and `format_answer` can give `task` in number format `fmt`: (first
    operand, second operand, answer), each at its own longest, so no drawn item is longer in any of the three
    (`make plan` sizes the transfer's prompts with them). Decimals have at most 2 places; a division's dividend is
    divisor x quotient."""
    if fmt == "multi_digit":
        high, low = int(cfg["max"]), int(cfg["min"])
        longest = {"addition": (high, high, 2 * high), "subtraction": (high, high, high - low),
                   "multiplication": (high, high, high * high), "division": (high * high, high, high)}
        return tuple(str(v) for v in longest[task])
    if fmt != "decimal":
        raise PromptError(f"unknown number format {fmt!r}; known: {', '.join(FORMATS)}")
    high = float(cfg["max"])
    longest = {"addition": (high, high, 2 * high), "subtraction": (high, high, high),
               "multiplication": (high, 9, 9 * high), "division": (9 * high, high, 9)}
    return tuple(f"{v:.2f}" if isinstance(v, float) else str(v) for v in longest[task])


def format_answer(task: str, a: Decimal, b: Decimal) -> Decimal:
    ops = {"addition": a + b, "subtraction": a - b, "multiplication": a * b}
    return ops[task] if task in ops else a / b


def format_prompts(task: str, fmt: str, fmt_cfg: dict, prompts_cfg: dict, *, n: int, seed: int) -> pd.DataFrame:
    """`n` few-shot prompts of `task` with operands in number format `fmt` (see `format_operands`), using
    the config's templates, operator words, shot count and separator; the shots are in the same format.
    Columns: task, format, template_id, operator, a, b, answer (string as in the shots), gold (float),
    prompt (ends where the answer starts)."""
    import numpy as np
    import pandas as pd

    if task not in TASKS:
        raise PromptError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    rng = np.random.default_rng([seed, list(TASKS).index(task), FORMATS.index(fmt) if fmt in FORMATS else 99])
    templates, words, sep = prompts_cfg["templates"], prompts_cfg["operators"][task], prompts_cfg["shot_separator"]
    rows = []
    for i in range(n):
        t_id = int(rng.integers(len(templates)))
        op = str(words[int(rng.integers(len(words)))])

        def line(a, b):
            return render(templates[t_id], a=_format_number(a), op=op, b=_format_number(b)).text

        shots = [format_operands(task, fmt, fmt_cfg, rng) for _ in range(prompts_cfg["n_shots"])]
        prefix = "".join(line(a, b) + _format_number(format_answer(task, a, b)) + sep for a, b in shots)
        a, b = format_operands(task, fmt, fmt_cfg, rng)
        answer = format_answer(task, a, b)
        rows.append(
            {"task": task, "format": fmt, "template_id": t_id, "operator": op, "a": _format_number(a),
             "b": _format_number(b), "answer": _format_number(answer), "gold": float(answer),
             "prompt": prefix + line(a, b)}
        )
    return pd.DataFrame(rows)
