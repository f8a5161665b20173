from arithmech.hub_lock import LOCK_FILE
from arithmech.jobs import job
from arithmech.stages.identify import run_prepare_model

with job(snakemake):
    run_prepare_model(
        source=snakemake.params.source,
        out_dir=snakemake.output[0],
        # Read here, not a rule param: moving the cache must not re-run the model's every job.
        model_cache=snakemake.config["run"].get("model_cache"),
        model=snakemake.wildcards.model,
        lock=LOCK_FILE,  # in the working directory, beside results/
    )
