"""The software jobs run with, and the check, before any job is queued, that a run has it.

A job reaches its software one of two ways (docs/cluster.md gives the commands on SLURM):
  (a) the checkout's environment: `make setup` builds .venv, whose Snakemake runs every job with its own
      Python (on SLURM too: a job runs that interpreter's path on the shared file system);
  (b) `--sdm conda`: Snakemake builds envs/arithmech.yaml (every rule's `conda:`) once and runs each job's
      script with that environment's Python.
Any Snakemake parses the workflow: what the Snakefile imports while parsing needs only the standard library
and Snakemake's own dependencies, so a Snakemake installed without the project (with the SLURM plugin, on a
login node say) dry-runs it, and runs it through route (b).

Neither route installs the package itself. The Snakefile puts the checkout's src/ first on sys.path, and
Snakemake appends the parsing process's sys.path to every `script:` job's, whichever Python runs it
(snakemake/script/__init__.py): jobs import this checkout's code, the code the rules' digests
(`code_digest`) were taken from. .venv's editable install points at the same src/.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

# What jobs import (the model, tables, figures) and parsing never does (tests/workflow/test_software_routes.py).
JOB_MODULES = ("torch", "transformers", "datasets", "pandas", "numpy", "pyarrow", "matplotlib", "scipy", "statsmodels")

# Each route's command, run in the checkout; on SLURM with the options of docs/cluster.md added.
ROUTE_COMMANDS = {
    "a": "make setup && .venv/bin/snakemake --cores 2",
    "b": "snakemake --sdm conda --cores 2",
}


class JobSoftwareError(RuntimeError):
    """The jobs of this run would lack their software."""


def check_job_software(deployment_methods) -> None:
    """Raise JobSoftwareError, naming both routes and their commands, when the jobs would run with this Python
    (no `--sdm conda`) and it lacks what they import. `deployment_methods`: the run's software deployment
    methods (Snakemake's `workflow.deployment_settings.deployment_method`)."""
    if "CONDA" in {method.name for method in deployment_methods}:
        return  # each job runs with its rule's conda environment
    missing = [name for name in JOB_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise JobSoftwareError(
            f"the jobs would run with {sys.executable}, which lacks {', '.join(missing)}: this Snakemake was "
            "installed without the project's packages. Run the workflow one of two ways (on SLURM with the "
            "options of docs/cluster.md):\n"
            f"  (a) with the checkout's environment: {ROUTE_COMMANDS['a']}\n"
            f"  (b) with a conda environment that Snakemake builds from envs/arithmech.yaml (conda on PATH): "
            f"{ROUTE_COMMANDS['b']}"
        )


def torch_build() -> dict[str, str | None] | None:
    """The version and the CUDA and HIP (ROCm) builds (None: not one) of the torch this Python would import, read
    from its torch/version.py without importing torch (the check runs in Snakemake's process); None without torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    found = dict(re.findall(r"^(__version__|cuda|hip)\b[^=\n]*=\s*(.+?)\s*$", text, re.M))
    return {key: ast.literal_eval(found.get(key, "None")) for key in ("__version__", "cuda", "hip")}


def check_gpu_build(deployment_methods, device: str) -> None:
    """On a cluster: raise JobSoftwareError when the run asks for GPUs (`compute.device` not `cpu`) and its jobs
    would run with this Python's torch (no `--sdm conda`), a CPU build: each GPU job would stop at its start
    (arithmech.jobs.check_gpus_visible). Without torch `check_job_software` speaks."""
    if device == "cpu" or "CONDA" in {method.name for method in deployment_methods}:
        return
    build = torch_build()
    if build is None or build["cuda"] or build["hip"]:
        return
    raise JobSoftwareError(
        f"the jobs would run with {sys.executable}, whose torch {build['__version__']} is a CPU build "
        f"(torch.version.cuda is None), and the run asks for GPUs (compute.device: {device}): every GPU job would "
        "stop at its start. Install torch's CUDA build there (`make setup` on a GPU node, or `make setup "
        "TORCH='torch==<version> --index-url <PyTorch's CUDA index>'`: docs/cluster.md), run with --sdm conda, or "
        "set compute.device: cpu to compute on the CPU"
    )
