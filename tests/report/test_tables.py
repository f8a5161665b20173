"""The Markdown tables the stages write (`arithmech.report.tables`)."""

import pandas as pd

from arithmech.report.tables import head_sets_markdown


def test_study_md_lists_each_head_sets_overlap_with_precise():
    """study.md's "Head sets": per arm (per draw where draws differ) its heads, those precise trains too and the
    Jaccard index; a run without the negative control says what that costs."""
    table = pd.DataFrame([
        {"arm": "base", "run": "base"},
        {"arm": "precise", "run": "chosen", "n_heads": 16, "overlap_precise": 16, "jaccard_precise": 1.0},
        {"arm": "precise", "run": "seed1", "n_heads": 16, "overlap_precise": 16, "jaccard_precise": 1.0},
        {"arm": "circuit", "run": "chosen", "n_heads": 16, "overlap_precise": 13, "jaccard_precise": 13 / 19},
        {"arm": "full", "run": "chosen"},
    ])
    md = head_sets_markdown(table, {"arms": ["precise", "circuit", "full"]})
    assert md.startswith("## Head sets")
    assert "- precise (chosen, seed1): 16 heads, 16 of them trained by precise too (Jaccard 1.00)" in md
    assert "- circuit (chosen): 16 heads, 13 of them trained by precise too (Jaccard 0.68)" in md
    assert "full" not in md.split("\n\n", 2)[2].split("This run")[0]
    assert "no circuit_disjoint, low_effect arm" in md and "no positive control" in md
    md = head_sets_markdown(table, {"arms": ["precise", "circuit", "circuit_disjoint", "low_effect"]})
    assert "This run has no" not in md
