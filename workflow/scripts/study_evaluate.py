from arithmech.jobs import job
from arithmech.stages.study import chosen_dir, run_study_evaluate

inputs, wildcards = snakemake.input, snakemake.wildcards
if wildcards.arm == "base":
    run_dir = None
elif wildcards.run == "chosen":
    grid = [inputs.grid] if isinstance(inputs.grid, str) else list(inputs.grid)
    run_dir = chosen_dir(inputs.selection, {f"lr{i}": d for i, d in enumerate(grid)})
else:
    run_dir = inputs.run
with job(snakemake):
    run_study_evaluate(
        model_dir=inputs.model,
        items_path=inputs.study_items,
        arm=wildcards.arm,
        run=wildcards.run,
        run_dir=run_dir,
        study=snakemake.params.study,
        data_paths={k: inputs[k] for k in snakemake.params.study["off_target"]["files"]},
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_path=snakemake.output[0],
    )
