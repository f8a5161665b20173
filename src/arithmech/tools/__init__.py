"""The repository's tools, each run as `python -m arithmech.tools.NAME` (or its make target).

docs_results writes README's scorecard block and docs/results.md from results/ (make docs).
plan estimates a configuration's jobs, GPU hours and peak memory before it runs (make plan).
rehearsal runs the paper's configuration at its shape on a tiny model through SLURM stand-ins (make rehearsal).

Tools may import the library; nothing outside tools/ imports them (tests/test_architecture.py).
"""
