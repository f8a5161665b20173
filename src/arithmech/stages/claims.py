"""The claims rule's entry point: one verdict per claim of the paper on this model, read from the stages'
tables (`arithmech.report.claims`: one module per claim, listed in its registry), written as a table and as
Markdown and HTML (`arithmech.report.scorecard`)."""

from __future__ import annotations

import pandas as pd

from arithmech.io import atomic_path, provenance, read_parquet_meta, write_parquet
from arithmech.report.claims.common import Tables
from arithmech.report.claims.knockout_collapse import read_knockout_items
from arithmech.report.claims.registry import scorecard
from arithmech.report.scorecard import claims_html, claims_markdown


def run_claims(*, model: str, key_paths: dict, effects_paths: dict, knockout_item_paths: dict, transfer_items_path,
               roles_all_paths: dict, probes_paths: dict, study_path=None, comparisons_path=None,
               claims_cfg: dict, seed: int, out_table, out_md, out_html, edge_path_paths: dict | None = None,
               discover_path=None, discover_item_paths: dict | None = None) -> None:
    """The scorecard of one model: claims.parquet (COLUMNS), and the same as Markdown and HTML
    (arithmech.report.scorecard).
    The path dicts map operator -> table; the study's tables are None when the study is off, `discover_path`
    (the discover rule's summary.parquet; `discover_item_paths`: its per-item tables) when that rule did not run:
    their claims then say so. The trained
    format, and why the study could not run where it could not, are read from the study table's metadata."""
    read = lambda paths: {task: pd.read_parquet(p) for task, p in paths.items()}  # noqa: E731
    study_meta = read_parquet_meta(study_path) if study_path else {}
    tables = Tables(
        keys=read(key_paths), effects=read(effects_paths),
        knockout_items={task: read_knockout_items(p, task) for task, p in knockout_item_paths.items()},
        transfer_items=pd.read_parquet(transfer_items_path), roles_all=read(roles_all_paths),
        probes=read(probes_paths),
        study=pd.read_parquet(study_path) if study_path else None,
        comparisons=pd.read_parquet(comparisons_path) if comparisons_path else None,
        train_format=study_meta.get("train_format"),
        edge_paths=read(edge_path_paths or {}),
        study_not_run=study_meta.get("reason") if study_meta.get("ran") is False else None,
        discover=pd.read_parquet(discover_path) if discover_path else None,
        discover_items=read(discover_item_paths or {}),
    )
    table = scorecard(tables, claims_cfg, seed)
    write_parquet(table, out_table, provenance(stage="claims", model=model, claims=claims_cfg, seed=seed))
    with atomic_path(out_md) as tmp:
        tmp.write_text(f"# {model}: the paper's claims on this model\n\n" + claims_markdown(table))
    with atomic_path(out_html) as tmp:
        tmp.write_text(claims_html(table, title=f"{model}: the paper's claims on this model"))
