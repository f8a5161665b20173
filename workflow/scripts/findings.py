from arithmech.jobs import job
from arithmech.stages.findings import run_findings

inputs = snakemake.input

with job(snakemake):
    tasks = snakemake.params.tasks
    run_findings(
        model=snakemake.wildcards.model,
        claims_path=inputs.claims,
        key_paths={t: inputs[f"key_{t}"] for t in tasks},
        knockout_paths={t: inputs[f"knockout_{t}"] for t in tasks},
        figure_paths=list(inputs.figures),
        study_path=inputs.get("study"),
        comparisons_path=inputs.get("comparisons"),
        discover_path=inputs.discover,
        out_html=snakemake.output.html,
    )
