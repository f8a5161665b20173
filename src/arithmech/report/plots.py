"""Figures: the paper's Figure 2 heatmap (layers x heads plus an MLP column) and the cross-task summary."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on cluster nodes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from arithmech.interp.nodes import node_label  # noqa: E402
from arithmech.io import atomic_path  # noqa: E402

CMAP = "RdBu"  # diverging: red = the patch lowers the answer logit (the node matters), blue = raises it
STABLE = 0.8  # a key component selected in at least this share of bootstrap resamples is drawn as stable


def _save(fig, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix.lstrip(".") or "png", dpi=150, bbox_inches="tight")
    plt.close(fig)


def _symmetric(values: np.ndarray) -> float:
    finite = np.abs(values[np.isfinite(values)])
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def effects_heatmap(effects: pd.DataFrame, key: pd.DataFrame, title: str, path: str | Path) -> None:
    """Mean effect (in %) of every head (layers x heads) and, in its own colour scale, every MLP.
    Key components are outlined (solid where at least 80% of the bootstrap resamples select them, dashed
    where fewer) and labelled with that share in %, when `key` has a stability column. Diverging colours
    centred on 0."""
    heads = effects[effects["component"] == "head"]
    grid = heads.pivot(index="layer", columns="head", values="mean_effect") * 100
    mlp = effects[effects["component"] == "mlp"].set_index("layer")["mean_effect"].reindex(grid.index) * 100
    n_layers, n_heads = grid.shape
    fig, (ax_h, ax_m) = plt.subplots(
        1, 2, figsize=(0.45 * n_heads + 3.2, 0.28 * n_layers + 1.8),
        gridspec_kw={"width_ratios": [n_heads, 1.6]},
    )
    v = _symmetric(grid.to_numpy())
    sns.heatmap(grid, ax=ax_h, cmap=CMAP, center=0, vmin=-v, vmax=v, cbar_kws={"label": "head effect (%)"})
    vm = _symmetric(mlp.to_numpy())
    sns.heatmap(mlp.to_frame("MLP"), ax=ax_m, cmap=CMAP, center=0, vmin=-vm, vmax=vm,
                cbar_kws={"label": "MLP effect (%)"}, yticklabels=False)
    for _, row in key.iterrows():
        y = list(grid.index).index(row["layer"])
        ax, x = (ax_h, list(grid.columns).index(row["head"])) if row["component"] == "head" else (ax_m, 0)
        stability = row.get("stability", np.nan)
        ls = "--" if stability < STABLE else "-"  # NaN (no bootstrap) compares False: solid
        ax.add_patch(Rectangle((x, y), 1, 1, fill=False, lw=1.8, ec="black", ls=ls))
        if pd.notna(stability):
            ax.text(x + 0.5, y + 0.5, f"{100 * stability:.0f}", ha="center", va="center", fontsize=6)
    ax_h.set_xlabel("head")
    ax_h.set_ylabel("layer")
    ax_m.set_xlabel("")
    ax_m.set_ylabel("")
    fig.suptitle(title)
    _save(fig, path)


def shared_heatmap(summary: pd.DataFrame, tasks: list[str], title: str, path: str | Path) -> None:
    """Nodes that are key for some task (rows) x tasks (columns): mean effect in %, '*' where key."""
    values = summary[[f"effect_{t}" for t in tasks]].to_numpy() * 100
    marks = np.where(summary[[f"key_{t}" for t in tasks]].to_numpy(), "*", "")
    annot = np.char.add(np.char.mod("%.2f", values), marks)
    fig, ax = plt.subplots(figsize=(1.3 * len(tasks) + 2.5, 0.32 * max(len(summary), 1) + 1.5))
    v = _symmetric(values) if values.size else 1.0
    sns.heatmap(pd.DataFrame(values, index=summary["node"], columns=tasks), ax=ax, cmap=CMAP, center=0,
                vmin=-v, vmax=v, annot=annot, fmt="", annot_kws={"size": 7}, cbar_kws={"label": "effect (%)"})
    ax.set_xlabel("task")
    ax.set_ylabel("")
    ax.set_title(title)
    _save(fig, path)


KNOCKOUT_CURVES = {"top_heads": "#b2182b", "random_heads": "#4d4d4d", "random_layer_matched": "#969696"}


def knockout_curves(table: pd.DataFrame, n_key_heads: int, title: str, path: str | Path) -> None:
    """Accuracy against the number of heads knocked out, one row of panels per ablated position set
    (`positions`), for the first answer token (left) and the full greedy answer (right): the top heads by
    patching effect, and random heads drawn uniformly or in the top heads' layers (mean and standard deviation
    over draws; where a control was drawn only at the largest k its line joins k = 0 to that point); the
    key-MLP knockout as a level."""
    if "positions" not in table:
        table = table.assign(positions="end")
    position_sets = list(dict.fromkeys(table["positions"]))
    metrics = [("accuracy", "first-token accuracy (%)")]
    if "full_accuracy" in table:
        metrics.append(("full_accuracy", "full-answer accuracy, greedy (%)"))
    fig, axes = plt.subplots(len(position_sets), len(metrics), figsize=(6.4 * len(metrics), 4.2 * len(position_sets)),
                             squeeze=False)
    for row, positions in enumerate(position_sets):
        part = table[table["positions"] == positions]
        heads = part[part["curve"] != "key_mlps"].copy()
        base = heads[(heads["curve"] == "top_heads") & (heads["k"] == 0)]
        # Every random curve starts from the same unablated model.
        starts = [base.assign(curve=c, seed=s) for c in KNOCKOUT_CURVES if c != "top_heads"
                  for s in sorted(set(heads.loc[heads["curve"] == c, "seed"]))]
        heads = pd.concat([heads, *starts], ignore_index=True)
        curves = [c for c in KNOCKOUT_CURVES if (heads["curve"] == c).any()]
        mlp = part[part["curve"] == "key_mlps"]
        for ax, (column, label) in zip(axes[row], metrics):
            sns.lineplot(heads.assign(value=100 * heads[column]), x="k", y="value", hue="curve", errorbar="sd",
                         marker="o", ax=ax, hue_order=curves, palette=[KNOCKOUT_CURVES[c] for c in curves])
            if len(mlp):  # a different intervention (MLPs, not heads): a level to compare with, not a point on k
                ax.axhline(100 * mlp[column].iloc[0], ls="--", color="#2166ac", lw=1.2,
                           label=f"key MLPs knocked out ({mlp['nodes'].iloc[0]})")
            if 0 < n_key_heads <= heads["k"].max():
                ax.axvline(n_key_heads, ls=":", color="black", lw=1, label=f"{n_key_heads} key heads")
            elif n_key_heads:
                ax.plot([], [], " ", label=f"{n_key_heads} key heads (beyond k = {heads['k'].max()})")
            ax.set_xlabel("heads knocked out (k)")
            ax.set_ylabel(label)
            ax.set_ylim(-2, 102)
            ax.set_title(f"positions: {positions} (n = {int(part['n'].iloc[0])})", fontsize=9)
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(hspace=0.3)  # room between a row's x label and the next row's panel title
    _save(fig, path)


# ---------------------------------------------------------------------------------------------------
# Analysis of the key components (the `analyze` rule)

ROLE_COLORS = {  # one colour per token role (arithmech.interp.analysis.ROLES), shared by the analysis figures
    "operand_a": "#1b9e77",
    "operand_b": "#d95f02",
    "operator": "#7570b3",
    "equals": "#e7298a",
    "prefix": "#8c8c8c",
    "other": "#4d4d4d",
}


def role_attention_heatmap(table: pd.DataFrame, title: str, path: str | Path) -> None:
    """Attention from END on each token role (columns, in %) of each head (rows, labelled L{l}H{h}, in the
    table's order); every row sums to 100%. Column labels give the mean number of tokens with the role."""
    from arithmech.interp.analysis import ROLES

    heads = list(dict.fromkeys(zip(table["layer"], table["head"])))
    labels = [node_label(l, h) for l, h in heads]
    grid = (
        table.assign(node=[node_label(l, h) for l, h in zip(table["layer"], table["head"])])
        .pivot(index="node", columns="role", values="attention")
        .reindex(index=labels, columns=list(ROLES))
        * 100
    )
    tokens = table.groupby("role")["tokens"].mean().reindex(list(ROLES))
    columns = [f"{r}\n({t:.1f} tok)" for r, t in zip(ROLES, tokens)]
    fig, ax = plt.subplots(figsize=(1.15 * len(ROLES) + 2.4, 0.42 * len(labels) + 1.8))
    sns.heatmap(
        pd.DataFrame(grid.to_numpy(), index=labels, columns=columns), ax=ax, cmap="rocket_r", vmin=0, vmax=100,
        annot=True, fmt=".0f", annot_kws={"size": 8}, linewidths=0.5, linecolor="white",
        cbar_kws={"label": "attention from END (%)"},
    )
    for tick, role in zip(ax.get_xticklabels(), ROLES):
        tick.set_color(ROLE_COLORS[role])
    ax.tick_params(axis="x", rotation=0, labelsize=8)
    ax.tick_params(axis="y", rotation=0)
    ax.set_xlabel("token role (mean tokens per prompt)")
    ax.set_ylabel("head")
    ax.set_title(title, fontsize=10)
    _save(fig, path)


def _token_label(text: str) -> str:
    """A token as a tick label: a lone space as '␣', newlines as '↵', surrounding spaces dropped."""
    if text.strip() == "":
        return "↵" * text.count("\n") or "␣"
    return text.replace("\n", "↵").strip()


def attention_example(
    tokens: list[str], weights: np.ndarray, head_labels: list[str], roles: list[str], *, title: str, path: str | Path
) -> None:
    """One prompt: its tokens along x, one row per head, colour = attention from END on the token (in %,
    values of 5% and more written in the cell). A strip under the heatmap and the colour of each tick
    label give the token's role."""
    from matplotlib.colors import ListedColormap

    from arithmech.interp.analysis import ROLES

    weights = np.asarray(weights, dtype=float) * 100
    n_heads, n_tokens = weights.shape
    if len(tokens) != n_tokens or len(roles) != n_tokens or len(head_labels) != n_heads:
        raise ValueError(f"{len(tokens)} tokens, {len(roles)} roles, {len(head_labels)} labels for weights "
                         f"{weights.shape}")
    fig = plt.figure(figsize=(max(6.0, 0.3 * n_tokens + 2.6), 0.36 * n_heads + 2.6))
    grid = fig.add_gridspec(2, 2, height_ratios=[n_heads, 0.7], width_ratios=[n_tokens, 0.6], hspace=0.06, wspace=0.03)
    ax, ax_roles, cax = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[0, 1])
    annot = np.where(weights >= 5, np.char.mod("%.0f", weights), "")
    sns.heatmap(weights, ax=ax, cmap="rocket_r", vmin=0, vmax=max(float(weights.max()), 1e-9), annot=annot, fmt="",
                annot_kws={"size": 6}, cbar_ax=cax, cbar_kws={"label": "attention from END (%)"},
                yticklabels=head_labels, xticklabels=False)
    ax.tick_params(axis="y", rotation=0, labelsize=8)
    ax.set_ylabel("head")
    ax_roles.imshow(np.array([[ROLES.index(r) for r in roles]]), aspect="auto", interpolation="nearest",
                    cmap=ListedColormap([ROLE_COLORS[r] for r in ROLES]), vmin=-0.5, vmax=len(ROLES) - 0.5,
                    extent=(0, n_tokens, 1, 0))
    ax_roles.set_yticks([])
    ax_roles.set_xticks(np.arange(n_tokens) + 0.5)
    ax_roles.set_xticklabels([_token_label(t) for t in tokens], rotation=90, fontsize=8)
    for tick, role in zip(ax_roles.get_xticklabels(), roles):
        tick.set_color(ROLE_COLORS[role])
    ax_roles.set_xlim(0, n_tokens)
    ax_roles.set_xlabel("token (tick colour and strip = role; END is the last token)")
    used = [r for r in ROLES if r in roles]
    handles = [Rectangle((0, 0), 1, 1, color=ROLE_COLORS[r]) for r in used]
    ax.legend(handles, used, ncol=len(used), fontsize=7, frameon=False, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              handlelength=1.2, columnspacing=1.0)
    ax.set_title(title, fontsize=10, pad=18)
    _save(fig, path)


PROBE_COLORS = {"a": ROLE_COLORS["operand_a"], "b": ROLE_COLORS["operand_b"], "c": "#2166ac"}
PROBE_NAMES = {
    "paper": {"input": "MLP input: residual entering the MLP block", "output": "MLP output",
              "delta": "change: output - input"},
    "normed": {"input": "MLP input: after the post-attention norm", "output": "MLP output",
               "delta": "change: unit(output) - unit(input)"},
}


def mlp_probe_lines(probes: pd.DataFrame, title: str, path: str | Path, variant: str = "paper") -> None:
    """Three panels (MLP input, output, change) of one `variant` of the `mlp_probes` table: per layer, the
    mean cosine similarity with the unembedding rows of the first tokens of A, B and the answer C on all
    prompts; the grey band is the random-token baseline, mean ± 2 std over random tokens (the null spread of
    a text-averaged cosine). A dashed line repeats C on the prompts whose answer token is neither operand's
    token (subset answer_distinct), where the table has that subset."""
    from arithmech.interp.analysis import VECTORS

    probes = probes[probes["variant"] == variant]
    distinct = probes[probes["subset"] == "answer_distinct"]
    probes = probes[probes["subset"] == "all"]
    fig, axes = plt.subplots(1, len(VECTORS), figsize=(4.2 * len(VECTORS), 3.6), sharex=True)
    for ax, vector in zip(axes, VECTORS):
        part = probes[probes["vector"] == vector]
        rnd = part[part["target"] == "random"].sort_values("layer")
        ax.fill_between(rnd["layer"], rnd["mean"] - 2 * rnd["std"], rnd["mean"] + 2 * rnd["std"], color="#bdbdbd",
                        alpha=0.6, lw=0, label="random tokens (mean ± 2 std)")
        ax.plot(rnd["layer"], rnd["mean"], color="#969696", lw=0.8)
        for target, name in (("a", "A (operand a)"), ("b", "B (operand b)"), ("c", "C (answer)")):
            line = part[part["target"] == target].sort_values("layer")
            ax.plot(line["layer"], line["mean"], marker="o", ms=3, lw=1.5, color=PROBE_COLORS[target], label=name)
        line = distinct[(distinct["vector"] == vector) & (distinct["target"] == "c")].sort_values("layer")
        if len(line):
            ax.plot(line["layer"], line["mean"], ls="--", marker="o", ms=2.5, mfc="white", lw=1.2,
                    color=PROBE_COLORS["c"], label=f"C, answer token ≠ A's, B's ({line['n'].iloc[0]} prompts)")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title(PROBE_NAMES[variant][vector], fontsize=10)
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cosine with unembedding row")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, -0.01))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    _save(fig, path)


def transfer_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The transfer matrix as a table: rows 'base accuracy' (% correct without knockout) then, per source
    task, its key heads and as many random heads (mean over seeds); columns the targets in table order;
    values the retained accuracy in % (share of the base-correct items still correct)."""
    targets = list(dict.fromkeys(table["target"]))
    base = table[table["heads"] == "none"].set_index("target")
    rows = {"base accuracy (%)": (100 * base["base_accuracy"]).reindex(targets)}
    for source in dict.fromkeys(table.loc[table["heads"] != "none", "source"]):
        part = table[table["source"] == source]
        for kind in ("key", "random"):
            sel = part[part["heads"] == kind]
            if sel.empty:
                continue
            label = f"{source}: {kind} heads ({sel['n_heads'].iloc[0]})"
            rows[label] = (100 * sel.groupby("target", sort=False)["retained"].mean()).reindex(targets)
    return pd.DataFrame(rows).T.rename_axis("knocked out").reset_index()


def transfer_heatmap(table: pd.DataFrame, title: str, path: str | Path) -> None:
    """Retained accuracy (%) with each source task's key heads (and random heads) knocked out, on every
    target data set; the top row is the unablated accuracy on which 'retained' is based."""
    summary = transfer_summary(table).set_index("knocked out")
    values = summary.to_numpy(dtype=float)
    n_rows, n_cols = values.shape
    fig, ax = plt.subplots(figsize=(0.75 * n_cols + 3.5, 0.42 * n_rows + 2.2))
    mask = np.zeros_like(values, dtype=bool)
    mask[0] = True  # the base row has its own meaning; drawn as text only
    sns.heatmap(summary, ax=ax, mask=mask, cmap="rocket", vmin=0, vmax=100, annot=True, fmt=".0f",
                annot_kws={"size": 7}, cbar_kws={"label": "retained accuracy (%)"})
    for j, v in enumerate(values[0]):
        ax.text(j + 0.5, 0.5, "" if np.isnan(v) else f"{v:.0f}", ha="center", va="center", fontsize=7, color="black")
    ax.axhline(1, color="black", lw=1)
    ax.set_xlabel("knocked out on")
    ax.set_ylabel("")
    ax.set_title(title, fontsize=10)
    plt.setp(ax.get_xticklabels(), rotation=40, ha="right")
    _save(fig, path)


def eval_summary(summary: pd.DataFrame, datasets: list[str], title: str, path: str | Path) -> None:
    """Accuracy (%) per data set (groups) and method (bars), with the confidence intervals as error bars;
    the trainable parameters of each method in the legend."""
    records = []
    for r in summary.to_dict("records"):
        label = f"{r['method']} ({r['trainable_params']:,} trained)" if r["trainable_params"] else f"{r['method']}"
        for d in datasets:
            records.append({"method": label, "dataset": d, "accuracy": r[d], "low": r[f"{d}_low"],
                            "high": r[f"{d}_high"]})
    frame = pd.DataFrame(records)
    methods = list(dict.fromkeys(frame["method"]))
    fig, ax = plt.subplots(figsize=(0.3 * len(datasets) * len(methods) + 3, 4.2))
    width = 0.8 / len(methods)
    colors = sns.color_palette("colorblind", len(methods))
    for i, (method, color) in enumerate(zip(methods, colors)):
        part = frame[frame["method"] == method].set_index("dataset").reindex(datasets)
        x = np.arange(len(datasets)) + (i - (len(methods) - 1) / 2) * width
        err = np.vstack([part["accuracy"] - part["low"], part["high"] - part["accuracy"]])
        ax.bar(x, part["accuracy"], width, yerr=err, capsize=2, label=method, color=color)
    ax.set_xticks(np.arange(len(datasets)), datasets)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title, fontsize=10)
    _save(fig, path)


STUDY_ARMS = ("base", "precise", "precise_mlp", "random_heads", "uniform_heads", "full", "lora", "circuit",
              "circuit_disjoint", "low_effect")


def _arm_colors() -> dict:
    """One colour per study arm, the same in every study figure (precise and random heads far apart)."""
    palette = sns.color_palette("colorblind", 10)
    return dict(zip(STUDY_ARMS, [palette[7], palette[1], palette[2], palette[0], palette[9], palette[4], palette[5],
                                 palette[3], palette[6], palette[8]]))


def study_accuracy(table: pd.DataFrame, train_format: str, title: str, path: str | Path) -> None:
    """Left: exact match (%) on the trained format's test set, one point per scored model (seeds and draws
    side by side) with its interval, arms in rows. Right: KL to the base model (nats per token) per model."""
    table = table.reset_index(drop=True)
    colors = _arm_colors()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * len(table) + 1.6), sharey=True,
                                      gridspec_kw={"width_ratios": [3, 2]})
    y = np.arange(len(table))[::-1]
    for yi, r in zip(y, table.to_dict("records")):
        acc = 100 * r["accuracy"]
        left.errorbar(acc, yi, xerr=[[acc - 100 * r["accuracy_low"]], [100 * r["accuracy_high"] - acc]], fmt="o",
                      color=colors[r["arm"]], capsize=3)
        right.barh(yi, r.get("kl_to_base", np.nan) if np.isfinite(r.get("kl_to_base", np.nan)) else 0,
                   color=colors[r["arm"]])
    base = table.loc[table["arm"] == "base", "accuracy"]
    if len(base):
        left.axvline(100 * base.iloc[0], color="grey", ls="--", lw=1, label="base")
        left.legend(fontsize=8, loc="lower right")
    left.set_yticks(y, [f"{a} {r}" for a, r in zip(table["arm"], table["run"])])
    left.set_xlim(0, 100)
    left.set_xlabel(f"greedy exact match on the held-out {train_format} test set (%)")
    right.set_xlabel("KL(base || model) on WikiText-2 (nats/token)")
    left.set_title(title, fontsize=10)
    _save(fig, path)


def message_figure(title: str, text: str, path: str | Path) -> None:
    """A figure that only says something (why a stage could not run), so that every expected figure exists."""
    import textwrap

    fig, ax = plt.subplots(figsize=(8, 2.2))
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(text, 100), ha="center", va="center", fontsize=9, transform=ax.transAxes)
    ax.set_title(title, fontsize=10)
    _save(fig, path)


def study_curves(curves: pd.DataFrame, title: str, path: str | Path) -> None:
    """Exact match on the validation split and on a fixed test subset against the training step, one line
    per run, coloured by arm."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    if len(curves):
        frame = curves.melt(id_vars=["arm", "run", "step"], value_vars=["val_accuracy", "test_accuracy"],
                            var_name="split", value_name="exact match")
        frame["exact match"] *= 100
        for ax, split in zip(axes, ["val_accuracy", "test_accuracy"]):
            part = frame[frame["split"] == split]
            sns.lineplot(part, x="step", y="exact match", hue="arm", units="run", estimator=None, marker="o",
                         ax=ax, palette=_arm_colors(), hue_order=[a for a in STUDY_ARMS if a in set(part["arm"])])
            ax.set_title(split.replace("_accuracy", "").replace("val", "validation"), fontsize=9)
            ax.set_ylim(0, 100)
    fig.suptitle(title, fontsize=10)
    _save(fig, path)


# ---------------------------------------------------------------------------------------------------
# Circuits on the teacher-forced protocol (the `discover` and `edge_curve` rules)

TARGET_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e")


def pruning_path(path: pd.DataFrame, title: str, out: str | Path) -> None:
    """The greedy pruning path (`interp.teacher_forcing.prune`): faithfulness of the measure on the identification pairs
    after each visit against the nodes still kept, one colour per target (the highest prunes the whole model,
    each lower one goes on from the circuit above; the chosen one thicker), its target dashed, each circuit's
    size marked."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    first = path[path["target"] == path["target"].max()].sort_values("visit")
    total = int(first["nodes_kept"].iloc[0] + first["dropped"].iloc[0])
    start = (total, 1.0)  # the highest target prunes the whole model; each lower one the circuit above it
    for i, (target, part) in enumerate(sorted(path.groupby("target"), key=lambda g: -g[0])):
        part = part.sort_values("visit")
        color = TARGET_COLORS[i % len(TARGET_COLORS)]
        chosen = bool(part["chosen"].iloc[0]) if "chosen" in part else False
        x = np.r_[start[0], part["nodes_kept"].to_numpy()]
        y = np.r_[start[1], part["faithfulness"].to_numpy()]
        start = (x[-1], y[-1])
        ax.step(x, y, where="post", color=color, lw=2.2 if chosen else 1.1,
                label=f"target {target:g}: {int(part['nodes_kept'].iloc[-1])} nodes" + (" (chosen)" if chosen else ""))
        ax.axhline(target, color=color, ls="--", lw=0.8)
        ax.plot(part["nodes_kept"].iloc[-1], part["faithfulness"].iloc[-1], "o", color=color, mec="black", ms=6)
    if total > 50:  # the first sweep's long tail, and the few nodes the targets differ by
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(total * 1.05, 0)
        ax.minorticks_off()
    else:
        ax.invert_xaxis()
    ax.set_xlabel(f"nodes kept (heads and MLPs, of {total})")
    ax.set_ylabel("faithfulness of the measure (identification pairs)")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(title, fontsize=10)
    _save(fig, out)


def circuit_grid(nodes: str, key_heads, n_layers: int, n_heads: int, title: str, out: str | Path) -> None:
    """A circuit ("L3H2 L5MLP ...", `CircuitSet.nodes`) on the layer x head grid with an MLP column, over the key
    heads: kept key heads, added heads (not key heads), key heads it leaves out, and kept MLPs."""
    from arithmech.interp.nodes import parse_nodes

    heads, mlps = (set(part) for part in parse_nodes(nodes))
    key = {(int(l), int(h)) for l, h in key_heads}
    grid = np.zeros((n_layers, n_heads + 1))
    for l, h in heads:
        grid[l, h] = 2 if (l, h) in key else 1
    for l, h in key - heads:
        grid[l, h] = 3
    for l in mlps:
        grid[l, n_heads] = 4
    colors = ["#f4f4f4", "#1f78b4", "#33a02c", "#fb9a99", "#6a3d9a"]
    names = ["ablated", "added head", "key head kept", "key head left out", "MLP kept"]
    fig, ax = plt.subplots(figsize=(max(4.5, 0.35 * (n_heads + 1) + 2), max(3.5, 0.22 * n_layers + 1.5)))
    ax.imshow(grid, cmap=matplotlib.colors.ListedColormap(colors), vmin=-0.5, vmax=4.5, aspect="auto",
              origin="lower", interpolation="nearest")
    ax.axvline(n_heads - 0.5, color="black", lw=0.8)
    ax.set_xticks(range(n_heads + 1), [str(h) for h in range(n_heads)] + ["MLP"], fontsize=7)
    ax.set_yticks(range(n_layers), [str(l) for l in range(n_layers)], fontsize=6)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    counts = [int((grid[:, :n_heads] == v).sum()) for v in range(4)] + [len(mlps)]
    ax.legend(handles=[Rectangle((0, 0), 1, 1, color=c, label=f"{n} ({k})") for c, n, k in zip(colors, names, counts)],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    ax.set_title(title, fontsize=9)
    _save(fig, out)


def edge_curve(curves: pd.DataFrame, title: str, out: str | Path) -> None:
    """The edge circuit against the node circuit (`interp.edges.items_edge_curve`): per operator, faithfulness of the
    answer's teacher-forced log-probability on the validation pairs against the head -> MLP edges kept, the edges
    chosen by EAP-IG score and in the order a node circuit takes them in (both ranked on identification pairs)."""
    tasks = list(dict.fromkeys(curves["task"]))
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.6 * len(tasks), 3.4), squeeze=False, sharey=True)
    styles = {"eap_ig": ("tab:red", "EAP-IG edges"), "nodes": ("tab:blue", "node ranking")}
    for ax, task in zip(axes[0], tasks):
        part = curves[curves["task"] == task]
        for ranking, (color, label) in styles.items():
            line = part[part["ranking"] == ranking].sort_values("edges")
            ax.plot(line["edges"], line["faithfulness"], "o-", color=color, label=label, ms=4)
        ax.axhline(1, color="grey", lw=0.6, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel(f"edges kept (of {int(part['n_edges'].iloc[0])})")
        ax.set_title(f"{task} ({int(part['n_items'].iloc[0])} pairs)", fontsize=9)
    axes[0][0].set_ylabel("faithfulness (log-probability)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    _save(fig, out)
