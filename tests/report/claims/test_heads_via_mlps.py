"""Claim heads_via_mlps on small tables whose answer is known."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from arithmech.report.claims import (
    common,
    heads_via_mlps,
)
from claim_tables import (
    CFG,
    FAILED,
    path_cuts,
    tf_circuit_items,
)


def test_heads_via_mlps_reads_the_key_heads_cut_paths_under_both_ablations():
    split = path_cuts(0.5, 0.1, 0.6)
    unequal = pd.concat([path_cuts(0.5, 0.1, 0.6, kinds=("resample",)), path_cuts(0.02, 0.5, 0.6, kinds=("mean",))])
    rows = heads_via_mlps.score({"addition": split, "subtraction": path_cuts(0.3, 0.5, 0.8),
                                  "multiplication": path_cuts(0.0, 0.5, 0.5), "division": unequal,
                                  "none": None}, CFG, seed=0)
    by = {r["scope"]: r for r in rows}
    assert by["addition"]["verdict"] == "holds" and by["addition"]["value"] == pytest.approx(100 * 0.5 / 0.6, abs=2)
    assert "resample: holds" in by["addition"]["note"]
    assert by["subtraction"]["verdict"] == "partly"  # through the MLPs, but less than directly
    assert by["multiplication"]["verdict"] == "does not hold"  # nothing through the MLPs
    assert by["division"]["verdict"] == "inconclusive"  # the two ablations disagree
    assert by["none"]["verdict"] == "not measured"
    # edges that carry nothing: no share to read
    nothing = heads_via_mlps.score({"addition": path_cuts(0.0, 0.0, 0.0, noise=0.2)}, CFG, seed=0)
    assert nothing[1]["verdict"] in ("inconclusive", "does not hold")


def test_the_discover_rules_checks_reach_the_path_cuts():
    """heads_via_mlps reads the failed checks of the discover rule's per-item tables (`rows`, the registry's entry)."""
    items = tf_circuit_items(0.95, 0.1, failed=FAILED)
    rows = heads_via_mlps.score({"addition": path_cuts(0.5, 0.1, 0.6)}, CFG, seed=0,
                                   sanity={"addition": common.failed_checks(items, ("resample", "mean"))})
    assert rows[1]["verdict"] == "inconclusive" and "resample ablation" in rows[1]["note"]
    # the registry's entry reads them from the discover rule's per-item tables
    tables = common.Tables(keys={}, effects={}, knockout_items={}, transfer_items=None, roles_all={}, probes={},
                           edge_paths={"addition": path_cuts(0.5, 0.1, 0.6)}, discover_items={"addition": items})
    (_, row) = heads_via_mlps.rows(tables, CFG, seed=0)
    assert row["verdict"] == "inconclusive" and "resample ablation" in row["note"]
    clean = heads_via_mlps.rows(dataclasses.replace(tables, discover_items={}), CFG, seed=0)
    assert clean[1]["verdict"] == "holds"
    assert heads_via_mlps.rows(common.Tables({}, {}, {}, None, {}, {}), CFG, seed=0)[0]["note"] == (
        "the edges rule did not run")
