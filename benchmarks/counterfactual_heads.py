"""Does the choice of counterfactual (`prompts.counterfactual_shots`) change which heads are found?

A zero-shot counterfactual (the default, least leak) differs from its reference in the operator AND in the
missing few-shot lines, so a head whose END output depends on the solved examples shows an effect as well as
a head that carries the operation. `keep` (few-shot lines with their answers) and `blank` (lines without
answers) change less besides the operator, at the price of more leak. A head that stands out under every
contrast is an operator head by this evidence; one that stands out under zero_shot only is more likely an
example reader.

Reads the identify stage's effect tables of two or more runs that differ only in counterfactual_shots, e.g.
the default run and one in another directory:

    # /tmp/cf-keep holds config.yaml, a link to resources/ and keep.yaml (prompts: {counterfactual_shots: keep})
    .venv/bin/snakemake -s Snakefile --directory /tmp/cf-keep --configfile /tmp/cf-keep/keep.yaml --cores 2 \\
        results/smollm2-135m/effects/{addition,subtraction,multiplication,division}.parquet
    .venv/bin/python benchmarks/counterfactual_heads.py zero_shot=results/smollm2-135m \\
        keep=/tmp/cf-keep/results/smollm2-135m [--top 10] [--out table.csv]

The runs select their identification pairs by the reference prompts alone, so the samples are the same
and the effects are compared node by node. Prints, per task and option against the first: the Spearman
correlation of the head effects, the overlap of the top heads and of the key-head sets, and each of the
first option's top heads with its effect [95% CI] under every option.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from arithmech.io import read_parquet_meta


def _load(results: Path, task: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The run's head effects (indexed by node), key components, identification sample ids and pairs metadata."""
    effects = pd.read_parquet(results / f"effects/{task}.parquet")
    key = pd.read_parquet(results / f"key_components/{task}.parquet")
    pairs_path = results / f"pairs/{task}.parquet"
    pairs = pd.read_parquet(pairs_path, columns=["sample_id", "split"])
    info = {"ids": sorted(pairs.loc[pairs["split"] == "identification", "sample_id"]),
            "meta": read_parquet_meta(pairs_path)}
    return effects[effects["component"] == "head"].set_index("node"), key, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="option=results directory of one model (the first is the baseline)")
    parser.add_argument("--tasks", nargs="+", default=["addition", "subtraction", "multiplication", "division"])
    parser.add_argument("--top", type=int, default=10, help="top heads compared (by mean effect, most negative)")
    parser.add_argument("--out", type=Path, default=None, help="also write the per-head table as CSV")
    args = parser.parse_args()
    runs = {}
    for spec in args.runs:
        option, _, path = spec.partition("=")
        if not path:
            parser.error(f"expected option=directory, got {spec!r}")
        runs[option] = Path(path)
    if len(runs) < 2:
        parser.error("give at least two runs")
    base = next(iter(runs))
    summary, heads = [], []
    for task in args.tasks:
        loaded = {o: _load(p, task) for o, p in runs.items()}
        b_eff, b_key, b_info = loaded[base]
        top = b_eff["mean_effect"].nsmallest(args.top).index
        b_keys = set(b_key.loc[b_key["component"] == "head", "node"])
        for option, (eff, key, info) in loaded.items():
            if info["ids"] != b_info["ids"]:
                raise SystemExit(f"{task}: {option}'s identification pairs are not {base}'s; the runs differ in more "
                                 "than counterfactual_shots")
            keys = set(key.loc[key["component"] == "head", "node"])
            eff = eff.reindex(b_eff.index)
            summary.append({
                "task": task, "option": option,
                "leak_full": info["meta"].get("leak", {}).get("identification", {}).get("full", float("nan")),
                "spearman_vs_" + base: b_eff["mean_effect"].rank().corr(eff["mean_effect"].rank()),
                f"top{args.top}_overlap": len(set(top) & set(eff["mean_effect"].nsmallest(args.top).index)),
                "key_heads": len(keys), "key_overlap": len(keys & b_keys),
            })
            for rank, node in enumerate(top, 1):
                heads.append({"task": task, "rank_" + base: rank, "node": node, "option": option,
                              "mean_effect": eff.loc[node, "mean_effect"], "ci_low": eff.loc[node, "ci_low"],
                              "ci_high": eff.loc[node, "ci_high"], "key": node in keys,
                              "rank": int(eff["mean_effect"].rank().loc[node])})
    summary, heads = pd.DataFrame(summary), pd.DataFrame(heads)
    pd.set_option("display.width", 200)
    print(summary.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    wide = heads.assign(cell=lambda d: [f"{100 * m:+.2f} [{100 * lo:+.2f},{100 * hi:+.2f}] #{r}{'*' if k else ''}"
                                        for m, lo, hi, r, k in zip(d["mean_effect"], d["ci_low"], d["ci_high"],
                                                                   d["rank"], d["key"])])
    print(wide.pivot(index=["task", "rank_" + base, "node"], columns="option", values="cell")[list(runs)].to_string())
    if args.out:
        heads.merge(summary, on=["task", "option"]).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
