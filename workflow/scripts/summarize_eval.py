from pathlib import Path

from arithmech.stages import STATS_FILE, job, run_summarize_eval

with job(snakemake):
    methods, datasets = snakemake.params.methods, snakemake.params.datasets
    evals = iter(snakemake.input.evals)  # expand order: method-major, then data set
    eval_paths = {m: {d: next(evals) for d in datasets} for m in methods}
    stats_paths = {Path(p).name: str(Path(p) / STATS_FILE) for p in snakemake.input.trained}
    run_summarize_eval(
        snakemake.wildcards.model,
        methods,
        eval_paths,
        stats_paths,
        snakemake.params.confidence,
        snakemake.output.table,
        snakemake.output.markdown,
        snakemake.output.html,
        snakemake.output.figure,
    )
