"""Reporting, torch-free: statistics, the claims' verdicts, the scorecard, the findings page, numbers, figures.

stats.accuracy_interval, mcnemar_exact, cluster_bootstrap, compare and holm are the statistics.
claims.registry.scorecard decides one verdict per claim of the paper from the stages' tables (claims/: one module
per claim).
scorecard.claims_markdown and claims_html write the claims table for people.
tables.markdown_table writes every other Markdown table (the docs, the fine-tuning stages' .md files).
page.findings_html writes one model's findings page.
display.number, percent, p_value, ... format every number shown to people.
tables.markdown_table writes the Markdown tables of the pages; eval_markdown and study_markdown the stages' ones.
plots.effects_heatmap, knockout_curves, ... draw every figure (matplotlib and seaborn).

Import from the modules (no re-exports here).
"""
