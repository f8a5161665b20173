"""Explaining the key components: where the key heads look from END, and what the MLPs read and write.

- `token_roles` labels every token of a prompt (operand_a, operand_b, operator, equals, prefix, other)
  from the tokenizer's character offsets and the character spans `arithmetic.build_prompts` records, so
  multi-digit and decimal operands split into several tokens are still found.
- `attention_rows` recomputes, for chosen query heads, the attention weights from END to every key
  position from the model's own queries and keys (hooked, rotated with the model's rotary embedding); it
  works under any attention implementation (sdpa and flash attention return no weights) and is tested
  against the eager implementation's weights. `role_attention` sums them per role.
- `mlp_probes` compares, per layer, the MLP's input, output and the change it makes with the unembedding
  vectors of the operands' and the answer's first tokens (the paper's "MLPs process the operand
  information into the answer"), against a random-token baseline: with the paper's definitions (input =
  the residual stream entering the MLP block) and with the normed input the MLP reads, on all prompts and
  on those whose answer token is neither operand's token.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from arithmech.data.arithmetic import encode
from arithmech.intervention.hooks import hooks
from arithmech.model.loading import LoadedModel

ROLES = ("operand_a", "operand_b", "operator", "equals", "prefix", "other")
# Words that announce the answer. The "equals" span (see `equals_span`) starts at the first of them after
# operand b, matched as a whole word, case-insensitively.
EQUALS_WORDS = ("=", "is", "are", "equals", "equal", "makes", "gives", "yields", "was")


# ---------------------------------------------------------------------------------------------------
# Token roles


def equals_span(prompt: str, b_end: int, words: Sequence[str] = EQUALS_WORDS) -> tuple[int, int] | None:
    """Character span of the words that announce the answer: from the first whole-word occurrence of one
    of `words` after operand b (which ends at `b_end`) to the end of the prompt, i.e. up to where the
    answer begins. '... 3 is equal to ' -> 'is equal to '; '...? The answer is ' -> 'is '; '... 3 = ' ->
    '= '. None if no such word follows b (then no token has the role)."""
    alternatives = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    match = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE).search(prompt, b_end)
    return (match.start(), len(prompt)) if match else None


def token_roles(tokenizer, prompt: str, spans: Mapping, equals_words: Sequence[str] = EQUALS_WORDS) -> list[str]:
    """One role per token of `tokenizer(prompt)` (special tokens included, as the model sees it).

    spans: character offsets into `prompt` (a pairs row works): query_start, a_start/a_end, op_start/op_end,
    b_start/b_end. A token takes the first role, in the order operand_a, operand_b, operator, equals, whose
    span its character range overlaps (a byte-level token such as ' plus' that carries the preceding space
    overlaps the operator's span); otherwise 'prefix' if it ends at or before query_start (the few-shot
    examples), else 'other'. Tokens without characters (BOS) are 'other'."""
    enc = tokenizer(prompt, return_offsets_mapping=True)
    b_end = int(spans["b_end"])
    eq = equals_span(prompt, b_end, equals_words)
    labelled = [
        ("operand_a", (int(spans["a_start"]), int(spans["a_end"]))),
        ("operand_b", (int(spans["b_start"]), b_end)),
        ("operator", (int(spans["op_start"]), int(spans["op_end"]))),
    ]
    if eq is not None:
        labelled.append(("equals", eq))
    query_start = int(spans["query_start"])
    roles = []
    for start, end in enc["offset_mapping"]:
        role = "other"
        if end > start:
            for name, (s, e) in labelled:
                if max(start, s) < min(end, e):
                    role = name
                    break
            else:
                if end <= query_start:
                    role = "prefix"
        roles.append(role)
    return roles


def role_token_ids(tokenizer, prompt: str, spans: Mapping, role: str) -> list[int]:
    """Token ids of the tokens of `prompt` with `role` (e.g. the first id of operand_a is A's first token)."""
    ids = tokenizer(prompt)["input_ids"]
    return [i for i, r in zip(ids, token_roles(tokenizer, prompt, spans)) if r == role]


def first_role_tokens(tokenizer, pairs, role: str) -> list[int]:
    """Per row of a pairs DataFrame, the id of the first token of `prompt` with `role` (e.g. operand_a:
    the first token of A as the model reads it, the A of `mlp_probes`). Raises if a row has none."""
    out = []
    for row in pairs.to_dict("records"):
        ids = role_token_ids(tokenizer, row["prompt"], row, role)
        if not ids:
            raise ValueError(f"sample {row.get('sample_id')}: no token with role {role!r} in {row['prompt']!r}")
        out.append(ids[0])
    return out


# ---------------------------------------------------------------------------------------------------
# Attention from END


@dataclass
class AttentionRows:
    """Attention weights from END of each text to every key position, for some query heads.

    heads:   [(layer, head)] in column order
    weights: [n_texts, n_heads_chosen, seq] float32, left-padded to the longest text; zero on padding;
             each row sums to 1 over the text's real positions
    mask:    [n_texts, seq] bool, True on real positions (a text's tokens are its last mask.sum() positions)
    """

    heads: list[tuple[int, int]]
    weights: torch.Tensor
    mask: torch.Tensor

    def row(self, i: int) -> torch.Tensor:
        """[n_heads_chosen, len_i]: text i's weights over its own tokens (in token order)."""
        return self.weights[i][:, self.mask[i]]


def _rotary(lm: LoadedModel):
    """The architecture's own `apply_rotary_pos_emb` (every supported modeling module defines one)."""
    module = importlib.import_module(type(lm.model.model).__module__)
    return module.apply_rotary_pos_emb


def _layer_rope(lm: LoadedModel, attn, seen: tuple, like: torch.Tensor, position_ids: torch.Tensor) -> tuple:
    """The cos/sin a layer's attention rotated with: those the forward's `rotary_emb` produced, or, where the
    architecture has one rotation per layer type (Gemma 3: sliding and full-attention layers differ), the
    rotary module's output for this layer's type, at the same positions."""
    layer_type = getattr(attn, "layer_type", None)
    if layer_type is None or "layer_type" not in inspect.signature(lm.model.model.rotary_emb.forward).parameters:
        return seen
    return lm.model.model.rotary_emb(like, position_ids, layer_type)


def _sliding_window(lm: LoadedModel, layer: int) -> int | None:
    attn = lm.layer(layer).self_attn
    if hasattr(attn, "sliding_window"):  # qwen2/qwen3: set per layer (None on full-attention layers)
        return attn.sliding_window
    return getattr(lm.model.config, "sliding_window", None)  # mistral: every layer, or None


@torch.no_grad()
def attention_rows(
    lm: LoadedModel, texts: list[str], heads: Sequence[tuple[int, int]], batch_size: int
) -> AttentionRows:
    """Attention weights from END to every key for the query heads `heads`, recomputed from hooked queries
    and keys: q_proj / k_proj outputs (then q_norm / k_norm where the architecture has them), rotated with
    the cos/sin the model's `rotary_emb` produced in the same forward and the modeling module's
    `apply_rotary_pos_emb`; query head h reads key/value head h // (n_heads // n_kv_heads) (GQA); scaled
    by the attention module's `scaling`; keys on left padding (and outside a sliding window) masked; softmax
    in float32. END sees every real position, so the causal mask removes nothing there."""
    heads = [(int(l), int(h)) for l, h in heads]
    for l, h in heads:
        if not (0 <= l < lm.n_layers and 0 <= h < lm.n_heads):
            raise ValueError(f"head ({l}, {h}) out of range")
    layers = sorted({l for l, _ in heads})
    group = lm.n_heads // lm.n_kv_heads
    rotate = _rotary(lm)
    texts = list(texts)
    enc_all = encode(lm.tokenizer, texts, "cpu")  # for the common width and the mask
    width = enc_all["input_ids"].shape[1]
    out = torch.zeros(len(texts), len(heads), width)
    for start in range(0, len(texts), batch_size):
        enc = encode(lm.tokenizer, texts[start : start + batch_size], lm.device)
        B, S = enc["input_ids"].shape
        seen: dict = {}

        def keep(key):
            def fn(module, args, output):
                seen[key] = output

            return fn

        post = [(lm.model.model.rotary_emb, keep("rope"))]
        for l in layers:
            attn = lm.layer(l).self_attn
            post += [(attn.q_proj, keep(("q", l))), (attn.k_proj, keep(("k", l)))]
        with hooks(post=post):
            lm.model(**enc, logits_to_keep=1)
        real = enc["attention_mask"].bool()  # [B, S]
        for l in layers:
            attn = lm.layer(l).self_attn
            cos, sin = _layer_rope(lm, attn, seen["rope"], seen[("q", l)], enc["position_ids"])
            q = seen[("q", l)].view(B, S, lm.n_heads, lm.head_dim)
            k = seen[("k", l)].view(B, S, lm.n_kv_heads, lm.head_dim)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = rotate(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [B, heads, S, D]
            scaling = float(getattr(attn, "scaling", lm.head_dim**-0.5))
            allowed = real.clone()
            window = _sliding_window(lm, l)
            if window is not None:
                # HF: a key is visible when its position > query position - window (positions count real tokens)
                pos = enc["position_ids"]
                allowed &= pos > pos[:, -1:] - window
            for j, (layer, h) in enumerate(heads):
                if layer != l:
                    continue
                scores = torch.einsum("bd,bsd->bs", q[:, h, -1].float(), k[:, h // group].float()) * scaling
                scores = scores.masked_fill(~allowed, float("-inf"))
                out[start : start + B, j, width - S :] = scores.softmax(-1).cpu()
    return AttentionRows(heads, out, enc_all["attention_mask"].bool())


def role_attention(rows: AttentionRows, roles: Sequence[Sequence[str]]) -> pd.DataFrame:
    """Attention from END on each role's tokens, per head: for every text the summed weight on the tokens
    with that role, then mean and standard deviation over texts.

    roles: per text, one role per token (`token_roles`), aligned with that text's real positions.
    Returns columns layer, head, role, attention (mean), std, n_texts, tokens (mean tokens with the role);
    per head the `attention` of all roles sums to 1."""
    n_texts = rows.weights.shape[0]
    if len(roles) != n_texts:
        raise ValueError(f"{len(roles)} role lists for {n_texts} texts")
    totals = np.zeros((n_texts, len(rows.heads), len(ROLES)))
    counts = np.zeros((n_texts, len(ROLES)))
    for i, text_roles in enumerate(roles):
        w = rows.row(i).double().numpy()  # [heads, len_i]
        if w.shape[1] != len(text_roles):
            raise ValueError(f"text {i}: {len(text_roles)} roles for {w.shape[1]} tokens")
        index = np.array([ROLES.index(r) for r in text_roles])
        for r in range(len(ROLES)):
            sel = index == r
            totals[i, :, r] = w[:, sel].sum(1)
            counts[i, r] = sel.sum()
    records = []
    for j, (layer, head) in enumerate(rows.heads):
        for r, role in enumerate(ROLES):
            values = totals[:, j, r]
            records.append(
                {
                    "layer": layer,
                    "head": head,
                    "role": role,
                    "attention": float(values.mean()),
                    "std": float(values.std(ddof=1)) if n_texts > 1 else 0.0,
                    "n_texts": n_texts,
                    "tokens": float(counts[:, r].mean()),
                }
            )
    return pd.DataFrame.from_records(records)


# ---------------------------------------------------------------------------------------------------
# MLP probes


def cosine(x: torch.Tensor, y: torch.Tensor, dim: int = -1, eps: float = 1e-12) -> torch.Tensor:
    """Cosine similarity along `dim` in float64 (arguments broadcast); 0 where a vector is zero."""
    x, y = x.double(), y.double()
    norms = x.norm(dim=dim) * y.norm(dim=dim)
    return (x * y).sum(dim) / norms.clamp_min(eps)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


VECTORS = ("input", "output", "delta")
TARGETS = ("a", "b", "c", "random")
def _mlp_written(lm: LoadedModel, layer: int) -> torch.nn.Module:
    """The module whose output is what `layer`'s MLP adds to the residual stream: the norm after the MLP where
    the architecture has one (Gemma 3), else the MLP."""
    norm = lm.mlp_out_norm(layer)
    return lm.mlp(layer) if norm is None else norm


# The two definitions of the MLP's input and change (see `mlp_probes`); `paper` is the default everywhere.
VARIANTS = ("paper", "normed")


@torch.no_grad()
def mlp_probes(
    lm: LoadedModel,
    texts: list[str],
    a_token_ids,
    b_token_ids,
    c_token_ids,
    *,
    batch_size: int,
    n_random: int = 256,
    seed: int = 0,
) -> pd.DataFrame:
    """Per layer, at END: cosine similarity of three MLP vectors with unembedding rows (lm_head weight rows)
    of the first tokens of operand A, operand B and the answer C, averaged over texts, plus a random-token
    baseline; under two definitions of the vectors (`variant`), on two sets of texts (`subset`).

    Vectors (all at END), variant `paper` (the paper's definitions, the default):
      input   the residual stream entering the MLP block: the input of the norm in front of the MLP
              (`LoadedModel.mlp_norm`), i.e. the layer's input plus the attention block's output;
      output  what the MLP adds to the residual stream: the MLP module's output, or, where the architecture
              puts a norm after the MLP (Gemma 3's post_feedforward_layernorm), that norm's output;
      delta   (output - input) / ||output - input||; cosine is scale-invariant, so this is the cosine of
              output - input.
    Variant `normed`: input is the MLP module's own input, the residual AFTER the norm in front of it
    (RMSNorm with its gain), which is what the MLP actually reads; output as above; delta is
    unit(output) - unit(input), both normalised first because the normed input and the raw output live on
    very different scales. All vectors of both variants come from one forward.
    Subsets: `all` texts, and `answer_distinct`, the texts whose answer token id differs from both operand
    token ids (when C's first token is A's or B's, the three cosines coincide for a trivial reason); every
    target is recomputed on the subset, and an empty subset has no rows.
    Targets a, b, c: the given token ids per text. 'random': `n_random` distinct vocabulary rows drawn with
    `seed` (the same rows for every variant and subset); its `mean` is the cosine averaged over texts and
    random rows, and its `std` is the spread over random rows of the text-averaged cosine, the null spread
    of a text-averaged a/b/c value.
    Returns columns variant, subset, layer, vector, target, mean, std (over texts for a/b/c), n (texts for
    a/b/c, random rows for random), n_texts (texts in the subset)."""
    given = {"a": a_token_ids, "b": b_token_ids, "c": c_token_ids}
    ids = {k: torch.as_tensor(list(v), dtype=torch.long) for k, v in given.items()}
    texts = list(texts)
    if any(len(v) != len(texts) for v in ids.values()):
        raise ValueError("a_token_ids, b_token_ids and c_token_ids need one id per text")
    W = lm.unembed.weight.detach()
    vocab = W.shape[0]
    gen = np.random.default_rng(seed)
    random_ids = torch.as_tensor(gen.choice(vocab, size=min(n_random, vocab), replace=False), dtype=torch.long)
    W_rand = W[random_ids.to(W.device)].double().cpu()  # [R, d]
    L, V = lm.n_layers, len(VARIANTS)
    # per text: cosines [n, variant, L, vector, target(a,b,c)] and random [n, variant, L, vector, R]
    cos_abc = torch.zeros(len(texts), V, L, len(VECTORS), 3, dtype=torch.float64)
    cos_rand = torch.zeros(len(texts), V, L, len(VECTORS), len(random_ids), dtype=torch.float64)
    for start in range(0, len(texts), batch_size):
        enc = encode(lm.tokenizer, texts[start : start + batch_size], lm.device)
        B = enc["input_ids"].shape[0]
        seen: dict = {}

        def pre_hook(key):
            def fn(module, args):
                seen[key] = args[0][:, -1].detach()

            return fn

        def post_hook(key):
            def fn(module, args, output):
                seen[key] = output[:, -1].detach()

            return fn

        pre = [(lm.mlp_norm(l), pre_hook(("resid_mid", l))) for l in range(L)]
        pre += [(lm.mlp(l), pre_hook(("normed", l))) for l in range(L)]
        # what the MLP adds to the residual stream: its output, or the norm's after it (Gemma 3)
        post = [(_mlp_written(lm, l), post_hook(("output", l))) for l in range(L)]
        with hooks(pre, post):
            lm.model(**enc, logits_to_keep=1)
        sl = slice(start, start + B)
        targets = torch.stack([W[ids[k][sl].to(W.device)] for k in ("a", "b", "c")], 1).double().cpu()  # [B, 3, d]
        for l in range(L):
            resid_mid, normed, out = (seen[(k, l)].double().cpu() for k in ("resid_mid", "normed", "output"))
            # variant -> [B, 3 (input, output, delta), d]; paper's delta is scaled to unit length as the
            # paper writes it, which no cosine sees
            vecs = {"paper": torch.stack([resid_mid, out, _unit(out - resid_mid)], 1),
                    "normed": torch.stack([normed, out, _unit(out) - _unit(normed)], 1)}
            for v, variant in enumerate(VARIANTS):
                cos_abc[sl, v, l] = cosine(vecs[variant][:, :, None, :], targets[:, None, :, :])
                cos_rand[sl, v, l] = cosine(vecs[variant][:, :, None, :], W_rand[None, None])
    # all texts, and those whose C cannot share its unembedding row with A or B
    subsets = {"all": torch.ones(len(texts), dtype=torch.bool),
               "answer_distinct": (ids["c"] != ids["a"]) & (ids["c"] != ids["b"])}
    records = []
    for v, variant in enumerate(VARIANTS):
        for subset, keep in subsets.items():
            n = int(keep.sum())
            if n == 0:
                continue
            row = {"variant": variant, "subset": subset, "n_texts": n}
            for l in range(L):
                for j, vector in enumerate(VECTORS):
                    for t, target in enumerate(("a", "b", "c")):
                        values = cos_abc[keep, v, l, j, t]
                        records.append({**row, "layer": l, "vector": vector, "target": target,
                                        "mean": float(values.mean()), "std": float(values.std()) if n > 1 else 0.0,
                                        "n": n})
                    per_row = cos_rand[keep, v, l, j].mean(0)  # [R]: text-averaged cosine of each random token
                    records.append({**row, "layer": l, "vector": vector, "target": "random",
                                    "mean": float(per_row.mean()),
                                    "std": float(per_row.std()) if len(per_row) > 1 else 0.0, "n": len(per_row)})
    columns = ["variant", "subset", "layer", "vector", "target", "mean", "std", "n", "n_texts"]
    return pd.DataFrame.from_records(records, columns=columns)
