"""A tiny, randomly initialised causal LM built fully offline: a Llama (the default) or a Gemma 3 text model
(`family="gemma3"`: its block's post-norms, q/k norms, scaled and tied embeddings, sliding-window layers).

Unit tests and the CI run of the pipeline need a real Hugging Face model directory
(``config.json``, ``model.safetensors``, ``tokenizer.json``) without downloading
anything. :func:`build_tiny_model` writes one in well under a second.

The tokenizer mimics the number handling of SmolLM2 / LLaMA-2, which the pipeline
relies on: every digit is its own token and the space before a number is its own
token, so ``"2 plus 3 is equal to "`` ends with a lone space token and the next
token the model should produce is a single digit.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from arithmech.io import atomic_dir

__all__ = ["FAMILIES", "build_tiny_model", "build_tiny_tokenizer"]

SPECIAL_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 400
FAMILIES = ("llama", "gemma3")  # build_tiny_model's `family`
# The tiny Gemma 3's sliding window: shorter than the test prompts (so the sliding layers' masks and caches
# matter), its residual width wider than its heads together (as Gemma 3's own: head_dim is not d_model / heads).
GEMMA3_SLIDING_WINDOW = 8
# Larger than Llama's default 0.02 so that the final logits of a 32-wide model
# differ visibly across tokens (otherwise every prediction is ~uniform).
INITIALIZER_RANGE = 0.1

_OPERATORS = [
    "plus", "minus", "times", "divided by", "multiplied by", "added to",
    "subtracted from", "nothing", "none", "@", "+", "-", "*", "/",
]
_EQUALS = ["is equal to", "equals", "makes", "is", "=", "gives"]
_ENGLISH = (
    "the a an of and or to in on at for with from by as that this it be was are "
    "number numbers result answer question what which how many much sum difference "
    "product quotient value total we you they if then so not no yes one two three "
    "four five six seven eight nine ten zero first second next last here there "
    "compute calculate find add subtract multiply divide count apples students"
).split()


def _corpus(seed: int) -> list[str]:
    """Deterministic training corpus of arithmetic sentences and plain English."""
    rng = random.Random(seed)
    def num() -> str:
        return str(rng.randint(0, 999))

    lines = []
    for op in _OPERATORS:
        for eq in _EQUALS:
            for _ in range(3):
                lines.append(f"{num()} {op} {num()} {eq} {num()}.")
                lines.append(f"What is {num()} {op} {num()}? The answer is {num()}.")
                lines.append(f"The result of {num()} {op} {num()} {eq} {num()}.\n")
    for _ in range(200):
        words = rng.sample(_ENGLISH, 8)
        words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ",", ":"]))
    lines.append(" ".join(_OPERATORS + _EQUALS + _ENGLISH))
    return lines


def build_tiny_tokenizer(seed: int = 0) -> PreTrainedTokenizerFast:
    """Train a small byte-level BPE tokenizer (vocab ~400) on an in-code corpus.

    Any text is tokenizable (the full 256-byte alphabet is in the vocabulary), digits
    are isolated before BPE so no merge can span them, and no BOS is prepended.
    ``seed`` only changes the training corpus.
    """
    tok = Tokenizer(models.BPE())
    # Digits first: "23 plus" -> "2","3"," plus"; ByteLevel's regex then keeps the
    # space before a digit as its own pre-token (" is equal to " -> ..., " to", " ").
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[SPECIAL_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKEN,
        eos_token=SPECIAL_TOKEN,
        pad_token=SPECIAL_TOKEN,
        unk_token=None,
        clean_up_tokenization_spaces=False,  # exact decode(encode(text)) round trip
        add_bos_token=False,
        add_eos_token=False,
    )


def d_model(family: str, n_heads: int, head_dim: int) -> int:
    """The residual width `build_tiny_model` gives a model of `family`."""
    return n_heads * head_dim + (8 if family == "gemma3" else 0)


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, n_layers: int = 3, n_heads: int = 4,
                     n_kv_heads: int = 2, head_dim: int = 8, intermediate_size: int = 64,
                     max_positions: int = 512, family: str = "llama") -> Path:
    """Write a tiny causal LM of `family` (FAMILIES) + fast tokenizer to out_dir (created if needed); return
    out_dir as Path.

    ``seed`` fixes the weights (same seed -> byte-identical ``model.safetensors``);
    the tokenizer is the same for every seed so models built with different seeds
    share a vocabulary. The directory is built next to ``out_dir`` and renamed into
    place, so readers never see a half-written model; an existing ``out_dir`` is
    replaced. A Llama's width is n_heads * head_dim; a Gemma 3's is that plus 8, with
    tied embeddings and every other layer a sliding-window one.
    """
    out_dir = Path(out_dir)
    tokenizer = build_tiny_tokenizer()
    common = dict(
        vocab_size=len(tokenizer),
        intermediate_size=intermediate_size,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        initializer_range=INITIALIZER_RANGE,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    if family == "llama":
        config, build = LlamaConfig(hidden_size=d_model(family, n_heads, head_dim), tie_word_embeddings=False,
                                    **common), LlamaForCausalLM
    elif family == "gemma3":
        config = Gemma3TextConfig(
            hidden_size=d_model(family, n_heads, head_dim), tie_word_embeddings=True, query_pre_attn_scalar=head_dim,
            sliding_window=GEMMA3_SLIDING_WINDOW,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)], **common)
        build = Gemma3ForCausalLM
    else:
        raise ValueError(f"tiny model family must be one of {', '.join(FAMILIES)}; got {family!r}")
    # fork_rng: seed the init without disturbing the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build(config).to(torch.float32).eval()
        if family == "gemma3":  # its norms start at zero weight (x * (1 + w)): make them differ from identity
            for name, param in model.named_parameters():
                if "norm" in name:
                    torch.nn.init.normal_(param, std=0.3)

    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out_dir
