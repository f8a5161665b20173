from arithmech.jobs import gpu_settings, job
from arithmech.sft.distributed import run_on_gpus
from arithmech.stages.study import run_study_train

inputs = snakemake.input
with job(snakemake):
    # gpus > 1: one process per GPU (gloo processes on CPU), each running run_study_train
    run_on_gpus(
        run_study_train,
        **gpu_settings(snakemake),
        model_dir=inputs.model,
        items_path=inputs.study_items,
        effects_paths={k[len("effects_"):]: v for k, v in inputs.items() if k.startswith("effects_")},
        arm=snakemake.wildcards.arm,
        run=snakemake.wildcards.run,
        study=snakemake.params.study,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        selection_path=inputs.get("selection"),
        out_dir=snakemake.output[0],
        checkpoint_root=snakemake.params.checkpoints,
        discover_paths={k[len("discover_"):]: v for k, v in inputs.items() if k.startswith("discover_")},
    )
