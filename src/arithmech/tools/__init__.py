"""The repository's tools, each run as `python -m arithmech.tools.NAME` (or its make target), and what the
Snakefile checks and asks a cluster for while it parses and before any job is queued.

cluster: each rule's cluster resources and retries, the SLURM account and partitions (standard library only).
model_access: before a run, every Hub model can be downloaded (token, licence, cache directory and its space).

docs_results writes README's scorecard, run-time and plan blocks and docs/results.md from results/ (make docs).
run_record runs the workflow and records its time, jobs and machine in results/run_record.json (make run).
plan estimates a configuration's jobs, GPU hours and peak memory before it runs (make plan).
rehearsal runs the paper's configuration at its shape on a tiny model through a SLURM scheduler (make rehearsal).

Tools may import the library; nothing outside tools/ imports them (tests/project/test_architecture.py).
"""
