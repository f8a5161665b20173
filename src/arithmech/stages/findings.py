"""The findings rule's entry point: one model's findings page (the report's "0. Findings"), read from the
claims and the stages' tables (`arithmech.report.page`)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from arithmech.io import atomic_path
from arithmech.report.page import findings_html, provenance_text, study_not_run


def run_findings(*, model: str, claims_path, key_paths: dict, knockout_paths: dict, figure_paths: list,
                 study_path=None, comparisons_path=None, discover_path=None, out_html) -> None:
    """Write the findings page of one model. `figure_paths` are PNGs under the model's results folder (the
    folder of `claims_path`); a scorecard row whose source is one of them links to it on the page.
    `discover_path`: the discover rule's summary.parquet (None: the rule did not run, and the page says nothing
    of the model's own circuit)."""
    root = Path(claims_path).parent
    page = findings_html(
        model=model,
        claims=pd.read_parquet(claims_path),
        keys={task: pd.read_parquet(p) for task, p in key_paths.items()},
        knockouts={task: pd.read_parquet(p) for task, p in knockout_paths.items()},
        figures={Path(os.path.relpath(p, root)).as_posix(): p for p in figure_paths},
        study=pd.read_parquet(study_path) if study_path else None,
        comparisons=pd.read_parquet(comparisons_path) if comparisons_path else None,
        not_run=study_not_run(study_path),
        origin=provenance_text(next(iter(knockout_paths.values()))),  # knockout records the model checksum
        discover=pd.read_parquet(discover_path) if discover_path else None,
    )
    with atomic_path(out_html) as tmp:
        tmp.write_text(page)
