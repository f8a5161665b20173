"""Mean node outputs over prompts, by position counted back from END: what mean ablation puts in place of a
node's output (`patching.collect` computes them, `ablation` ablates with them)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AlignedMean:
    """Mean node outputs over prompts, by position counted back from END (index 0 is END).

    heads: [n_positions, n_layers, n_heads, head_dim];  mlps: [n_positions, n_layers, d_model]
    """

    heads: torch.Tensor
    mlps: torch.Tensor


@dataclass
class GroupedMean:
    """Mean node outputs per group of prompts (e.g. per template), by position counted back from END (index
    0 is END), each offset averaged over the group's prompts that reach it (prompts differ in length).

    heads: [n_groups, n_positions, n_layers, n_heads, head_dim];  mlps: [n_groups, n_positions, n_layers, d_model]
    counts: [n_groups, n_positions] prompts averaged at each offset (0 beyond a group's longest prompt)
    """

    heads: torch.Tensor
    mlps: torch.Tensor
    counts: torch.Tensor

    def group(self, g: int) -> AlignedMean:
        """Group g's mean over the offsets its prompts reach (for `ablation.mean_ablate(positions="aligned")`)."""
        n = int((self.counts[g] > 0).sum())
        return AlignedMean(self.heads[g, :n], self.mlps[g, :n])

    def end(self) -> AlignedMean:
        """The END mean over all prompts of all groups (count-weighted), P = 1."""
        w = self.counts[:, 0].double()
        heads = (self.heads[:, 0].double() * w[:, None, None, None]).sum(0) / w.sum()
        mlps = (self.mlps[:, 0].double() * w[:, None, None]).sum(0) / w.sum()
        return AlignedMean(heads[None].float(), mlps[None].float())
