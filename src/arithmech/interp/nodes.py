"""Nodes: the head type, the node sets a circuit keeps, heads and MLPs ranked by their patching effect, and the
random head sets a knockout, a circuit or a fine-tuning arm is compared with. Torch-free (the Snakefile imports the
study, whose arms `sft.methods.select_nodes` draws with these: its method uniform_heads draws `random_heads`, its
method random_heads `layer_matched_heads`).

    all_nodes(n_layers, n_heads)           every node, the columns of a circuit's kept mask (MLP: the MLP's head)
    CircuitSet                             one circuit's heads and MLPs; kept_masks(sets, nodes) their masks
    key_nodes(key)                         the key heads and key MLPs of a key_components table
    ranked_heads(effects)                  one operator's heads, strongest (most negative) effect first
    rank_across_tasks(effects, "head")     nodes ranked by their effect averaged over operators (a table)
    ranked_nodes(effects)                  the same as (heads, MLP layers), what fine-tuning selects from
    random_heads(...)                      k heads drawn uniformly among the others
    layer_matched_heads(ranked, ...)       one head per ranked head, drawn in its layer
    parse_nodes("L3H2 L5MLP")              a node list as written in tables, back to (heads, MLP layers)
    circuit_first(ranked, circuit)         a ranking with a circuit's heads first (the study's circuit arm)
    knockout_node_sets(effects, key, ...)  the knockout rule's node sets at one position set (its plan counts them)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

Head = tuple[int, int]  # (layer, query head)

MLP = -1  # the head number of an MLP node

Node = tuple[int, int]  # (layer, head), head MLP (-1) for the layer's MLP


def node_label(layer: int, head=None) -> str:
    """'L12H3' for a head, 'L12MLP' for an MLP (head None, NaN or negative, as `MLP`): the one spelling
    of a node, which `parse_nodes` reads back."""
    mlp = head is None or pd.isna(head) or int(head) < 0
    return f"L{int(layer)}MLP" if mlp else f"L{int(layer)}H{int(head)}"


def nodes_text(heads: Iterable[Head], mlp_layers: Iterable[int] = ()) -> str:
    """A node list as the circuit tables write it ("L3H2 L5MLP"), heads then MLPs: `parse_nodes`'s inverse."""
    return " ".join([node_label(l, h) for l, h in heads] + [node_label(l) for l in mlp_layers])


def parse_nodes(text: str) -> tuple[list[Head], list[int]]:
    """(heads, MLP layers) from a space-separated node list as the circuit tables write it ("L3H2 L5MLP",
    `CircuitSet.nodes`); an empty string is the empty circuit."""
    heads, mlps = [], []
    for token in str(text).split():
        if token.endswith("MLP") and token.startswith("L"):
            mlps.append(int(token[1:-3]))
        elif token.startswith("L") and "H" in token:
            layer, head = token[1:].split("H")
            heads.append((int(layer), int(head)))
        else:
            raise ValueError(f"node {token!r}: expected L<layer>H<head> or L<layer>MLP")
    return heads, mlps


def all_nodes(n_layers: int, n_heads: int) -> list[Node]:
    """Every node in column order: the heads layer by layer, then the MLPs (the order `mean_ablate` takes)."""
    return [(l, h) for l in range(n_layers) for h in range(n_heads)] + [(l, MLP) for l in range(n_layers)]


@dataclass(frozen=True)
class CircuitSet:
    """One circuit: the heads and MLPs it keeps. curve: model (everything), empty (nothing), key (the key heads),
    top (the top k heads by effect) or random (k heads drawn in the layers of the top k, or of the key heads);
    mlps: which MLPs it keeps (all, key or none); seed: the random draw (-1 otherwise)."""

    curve: str
    mlps: str
    k: int
    seed: int
    heads: tuple[Head, ...]
    mlp_layers: tuple[int, ...]

    def ablated(self, n_layers: int, n_heads: int) -> tuple[list[Head], list[int]]:
        """The heads and MLPs outside the circuit, which mean ablation replaces."""
        kept_h, kept_m = set(self.heads), set(self.mlp_layers)
        heads = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in kept_h]
        return heads, [l for l in range(n_layers) if l not in kept_m]

    def nodes(self) -> str:
        return nodes_text(self.heads, self.mlp_layers)


def kept_masks(sets: Sequence[CircuitSet], nodes: Sequence[Node]) -> np.ndarray:
    """Kept masks [len(sets), len(nodes)] of circuit sets over `nodes` (`all_nodes`: (layer, head), then
    (layer, MLP) for the MLPs)."""
    return np.array([[(l, h) in set(s.heads) if h >= 0 else l in set(s.mlp_layers) for l, h in nodes] for s in sets],
                    dtype=bool).reshape(len(sets), len(nodes))


def key_nodes(key: pd.DataFrame) -> tuple[list[Head], list[int]]:
    """The key heads [(layer, head)] and key MLP layers of a key_components table."""
    heads = key[key["component"] == "head"]
    return ([(int(l), int(h)) for l, h in zip(heads["layer"], heads["head"])],
            [int(l) for l in key.loc[key["component"] == "mlp", "layer"]])


def circuit_first(ranked: Sequence[Head], circuit: Iterable[Head]) -> list[Head]:
    """Every head of `ranked`, the circuit's heads first, each group in ranked order: the top k of this list are
    the k circuit heads of strongest effect, as precise SFT takes the top k heads of `ranked`. (A circuit of fewer
    than k heads is filled with the strongest heads outside it: the caller says so.)"""
    inside = {(int(l), int(h)) for l, h in circuit}
    ranked = [(int(l), int(h)) for l, h in ranked]
    return [h for h in ranked if h in inside] + [h for h in ranked if h not in inside]


def random_heads(n_layers: int, n_heads: int, k: int, seed: int, exclude: Iterable[Head] = ()) -> list[Head]:
    """k distinct heads drawn uniformly (seeded) from all heads not in `exclude`, in draw order."""
    excluded = {(int(l), int(h)) for l, h in exclude}
    pool = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in excluded]
    if not 0 <= k <= len(pool):
        raise ValueError(f"cannot draw {k} heads from the {len(pool)} heads left after excluding {len(excluded)}")
    picks = np.random.default_rng(seed).choice(len(pool), size=k, replace=False)
    return [pool[i] for i in picks]


def layer_matched_heads(ranked: Sequence[Head], n_heads: int, seed: int, exclude: Iterable[Head] = (),
                        n_layers: int | None = None) -> list[Head]:
    """One random head per head of `ranked`, in the same layer, drawn (seeded) in rank order among that
    layer's heads not in `ranked`, not in `exclude` and not drawn before: every prefix [:k] has the layer
    histogram of ranked[:k], the random control at the same layers. Where a layer has no head left (5 of its
    9 heads ranked, say), the head comes from the nearest layer that has one (the lower first on a tie,
    within 0..n_layers-1, default: up to the highest ranked layer); fails when no layer has one."""
    ranked = [(int(l), int(h)) for l, h in ranked]
    taken = set(ranked) | {(int(l), int(h)) for l, h in exclude}
    top = n_layers if n_layers is not None else max((l for l, _ in ranked), default=-1) + 1
    rng = np.random.default_rng(seed)
    out = []
    for layer, _ in ranked:
        nearest = sorted(range(top), key=lambda other: (abs(other - layer), other))
        pools = ([(other, h) for h in range(n_heads) if (other, h) not in taken] for other in nearest)
        pool = next((p for p in pools if p), None)
        if pool is None:
            raise ValueError(f"no head left for a layer-matched random draw near layer {layer}")
        pick = pool[int(rng.integers(len(pool)))]
        taken.add(pick)
        out.append(pick)
    return out


def ranked_heads(effects: pd.DataFrame) -> list[Head]:
    """Every head of one operator's effects table, strongest (most negative) mean effect first."""
    heads = effects[effects["component"] == "head"].sort_values("mean_effect", kind="stable")
    return [(int(l), int(h)) for l, h in zip(heads["layer"], heads["head"])]


def rank_across_tasks(effects: dict[str, pd.DataFrame], component: str) -> pd.DataFrame:
    """Nodes of one component ('head' or 'mlp') ranked by their mean effect averaged over tasks (most
    negative first): the nodes that matter for arithmetic as a whole, e.g. the heads precise SFT trains.
    Returns node, layer, head, mean_effect (the average over tasks), one effect_<task> column per task."""
    if not effects:
        raise ValueError("rank_across_tasks needs the effects of at least one task")
    frames = []
    for task, frame in effects.items():
        part = frame[frame["component"] == component].set_index("node")
        frames.append(part["mean_effect"].rename(f"effect_{task}"))
    first = next(iter(effects.values()))
    nodes = first[first["component"] == component].set_index("node")[["layer", "head"]]
    table = nodes.join(pd.concat(frames, axis=1), how="inner")
    table["mean_effect"] = table[[f.name for f in frames]].mean(axis=1)
    return table.sort_values("mean_effect", kind="stable").reset_index()


def ranked_nodes(effects: dict[str, pd.DataFrame]) -> tuple[list[Head], list[int]]:
    """Every head as (layer, head) and every MLP layer, ranked by patching effect averaged over the operators
    whose effects tables are given (most negative first)."""
    heads = [(int(l), int(h)) for l, h in rank_across_tasks(effects, "head")[["layer", "head"]].to_numpy()]
    return heads, rank_across_tasks(effects, "mlp")["layer"].astype(int).tolist()


def knockout_node_sets(effects: pd.DataFrame, key: pd.DataFrame, ablation: dict, *, n_layers: int, n_heads: int,
                       seed: int, positions: str = "end") -> list[tuple]:
    """The knockout rule's node sets at `positions`, each (curve, seed, k, heads, mlps): the top k heads by
    patching effect (`effects`); two random controls over `ablation.random_seeds` draws each, k random heads drawn
    uniformly among the others (`random_heads`) and k drawn in the layers of the top k (`random_layer_matched`);
    the key MLPs (`key`, the key-component table). At "end" every k = 0..K (K = ablation.max_heads) and the
    controls at `ablation.random_k` (capped at K); at "all", where each set is a full forward of every prompt, the
    top heads at k = 0 and random_k and the controls at K only. The one home of these sets: the knockout stage runs
    them and `make plan` counts them."""
    if positions not in ("end", "all"):
        raise ValueError(f"knockout positions must be 'end' or 'all'; got {positions!r}")
    ranked = ranked_heads(effects)
    K = min(ablation["max_heads"], len(ranked))
    ranked = ranked[:K]
    if positions == "end":
        tops, random_k = range(K + 1), ablation["random_k"]
    else:
        tops, random_k = sorted({min(k, K) for k in [0, *ablation["random_k"]]}), [ablation["max_heads"]]
    ks = sorted({min(k, K) for k in random_k} - {0})
    sets = [("top_heads", -1, k, ranked[:k], []) for k in tops]
    for s in range(ablation["random_seeds"]):
        drawn = random_heads(n_layers, n_heads, K, seed=seed * 1000 + s, exclude=ranked)
        sets += [("random_heads", s, k, drawn[:k], []) for k in ks]
    for s in range(ablation["random_seeds"]):
        drawn = layer_matched_heads(ranked, n_heads, seed=seed * 1000 + 500 + s, n_layers=n_layers)
        sets += [("random_layer_matched", s, k, drawn[:k], []) for k in ks]
    key_mlps = [int(l) for l in key.loc[key["component"] == "mlp", "layer"]]
    return sets + [("key_mlps", -1, len(key_mlps), [], key_mlps)]
