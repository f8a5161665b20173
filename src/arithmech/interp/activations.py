"""The activations cache of rule cache_activations (results/{model}/activations/{task}.safetensors): its one layout,
written and read here only.

    ref_<field>, cf_<field>    `patching.EndState` of the identification pairs' reference and counterfactual
                               prompts at END, each field of `STATE_FIELDS` ([n, ...])
    answer_ids, sample_ids     [n]: the answers' first token ids and the pairs' sample ids
    cf_mean_heads, _mlps       [1, L, H, head_dim], [1, L, d_model]: the END mean over every counterfactual
    cf_template_heads, _mlps   [n_templates, P, L, ...]: each template's counterfactual mean at every offset P
                               from END (index 0 = END), with cf_template_counts [n_templates, P]
                               (`means.GroupedMean`)

Torch is imported where tensors are made or read, so `make plan` can read `STATE_FIELDS` without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    import torch

    from arithmech.interp.patching import EndState
    from arithmech.intervention.means import AlignedMean, GroupedMean

STATE_FIELDS = ("heads", "mlps", "resid", "logits", "logprobs", "predicted")


def cache_tensors(ref: EndState, cf: EndState, grouped: GroupedMean, answer_ids: torch.Tensor,
                  sample_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The cache file's tensors (module docstring) from the reference and counterfactual END states, the
    counterfactuals' per-template means (`patching.collect(..., groups=...)`) and the pairs' ids."""
    end = grouped.end()
    return {**{f"ref_{k}": getattr(ref, k) for k in STATE_FIELDS}, **{f"cf_{k}": getattr(cf, k) for k in STATE_FIELDS},
            "answer_ids": answer_ids, "sample_ids": sample_ids,
            "cf_mean_heads": end.heads, "cf_mean_mlps": end.mlps,
            "cf_template_heads": grouped.heads, "cf_template_mlps": grouped.mlps,
            "cf_template_counts": grouped.counts}


def cache_states(cache: dict) -> tuple[EndState, EndState, torch.Tensor, torch.Tensor]:
    """(reference, counterfactual, answer_ids [n], sample_ids [n]) from a cache file's tensors."""
    from arithmech.interp.patching import EndState

    ref = EndState(**{k: cache[f"ref_{k}"] for k in STATE_FIELDS})
    cf = EndState(**{k: cache[f"cf_{k}"] for k in STATE_FIELDS})
    return ref, cf, cache["answer_ids"], cache["sample_ids"]


def cache_means(cache: dict, positions: str) -> AlignedMean | GroupedMean:
    """The counterfactual means a node set is ablated with at the knockout rule's `positions`, from a cache file's
    tensors: "end", the END mean over all identification counterfactuals; "all", each template's mean at every
    offset from END (`means.GroupedMean`)."""
    from arithmech.intervention.means import AlignedMean, GroupedMean

    if positions == "end":
        return AlignedMean(cache["cf_mean_heads"], cache["cf_mean_mlps"])
    return GroupedMean(cache["cf_template_heads"], cache["cf_template_mlps"], cache["cf_template_counts"])
