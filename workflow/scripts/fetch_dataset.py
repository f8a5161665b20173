from arithmech.data.eval_sets import fetch
from arithmech.hub_lock import LOCK_FILE
from arithmech.jobs import job

with job(snakemake):
    fetch(name=snakemake.wildcards.dataset, hub=snakemake.params.hub, out_path=snakemake.output[0],
          lock=LOCK_FILE)  # in the working directory, beside results/
