"""Hooks on the model's real modules: one context manager that attaches and always removes them, and two
specialisations, `capture` (read head and MLP outputs) and `patch_end` (overwrite them at END).

END is the last position: batches are left-padded, so it is index -1 for every row.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from arithmech.model.loading import LoadedModel

Hook = tuple[nn.Module, Callable]


@contextmanager
def hooks(pre: Iterable[Hook] = (), post: Iterable[Hook] = ()) -> Iterator[None]:
    """Register forward pre-hooks and forward hooks for the duration of the block."""
    handles = [m.register_forward_pre_hook(fn) for m, fn in pre]
    handles += [m.register_forward_hook(fn) for m, fn in post]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class Captured:
    """What one forward pass wrote. With `end_only`, the sequence axis is dropped.

    heads[layer]: [batch, (seq,) n_heads, head_dim]   input of o_proj, split per query head
    mlps[layer]:  [batch, (seq,) d_model]             output of the MLP module
    resid_final:  [batch, (seq,) d_model]             input of the final norm (the residual stream)

    Each layer's entries are on that layer's device; `resid_final` and the stacked tensors are on `device`
    (the model's input device, where the batch and its masks are).
    """

    heads: dict[int, torch.Tensor] = field(default_factory=dict)
    mlps: dict[int, torch.Tensor] = field(default_factory=dict)
    resid_final: torch.Tensor | None = None
    device: torch.device | None = None

    def _stacked(self, per_layer: dict[int, torch.Tensor], dim: int) -> torch.Tensor:
        # On a model spread over devices the layers' captures are on several devices, which torch.stack
        # refuses: gather them on one (a no-op on a model on one device).
        return torch.stack([per_layer[k].to(self.device) for k in sorted(per_layer)], dim=dim)

    def stacked_heads(self) -> torch.Tensor:
        """[batch, (seq,) n_layers, n_heads, head_dim] in layer order."""
        return self._stacked(self.heads, dim=-3)

    def stacked_mlps(self) -> torch.Tensor:
        """[batch, (seq,) n_layers, d_model] in layer order."""
        return self._stacked(self.mlps, dim=-2)


@contextmanager
def capture(lm: LoadedModel, layers: Iterable[int] | None = None, end_only: bool = True) -> Iterator[Captured]:
    """Record head outputs, MLP outputs and the final residual of `layers` (default: all) during forwards."""
    out = Captured(device=lm.device)
    layers = range(lm.n_layers) if layers is None else list(layers)
    pick = (lambda x: x[:, -1]) if end_only else (lambda x: x)

    def head_hook(layer):
        def fn(module, args):
            x = pick(args[0]).detach()
            out.heads[layer] = x.reshape(*x.shape[:-1], lm.n_heads, lm.head_dim)

        return fn

    def mlp_hook(layer):
        def fn(module, args, output):
            out.mlps[layer] = pick(output).detach()

        return fn

    def resid_hook(module, args):
        out.resid_final = pick(args[0]).detach().to(out.device)  # from the last layer's device, if spread

    pre = [(lm.o_proj(l), head_hook(l)) for l in layers] + [(lm.final_norm, resid_hook)]
    post = [(lm.mlp(l), mlp_hook(l)) for l in layers]
    with hooks(pre, post):
        yield out


@contextmanager
def patch_end(
    lm: LoadedModel,
    heads: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    mlps: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Iterator[None]:
    """Overwrite node outputs at END where a mask says so; everything else runs untouched.

    heads[layer] = (mask [batch, n_heads] bool, values [batch, n_heads, head_dim])
    mlps[layer]  = (mask [batch] bool,          values [batch, d_model])
    `values` broadcast against the batch, so a mean ([n_heads, head_dim]) works as well as per-row values.
    """
    # The one-position case of `patch_tail`: give the values a position axis of length 1 (index 0 = END).
    heads = {l: (mask, values.unsqueeze(-3)) for l, (mask, values) in (heads or {}).items()}
    mlps = {l: (mask, values.unsqueeze(-2)) for l, (mask, values) in (mlps or {}).items()}
    with patch_tail(lm, heads, mlps):
        yield


@contextmanager
def patch_tail(
    lm: LoadedModel,
    heads: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    mlps: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Iterator[None]:
    """Overwrite node outputs at the last positions of every forward, with per-row and per-node masks.

    heads[layer] = (mask [batch, n_heads] or [n_heads] bool, values [(batch,) n_pos, n_heads, head_dim])
    mlps[layer]  = (mask [batch] or [] bool,                  values [(batch,) n_pos, d_model])

    values[..., j, ...] is written at offset j back from the last position (j = 0 is END, the convention of
    `means.AlignedMean`), for j < min(n_pos, seq); positions further back are left alone. A forward over
    one new token (generation with a KV cache) therefore writes the j = 0 value on that token only. With
    n_pos = 1 and a [batch, ...] mask this is `patch_end`. A leading batch axis on `values` gives per-row
    values; without it the same values go to every row.
    """
    heads, mlps = heads or {}, mlps or {}
    H, D = lm.n_heads, lm.head_dim

    def head_hook(mask, values):
        mask = mask.to(torch.bool)[..., None, :, None]  # [(B,) 1, H, 1]

        def fn(module, args):
            x = args[0]
            B, S = x.shape[:2]
            n = min(values.shape[-3], S)
            v = values[..., :n, :, :].flip(-3).to(x.device, x.dtype)  # oldest first, END last
            tail = x[:, S - n :].reshape(B, n, H, D)
            x = x.clone()
            x[:, S - n :] = torch.where(mask.to(x.device), v, tail).reshape(B, n, H * D)
            return (x, *args[1:])

        return fn

    def mlp_hook(mask, values):
        mask = mask.to(torch.bool)[..., None, None]  # [(B,) 1, 1]

        def fn(module, args, output):
            S = output.shape[1]
            n = min(values.shape[-2], S)
            v = values[..., :n, :].flip(-2).to(output.device, output.dtype)
            output = output.clone()
            output[:, S - n :] = torch.where(mask.to(output.device), v, output[:, S - n :])
            return output

        return fn

    pre = [(lm.o_proj(l), head_hook(*heads[l])) for l in heads]
    post = [(lm.mlp(l), mlp_hook(*mlps[l])) for l in mlps]
    with hooks(pre, post):
        yield
