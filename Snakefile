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
from arithmech.tools import hub_token
from arithmech.tools import model_access
from arithmech.tools import profiles
from arithmech.tools import slurm_plugin
from arithmech.config import validate_config
from arithmech.data.eval_sets import (
    REGISTRY as EVAL_REGISTRY,
    check_fetchable,
    hub_file,
    unfetched_hub_sets,
)

min_version("9.0")

# The SLURM plugin as pinned reads a cancelled or preempted job as running: its state query is wrapped so that
# they count as failures (arithmech.tools.slurm_plugin; a note when the plugin is not the pinned version).
if workflow.is_main_process:
    for note in filter(None, [slurm_plugin.install()]):
        print(f"note: {note}", file=sys.stderr)
    # `--profile slurm` here is the workflow's SLURM profile (./slurm); a user's own limits still win over it.
    try:
        for note in profiles.fold_in_user_profiles(
            workflow,
            profiles.snakemake_argv(sys.argv),
            Path.cwd(),
            Path(workflow.basedir),
        ):
            print(f"note: {note}", file=sys.stderr)
    except profiles.ProfileError as err:
        raise WorkflowError(str(err)) from None
    # The Hub token reaches the download rules on this host only, not the jobs sbatch submits.
    if profiles.is_snakemake_command(sys.argv):
        for note in filter(None, [hub_token.keep_from_jobs()]):
            print(f"note: {note}", file=sys.stderr)
elif workflow.remote_exec:
    hub_token.offline_job()  # a cluster job downloads nothing


configfile: "config.yaml"


# Fails before any job runs, naming the offending key.
validate_config(config, Path(workflow.basedir) / "workflow/schemas/config.schema.yaml")

# The submitting shell's environment as it is now: the SLURM plugin deletes the SLURM_* variables of an enclosing
# allocation (SLURM_CONF among them) before the run starts, and the cluster check runs Slurm's clients in this.
SUBMIT_ENVIRONMENT = dict(os.environ)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/identify.smk"
include: "workflow/rules/validate.smk"
include: "workflow/rules/analyze.smk"
include: "workflow/rules/circuit.smk"
include: "workflow/rules/discover.smk"
include: "workflow/rules/finetune.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/claims.smk"
include: "workflow/rules/findings.smk"


# A Hub evaluation set that cannot be fetched stops the run here, with one error naming it, before any job
# is queued (not in dry runs; sets already fetched are not checked again).
onstart:
    # What would fail jobs for a reason known now stops the run here, in one message, before any job is queued:
    # the jobs' software; on SLURM the account and partitions; Hub data sets and models (token, licence,
    # cache). Not in dry runs; sets and models already fetched are not checked again.
    on_slurm = workflow.executor_plugin.cli_prefix == "slurm"
    checks = [
        lambda: software.check_job_software(
            workflow.deployment_settings.deployment_method
        ),
        lambda: (
            cluster.check_slurm(config.get("slurm"), SUBMIT_ENVIRONMENT)
            if on_slurm
            else []
        ),
        lambda: (
            profiles.check_per_cpu_memory(
                workflow.resource_settings.default_resources,
                {m: config["models"][m]["resources"].get("mem_mb") for m in MODELS},
            )
            if on_slurm
            else []
        ),
        # a job that asks for GPUs without a CUDA torch, or for more GPUs than a node holds, never runs
        lambda: (
            software.check_gpu_build(
                workflow.deployment_settings.deployment_method,
                config["compute"]["device"],
            )
            if on_slurm
            and any(
                cluster.asks_for_gpus(config["models"][m]["resources"])
                for m in MODELS
            )
            else []
        ),
        lambda: (
            cluster.check_node_gpus(
                {model: config["models"][model]["resources"] for model in MODELS},
                cluster.slurm_settings(config.get("slurm"), gpu=True).get(
                    "slurm_partition"
                ),
                SUBMIT_ENVIRONMENT,
            )
            if on_slurm
            else []
        ),
        lambda: model_access.check_models(config),
        # slurm.requests names a file `make plan --requests` wrote for this configuration
        check_planned_requests,
    ]
    if FINETUNE_METHODS:
        checks += [
            lambda name=name, hub=hub: check_fetchable(name, hub)
            for name, hub in unfetched_hub_sets(config["evaluation"]).items()
        ]
    problems = []
    for check in checks:
        try:
            notes = check() or []  # what could not be checked here
        except (RuntimeError, ValueError) as err:
            problems.append(f"{type(err).__name__}: {err}")
            continue
        except (
            ImportError
        ) as err:  # a Snakemake without the project's packages (route c): the jobs check
            notes = [f"not checked before the run ({err})"]
        for note in notes:
            print(f"note: {note}")
    if problems:
        raise WorkflowError(
            "Stopped before any job was queued:\n" + "\n".join(problems)
        ) from None


rule all:
    default_target: True
    input:
        identify_targets(),
        expand(layout.under(layout.EVAL_SUMMARY_FIGURE), model=MODELS)
        if FINETUNE_METHODS
        else [],
        expand(layout.under(layout.STUDY_FIGURE), model=MODELS) if STUDY_ARMS else [],
        expand(
            [
                layout.under(layout.DISCOVER_PATH_FIGURE),
                layout.under(layout.DISCOVER_CIRCUIT_FIGURE),
            ],
            model=MODELS,
            task=TASKS,
        ),
        expand(layout.under(layout.DISCOVER_SUMMARY), model=MODELS),
        expand(layout.under(layout.EDGE_CURVE_FIGURE), model=MODELS)
        if config["circuit"]["edges"]["curve"]
        else [],
        expand(layout.under(layout.CLAIMS), model=MODELS),
        expand(layout.under(layout.FINDINGS), model=MODELS),
