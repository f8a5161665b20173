from pathlib import Path

from arithmech.jobs import job
from arithmech.sft.runs import STATS_FILE
from arithmech.stages.study import run_study_summary

inputs = snakemake.input


def keyed(kind):
    """{(arm, run): path} of the inputs of one kind (eval, grid, run), as the rule names them."""
    return {(arm, run): inputs[name] for name, (arm, run) in snakemake.params.runs[kind].items()}


with job(snakemake):
    arms = snakemake.params.study["arms"]
    runs = {**keyed("grid"), **keyed("run")}
    run_study_summary(
        model=snakemake.wildcards.model,
        study=snakemake.params.study,
        formats_path=inputs.formats,
        items_path=inputs.get("study_items"),  # absent when no format was chosen: the study did not run
        selection_paths={a: inputs[f"select_{a}"] for a in arms if f"select_{a}" in inputs.keys()},
        eval_paths=keyed("eval"),
        stats_paths={key: str(Path(path) / STATS_FILE) for key, path in runs.items()},
        seed=snakemake.params.seed,
        out_study=snakemake.output.study,
        out_comparisons=snakemake.output.comparisons,
        out_md=snakemake.output.markdown,
        out_html=snakemake.output.html,
        out_png=snakemake.output.figure,
        out_curves=snakemake.output.curves,
        operands=snakemake.params.operands,
    )
