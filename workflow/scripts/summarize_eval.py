from pathlib import Path

from arithmech.jobs import job
from arithmech.sft.runs import STATS_FILE
from arithmech.stages.finetune import run_summarize_eval

with job(snakemake):
    methods, datasets = snakemake.params.methods, snakemake.params.datasets
    evals = iter(snakemake.input.evals)  # expand order: method-major, then data set
    eval_paths = {m: {d: next(evals) for d in datasets} for m in methods}
    stats_paths = {Path(p).name: str(Path(p) / STATS_FILE) for p in snakemake.input.trained}
    run_summarize_eval(
        model=snakemake.wildcards.model,
        methods=methods,
        eval_paths=eval_paths,
        stats_paths=stats_paths,
        confidence=snakemake.params.confidence,
        out_table=snakemake.output.table,
        out_md=snakemake.output.markdown,
        out_html=snakemake.output.html,
        out_png=snakemake.output.figure,
    )
