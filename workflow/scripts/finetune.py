from arithmech.jobs import gpu_settings, job
from arithmech.sft.distributed import run_on_gpus
from arithmech.stages.finetune import run_finetune

with job(snakemake):
    # gpus > 1: one process per GPU (gloo processes on CPU), each running run_finetune
    run_on_gpus(
        run_finetune,
        **gpu_settings(snakemake),
        model=snakemake.wildcards.model,
        model_dir=snakemake.input.model,
        method=snakemake.wildcards.method,
        # head methods get one effects table per task (inputs effects_<task>); full and LoRA none
        effects_paths={k.removeprefix("effects_"): v for k, v in snakemake.input.items() if k.startswith("effects_")},
        data_path=snakemake.input.data,
        finetune=snakemake.params.finetune,
        compute=snakemake.params.compute,
        seed=snakemake.params.seed,
        out_dir=snakemake.output[0],
        checkpoint_root=snakemake.params.checkpoints,
    )
