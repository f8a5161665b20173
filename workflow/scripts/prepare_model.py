from arithmech.jobs import job
from arithmech.stages.identify import run_prepare_model

with job(snakemake):
    run_prepare_model(source=snakemake.params.source, out_dir=snakemake.output[0])
