"""Tests for the offline tiny Llama model and its SmolLM2-like tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arithmech.model.tiny import build_tiny_model, build_tiny_tokenizer

SPACE = "Ġ"  # byte-level marker for a leading space


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tok(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


def _tokens(tok, text):
    return tok.convert_ids_to_tokens(tok(text)["input_ids"])


def test_digits_and_space_before_numbers_are_separate_tokens(tok):
    assert _tokens(tok, "23 plus 45 is equal to 68") == [
        "2", "3", f"{SPACE}plus", SPACE, "4", "5",
        f"{SPACE}is", f"{SPACE}equal", f"{SPACE}to", SPACE, "6", "8",
    ]


def test_every_digit_is_its_own_token(tok):
    for t in _tokens(tok, "0123456789 9876543210 100 plus 2000"):
        assert not (any(c.isdigit() for c in t) and len(t) > 1), t


@pytest.mark.parametrize("text", [
    "23 plus 45 is equal to 68",
    "1.5 plus 2.25",
    "-3",
    "What is 12 * 7? The answer is ",
    "2 plus 3 is equal to 5.\n7 nothing 4 is equal to ",
    "héllo  wörld ✓ 日本\t!",
])
def test_decode_encode_round_trip(tok, text):
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text


def test_prompt_ends_with_lone_space_then_digit(tok):
    prompt = "2 plus 3 is equal to "
    assert _tokens(tok, prompt)[-1] == SPACE
    # the answer continues with a digit token, not a merged " 5"
    full = tok(prompt + "5")["input_ids"]
    assert full[:-1] == tok(prompt)["input_ids"]
    assert tok.convert_ids_to_tokens(full[-1]) == "5"


def test_special_tokens_and_no_bos(tok):
    assert tok.eos_token == tok.bos_token == tok.pad_token == "<|endoftext|>"
    assert tok.padding_side == "right"
    ids = tok("7 minus 2")["input_ids"]
    assert tok.bos_token_id not in ids
    assert 300 <= len(tok) <= 600


def test_saved_tokenizer_matches_built_one(tok):
    fresh = build_tiny_tokenizer()
    assert len(fresh) == len(tok)
    for text in ["12 times 34 equals 408", "What is 9 / 3? The answer is "]:
        assert fresh(text)["input_ids"] == tok(text)["input_ids"]


def test_config_shapes(tiny_dir, tok):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]
    assert cfg["hidden_size"] == cfg["num_attention_heads"] * cfg["head_dim"]
    assert cfg["vocab_size"] == len(tok)
    assert cfg["tie_word_embeddings"] is False


def test_custom_shapes(tmp_path):
    d = build_tiny_model(tmp_path / "m", n_layers=2, n_heads=6, n_kv_heads=3,
                         head_dim=4, intermediate_size=48)
    model = AutoModelForCausalLM.from_pretrained(d)
    c = model.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.hidden_size, c.intermediate_size) == (2, 6, 3, 4, 24, 48)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (24, 24)
    assert attn.k_proj.weight.shape == (12, 24)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


def test_round_trip_logits_match_and_are_not_degenerate(tiny_dir, tok):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    assert model.dtype == torch.float32
    ids = torch.tensor([tok("2 plus 3 is equal to ")["input_ids"]])
    with torch.no_grad():
        loaded = model(ids).logits
        again = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()(ids).logits
    assert torch.equal(loaded, again)
    assert loaded[0, -1].std() > 0.1  # logits vary across the vocabulary
    assert (loaded[0, 0] - loaded[0, -1]).abs().max() > 1e-3  # and across positions


def test_in_memory_model_matches_saved(tiny_dir, tok):
    """Re-initialising from the saved config with seed 0 reproduces the saved logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    fresh = LlamaForCausalLM(LlamaConfig.from_pretrained(tiny_dir)).eval()
    loaded = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    ids = torch.tensor([tok("7 nothing 4 is equal to ")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, loaded(ids).logits)


def test_weights_deterministic_per_seed(tmp_path, tiny_dir):
    same = build_tiny_model(tmp_path / "same", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    ref = (tiny_dir / "model.safetensors").read_bytes()
    assert (same / "model.safetensors").read_bytes() == ref
    assert (other / "model.safetensors").read_bytes() != ref
    assert (same / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()


def test_overwrite_is_clean_and_leaves_no_temp_dirs(tmp_path):
    out = tmp_path / "m"
    build_tiny_model(out, seed=0)
    (out / "stale.txt").write_text("old")
    build_tiny_model(out, seed=1)
    assert not (out / "stale.txt").exists()
    assert (out / "model.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_a_tiny_gemma3_is_deterministic_and_another_family_is_named(tmp_path):
    """family="gemma3" builds a Gemma 3 text model (the same tokenizer, byte-identical weights per seed); a family
    the builder does not know is named with the known ones, before anything is written."""
    first = build_tiny_model(tmp_path / "a", family="gemma3")
    again = build_tiny_model(tmp_path / "b", family="gemma3")
    assert (first / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()
    config = json.loads((first / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["tie_word_embeddings"]
    with pytest.raises(ValueError, match="family must be one of llama, gemma3; got 'gpt2'"):
        build_tiny_model(tmp_path / "c", family="gpt2")
    assert not (tmp_path / "c").exists()
