from arithmech.jobs import job
from arithmech.stages.analyze import run_analyze

with job(snakemake):
    run_analyze(
        model=snakemake.wildcards.model,
        task=snakemake.wildcards.task,
        model_dir=snakemake.input.model,
        pairs_path=snakemake.input.pairs,
        key_path=snakemake.input.key,
        effects_path=snakemake.input.effects,
        analysis=snakemake.params.analysis,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_roles=snakemake.output.roles,
        out_roles_all=snakemake.output.roles_all,
        out_example=snakemake.output.example,
        out_probes=snakemake.output.probes,
    )
