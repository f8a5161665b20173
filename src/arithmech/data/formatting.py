"""How questions are put to the model: the one place that writes the "Question: ...\nAnswer:" format, its
few-shot blocks, and the chat-template rendering of the same conversation.

  `qa_prompt`:  "{question_prefix}{shot q}{answer_prefix} {shot a}{separator}" per solved shot, then
                "{question_prefix}{question}{answer_prefix}"; by default "Question: ", "\nAnswer:", "\n\n".
                The model's continuation after the answer prefix is its answer.

Its users: math prompts (GSM8K, SVAMP), multiple-choice contexts (each choice scored as the continuation
" " + choice), and few-shot direct-answer prompts of a question set (the transfer's SVAMP and qa_wikidata).

Math prompts (solved few-shot examples from GSM8K train, `datasets.few_shot_examples`):
  style "plain":  prompt = qa_prompt(q, shots)
                  target = " " + solution
  style "chat":   prompt = the tokenizer's chat template over the messages (user: shot q, assistant: shot
                  solution) * k + (user: q), with the generation prompt (the assistant turn's header);
                  target = the rest of the template rendered with (assistant: solution) appended, i.e. the
                  solution and the template's end-of-turn marker.
The prompt is what the model is given (evaluation generates from it); the target is what fine-tuning teaches
it to continue with (loss on the target tokens only). Neither adds an end-of-sequence token: a fine-tuning
step that wants the model to stop appends `tokenizer.eos_token` itself.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

STYLES = ("plain", "chat")
QUESTION_PREFIX, ANSWER_PREFIX, SEPARATOR = "Question: ", "\nAnswer:", "\n\n"


def qa_prompt(
    question: str, shots: Sequence[tuple[str, str]] = (), question_prefix: str = QUESTION_PREFIX,
    answer_prefix: str = ANSWER_PREFIX, separator: str = SEPARATOR,
) -> str:
    """`question` after the solved `shots` [(question, answer)], in the Question/Answer format (module
    docstring): qa_prompt("2+2?") == "Question: 2+2?\nAnswer:"."""
    solved = "".join(f"{question_prefix}{q}{answer_prefix} {a}{separator}" for q, a in shots)
    return f"{solved}{question_prefix}{question}{answer_prefix}"


def _check_style(style: str, tokenizer) -> None:
    if style not in STYLES:
        raise ValueError(f"unknown prompt style {style!r}; expected one of {', '.join(STYLES)}")
    if style == "chat" and (tokenizer is None or not getattr(tokenizer, "chat_template", None)):
        raise ValueError("prompt style 'chat' needs a tokenizer with a chat template")


def _chat(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    # Templates that write the BOS token into the text (LLaMA-2) would get a second one when the text is
    # tokenized with special tokens (`arithmetic.encode`); drop the written one.
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]:
        text = text[len(bos) :]
    return text


def _messages(question: str, shots: Sequence[tuple[str, str]]) -> list[dict]:
    messages = []
    for q, s in shots:
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": s}]
    return messages + [{"role": "user", "content": question}]


def math_prompt(question: str, shots: Sequence[tuple[str, str]] = (), style: str = "plain", tokenizer=None) -> str:
    """The prompt for one math question (see the module docstring); `tokenizer` is needed for "chat"."""
    _check_style(style, tokenizer)
    if style == "chat":
        return _chat(tokenizer, _messages(question, shots), generation_prompt=True)
    return qa_prompt(question, shots)


def math_example(
    question: str, solution: str, shots: Sequence[tuple[str, str]] = (), style: str = "plain", tokenizer=None
) -> tuple[str, str]:
    """(prompt, target) for fine-tuning: prompt == math_prompt(question, shots, style, tokenizer), and
    prompt + target is the whole solved example."""
    prompt = math_prompt(question, shots, style, tokenizer)
    if style == "plain":
        return prompt, " " + solution
    full = _chat(tokenizer, _messages(question, shots) + [{"role": "assistant", "content": solution}], False)
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template does not render the conversation with the answer as the prompt (with the "
            "generation prompt) plus a continuation, so no fine-tuning target can be cut from it"
        )
    return prompt, full[len(prompt) :]


def math_prompts(
    df: pd.DataFrame, shots: Sequence[tuple[str, str]] = (), style: str = "plain", tokenizer=None
) -> pd.DataFrame:
    """A copy of a GSM8K or SVAMP frame with a `prompt` column, and a `target` column when it has a
    `solution` column (GSM8K)."""
    out = df.copy()
    if "solution" in df:
        pairs = [math_example(q, s, shots, style, tokenizer) for q, s in zip(df["question"], df["solution"])]
        out["prompt"] = [p for p, _ in pairs]
        out["target"] = [t for _, t in pairs]
    else:
        out["prompt"] = [math_prompt(q, shots, style, tokenizer) for q in df["question"]]
    return out


def choice_prompt(text: str) -> str:
    """The context for a multiple-choice question, qa_prompt(text.strip()); each choice is scored as the
    continuation " " + choice."""
    return qa_prompt(text.strip())


def question_prompts(
    questions: list[str], answers: list[str], n_shots: int, seed: int, *, items: Iterable[int] | None = None,
    question_prefix: str = QUESTION_PREFIX, answer_prefix: str = ANSWER_PREFIX, separator: str = SEPARATOR,
) -> list[str]:
    """Few-shot direct-answer prompts for the questions at `items` (default: all): for item i, `n_shots`
    other questions of the set (a seeded draw) solved, then question i:
    "Question: {q}\nAnswer: {a}\n\n" ... "Question: {q_i}\nAnswer:". The model's first generated words
    are the answer (SVAMP with a number; BIG-bench qa_wikidata with `question_prefix=""`,
    `answer_prefix=""`, whose inputs end where the answer starts)."""
    if len(questions) != len(answers):
        raise ValueError(f"{len(questions)} questions but {len(answers)} answers")
    if len(questions) <= n_shots:
        raise ValueError(f"need more than n_shots={n_shots} items to draw shots from, got {len(questions)}")
    rng = np.random.default_rng(seed)
    out = []
    for i in range(len(questions)) if items is None else items:
        shots = rng.choice(len(questions) - 1, size=n_shots, replace=False)
        shots = shots + (shots >= i)  # every index but i
        solved = [(questions[j], answers[j]) for j in shots]
        out.append(qa_prompt(questions[i], solved, question_prefix, answer_prefix, separator))
    return out


def svamp_prompts(path, cfg: dict, seed: int) -> tuple[pd.DataFrame, list[str]]:
    """The transfer's SVAMP items (`cfg`: transfer.svamp; a seeded draw of n, with `answer` and `index`)
    and their few-shot direct-answer prompts (shots drawn from the whole set). `make plan` reads the
    prompts' lengths from here too."""
    from arithmech.data.datasets import load_svamp, subsample

    svamp = load_svamp(path).assign(answer=lambda d: [f"{g:g}" for g in d["gold"]], index=lambda d: d.index)
    keep = subsample(svamp, cfg["n"], seed)
    texts = question_prompts(list(svamp["question"]), list(svamp["answer"]), cfg["n_shots"], seed, items=keep["index"])
    return keep, texts


def non_math_prompts(path, cfg: dict, seed: int) -> tuple[pd.DataFrame, list[str]]:
    """The transfer's non-math items (`cfg`: transfer.non_math; a seeded draw of n of a BIG-bench
    generation task, with `index`) and their few-shot prompts, as `svamp_prompts`."""
    from arithmech.data.datasets import load_bigbench_generation, subsample

    qa = load_bigbench_generation(path).assign(index=lambda d: d.index)
    keep = subsample(qa, cfg["n"], seed)
    texts = question_prompts(list(qa["input"]), [t[0] for t in qa["targets"]], cfg["n_shots"], seed,
                             items=keep["index"], question_prefix="", answer_prefix="", separator="\n")
    return keep, texts
