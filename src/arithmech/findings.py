"""The headline findings of one model's run on one page, the report's "0. Findings": which components the
identify stage selected, what knocking them out does against as many random heads, and what the precise-SFT
study found. Everything is read from the stages' own tables; nothing is recomputed. Pure pandas (no torch).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .io import write_html_page


def key_component_rows(key_tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per task: the key heads (strongest patching effect first) and key MLPs the rule selected,
    and the share of all heads that are key heads."""
    rows = []
    for task, key in key_tables.items():
        heads = key[key["component"] == "head"].sort_values("mean_effect", kind="stable")
        mlps = key[key["component"] == "mlp"].sort_values("mean_effect", kind="stable")
        total = int(key["n_heads_total"].iloc[0]) if len(key) else 0
        rows.append({
            "task": task, "key heads": " ".join(heads["node"]) or "none", "key MLPs": " ".join(mlps["node"]) or "none",
            "heads selected": f"{len(heads)} of {total}" if total else str(len(heads)),
            "strongest effect": float(heads["mean_effect"].iloc[0]) if len(heads) else float("nan"),
        })
    return pd.DataFrame(rows)


CONTROLS = {"random_heads": "random K", "random_layer_matched": "layer-matched K"}


def knockout_rows(knockout_tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per task and ablated positions: accuracy (%) on the validation pairs with nothing, the top K
    heads, and K random heads drawn uniformly or in the top K's layers (mean and range over the draws)
    knocked out, K = the curve's largest k; first answer token and full greedy answer."""
    rows = []
    for task, whole in knockout_tables.items():
        for positions, table in whole.groupby("positions", sort=False):
            top = table[table["curve"] == "top_heads"]
            K = int(top["k"].max())
            base, knocked = top[top["k"] == 0].iloc[0], top[top["k"] == K].iloc[0]
            row = {"task": task, "positions": positions, "n": int(table["n"].iloc[0]), "K": K}
            for col, name in (("accuracy", "first token"), ("full_accuracy", "full answer")):
                row[f"{name}: none"] = 100 * base[col]
                row[f"{name}: top K"] = 100 * knocked[col]
                for curve, label in CONTROLS.items():
                    rand = table.loc[(table["curve"] == curve) & (table["k"] == K), col]
                    row[f"{name}: {label}"] = (f"{100 * rand.mean():.1f} [{100 * rand.min():.1f}, "
                                               f"{100 * rand.max():.1f}]" if len(rand) else "")
            rows.append(row)
    return pd.DataFrame(rows)


def study_rows(study: pd.DataFrame, comparisons: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per arm: test exact match (%) of its chosen run with its interval, mean over all its runs, KL to
    base; the precise arm's comparisons on test exact match and KL to base, with intervals and Holm p)."""
    arms = []
    for arm, part in study.groupby("arm", sort=False):
        chosen = part[part["run"].isin(["chosen", "base"])].iloc[0]
        arms.append({
            "arm": arm, "runs": len(part),
            "exact match (chosen run)": f"{100 * chosen['accuracy']:.1f} [{100 * chosen['accuracy_low']:.1f}, "
                                        f"{100 * chosen['accuracy_high']:.1f}]",
            "mean over runs": 100 * part["accuracy"].mean(),
            "KL to base": chosen.get("kl_to_base", float("nan")),
            "trainable parameters": chosen.get("trainable_params", float("nan")),
        })
    comp = comparisons[comparisons["metric"].isin(["accuracy", "kl_to_base"])
                       & comparisons["arm_a"].str.startswith("precise")]
    comp = pd.DataFrame({
        "comparison": comp["arm_a"] + " - " + comp["arm_b"], "metric": comp["metric"],
        "difference": comp["difference"].where(comp["metric"] != "accuracy", 100 * comp["difference"]),
        "interval": [f"[{lo:.3g}, {hi:.3g}]" if m != "accuracy" else f"[{100 * lo:.1f}, {100 * hi:.1f}]"
                     for m, lo, hi in zip(comp["metric"], comp["ci_low"], comp["ci_high"])],
        "p": comp["p_value"], "p (Holm)": comp["p_holm"], "test": comp["test"],
    })
    return pd.DataFrame(arms), comp


def run_findings(*, model: str, key_paths: dict, knockout_paths: dict, study_path=None, comparisons_path=None,
                 out_html) -> None:
    """The findings page of one model: key components and knockout per task, and the study when it ran."""
    read = lambda paths: {task: pd.read_parquet(p) for task, p in paths.items()}  # noqa: E731
    sections = [
        ("Key components (identify)", key_component_rows(read(key_paths)),
         "Heads and MLPs the key-component rule selected by their path-patching effect at END on the answer "
         "logit (relative change; negative = the answer logit falls when the node gets its counterfactual "
         "value). Strongest first."),
        ("Knockout (validate)", knockout_rows(read(knockout_paths)),
         "Accuracy in % on the operator's validation pairs (operand pairs not used to rank the heads or take "
         "the means) with nothing, the top K heads by effect, or K random heads (uniform, or in the top K's "
         "layers; mean [min, max] over the draws) mean-ablated, at END or at every position (per-template "
         "means). The paper: accuracy collapses with the key heads knocked out and not with random heads."),
    ]
    if study_path is not None:
        arms, comp = study_rows(pd.read_parquet(study_path), pd.read_parquet(comparisons_path))
        sections += [
            ("Precise SFT study: arms", arms,
             "Greedy full-answer exact match (%) on the held-out test pairs of the trained format, the chosen "
             "run's interval resampling operand pairs; KL(base || model) in nats per WikiText-2 token."),
            ("Precise SFT study: the precise arm against the others", comp,
             "Differences (exact match in points, KL in nats) on the same test items, with intervals and "
             "p-values (McNemar where each arm is one model, else the paired cluster bootstrap), Holm-adjusted "
             "over the whole comparison table. The paper: precise SFT matches full fine-tuning and beats "
             "random heads."),
        ]
    write_html_page(sections, Path(out_html), f"{model}: findings")
