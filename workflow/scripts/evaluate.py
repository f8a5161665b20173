from arithmech.jobs import job
from arithmech.stages.finetune import run_evaluate

with job(snakemake):
    run_evaluate(
        model=snakemake.wildcards.model,
        model_dir=snakemake.input.model,
        method=snakemake.wildcards.method,
        dataset=snakemake.wildcards.dataset,
        finetune_dir=snakemake.input.get("trained"),
        data_path=snakemake.input.data,
        shots_path=snakemake.input.get("shots"),
        evaluation=snakemake.params.evaluation,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_path=snakemake.output[0],
    )
