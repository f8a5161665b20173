# arithmech: find the attention heads and MLPs that do arithmetic (Zhang et al., ICML 2024).
# Run: snakemake --cores 2   (see README.md)
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

# This checkout's package, installed or not; Snakemake passes this path on to every job (arithmech.software).
sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from arithmech import software
from arithmech.sft import study_config as study
from arithmech.tools import cluster
from arithmech.tools import model_access
from arithmech.config import validate_config
from arithmech.data.eval_sets import (
    REGISTRY as EVAL_REGISTRY,
    check_fetchable,
    hub_file,
    unfetched_hub_sets,
)

min_version("9.0")


configfile: "config.yaml"


# Fails before any job runs, naming the offending key.
validate_config(config, Path(workflow.basedir) / "workflow/schemas/config.schema.yaml")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/identify.smk"
include: "workflow/rules/validate.smk"
include: "workflow/rules/analyze.smk"
include: "workflow/rules/circuit.smk"
include: "workflow/rules/finetune.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/claims.smk"
include: "workflow/rules/findings.smk"


# A Hub evaluation set that cannot be fetched stops the run here, with one error naming it, before any job
# is queued (not in dry runs; sets already fetched are not checked again).
onstart:
    software.check_job_software(workflow.deployment_settings.deployment_method)
    # On SLURM: the account and partitions are the cluster's and the user's (arithmech.tools.cluster).
    if workflow.executor_plugin.cli_prefix == "slurm":
        try:
            for note in cluster.check_slurm(os.environ):
                print(f"note: {note}")
        except cluster.ClusterSettingError as err:
            raise WorkflowError(str(err)) from None
    if FINETUNE_METHODS:
        for name, hub in unfetched_hub_sets(config["evaluation"]).items():
            try:
                check_fetchable(name, hub)
            except RuntimeError as err:
                raise WorkflowError(str(err)) from None
    model_access.check_models(config)  # Hub models: cache, token, licence


rule all:
    default_target: True
    input:
        identify_targets(),
        expand("results/{model}/eval/summary.png", model=MODELS)
        if FINETUNE_METHODS
        else [],
        expand("results/{model}/finetune/study.png", model=MODELS) if STUDY_ARMS else [],
        expand("results/{model}/claims.parquet", model=MODELS),
        expand("results/{model}/findings.html", model=MODELS),
