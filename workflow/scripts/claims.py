from arithmech.jobs import job
from arithmech.stages.claims import run_claims

inputs = snakemake.input

with job(snakemake):
    tasks = snakemake.params.tasks
    run_claims(
        model=snakemake.wildcards.model,
        key_paths={t: inputs[f"key_{t}"] for t in tasks},
        effects_paths={t: inputs[f"effects_{t}"] for t in tasks},
        knockout_item_paths={t: inputs[f"knockout_{t}"] for t in tasks},
        transfer_items_path=inputs.transfer,
        roles_all_paths={t: inputs[f"roles_{t}"] for t in tasks},
        probes_paths={t: inputs[f"probes_{t}"] for t in tasks},
        study_path=inputs.get("study"),
        comparisons_path=inputs.get("comparisons"),
        claims_cfg=snakemake.params.claims,
        seed=snakemake.params.seed,
        out_table=snakemake.output.table,
        out_md=snakemake.output.markdown,
        out_html=snakemake.output.html,
        edge_path_paths={t: inputs[f"edge_paths_{t}"] for t in tasks},
        discover_path=inputs.discover,
        discover_item_paths={t: inputs[f"discover_items_{t}"] for t in tasks},
    )
