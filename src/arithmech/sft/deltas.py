"""Per-head delta parameters: the hooks that train them on top of frozen base weights (`HeadDeltas`), and
the saved file of what was trained (`save_trained`) with its inverse, adding it to a base model
(`apply_trained`).

How the heads are trained. The base weights are never touched: each selected slice gets its own DELTA
parameter, and a forward hook on the projection adds the delta's contribution to the module's output, so the
effective weight is W + scatter(delta) (`HeadDeltas.effective_weight`) without ever forming that matrix:
  rows (q/k/v_proj):  out[..., rows(h)] += x @ delta_h.T          delta_h: [hd, d_in]
  cols (o_proj):      out += x[..., cols(h)] @ delta_h.T          delta_h: [d_out, hd]
  full (MLP weights): out += x @ delta.T                          delta:   [d_out, d_in]
Only the deltas require gradients, so autograd computes no gradient for any base weight, and the optimizer
holds state for the deltas only. Biases (Qwen2's q/k/v) are not trained.

Saved artifacts (`save_trained`): for the head methods (precise, random_heads, ...) one safetensors file of
deltas, which `apply_trained` adds to a base model in place (a plain HF model afterwards, no training hooks); keys
name the module and head:
  model.layers.{l}.self_attn.q_proj.weight.head.{h}       [hd, d_model]   rows h*hd:(h+1)*hd
  model.layers.{l}.self_attn.o_proj.weight.head.{h}       [d_model, hd]   columns h*hd:(h+1)*hd
  model.layers.{l}.self_attn.k_proj.weight.kv_head.{g}    [hd, d_model]   rows g*hd:(g+1)*hd (v_proj alike)
  model.layers.{l}.mlp.gate_proj.weight                   the whole matrix (MLP layers)
with the method, heads and shapes as JSON in the header (`read_trained_meta`). For lora, a PEFT adapter
directory (peft's own `save_pretrained`: adapter_config.json, adapter_model.safetensors with the factors
unscaled), which `PeftModel.from_pretrained(base, path)` loads and `apply_trained` merges into a base model
(`lora_updates`). For full, a normal HF directory (save_pretrained plus the tokenizer), loaded with
`loading.load_model`. Both directories hold the recorded metadata in finetune.json.
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from arithmech.interp.nodes import Head
from arithmech.intervention.hooks import hooks
from arithmech.io import atomic_dir, write_safetensors
from arithmech.model.loading import LoadedModel, load_model

MLP_PROJS = ("gate_proj", "up_proj", "down_proj")
META_FILE = "finetune.json"  # the recorded metadata of a saved directory (full, lora)
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # peft's file names


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

    def __init__(self, lm: LoadedModel, heads: Sequence[Head], *, train_kv: bool = False,
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
            self._add(lm, layer, lm.attn_proj(layer, "q_proj"), "q_proj", kind="rows", heads=hs, label="head",
                      dtype=dtype)
            self._add(lm, layer, lm.attn_proj(layer, "o_proj"), "o_proj", kind="cols", heads=hs, label="head",
                      dtype=dtype)
            if train_kv:
                self._add(lm, layer, lm.attn_proj(layer, "k_proj"), "k_proj", kind="rows", heads=kv, label="kv_head",
                          dtype=dtype)
                self._add(lm, layer, lm.attn_proj(layer, "v_proj"), "v_proj", kind="rows", heads=kv, label="kv_head",
                          dtype=dtype)
        for layer in sorted(mlp_layers):
            for proj in MLP_PROJS:
                self._add(lm, layer, lm.mlp_proj(layer, proj), proj, kind="full", heads=(), label="", dtype=dtype)

    def _add(self, lm: LoadedModel, layer: int, module: nn.Linear, proj: str, *, kind: str, heads: Sequence[int],
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


def save_trained(ft, path: str | Path, meta: dict | None = None) -> Path:
    """Save what `ft` (a `training.FineTune`) trained (module docstring): a safetensors file of deltas for
    the head methods, a PEFT adapter directory for lora, or an HF model directory for full.
    `meta` is added to the recorded metadata. Written atomically; returns `path`."""
    path = Path(path)
    lm = ft.lm
    if ft.method.name == "full":
        with atomic_dir(path) as tmp:
            lm.model.save_pretrained(tmp)
            lm.tokenizer.save_pretrained(tmp)
            (tmp / META_FILE).write_text(json.dumps({**ft.method.describe(), **(meta or {})}, indent=2) + "\n")
        return path
    info = {**ft.method.describe(), "n_layers": lm.n_layers, "n_heads": lm.n_heads, "n_kv_heads": lm.n_kv_heads,
            "head_dim": lm.head_dim, "d_model": lm.d_model, "n_trainable": ft.n_trainable}
    if ft.method.name == "lora":
        with atomic_dir(path) as tmp:
            # The embeddings are never trained here; "auto" would look the base model up on the Hub.
            ft.model.save_pretrained(tmp, save_embedding_layers=False)
            (tmp / META_FILE).write_text(json.dumps({**info, **(meta or {})}, indent=2) + "\n")
        return path
    tensors = ft.deltas.named_tensors()
    write_safetensors(tensors, path, {**info, "shapes": {k: list(v.shape) for k, v in tensors.items()}, **(meta or {})})
    return path


def lora_updates(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The weight update of every module of a PEFT LoRA adapter directory (as `save_trained` writes it), under
    `<module path in the base model>.weight`: (lora_B * alpha/r) @ lora_A in float32, [d_out, d_in]. The
    scaling goes into lora_B before the product, the order of the factors saved before the PEFT layout, so
    evaluations are bit-identical to those. Adapter options that change the update otherwise (rsLoRA, rank
    or alpha patterns, fan_in_fan_out; DoRA, biases and saved modules show as other keys) are errors."""
    adapter_dir = Path(adapter_dir)
    config_file, weights_file = adapter_dir / ADAPTER_CONFIG, adapter_dir / ADAPTER_WEIGHTS
    config = json.loads(config_file.read_text())
    others = [key for key in ("use_rslora", "rank_pattern", "alpha_pattern", "fan_in_fan_out") if config.get(key)]
    if config.get("peft_type") != "LORA" or others:
        raise ValueError(f"{config_file}: expected a plain LoRA adapter (peft_type LORA, as save_trained writes "
                         f"it), got peft_type {config.get('peft_type')!r} with {others or 'no other options'}")
    scaling = config["lora_alpha"] / config["r"]
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(str(weights_file)).items():
        m = re.fullmatch(r"base_model\.model\.(.+)\.lora_([AB])\.weight", key)
        if m is None:
            raise ValueError(f"{weights_file}: key {key!r} is not a LoRA factor "
                             "(base_model.model.<module>.lora_A.weight or .lora_B.weight)")
        factors.setdefault(m[1], {})[m[2]] = tensor
    updates = {}
    for module, pair in sorted(factors.items()):
        if set(pair) != {"A", "B"}:
            raise ValueError(f"{weights_file}: {module} has lora_{''.join(pair)} without its pair")
        updates[f"{module}.weight"] = (pair["B"] * scaling).float() @ pair["A"].float()  # [d_out, d_in]
    return updates


def read_trained_meta(path: str | Path) -> dict:
    """The metadata `save_trained` wrote (method, heads, shapes, ...)."""
    path = Path(path)
    if path.is_dir():
        return json.loads((path / META_FILE).read_text())
    with safe_open(str(path), "pt") as f:
        return json.loads((f.metadata() or {}).get("arithmech", "{}"))


@torch.no_grad()
def apply_trained(model: LoadedModel | nn.Module, path: str | Path) -> nn.Module:
    """Add what `save_trained` saved at `path` (a deltas file or a LoRA adapter directory) to `model`'s weights
    IN PLACE and return the (HF) model.

    The result is a plain model without training hooks (the same as `FineTune.merged_model` after training). Updates
    are cast to the weight's dtype. A full fine-tune is a whole model directory: load it with load_model."""
    module = model.model if isinstance(model, LoadedModel) else model
    path = Path(path)
    if path.is_dir() and not (path / ADAPTER_CONFIG).is_file():
        raise ValueError(f"{path} is a directory (a full fine-tune saves a whole model): load it with "
                         "arithmech.model.loading.load_model instead of applying it to a base model")
    modules = dict(module.named_modules())
    tensors = lora_updates(path) if path.is_dir() else load_file(str(path))
    if any(re.search(r"\.lora_[AB]$", key) for key in tensors):
        raise ValueError(f"{path} holds LoRA factors in the former layout (keys <module>.weight.lora_A and "
                         ".lora_B), which is no longer read: LoRA is now saved as a PEFT adapter directory; re-run "
                         "the rule that trained it (finetune, or study_train for a study run) to save it anew")
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
    """The fine-tuned model for evaluation: load_model(trained) for a full fine-tune (a model directory), else
    the base model with the saved deltas or LoRA adapter applied (`apply_trained`)."""
    trained = Path(trained)
    if trained.is_dir() and not (trained / ADAPTER_CONFIG).is_file():
        return load_model(trained, device=device, dtype=dtype)
    lm = load_model(base_dir, device=device, dtype=dtype)
    apply_trained(lm, trained)
    return lm
