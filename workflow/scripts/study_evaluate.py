from pathlib import Path

from arithmech.jobs import job
from arithmech.stages.study import chosen_dir, run_study_evaluate

inputs, wildcards = snakemake.input, snakemake.wildcards
with job(snakemake):
    if wildcards.arm == "base":
        run_dir = None
    elif wildcards.run == "chosen":  # the grid run the selection chose, by its name (each run's folder)
        grid = [inputs.grid] if isinstance(inputs.grid, str) else list(inputs.grid)
        run_dir = chosen_dir(inputs.selection, {Path(d).name: d for d in grid})
    else:
        run_dir = inputs.run
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
