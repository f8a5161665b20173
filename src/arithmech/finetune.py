"""Fine-tuning a Llama-family model on (prompt, target) pairs: precise SFT of the key heads (Zhang et al.,
ICML 2024), the same on random heads, full fine-tuning and LoRA, with one resumable training loop and one
saved-artifact format.

Methods (`Method`, or a config dict through `parse_method`):
  precise        train only the selected query heads' slices: for head h of layer l, the rows
                 h*hd:(h+1)*hd of q_proj.weight (what the head reads) and the columns h*hd:(h+1)*hd of
                 o_proj.weight (what it writes). Optionally (`train_kv`) the rows of k_proj/v_proj of the
                 key/value head g = h // (n_heads // n_kv_heads) it reads; with grouped-query attention that
                 head is shared by its group, so it is trained once however many of its query heads are
                 selected, and the change reaches every query head of the group (selected or not).
                 Optionally (`mlp_layers`) the whole gate/up/down weights of key MLP layers.
  random_heads   the same with a head list the caller drew at random (the baseline).
  full           every parameter.
  lora           peft LoRA adapters (r, alpha, dropout, target_modules), merged for evaluation.

How the heads are trained. The base weights are never touched: each selected slice gets its own DELTA
parameter, and a forward hook on the projection adds the delta's contribution to the module's output, so the
effective weight is W + scatter(delta) (`HeadDeltas.effective_weight`) without ever forming that matrix:
  rows (q/k/v_proj):  out[..., rows(h)] += x @ delta_h.T          delta_h: [hd, d_in]
  cols (o_proj):      out += x[..., cols(h)] @ delta_h.T          delta_h: [d_out, hd]
  full (MLP weights): out += x @ delta.T                          delta:   [d_out, d_in]
Only the deltas require gradients, so autograd computes no gradient for any base weight, and the optimizer
(`TrainConfig.optimizer`: AdamW, or plain SGD, which keeps no state) holds state for the deltas only. Biases
(Qwen2's q/k/v) are not trained. Weight decay pulls the deltas towards 0, i.e. towards the base weights.

Saved artifacts (`save_trained`): for precise, random_heads and lora one safetensors file of deltas, which
`apply_trained` adds to a base model in place (a plain HF model afterwards, no hooks); keys name the module
and head:
  model.layers.{l}.self_attn.q_proj.weight.head.{h}       [hd, d_model]   rows h*hd:(h+1)*hd
  model.layers.{l}.self_attn.o_proj.weight.head.{h}       [d_model, hd]   columns h*hd:(h+1)*hd
  model.layers.{l}.self_attn.k_proj.weight.kv_head.{g}    [hd, d_model]   rows g*hd:(g+1)*hd (v_proj alike)
  model.layers.{l}.mlp.gate_proj.weight                   the whole matrix (MLP layers)
  model.layers.{l}.self_attn.q_proj.weight.lora_A         [r, d_in]  (LoRA; .lora_B [d_out, r] with the
                                                          scaling folded in: the update is lora_B @ lora_A)
with the method, heads and shapes as JSON in the header (`read_trained_meta`). For full, a normal HF
directory (save_pretrained plus the tokenizer), loaded with `models.load_model`.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm

from .hooks import hooks
from .io import atomic_path, config_hash, write_json, write_safetensors
from .models import LoadedModel
from .prompts import continuation_ids

METHODS = ("precise", "random_heads", "full", "lora")
HEAD_METHODS = ("precise", "random_heads")
SCHEDULES = ("constant", "linear", "cosine")
OPTIMIZERS = ("adamw", "sgd")
MLP_PROJS = ("gate_proj", "up_proj", "down_proj")
IGNORE_INDEX = -100  # label of positions that carry no loss (prompt, padding)
# Training-config fields a resumed run may change: how long it runs and how often it checkpoints.
RESUMABLE_CHANGES = ("epochs", "max_steps", "checkpoint_every")

Head = tuple[int, int]


# ---------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class Method:
    """What to train.

    name: one of METHODS.  heads: (layer, query head) pairs (precise, random_heads).  train_kv: also train
    the K/V rows (W_K, W_V) of the key/value head g = h // (n_heads // n_kv_heads) that each selected query
    head h reads, so that a head's W_Q, W_K, W_V and W_O slices are all trained. With grouped-query
    attention (n_kv_heads < n_heads) key/value head g is shared: training it changes the attention pattern
    and output of EVERY query head h' of that layer with h' // (n_heads // n_kv_heads) == g, selected or not.
    Without train_kv only the selected heads' q rows and o columns change, and no other head's q, k or v.
    mlp_layers: layers whose whole MLP weights are trained (precise, random_heads).  grad_scale: an optional
    factor on the head deltas' gradients (`resolve_grad_scale`).
    delta_dtype: "model" (deltas in the model's dtype) or "float32" (fp32 deltas, cast to the activations'
    dtype in the forward: fp32 master weights for a bf16 model). bf16 deltas start at 0, where bf16 is
    finest, but like bf16 weights they drop updates below ~1/256 of their value.  lora: {r, alpha, dropout,
    target_modules}.
    """

    name: str
    heads: tuple[Head, ...] = ()
    train_kv: bool = False
    mlp_layers: tuple[int, ...] = ()
    grad_scale: float | str | None = None
    delta_dtype: str = "model"
    lora: dict = field(default_factory=lambda: {"r": 8, "alpha": 16, "dropout": 0.0,
                                                "target_modules": ["q_proj", "v_proj"]})

    def describe(self) -> dict:
        """JSON-able description (recorded in checkpoints and saved artifacts)."""
        out = {"method": self.name}
        if self.name in HEAD_METHODS:
            out.update(heads=[list(h) for h in self.heads], train_kv=self.train_kv, mlp_layers=list(self.mlp_layers),
                       grad_scale=self.grad_scale, delta_dtype=self.delta_dtype)
        if self.name == "lora":
            out["lora"] = dict(self.lora)
        return out


def parse_head(value, where: str) -> Head:
    """A head as (layer, head) from [layer, head] or "L20H8"."""
    if isinstance(value, str):
        m = re.fullmatch(r"L(\d+)H(\d+)", value.strip())
        if m:
            return int(m[1]), int(m[2])
    elif isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, (int, np.integer)) for v in value):
        return int(value[0]), int(value[1])
    raise ValueError(f"{where}: expected a head as [layer, head] or 'L<layer>H<head>', got {value!r}")


def parse_method(cfg: dict, where: str = "finetune") -> Method:
    """A `Method` from a config dict with key `method` (one of METHODS) and the optional keys heads,
    train_kv, mlp_layers, grad_scale, delta_dtype, lora. Unknown keys and keys that do not apply to the
    method (heads for full, say) are errors naming the key."""
    known = {"method", "heads", "train_kv", "mlp_layers", "grad_scale", "delta_dtype", "lora"}
    if not isinstance(cfg, dict):
        raise ValueError(f"{where}: expected a mapping with key 'method', got {cfg!r}")
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; expected some of {sorted(known)}")
    name = cfg.get("method")
    if name not in METHODS:
        raise ValueError(f"{where}.method: expected one of {list(METHODS)}, got {name!r}")
    # Keys that only some methods use must be absent or empty for the others, so a typo cannot pass silently.
    only = {"heads": HEAD_METHODS, "train_kv": HEAD_METHODS, "mlp_layers": HEAD_METHODS,
            "grad_scale": HEAD_METHODS, "delta_dtype": HEAD_METHODS, "lora": ("lora",)}
    for key, methods in only.items():
        if cfg.get(key) not in (None, [], {}, False, "model") and name not in methods:
            raise ValueError(f"{where}.{key}: only methods {list(methods)} use it, but method is {name!r}")
    heads = tuple(parse_head(h, f"{where}.heads[{i}]") for i, h in enumerate(cfg.get("heads") or []))
    if name in HEAD_METHODS and not heads:
        raise ValueError(f"{where}.heads: method {name!r} needs a non-empty list of heads")
    if len(set(heads)) != len(heads):
        raise ValueError(f"{where}.heads: duplicate heads in {['L%dH%d' % h for h in heads]}")
    mlp_layers = cfg.get("mlp_layers") or []
    if not all(isinstance(x, (int, np.integer)) for x in mlp_layers) or len(set(mlp_layers)) != len(mlp_layers):
        raise ValueError(f"{where}.mlp_layers: expected a list of distinct layer indices, got {mlp_layers!r}")
    grad_scale = cfg.get("grad_scale")
    if not (grad_scale is None or grad_scale == "heads_ratio"
            or (isinstance(grad_scale, (int, float)) and not isinstance(grad_scale, bool) and grad_scale > 0)):
        raise ValueError(f"{where}.grad_scale: expected a positive number, 'heads_ratio' or null, got {grad_scale!r}")
    delta_dtype = cfg.get("delta_dtype") or "model"
    if delta_dtype not in ("model", "float32"):
        raise ValueError(f"{where}.delta_dtype: expected 'model' or 'float32', got {delta_dtype!r}")
    lora = Method("lora").lora | (cfg.get("lora") or {})
    unknown = sorted(set(lora) - {"r", "alpha", "dropout", "target_modules"})
    if unknown:
        raise ValueError(f"{where}.lora: unknown key(s) {unknown}; expected r, alpha, dropout, target_modules")
    if not (isinstance(lora["r"], int) and lora["r"] > 0):
        raise ValueError(f"{where}.lora.r: expected a positive integer, got {lora['r']!r}")
    if not (isinstance(lora["alpha"], (int, float)) and lora["alpha"] > 0):
        raise ValueError(f"{where}.lora.alpha: expected a positive number, got {lora['alpha']!r}")
    if not 0 <= lora["dropout"] < 1:
        raise ValueError(f"{where}.lora.dropout: expected a probability in [0, 1), got {lora['dropout']!r}")
    if not lora["target_modules"] or not all(isinstance(m, str) for m in lora["target_modules"]):
        raise ValueError(f"{where}.lora.target_modules: expected a non-empty list of module names such as q_proj")
    lora["target_modules"] = list(lora["target_modules"])
    return Method(name, heads, bool(cfg.get("train_kv", False)), tuple(int(x) for x in mlp_layers), grad_scale,
                  delta_dtype, lora)


@dataclass(frozen=True)
class TrainConfig:
    """Training hyperparameters.

    batch_size examples per forward; grad_accumulation forwards per optimizer step. Exactly one of epochs
    or max_steps (optimizer steps; the data then cycles over epochs as needed). lr schedule: linear warmup
    over warmup_steps from lr/warmup_steps to lr, then `schedule` (constant, or linear/cosine decay to 0 at
    the last step). max_grad_norm: clip the global gradient norm (null: no clipping). max_length: tokens
    per example (prompt + target + eos). checkpoint_every: optimizer steps between checkpoints (null: only
    at the end of the call). seed: the data order and dropout. optimizer: "adamw" (torch AdamW, decoupled
    weight decay) or "sgd" (torch SGD without momentum, the update theta <- theta - lr * grad written out
    in the paper's Algorithm 2; weight_decay is then added to the gradient, L2 style; no optimizer state).
    """

    lr: float = 1e-4
    weight_decay: float = 0.0
    batch_size: int = 8
    grad_accumulation: int = 1
    epochs: int | None = None
    max_steps: int | None = None
    warmup_steps: int = 0
    schedule: str = "constant"
    max_grad_norm: float | None = 1.0
    max_length: int = 256
    seed: int = 0
    checkpoint_every: int | None = None
    optimizer: str = "adamw"

    @classmethod
    def from_dict(cls, cfg: dict | None, where: str = "finetune.train") -> TrainConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg or {}) - names)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; expected some of {sorted(names)}")
        return cls(**(cfg or {}))._checked(where)

    def _checked(self, where: str) -> TrainConfig:
        def positive_int(name, allow_none=False, allow_zero=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < (0 if allow_zero else 1):
                raise ValueError(f"{where}.{name}: expected an integer >= {0 if allow_zero else 1}, got {v!r}")

        for name in ("batch_size", "grad_accumulation", "max_length"):
            positive_int(name)
        for name in ("epochs", "max_steps", "checkpoint_every"):
            positive_int(name, allow_none=True)
        positive_int("warmup_steps", allow_zero=True)
        positive_int("seed", allow_zero=True)
        if (self.epochs is None) == (self.max_steps is None):
            raise ValueError(f"{where}: give exactly one of epochs or max_steps (got epochs={self.epochs!r}, "
                             f"max_steps={self.max_steps!r})")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"{where}.lr: expected a positive number, got {self.lr!r}")
        if not (isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0):
            raise ValueError(f"{where}.weight_decay: expected a number >= 0, got {self.weight_decay!r}")
        if self.max_grad_norm is not None and not (isinstance(self.max_grad_norm, (int, float))
                                                   and self.max_grad_norm > 0):
            raise ValueError(f"{where}.max_grad_norm: expected a positive number or null, got {self.max_grad_norm!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"{where}.schedule: expected one of {list(SCHEDULES)}, got {self.schedule!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"{where}.optimizer: expected one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        return self

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """The configured optimizer over `params` (its lr is reset every step by the schedule)."""
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=0, weight_decay=self.weight_decay)
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based) of `total`."""
    if step < warmup:
        return (step + 1) / warmup  # the first step already moves (lr/warmup), unlike a ramp from 0
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------------------------------------------
# Data


def ends_with_eos(tokenizer, ids: Sequence[int]) -> bool:
    """Whether the last token of `ids` that is not whitespace only is the tokenizer's eos token: a chat
    target ends its turn with it (SmolLM2-Instruct: "<|im_end|>", its eos) and the template often adds a
    "\n" after it."""
    for i in reversed(ids):
        if i == tokenizer.eos_token_id:
            return True
        if tokenizer.decode([i]).strip():
            return False
    return False


def encode_example(tokenizer, prompt: str, target: str, max_length: int,
                   eos: bool = True) -> tuple[list[int], list[int]]:
    """Token ids and labels of one example: prompt ids (with the tokenizer's special tokens, e.g. BOS), then
    target ids (without), then eos. Labels are the ids on the target and eos, IGNORE_INDEX on the prompt.

    eos: append the eos token, unless the target already ends with it (`ends_with_eos`: the last token
    that is not whitespace only is eos, as in a chat turn "...<|im_end|>\n"; the target's ids are then
    kept as they are). eos=False appends none: the model learns the target and nothing after it (e.g. a
    few-shot answer "16." that the prompt format never ends with eos).
    Too long: the prompt is cut from the left (its start, BOS included, goes) so the target stays whole;
    a target (with its eos) longer than max_length alone is an error. The target ids are those that follow
    the prompt in the whole text's tokenization (`prompts.continuation_ids`: no SentencePiece word-start
    token of its own)."""
    if eos and tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token; the target must end with one (or train with "
                         "append_eos=False)")
    prompt_ids, target_ids = continuation_ids(tokenizer, prompt, target)
    prompt_ids, target_ids = list(prompt_ids), list(target_ids)
    if eos and not ends_with_eos(tokenizer, target_ids):
        target_ids.append(tokenizer.eos_token_id)
    if not target_ids:
        raise ValueError(f"target {target!r} has no tokens to train on")
    if len(target_ids) > max_length:
        raise ValueError(f"target {target!r} is {len(target_ids)} tokens{' with eos' if eos else ''}, longer "
                         f"than max_length={max_length} (finetune.train.max_length)")
    keep = max_length - len(target_ids)
    prompt_ids = prompt_ids[len(prompt_ids) - keep:] if keep else []
    return prompt_ids + target_ids, [IGNORE_INDEX] * len(prompt_ids) + target_ids


def collate(encoded: Sequence[tuple[list[int], list[int]]], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask, labels [batch, seq] (labels IGNORE_INDEX on padding)."""
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, (x, y) in enumerate(encoded):
        ids[i, :len(x)] = torch.tensor(x)
        labels[i, :len(y)] = torch.tensor(y)
        mask[i, :len(x)] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def batch_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over the labelled positions (fp32) and their number.

    Position i predicts label i+1. Logits are computed only where a label follows (`logits_to_keep` as a
    boolean [batch, seq] mask): the prompt is most of the tokens and the vocabulary projection is costly."""
    labels = batch["labels"]
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False,
                   logits_to_keep=keep).logits  # [n_kept, vocab] (or [1, n_kept, vocab])
    targets = labels[:, 1:][keep[:, :-1]]
    loss = F.cross_entropy(logits.reshape(len(targets), -1).float(), targets, reduction="sum")
    return loss, len(targets)


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The example order of one epoch: a function of (seed, epoch) alone, so a resumed run needs no state."""
    return np.random.default_rng([seed, epoch]).permutation(n)


# ---------------------------------------------------------------------------------------------------
# Per-head deltas


@dataclass(frozen=True)
class _Slot:
    """Where one delta parameter goes: the slices of `heads` (none: the whole matrix) of `module_name`."""

    module_name: str  # e.g. model.layers.3.self_attn.q_proj
    kind: str  # rows, cols or full
    heads: tuple[int, ...]  # query heads (q/o), key/value heads (k/v), () for full
    label: str  # "head" or "kv_head" in the saved keys


def _head_index(heads: Sequence[int], head_dim: int, device) -> torch.Tensor:
    """Row/column indices of the heads' slices, head-major: [len(heads) * head_dim]."""
    return torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in heads]).to(device)


def _add_into(weight: torch.Tensor, kind: str, index: torch.Tensor | None, delta: torch.Tensor) -> torch.Tensor:
    """weight + scatter(delta) in place. delta: [k, hd, d_in] (rows), [k, d_out, hd] (cols) or weight's shape."""
    delta = delta.to(weight.device, weight.dtype)
    if kind == "full":
        return weight.add_(delta)
    k, a, b = delta.shape
    if kind == "rows":
        return weight.index_add_(0, index, delta.reshape(k * a, b))
    return weight.index_add_(1, index, delta.permute(1, 0, 2).reshape(a, k * b))


class HeadDeltas(nn.Module):
    """Delta parameters for selected heads (and whole MLP matrices), added by forward hooks.

    One parameter per (layer, projection), stacking its selected heads: deltas["L{l}_q_proj"] is
    [k, head_dim, d_model] for the k selected query heads of layer l (in increasing head order), o_proj
    [k, d_model, head_dim], k/v_proj [k_kv, head_dim, d_model], MLP weights their matrix's shape. All start
    at 0, so the model is unchanged until trained. `attach` registers the hooks, `detach` removes them.
    """

    def __init__(self, lm: LoadedModel, heads: Sequence[Head], train_kv: bool = False,
                 mlp_layers: Sequence[int] = (), dtype: torch.dtype | None = None):
        super().__init__()
        self.head_dim, self.group = lm.head_dim, lm.n_heads // lm.n_kv_heads
        self.deltas = nn.ParameterDict()
        self.slots: dict[str, _Slot] = {}
        self._index: dict[str, torch.Tensor] = {}
        self._module_at = lm.model.get_submodule  # module path -> module (a method: no submodule registered)
        self._attached: ExitStack | None = None
        by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            by_layer.setdefault(layer, []).append(head)
        for layer, hs in sorted(by_layer.items()):
            hs = sorted(hs)
            kv = sorted({h // self.group for h in hs})
            self._add(lm, layer, lm.attn_proj(layer, "q_proj"), "q_proj", "rows", hs, "head", dtype)
            self._add(lm, layer, lm.attn_proj(layer, "o_proj"), "o_proj", "cols", hs, "head", dtype)
            if train_kv:
                self._add(lm, layer, lm.attn_proj(layer, "k_proj"), "k_proj", "rows", kv, "kv_head", dtype)
                self._add(lm, layer, lm.attn_proj(layer, "v_proj"), "v_proj", "rows", kv, "kv_head", dtype)
        for layer in sorted(mlp_layers):
            for proj in MLP_PROJS:
                self._add(lm, layer, lm.mlp_proj(layer, proj), proj, "full", (), "", dtype)

    def _add(self, lm: LoadedModel, layer: int, module: nn.Linear, proj: str, kind: str, heads: Sequence[int],
             label: str, dtype) -> None:
        weight = module.weight
        out_f, in_f = weight.shape
        shape = {"rows": (len(heads), self.head_dim, in_f), "cols": (len(heads), out_f, self.head_dim),
                 "full": (out_f, in_f)}[kind]
        key, path = f"L{layer}_{proj}", lm.module_path(module)
        self.deltas[key] = nn.Parameter(torch.zeros(shape, dtype=dtype or weight.dtype, device=weight.device))
        self.slots[key] = _Slot(path, kind, tuple(heads), label)
        self._index[key] = _head_index(heads, self.head_dim, weight.device) if heads else None

    def attach(self) -> HeadDeltas:
        """Register the hooks (`hooks.hooks`) until `detach`; a second attach does nothing."""
        if self._attached is None:
            self._attached = ExitStack()
            post = [(self._module_at(slot.module_name), partial(self._hook, key)) for key, slot in self.slots.items()]
            self._attached.enter_context(hooks(post=post))
        return self

    def detach(self) -> None:
        if self._attached is not None:
            self._attached.close()
            self._attached = None

    def _hook(self, key: str, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        """output + x @ scatter(delta).T, computed on the selected slices only. x: [..., d_in]."""
        x, slot, index = args[0], self.slots[key], self._index[key]
        delta = self.deltas[key].to(x.dtype)  # fp32 deltas of a bf16 model: the cast is differentiable
        if slot.kind == "full":
            return output + F.linear(x, delta)
        k, a, b = delta.shape
        if slot.kind == "rows":  # the selected heads' rows of the output: [..., k*hd]
            return output.index_add(-1, index, F.linear(x, delta.reshape(k * a, b)))
        # cols: only the selected heads' input slices meet the delta: [..., k*hd] @ [k*hd, d_out]
        return output + F.linear(x.index_select(-1, index), delta.permute(1, 0, 2).reshape(a, k * b))

    @torch.no_grad()
    def effective_weight(self, module_name: str) -> torch.Tensor:
        """W + scatter(delta) of one module (a new tensor; the base weight is untouched)."""
        weight = self._module_at(module_name).weight.detach().clone()
        for key, slot in self.slots.items():
            if slot.module_name == module_name:
                _add_into(weight, slot.kind, self._index[key], self.deltas[key])
        return weight

    @torch.no_grad()
    def fold(self) -> None:
        """Add the deltas into the base weights in place and remove the hooks: a plain HF model remains."""
        self.detach()
        for key, slot in self.slots.items():
            _add_into(self._module_at(slot.module_name).weight, slot.kind, self._index[key], self.deltas[key])

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The deltas one per head under the saved-file keys (module docstring)."""
        out = {}
        for key, slot in self.slots.items():
            delta = self.deltas[key].detach()
            if slot.kind == "full":
                out[f"{slot.module_name}.weight"] = delta
            for j, h in enumerate(slot.heads):
                out[f"{slot.module_name}.weight.{slot.label}.{h}"] = delta[j].clone()  # own storage per key
        return out

    @property
    def head_keys(self) -> list[str]:
        """Parameters of attention heads (what grad_scale applies to), not of MLP layers."""
        return [key for key, slot in self.slots.items() if slot.kind != "full"]


# ---------------------------------------------------------------------------------------------------
# Preparing a model


@dataclass
class FineTune:
    """A model made ready for training by `prepare`.

    params: exactly the trained tensors, by name (the deltas', the adapters' or all the model's).
    model: the module to call (lm.model, or the peft wrapper for lora).  deltas: the HeadDeltas (precise,
    random_heads).  grad_scale: the resolved factor on the head deltas' gradients (1.0: none).
    """

    lm: LoadedModel
    method: Method
    model: nn.Module
    params: dict[str, nn.Parameter]
    grad_scale: float = 1.0
    deltas: HeadDeltas | None = None
    scaled: list[str] = field(default_factory=list)  # names in params that grad_scale applies to

    @property
    def n_trainable(self) -> int:
        """Trained elements: delta elements for the head methods (not the sizes of the matrices they sit in)."""
        return sum(p.numel() for p in self.params.values())

    def merged_model(self) -> nn.Module:
        """The trained model as a plain HF model, for evaluation in this process: the deltas are folded into
        the base weights (in place; afterwards the base is the trained model), LoRA is merged and unloaded."""
        if self.deltas is not None:
            self.deltas.fold()
            self.deltas = None
        elif self.method.name == "lora":
            self.model = self.model.merge_and_unload()
            self.lm.model = self.model
        self.lm.model.eval()
        self.lm.model.requires_grad_(False)
        return self.lm.model


def resolve_grad_scale(grad_scale: float | str | None, lm: LoadedModel, n_selected: int) -> float:
    """The factor on the head deltas' gradients: None -> 1 (the default: no multiplier); "heads_ratio" ->
    H / h with H = n_layers * n_heads (all query heads of the model) and h = n_selected (the trained ones);
    a number -> itself.

    An optional gradient multiplier, off unless configured: with "heads_ratio" the h trained heads' updates
    are scaled up by H/h. It is applied after gradient clipping, so clipping does not undo it, and not to
    MLP deltas. With SGD it multiplies the head deltas' step (the same as an lr H/h times larger for them).
    AdamW is invariant to a constant gradient factor (m scales by c, sqrt(v) by c) except through eps: with
    AdamW the factor mostly makes eps relatively smaller. Scale lr to change the step size itself."""
    if grad_scale is None:
        return 1.0
    if grad_scale == "heads_ratio":
        return lm.n_layers * lm.n_heads / n_selected
    return float(grad_scale)


def prepare(lm: LoadedModel, method: Method | dict, seed: int = 0) -> FineTune:
    """Make `lm` trainable by `method` (in place: hooks, adapters or requires_grad on `lm.model`).

    precise/random_heads: zero deltas on the selected heads (and MLP layers), hooks attached; no base weight
    requires grad. full: every parameter requires grad. lora: peft adapters injected into lm.model,
    initialised with `seed` (the caller's RNG is untouched). Prepare a loaded model once."""
    method = parse_method(method) if isinstance(method, dict) else method
    if method.name in HEAD_METHODS:
        for i, (layer, head) in enumerate(method.heads):
            if not (0 <= layer < lm.n_layers and 0 <= head < lm.n_heads):
                raise ValueError(f"finetune.heads[{i}]: L{layer}H{head} is not a head of this model "
                                 f"({lm.n_layers} layers x {lm.n_heads} heads)")
        for i, layer in enumerate(method.mlp_layers):
            if not 0 <= layer < lm.n_layers:
                raise ValueError(f"finetune.mlp_layers[{i}]: layer {layer} is not in 0..{lm.n_layers - 1}")
        dtype = torch.float32 if method.delta_dtype == "float32" else None
        deltas = HeadDeltas(lm, method.heads, method.train_kv, method.mlp_layers, dtype).attach()
        params = dict(deltas.deltas.items())
        scale = resolve_grad_scale(method.grad_scale, lm, len(method.heads))
        return FineTune(lm, method, lm.model, params, scale, deltas, deltas.head_keys)
    if method.name == "full":
        lm.model.requires_grad_(True)
        return FineTune(lm, method, lm.model, dict(lm.model.named_parameters()))
    from peft import LoraConfig, get_peft_model

    cfg = method.lora
    config = LoraConfig(r=cfg["r"], lora_alpha=cfg["alpha"], lora_dropout=cfg["dropout"],
                        target_modules=list(cfg["target_modules"]), bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[lm.device] if lm.device.type == "cuda" else []):
        torch.manual_seed(seed)
        try:
            peft_model = get_peft_model(lm.model, config)
        except ValueError as err:
            raise ValueError(f"finetune.lora.target_modules {cfg['target_modules']}: {err}") from err
    params = {n: p for n, p in peft_model.named_parameters() if p.requires_grad}
    return FineTune(lm, method, peft_model, params)


# ---------------------------------------------------------------------------------------------------
# Training


@dataclass
class TrainStats:
    """What a training run measured. Lists have one entry per optimizer step of the whole run, resumed
    steps included (from the checkpoint).

    losses: mean cross-entropy per target token of each step.  step_times_s: wall time of each step
    (forwards, backwards, optimizer).  peak_memory_bytes: on CUDA torch.cuda.max_memory_allocated during
    this call; on CPU the peak resident set size of the whole PROCESS over its lifetime (getrusage), which
    includes the model, the data and anything the process did before.  optimizer_state_bytes: the tensors
    in optimizer.state (AdamW: exp_avg, exp_avg_sq, step; SGD without momentum: none, 0 bytes)."""

    method: str
    n_trainable: int
    optimizer_state_bytes: int
    steps: int
    total_steps: int
    losses: list[float]
    step_times_s: list[float]
    peak_memory_bytes: int
    peak_memory_kind: str
    resumed_from_step: int | None = None
    evaluations: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
               if torch.is_tensor(t))


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated"
    # ru_maxrss is in kilobytes on Linux (bytes on macOS).
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024, "process_peak_rss"


def train(ft: FineTune, examples: Sequence[tuple[str, str]], config: TrainConfig | dict, *,
          checkpoint_dir: str | Path | None = None, stop_at_step: int | None = None,
          progress: bool = True, append_eos: bool = True,
          evaluate: Callable[[int], dict] | None = None, evaluate_every: int | None = None) -> TrainStats:
    """Train `ft` on (prompt, target) pairs with the configured optimizer (AdamW or SGD) over its trained
    parameters only.

    Loss: cross-entropy on the target tokens and eos (`encode_example`; append_eos=False: no eos is
    appended, and a target that ends with eos keeps it either way), averaged over all target tokens
    of an optimizer step (so grad_accumulation x batch_size is exactly one large batch). Examples are
    shuffled per epoch (`epoch_order`); the last step of an epoch may be smaller. Dropout follows the model
    config (train mode during the call, eval mode after) and lora.dropout; its RNG is seeded with `seed`
    (the caller's RNG is untouched).

    checkpoint_dir: every `checkpoint_every` steps and at the end of the call a checkpoint is written there
    (`save_checkpoint`); a call that finds one resumes from it, and ends with the same parameters as an
    uninterrupted run. stop_at_step: end the call after this many optimizer steps in all (resumed ones
    included), without changing the schedule, as if the job were killed there (or to split a long run over
    time-limited jobs).

    evaluate, evaluate_every: after every `evaluate_every`-th optimizer step (and after the last one)
    `evaluate(step)` is called with the model in eval mode and no gradients, and the dict it returns is kept
    in `TrainStats.evaluations` (and in checkpoints, so a resumed run keeps the earlier ones): learning
    curves without saving a model per point. It must not use the torch RNG's state for anything that
    matters (greedy decoding does not), since the training RNG continues after it.
    """
    config = TrainConfig.from_dict(config) if isinstance(config, dict) else config._checked("finetune.train")
    lm, device = ft.lm, ft.lm.device
    tokenizer = lm.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for i, ex in enumerate(examples):
        if not (isinstance(ex, (tuple, list)) and len(ex) == 2 and all(isinstance(s, str) for s in ex)):
            raise ValueError(f"examples[{i}]: expected a (prompt, target) pair of strings, got {ex!r}")
    if not examples:
        raise ValueError("examples: nothing to train on (empty list)")
    encoded = [encode_example(tokenizer, p, t, config.max_length, eos=append_eos) for p, t in examples]
    per_step = config.batch_size * config.grad_accumulation
    steps_per_epoch = math.ceil(len(encoded) / per_step)
    total = config.max_steps or config.epochs * steps_per_epoch
    stop = total if stop_at_step is None else min(total, stop_at_step)

    params = list(ft.params.values())
    scaled = [ft.params[n] for n in ft.scaled] if ft.grad_scale != 1.0 else []
    optimizer = config.make_optimizer(params)
    fingerprint = {"config": asdict(config), "method": ft.method.describe(),
                   "data": config_hash([list(ex) for ex in examples]), "append_eos": append_eos,
                   "n_trainable": ft.n_trainable}
    history = {"losses": [], "step_times_s": []}
    start, resumed = 0, None
    checkpoint = latest_checkpoint(checkpoint_dir) if checkpoint_dir is not None else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    cuda_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(config.seed)
        if checkpoint is not None:
            start, history = _load_checkpoint(checkpoint, ft, optimizer, fingerprint)
            resumed = start
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        bar = tqdm(total=total, initial=start, desc=f"finetune {ft.method.name}", file=sys.stderr,
                   disable=not progress, dynamic_ncols=True)
        saved_at = start
        ft.model.train()
        try:
            for step in range(start, stop):
                t0 = time.perf_counter()
                epoch, position = divmod(step, steps_per_epoch)
                chosen = epoch_order(config.seed, epoch, len(encoded))[position * per_step:(position + 1) * per_step]
                step_examples = [encoded[i] for i in chosen]
                # Position 0 predicts nothing (`batch_loss` shifts), so its label never counts.
                n_tokens = max(1, sum(sum(y != IGNORE_INDEX for y in labels[1:]) for _, labels in step_examples))
                optimizer.zero_grad(set_to_none=True)
                loss_sum = 0.0
                for j in range(0, len(step_examples), config.batch_size):
                    batch = collate(step_examples[j:j + config.batch_size], pad_id, device)
                    loss, _ = batch_loss(ft.model, batch)
                    (loss / n_tokens).backward()
                    loss_sum += loss.item()
                if config.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                for p in scaled:  # after clipping, so the clip does not undo the factor
                    if p.grad is not None:
                        p.grad.mul_(ft.grad_scale)
                for group in optimizer.param_groups:
                    group["lr"] = config.lr * lr_factor(step, total, config.warmup_steps, config.schedule)
                optimizer.step()
                sync()
                history["losses"].append(loss_sum / n_tokens)
                history["step_times_s"].append(time.perf_counter() - t0)
                bar.update(1)
                bar.set_postfix(loss=f"{history['losses'][-1]:.4f}")
                if evaluate is not None and ((step + 1) % (evaluate_every or total) == 0 or step + 1 == total):
                    ft.model.eval()
                    with torch.no_grad():
                        history.setdefault("evaluations", []).append({"step": step + 1, **evaluate(step + 1)})
                    ft.model.train()
                if checkpoint_dir is not None and config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
                    save_checkpoint(checkpoint_dir, ft, optimizer, step + 1, steps_per_epoch, fingerprint, history)
                    saved_at = step + 1
        finally:
            bar.close()
            ft.model.eval()
        done = max(start, stop)  # a checkpoint past stop_at_step stays where it is
        if checkpoint_dir is not None and done > saved_at:
            save_checkpoint(checkpoint_dir, ft, optimizer, done, steps_per_epoch, fingerprint, history)
    peak, kind = _peak_memory(device)
    return TrainStats(ft.method.name, ft.n_trainable, optimizer_state_bytes(optimizer), done, total,
                      history["losses"], history["step_times_s"], peak, kind, resumed,
                      history.get("evaluations", []))


# ---------------------------------------------------------------------------------------------------
# Checkpoints


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in `checkpoint_dir` (named by its `latest` file), or None."""
    checkpoint_dir = Path(checkpoint_dir)
    pointer = checkpoint_dir / "latest"
    if pointer.is_file() and (checkpoint_dir / pointer.read_text().strip()).is_dir():
        return checkpoint_dir / pointer.read_text().strip()
    # Killed between renaming a checkpoint into place and updating `latest`: the step-* dirs are complete.
    steps = sorted(checkpoint_dir.glob("step-*")) if checkpoint_dir.is_dir() else []
    return steps[-1] if steps else None


def save_checkpoint(checkpoint_dir: str | Path, ft: FineTune, optimizer: torch.optim.Optimizer, step: int,
                    steps_per_epoch: int, fingerprint: dict, history: dict) -> Path:
    """Write checkpoint_dir/step-{step:08d}/ atomically (built in a temporary folder, renamed into place,
    then named in checkpoint_dir/latest; older checkpoints are removed after). It holds:
      trainable.safetensors   the trained tensors (ft.params)
      optimizer.pt            the optimizer's state dict (AdamW moments; SGD: hyperparameters only)
      rng.pt                  the torch CPU (and CUDA) RNG states after `step` steps
      trainer.json            step, epoch and position in it, the lr schedule's position, the run's
                              fingerprint (config, method, data hash) and the loss/time history."""
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=checkpoint_dir))
    try:
        save_file({n: p.detach().contiguous().cpu() for n, p in ft.params.items()}, str(tmp / "trainable.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        rng = {"cpu": torch.get_rng_state()}
        if ft.lm.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(ft.lm.device)
        torch.save(rng, tmp / "rng.pt")
        epoch, position = divmod(step, steps_per_epoch)
        state = {"step": step, "epoch": epoch, "position_in_epoch": position, "steps_per_epoch": steps_per_epoch,
                 "scheduler": {"step": step, "lr": [g["lr"] for g in optimizer.param_groups]},
                 "fingerprint": fingerprint, "history": history}
        write_json(state, tmp / "trainer.json")
        final = checkpoint_dir / name
        if final.exists():  # the same step written again (a rerun): replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with atomic_path(checkpoint_dir / "latest") as pointer:
        pointer.write_text(name + "\n")
    for old in checkpoint_dir.glob("step-*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _load_checkpoint(path: Path, ft: FineTune, optimizer: torch.optim.Optimizer, fingerprint: dict) -> tuple[int, dict]:
    """Restore parameters, optimizer and RNG from checkpoint `path`; return (step, history)."""
    state = json.loads((path / "trainer.json").read_text())
    saved = state["fingerprint"]
    saved.setdefault("append_eos", True)  # written before append_eos existed
    for key in ("method", "data", "append_eos", "n_trainable"):
        if saved[key] != fingerprint[key]:
            raise ValueError(f"checkpoint {path} belongs to another run: its {key} is {saved[key]!r}, this run's "
                             f"is {fingerprint[key]!r}; use another checkpoint_dir or delete it")
    defaults = {f.name: f.default for f in fields(TrainConfig)}  # keys added since the checkpoint was written
    for key, value in fingerprint["config"].items():
        if key not in RESUMABLE_CHANGES and saved["config"].get(key, defaults[key]) != value:
            raise ValueError(f"checkpoint {path} was written with finetune.train.{key}="
                             f"{saved['config'].get(key, defaults[key])!r}, "
                             f"this run has {value!r}; only {list(RESUMABLE_CHANGES)} may change on resume")
    tensors = load_file(str(path / "trainable.safetensors"))
    if set(tensors) != set(ft.params):
        raise ValueError(f"checkpoint {path} holds other parameters than this run trains")
    with torch.no_grad():
        for name, p in ft.params.items():
            p.copy_(tensors[name])
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=ft.lm.device, weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and ft.lm.device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], ft.lm.device)
    return state["step"], state["history"]


# ---------------------------------------------------------------------------------------------------
# Saving and applying what was trained


def _lora_factors(ft: FineTune) -> dict[str, torch.Tensor]:
    """The trained LoRA factors of every adapted module, under `<module path in the base model>.weight.`
    lora_A [r, d_in] and lora_B [d_out, r], the scaling alpha/r folded into lora_B, so that the update of
    the weight is lora_B @ lora_A. A module that stores its weight transposed (fan_in_fan_out, GPT-2's
    Conv1D) saves its whole update under `.weight` instead."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, module in ft.model.get_base_model().named_modules():
        if not isinstance(module, LoraLayer):
            continue
        if getattr(module, "fan_in_fan_out", False):
            out[f"{name}.weight"] = module.get_delta_weight("default").detach()
            continue
        out[f"{name}.weight.lora_A"] = module.lora_A["default"].weight.detach().clone()
        out[f"{name}.weight.lora_B"] = (module.lora_B["default"].weight * module.scaling["default"]).detach()
    return out


def save_trained(ft: FineTune, path: str | Path, meta: dict | None = None) -> Path:
    """Save what was trained (module docstring): a safetensors file of deltas for precise and random_heads,
    of the LoRA factors for lora, or an HF model directory for full.
    `meta` is added to the recorded metadata. Written atomically; returns `path`."""
    path = Path(path)
    lm = ft.lm
    if ft.method.name == "full":
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            lm.model.save_pretrained(tmp)
            lm.tokenizer.save_pretrained(tmp)
            (tmp / "finetune.json").write_text(json.dumps({**ft.method.describe(), **(meta or {})}, indent=2) + "\n")
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return path
    tensors = ft.deltas.named_tensors() if ft.deltas is not None else _lora_factors(ft)
    info = {**ft.method.describe(), "n_layers": lm.n_layers, "n_heads": lm.n_heads, "n_kv_heads": lm.n_kv_heads,
            "head_dim": lm.head_dim, "d_model": lm.d_model, "n_trainable": ft.n_trainable,
            "shapes": {k: list(v.shape) for k, v in tensors.items()}, **(meta or {})}
    write_safetensors(tensors, path, info)
    return path


def read_trained_meta(path: str | Path) -> dict:
    """The metadata `save_trained` wrote (method, heads, shapes, ...)."""
    path = Path(path)
    if path.is_dir():
        return json.loads((path / "finetune.json").read_text())
    with safe_open(str(path), "pt") as f:
        return json.loads((f.metadata() or {}).get("arithmech", "{}"))


@torch.no_grad()
def apply_trained(model: LoadedModel | nn.Module, path: str | Path) -> nn.Module:
    """Add the deltas saved by `save_trained` to `model`'s weights IN PLACE and return the (HF) model.

    The result is a plain model without hooks (the same as `FineTune.merged_model` after training). Deltas
    are cast to the weight's dtype. A full fine-tune is a whole model directory: load it with load_model."""
    module = model.model if isinstance(model, LoadedModel) else model
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a directory (a full fine-tune saves a whole model): load it with "
                         "arithmech.models.load_model instead of applying it to a base model")
    modules = dict(module.named_modules())
    tensors = load_file(str(path))
    factors = {key: tensors.pop(key) for key in [k for k in tensors if re.search(r"\.lora_[AB]$", k)]}
    for key in sorted(k for k in factors if k.endswith(".lora_A")):
        pair = key[: -len("A")] + "B"
        if pair not in factors:
            raise ValueError(f"{path}: {key} has no {pair}")
        tensors[key[: -len(".lora_A")]] = factors.pop(pair).float() @ factors.pop(key).float()  # [d_out, d_in]
    if factors:
        raise ValueError(f"{path}: {sorted(factors)} without their lora_A")
    for key, delta in tensors.items():
        m = re.fullmatch(r"(.+)\.weight(?:\.(head|kv_head)\.(\d+))?", key)
        if m is None or m[1] not in modules:
            raise ValueError(f"{path}: key {key!r} names no module of this model")
        weight = modules[m[1]].weight
        if m[2] is None:
            if delta.shape != weight.shape:
                raise ValueError(f"{path}: {key} has shape {list(delta.shape)}, the weight {list(weight.shape)}")
            _add_into(weight, "full", None, delta)
            continue
        # o_proj: a [d_out, hd] block of columns; q/k/v_proj: a [hd, d_in] block of rows.
        kind = "cols" if m[1].endswith("o_proj") else "rows"
        sliced_dim = 1 if kind == "cols" else 0
        head_dim = delta.shape[sliced_dim]
        index = _head_index([int(m[3])], head_dim, weight.device)
        if delta.shape[1 - sliced_dim] != weight.shape[1 - sliced_dim] or int(index[-1]) >= weight.shape[sliced_dim]:
            raise ValueError(f"{path}: {key} of shape {list(delta.shape)} does not fit the weight "
                             f"{list(weight.shape)} of {m[1]}")
        _add_into(weight, kind, index, delta[None])
    return module


def load_trained(base_dir: str | Path, trained: str | Path, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    """The fine-tuned model for evaluation: load_model(trained) for a full fine-tune (a directory), else the
    base model with the saved deltas applied."""
    from .models import load_model

    if Path(trained).is_dir():
        return load_model(trained, device=device, dtype=dtype)
    lm = load_model(base_dir, device=device, dtype=dtype)
    apply_trained(lm, trained)
    return lm
