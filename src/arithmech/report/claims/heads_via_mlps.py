"""Claim heads_via_mlps: the key heads act through the MLPs: cutting their edges into the later MLPs loses more
of the answer's log-probability than cutting their edges into the logits (the edges rule's path cuts)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from arithmech import layout, stats
from arithmech.interp import protocol
from arithmech.report.claims.common import (
    IDENTICAL,
    SANITY_RULE,
    Claim,
    Tables,
    claim_row,
    degenerate,
    directional,
    failed_checks,
    headline,
    in_percent,
    not_measured,
    sanity_headline,
    sanity_note,
)

CLAIM = Claim("heads_via_mlps", "circuit",
              "The key heads act through the MLPs: their effect reaches the answer through later MLPs more than "
              "directly.",
              "the hypothesis that heads \"pinpoint arithmetic operands\", \"subsequently engaging MLPs to work out "
              "the answers\" (introduction); no path is measured")


def _cut_shares(rows: pd.DataFrame, cfg: dict, seed: int) -> dict:
    """Paired cluster-bootstrap estimates from one kind's per-item path cuts: the log-probability lost (model - cut)
    with the key heads' edges into the MLPs cut (via), into the logits cut (direct) and both; via, direct and their
    difference as shares of `both` (what the key heads' edges carry in all)."""
    lost = np.column_stack([rows["model"] - rows[c] for c in ("via_mlps", "direct", "both")])
    point, boot = stats.cluster_resampled_means(lost, rows["cluster"].to_numpy(), n_boot=cfg["bootstrap"], seed=seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = np.column_stack([boot[:, 0], boot[:, 1], boot[:, 0] - boot[:, 1]]) / boot[:, [2]]
        share_point = np.array([point[0], point[1], point[0] - point[1]]) / point[2]
    low, high = stats.percentile_interval(shares, cfg["confidence"])
    both_low, both_high = stats.percentile_interval(boot[:, [2]], cfg["confidence"])
    return {"lost": point, "both_low": float(both_low[0]), "both_high": float(both_high[0]), "share": share_point,
            "share_low": low, "share_high": high, "n": len(rows)}


def _cut_verdict(est: dict, min_diff: float) -> str:
    """The key heads' edges must carry something (lost with both cut: interval above 0); then the path through the
    MLPs must carry a share of it (interval above 0, or inside +-min_diff: does not hold) and more than the direct
    path (the same on via - direct)."""
    carried = directional(est["both_low"], est["both_high"], direction=+1, min_effect=0.0)
    if carried != "holds":
        return carried
    via = directional(est["share_low"][0], est["share_high"][0], direction=+1, min_effect=min_diff)
    more = directional(est["share_low"][2], est["share_high"][2], direction=+1, min_effect=min_diff)
    return "holds" if via == more == "holds" else "partly" if via == "holds" else via


def score(edge_paths: dict[str, pd.DataFrame | None], cfg: dict, seed: int,
                 sanity: dict[str, dict[str, str]] | None = None) -> list[dict]:
    """Per operator, on the teacher-forced protocol (the edges rule's `{task}_edge_paths`: the answer's
    log-probability with the key heads' edges into every later MLP, into the logits, or both cut exactly, per
    validation item, under each ablation): the path through the MLPs must carry a share of what the key heads'
    edges carry and more than the direct path does, with the same verdict under both ablations (else
    inconclusive). `sanity`: per
    operator, the ablations whose sanity check failed in the discover rule (`failed_checks`; the edges rule cuts
    under the same ablations, values from the same identification pairs): their rows are inconclusive."""
    min_diff = cfg["min_difference"]
    rule = ("teacher-forced (answer and terminator), log-probability lost when the key heads' edges are cut exactly: "
            "holds if, under both ablations, cutting all their edges loses log-probability (interval above 0) and the "
            "edges into the MLPs carry a share of it and more than the edges into the logits (95% intervals of both "
            f"shares above 0); partly if only the first share is; does not hold if an interval lies below 0 or inside "
            f"+-{100 * min_diff:g} points; inconclusive otherwise, or where the two ablations disagree; {SANITY_RULE} "
            "(the discover rule's checks, on the same ablations)")
    subs, failed_by_task = [], {}
    for task, paths in edge_paths.items():
        if paths is None or paths.empty:
            subs.append(claim_row(CLAIM, task, rule=rule, note="no key head, or no path-cut table"))
            continue
        kinds = list(dict.fromkeys(paths["kind"]))
        per_kind = {kind: _cut_shares(paths[paths["kind"] == kind], cfg, seed) for kind in kinds}
        verdicts = {kind: _cut_verdict(est, min_diff) for kind, est in per_kind.items()}
        verdict = next(iter(verdicts.values())) if len(set(verdicts.values())) == 1 else "inconclusive"
        failed = {k: msg for k, msg in (sanity or {}).get(task, {}).items() if k in per_kind}
        if failed:
            verdict, failed_by_task[task] = "inconclusive", failed
        notes = [sanity_note(failed)] if failed else []
        for kind, est in per_kind.items():
            lo, hi = est["share_low"], est["share_high"]
            if degenerate(est["both_low"], est["both_high"]):
                notes.append(f"{kind}: cutting the key heads' edges: {IDENTICAL}")
                continue
            notes.append(f"{kind}: {verdicts[kind]}; all edges cut loses {est['lost'][2]:.3f} nats "
                         f"[{est['both_low']:.3f}, {est['both_high']:.3f}], of which through the MLPs "
                         f"{in_percent(est['share'][0], lo[0], hi[0])}, "
                         f"direct {in_percent(est['share'][1], lo[1], hi[1])}")
        main = per_kind[kinds[0]]
        subs.append(claim_row(CLAIM, task,
                              measure=f"share of the key heads' edge effect through the MLPs ({kinds[0]} ablation)",
                              value=100 * main["share"][0], ci_low=100 * main["share_low"][0],
                              ci_high=100 * main["share_high"][0], unit="percent", n=int(main["n"]), split="validation",
                              verdict=verdict, rule=rule, note="; ".join(notes),
                              source=layout.EDGE_PATHS.format(task=task)))
    return headline(CLAIM, subs, measure="per operator, below", split="validation",
                    note=sanity_headline(failed_by_task))


def rows(t: Tables, cfg: dict, seed: int) -> list[dict]:
    """The registry's entry (`registry.scorecard`): the edges rule's path cuts, per operator, with the discover
    rule's failed sanity checks (its per-item tables)."""
    if not t.edge_paths:
        return not_measured(CLAIM, "the edges rule did not run")
    sanity = {task: failed_checks(items, protocol.KINDS) for task, items in t.discover_items.items()}
    return score(t.edge_paths, cfg, seed, sanity=sanity)
