"""Tokens of texts as a model's tokenizer counts them, or estimated from characters without one.

    TokenCounter().count("9 plus 9 is equal to ")      # 9: 6 for 19 other characters, 2 digits, BOS
    TokenCounter(Path("model/tokenizer.json")).counts(["a", "b"], special=False)
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import NamedTuple, Sequence

from arithmech.data.answers import answer_sentence

CHARS_PER_TOKEN = 3.5  # characters per token of English text other than digits (the estimate without a tokenizer)
CHAT_TOKENS_PER_MESSAGE = 5  # a chat template's role header and end of turn, per message (the estimate without one)
# The conversations whose renders measure a chat template: one question; one solved shot and the question.
CHAT_PROBE_QUESTION, CHAT_PROBE_SHOT = "What is 12 plus 7?", ("What is 3 plus 5?", answer_sentence(8))


class ChatCost(NamedTuple):
    """Tokens a chat template adds to a conversation's contents (no BOS): `fixed` once a prompt (a default system
    message, the generation prompt), `per_message` for each message (its role header and end of turn)."""

    fixed: float
    per_message: float
    source: str

    def tokens(self, messages: int) -> float:
        """What the template adds to a prompt of `messages` messages."""
        return self.fixed + messages * self.per_message


class TokenCounter:
    """Tokens of texts: by the model's tokenizer (a tokenizer.json, read by the `tokenizers` library), or
    estimated: every digit one token (the LLaMA, Mistral and SmolLM2 tokenizers split numbers into digits),
    the other characters 3.5 a token (rounded up), plus 1 for the BOS token when special tokens count."""

    def __init__(self, tokenizer_file: Path | None = None):
        self.file = tokenizer_file
        self._tokenizer = None
        if tokenizer_file is not None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(tokenizer_file))

    @property
    def method(self) -> str:
        if self._tokenizer is None:
            return f"estimated from characters ({CHARS_PER_TOKEN} per token, digits 1 each)"
        return f"counted by {self.file}"

    @staticmethod
    def estimate(text: str) -> int:
        """Tokens of `text` without special tokens, estimated from its characters."""
        digits = sum(c.isdigit() for c in text)
        return math.ceil((len(text) - digits) / CHARS_PER_TOKEN) + digits

    def counts(self, texts: Sequence[str], *, special: bool = True) -> list[int]:
        """Tokens of each text; `special`: with the tokenizer's special tokens (BOS), as a prompt is encoded."""
        if self._tokenizer is None:
            return [self.estimate(text) + int(special) for text in texts]
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=special)]

    def count(self, text: str, *, special: bool = True) -> int:
        return self.counts([text], special=special)[0]

    def mean(self, texts: Sequence[str], *, special: bool = True) -> float:
        counts = self.counts(texts, special=special)
        return sum(counts) / len(counts) if counts else 0.0

    @functools.cached_property
    def chat(self) -> ChatCost:
        """What the chat style adds to a prompt's tokens: measured from the tokenizer's own chat template where
        the folder of its tokenizer.json has one (two prompts rendered by the stages' own
        `data.formatting.math_prompt`: one question, then one solved shot and the question; the difference is
        two messages), else estimated (CHAT_TOKENS_PER_MESSAGE a message)."""
        template = self._chat_tokenizer()
        if template is None:
            return ChatCost(0.0, float(CHAT_TOKENS_PER_MESSAGE), f"estimated ({CHAT_TOKENS_PER_MESSAGE} a message)")
        from arithmech.data.formatting import math_prompt

        question, (shot_q, shot_a) = CHAT_PROBE_QUESTION, CHAT_PROBE_SHOT
        one = self.count(math_prompt(question, (), "chat", template), special=False)
        three = self.count(math_prompt(question, [CHAT_PROBE_SHOT], "chat", template), special=False)
        per_message = (three - one - self.count(shot_q, special=False) - self.count(shot_a, special=False)) / 2
        fixed = one - self.count(question, special=False) - per_message
        return ChatCost(fixed, per_message, f"measured from the chat template beside {self.file}")

    def _chat_tokenizer(self):
        """The Hugging Face tokenizer of the tokenizer.json's folder where it has a chat template, else None."""
        if self._tokenizer is None:
            return None
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.file.parent)
        return tokenizer if getattr(tokenizer, "chat_template", None) else None
