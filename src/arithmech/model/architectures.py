"""The supported architectures as data: one entry per Hugging Face `model_type`, naming the modules of its
decoder layer that arithmech reads, writes and hooks, and which closed forms its block allows.

    spec = architectures.spec("gemma3_text")   # or architectures.check(config) for a whole HF config
    spec.mlp_norm                               # "pre_feedforward_layernorm"
    spec.head_linear                            # False: a head's contribution is not linear in its o_proj slice

Every family keeps its decoder layers at `model.layers[i]` of the causal LM, its final norm at `model.norm` and
its unembedding at `lm_head`; what differs is the block:

    h = x + attn_out_norm(o_proj(heads)),   out = h + mlp_out_norm(mlp(mlp_norm(h)))

with attn_out_norm and mlp_out_norm the identity where the entry names none (the Llama block).

A head's output is its slice of the input of `self_attn.o_proj` ([batch, seq, n_heads * head_dim], head h at
h*head_dim:(h+1)*head_dim) in every family; an MLP's output is the output of `mlp`. What stands between those
and the residual stream (`attn_out_norm`, `mlp_out_norm`) decides the closed forms: without a norm there, a
head's contribution to the residual is W_O[:, head] z_head, linear in its slice (`head_linear`), and an MLP's
output is written to the residual unchanged (`mlp_direct`). With one (Gemma 3's post-norms) the contribution is
the norm of the sum of all heads' outputs, and only computations through the real modules are exact: every
method built on the closed form (`patching.direct_logits`, the EAP-IG edge scores and edge
circuits of `edges`) asks `head_linear` / `mlp_direct` and, where they are false, takes the node's change through
those norms (float32 copies of o_proj and the norm, with the other heads at their values), so that it stays
exact; the hooked paths (capture, patching, ablation, discovery, the teacher-forced trials) hook the same modules
in every family.

A GGUF file names its architecture in its header (`general.architecture`), which transformers maps to a
model_type (`gguf`: "gemma3" loads as the text-only "gemma3_text").
"""

from __future__ import annotations

from dataclasses import dataclass


class UnsupportedArchitecture(ValueError):
    """A model_type (or a setting of its config) outside the table."""


@dataclass(frozen=True)
class Architecture:
    """One family's decoder layer: module names relative to a layer (`model.layers[i]`), None where it has
    none.

    head_out       the module whose input holds the heads' outputs, one slice per query head
    attn_out_norm  the norm between that module's output and the residual stream (Gemma 3's
                   post_attention_layernorm), or None: written unchanged
    mlp            the MLP module; its output is the MLP node's output
    mlp_norm       the norm in front of the MLP; its input is the residual stream entering the MLP block
    mlp_out_norm   the norm between the MLP's output and the residual stream (post_feedforward_layernorm), or None
    qk_norm        q_norm / k_norm per head after q_proj / k_proj (the heads' rows of q/k/v_proj and columns of
                   o_proj are still each head's own)
    layer_norms    norms of width d_model in a layer (parameter counts)
    gguf           the GGUF `general.architecture` names that load as this model_type
    """

    model_type: str
    head_out: str = "self_attn.o_proj"
    attn_out_norm: str | None = None
    mlp: str = "mlp"
    mlp_norm: str = "post_attention_layernorm"
    mlp_out_norm: str | None = None
    qk_norm: bool = False
    layer_norms: int = 2
    gguf: tuple[str, ...] = ()
    # Every entry: the final norm and the unembedding of the causal LM, and an embedding module that applies
    # any scale itself, so `inputs_embeds` enter layer 0 unchanged (`LoadedModel.layers_from` relies on it).
    final_norm: str = "model.norm"
    unembed: str = "lm_head"
    layers: str = "model.layers"

    @property
    def head_linear(self) -> bool:
        """A head's contribution to the residual stream is W_O[:, head] times its o_proj input slice."""
        return self.attn_out_norm is None

    @property
    def mlp_direct(self) -> bool:
        """An MLP's output is what it adds to the residual stream."""
        return self.mlp_out_norm is None

    @property
    def linear_writes(self) -> bool:
        """Both: the closed forms that add a node's change to the residual stream (direct effects, edge
        decompositions, attribution through W_O) are exact."""
        return self.head_linear and self.mlp_direct


TABLE: dict[str, Architecture] = {
    arch.model_type: arch
    for arch in (
        Architecture("llama", gguf=("llama",)),
        Architecture("mistral"),  # its GGUF files declare "llama"
        Architecture("qwen2", gguf=("qwen2",)),
        Architecture("qwen3", qk_norm=True, gguf=("qwen3",)),
        Architecture("gemma3_text", attn_out_norm="post_attention_layernorm", mlp_norm="pre_feedforward_layernorm",
                     mlp_out_norm="post_feedforward_layernorm", qk_norm=True, layer_norms=4, gguf=("gemma3",)),
    )
}
SUPPORTED: tuple[str, ...] = tuple(TABLE)
GGUF_SUPPORTED: tuple[str, ...] = tuple(name for arch in TABLE.values() for name in arch.gguf)
# Config settings that change what `lm_head` or the embedding computes, which no entry's hooks see.
_REFUSED_SETTINGS = {
    "final_logit_softcapping": "the logits are soft-capped after lm_head, which the methods read directly",
    "attn_logit_softcapping": "attention scores are soft-capped, which the recomputed attention patterns omit",
    "use_bidirectional_attention": "attention is not causal",
}


def from_gguf(name: str) -> Architecture:
    """The entry whose model_type a GGUF file declaring `general.architecture` = `name` loads as; one not in the
    table raises, naming it and the supported GGUF architectures."""
    for arch in TABLE.values():
        if name in arch.gguf:
            return arch
    raise UnsupportedArchitecture(f"GGUF architecture '{name}' is not supported; supported: "
                                  f"{', '.join(GGUF_SUPPORTED)}")


def spec(model_type: str) -> Architecture:
    """The table's entry for `model_type`; an architecture not in it raises, naming it and the supported ones."""
    if model_type not in TABLE:
        raise UnsupportedArchitecture(f"architecture '{model_type}' is not supported; "
                                      f"supported: {', '.join(SUPPORTED)}")
    return TABLE[model_type]


def check(config) -> Architecture:
    """The entry for a Hugging Face config (an object with its keys as attributes), after refusing settings of
    a supported architecture that the table's module names do not cover (soft-capped logits, bidirectional
    attention)."""
    arch = spec(config.model_type)
    for key, why in _REFUSED_SETTINGS.items():
        if getattr(config, key, None):
            raise UnsupportedArchitecture(f"architecture '{arch.model_type}' with {key}={getattr(config, key)!r} is "
                                          f"not supported: {why}")
    return arch
