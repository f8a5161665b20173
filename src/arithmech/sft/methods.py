"""What fine-tuning trains and with which hyperparameters: the method names, which heads and MLPs a head
method trains (`select_nodes`), `Method` (which parameters a method trains) and `TrainConfig` (the training
loop's settings), parsed from config dicts with errors that name the key. Standard library only at import
(`select_nodes` imports NumPy when called): the Snakefile and the config checks read it while Snakemake
parses the workflow.

One vocabulary serves the GSM8K recipe (`finetune.methods`) and the study (`study.arms`), so a name means
the same draw in both:

    >>> select_nodes("precise", [(2, 1), (0, 3), (1, 1)], [2, 0], heads=2, mlps=1, n_layers=3, n_heads=4, seed=0)
    ([(2, 1), (0, 3)], [2])
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from numbers import Integral  # int and NumPy's integers
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arithmech.interp.nodes import Head

# Every method name and what it trains (the config checks quote these when a name is unknown).
METHODS = {
    "precise": "the top `heads` heads by patching effect averaged over run.tasks, and in the GSM8K recipe the "
               "top `finetune.mlps` MLPs",
    "precise_mlp": "the study's precise plus the whole weights of the top `study.mlps` MLPs",
    "circuit": "the study's precise count of heads from the discovered circuit (circuit.discover): its heads "
               "ranked by patching effect averaged over run.tasks, as precise ranks all heads",
    "circuit_disjoint": "the discovered circuit's heads that are not among the top `heads` (the key heads precise "
                        "trains), strongest first, at most as many as precise (fewer when the circuit has fewer)",
    "low_effect": "the negative control: as many heads layer-matched to the top heads, in each of their layers the "
                  "heads of smallest patching effect on every operator, never a top head",
    "random_heads": "as many heads drawn layer-matched, the same number in each layer as the top heads and never "
                    "a top head",
    "uniform_heads": "as many heads drawn uniformly among all heads but the top ones",
    "full": "every parameter",
    "lora": "LoRA factors",
}
# per-head deltas (`select_nodes`)
HEAD_METHODS = ("precise", "precise_mlp", "circuit", "circuit_disjoint", "low_effect", "random_heads", "uniform_heads")
DRAWN_METHODS = ("random_heads", "uniform_heads")  # heads drawn at random: the study trains several draws
# The recipe's precise already trains `finetune.mlps` MLPs, so precise_mlp is the study's alone; so are the circuit
# arms and their negative control (the study asks whether the discovered circuit is the better place to train).
STUDY_METHODS = ("precise_mlp", "circuit", "circuit_disjoint", "low_effect")
RECIPE_METHODS = tuple(name for name in METHODS if name not in STUDY_METHODS)
SCHEDULES = ("constant", "linear", "cosine")
OPTIMIZERS = ("adamw", "sgd")


def length_problem(epochs, max_steps, where: str) -> str | None:
    """How long a run trains is given by exactly one of epochs and max_steps: the error naming `where` when
    it is not, else None."""
    if (epochs is None) == (max_steps is None):
        return f"{where}: give exactly one of epochs or max_steps (got epochs={epochs!r}, max_steps={max_steps!r})"
    return None


@dataclass(frozen=True)
class Method:
    """What to train.

    name: one of METHODS.  heads: (layer, query head) pairs (HEAD_METHODS, `select_nodes`).  train_kv: also
    train the K/V rows (W_K, W_V) of the key/value head g = h // (n_heads // n_kv_heads) that each selected
    query head h reads, so that a head's W_Q, W_K, W_V and W_O slices are all trained. With grouped-query
    attention (n_kv_heads < n_heads) key/value head g is shared: training it changes the attention pattern
    and output of EVERY query head h' of that layer with h' // (n_heads // n_kv_heads) == g, selected or not.
    Without train_kv only the selected heads' q rows and o columns change, and no other head's q, k or v.
    mlp_layers: layers whose whole MLP weights are trained (HEAD_METHODS).  grad_scale: an optional
    factor on the head deltas' gradients (`resolve_grad_scale`).
    delta_dtype: "float32" (the default: fp32 deltas, cast to the activations' dtype in the forward, i.e.
    fp32 master weights for a bf16 model, as full fine-tuning and LoRA train; on a float32 model the same as
    "model") or "model" (deltas in the model's dtype). bf16 deltas start at 0, where bf16 is finest, but like
    bf16 weights they drop updates below ~1/256 of their value.  lora: {r, alpha, dropout, target_modules}.
    """

    name: str
    heads: tuple[Head, ...] = ()
    train_kv: bool = False
    mlp_layers: tuple[int, ...] = ()
    grad_scale: float | str | None = None
    delta_dtype: str = "float32"
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


def unknown_method(name, allowed=tuple(METHODS)) -> str:
    """What an unknown method name gets told: every allowed name with what it trains."""
    listed = "; ".join(f"{m} ({METHODS[m]})" for m in allowed)
    return f"unknown method {name!r}; expected one of: {listed}"


def select_nodes(method: str, ranked_heads, ranked_mlps, *, heads: int, mlps: int, n_layers: int, n_heads: int,
                 seed: int, draw: int = 0, section: str = "finetune", circuit=(), weakest=()
                 ) -> tuple[list[Head], list[int]]:
    """(heads, MLP layers) that head method `method` trains, from every head and MLP layer ranked by patching
    effect, best first (`interp.nodes.ranked_nodes`):

        precise, precise_mlp   the top `heads` heads and the top `mlps` MLP layers
        circuit                the same, from a ranking that puts the discovered circuit's heads first
                               (`interp.nodes.circuit_first`)
        circuit_disjoint       the heads of `circuit` (the discovered circuits' heads) outside the top `heads`,
                               in ranked order, at most `heads` of them (all of them when fewer), no MLP
        low_effect             `heads` heads layer-matched to the top ones, each the first head of `weakest`
                               (every head, weakest patching effect first) in its layer (`layer_matched_weakest`)
        random_heads           `heads` heads drawn layer-matched (`layer_matched_heads`), no MLP
        uniform_heads          `heads` heads drawn uniformly among the others (`random_heads`), no MLP

    Draw `draw` (the study's draw{d} runs; the recipe trains draw 0) is seeded by SeedSequence([seed, 11,
    draw]) for random_heads and by seed + draw for uniform_heads. `section` is the config section the counts
    come from, named in errors.

    >>> select_nodes("uniform_heads", [(2, 1), (0, 3), (1, 1)], [2, 0], heads=2, mlps=1, n_layers=3, n_heads=4,
    ...              seed=0)[1]
    []
    """
    import numpy as np

    from arithmech.interp.nodes import layer_matched_heads, random_heads

    if method not in HEAD_METHODS:
        raise ValueError(f"{section}: method {method!r} selects no heads; head methods are {list(HEAD_METHODS)}")
    if heads > len(ranked_heads):
        raise ValueError(f"config key '{section}.heads': {heads} heads asked for, the model has {len(ranked_heads)}")
    top = [(int(l), int(h)) for l, h in ranked_heads[:heads]]
    if method == "random_heads":
        derived = int(np.random.SeedSequence([seed, 11, draw]).generate_state(1)[0])
        return layer_matched_heads(top, n_heads, seed=derived), []
    if method == "uniform_heads":
        return random_heads(n_layers, n_heads, heads, seed=seed + draw, exclude=top), []
    if method == "circuit_disjoint":
        inside = {(int(l), int(h)) for l, h in circuit}
        outside_top = [(int(l), int(h)) for l, h in ranked_heads[heads:] if (int(l), int(h)) in inside]
        if not outside_top:
            raise ValueError(f"{section}: arm 'circuit_disjoint' has no head to train: every head of the discovered "
                             f"circuits is among the top {heads} (the key heads); drop it from {section}.arms")
        return outside_top[:heads], []
    if method == "low_effect":
        return layer_matched_weakest(top, weakest, n_layers), []
    return top, [int(m) for m in ranked_mlps[:mlps]]


def layer_matched_weakest(top, weakest, n_layers: int) -> list[Head]:
    """One head per head of `top`, in rank order: the first head of `weakest` (heads ordered by patching effect,
    weakest first) in the same layer that is neither in `top` nor picked before; where that layer has none left,
    the first of the nearest layer that has one (the lower first on a tie). Every prefix [:k] then has the layer
    histogram of top[:k], as the layer-matched random control has, so this control differs from the key heads in
    their effect, not in their depth.

    >>> layer_matched_weakest([(1, 0), (1, 1)], [(0, 2), (1, 3), (0, 1), (1, 0), (1, 2)], n_layers=2)
    [(1, 3), (1, 2)]
    """
    weakest = [(int(l), int(h)) for l, h in weakest]
    taken = {(int(l), int(h)) for l, h in top}
    out = []
    for layer, _ in top:
        for other in sorted(range(n_layers), key=lambda x: (abs(x - int(layer)), x)):
            pick = next((h for h in weakest if h[0] == other and h not in taken), None)
            if pick is not None:
                break
        else:
            raise ValueError(f"no head left for a layer-matched low-effect head near layer {layer}: `weakest` "
                             f"lists {len(weakest)} heads")
        taken.add(pick)
        out.append(pick)
    return out


def parse_head(value, where: str) -> Head:
    """A head as (layer, head) from [layer, head] or "L20H8"."""
    if isinstance(value, str):
        m = re.fullmatch(r"L(\d+)H(\d+)", value.strip())
        if m:
            return int(m[1]), int(m[2])
    elif isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, Integral) for v in value):
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
    if not all(isinstance(x, Integral) for x in mlp_layers) or len(set(mlp_layers)) != len(mlp_layers):
        raise ValueError(f"{where}.mlp_layers: expected a list of distinct layer indices, got {mlp_layers!r}")
    grad_scale = cfg.get("grad_scale")
    if not (grad_scale is None or grad_scale == "heads_ratio"
            or (isinstance(grad_scale, (int, float)) and not isinstance(grad_scale, bool) and grad_scale > 0)):
        raise ValueError(f"{where}.grad_scale: expected a positive number, 'heads_ratio' or null, got {grad_scale!r}")
    delta_dtype = cfg.get("delta_dtype") or Method.delta_dtype
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
            if not isinstance(v, Integral) or isinstance(v, bool) or v < (0 if allow_zero else 1):
                raise ValueError(f"{where}.{name}: expected an integer >= {0 if allow_zero else 1}, got {v!r}")

        for name in ("batch_size", "grad_accumulation", "max_length"):
            positive_int(name)
        for name in ("epochs", "max_steps", "checkpoint_every"):
            positive_int(name, allow_none=True)
        positive_int("warmup_steps", allow_zero=True)
        positive_int("seed", allow_zero=True)
        length = length_problem(self.epochs, self.max_steps, where)
        if length is not None:
            raise ValueError(length)
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
