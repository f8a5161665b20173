"""What every rule script does around its entry point: log, seeds, threads, a traceback in the log (with a mark
when it ran out of GPU or host memory), the batch split a cluster retry asks for, a stop when a cluster job that
asked for GPUs sees none, the CPU for one that asked for none, and the job's usage (wall time, peak host and GPU
memory) next to its log.

Standard library only at import (the cluster resources read GPU_OOM_MARK while Snakemake parses the
workflow), and torch-free, so that jobs which only read tables and draw figures never import it."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import sys
import time
import traceback
from pathlib import Path

# Written into the log when a job runs out of GPU memory; the retry's resources read it (arithmech.tools.cluster).
GPU_OOM_MARK = "arithmech: GPU out of memory"
# Written into the log when the job's Python runs out of host memory (MemoryError: an allocation refused, as under a
# virtual-memory limit; a job killed by the kernel for memory cannot write it, sacct says OUT_OF_MEMORY then).
HOST_OOM_MARK = "arithmech: host out of memory"
# CPUs a job with several GPUs asks for per GPU (arithmech.tools.cluster), i.e. per training process: also the
# most a process over several nodes asks its Slurm task for (arithmech.sft.distributed)
CPUS_PER_GPU = 2
# Where a job's batch sizes are among its params: inference batches (examples per forward), and training's
# blocks, whose batch_size x grad_accumulation examples make one optimizer step.
INFERENCE_BATCHES = (("compute", "batch_size"), ("evaluation", "batch_size"))
TRAINING_BLOCKS = (("finetune", "train"), ("study", "train"))


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed Python's and NumPy's generators, and torch's (with its thread count) when the job imported it:
    every entry module that uses torch imports it at module level, before the job starts."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
        if threads:
            torch.set_num_threads(threads)


def split_batches(params, split: int) -> list[str]:
    """Make every batch of a job's `params` (a rule's params: dicts by name) `split` times smaller, in place,
    for a retry after running out of GPU memory. Training keeps its examples per optimizer step: the batch
    shrinks to a divisor of itself and grad_accumulation grows by as much. Returns what changed."""
    changed = []
    for name, key in INFERENCE_BATCHES:
        block = params.get(name)
        if isinstance(block, dict) and isinstance(block.get(key), int):
            new = max(1, block[key] // split)
            changed.append(f"{name}.{key} {block[key]} -> {new}")
            block[key] = new
    for name, key in TRAINING_BLOCKS:
        outer = params.get(name)
        block = outer.get(key) if isinstance(outer, dict) else None
        if isinstance(block, dict) and isinstance(block.get("batch_size"), int):
            size, accumulation = block["batch_size"], block.get("grad_accumulation") or 1
            new = max(d for d in range(1, size + 1) if size % d == 0 and d <= max(1, size // split))
            block["batch_size"], block["grad_accumulation"] = new, accumulation * size // new
            changed.append(f"{name}.{key}.batch_size {size} -> {new}, grad_accumulation {accumulation} -> "
                           f"{block['grad_accumulation']} (examples per step unchanged)")
    return changed


def gpu_settings(smk) -> dict:
    """How a training job runs over its GPUs (`arithmech.sft.distributed.run_on_gpus`): its GPUs and nodes,
    `compute.device`, and its runtime as the time limit of a multi-process run. From the rule's resources
    (arithmech.tools.cluster.rule_resources): on one node `gpu`; over several, `nodes` with `tasks_per_node`
    (one Slurm task per GPU on each node)."""
    resources = getattr(smk, "resources", {})
    runtime = resources.get("runtime")
    compute = smk.params.get("compute") or {}
    nodes = int(resources.get("nodes", 1) or 1)
    gpus = nodes * int(resources["tasks_per_node"]) if nodes > 1 else int(resources.get("gpu", 1) or 1)
    return {"gpus": gpus, "nodes": nodes, "device": compute.get("device", "auto"),
            "timeout_s": 60 * float(runtime) if runtime else None}


class NoGpuError(RuntimeError):
    """A cluster job that asked for GPUs sees none; the message names the likely causes."""


def in_slurm_job() -> bool:
    return bool(os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID"))


def hide_gpus_not_asked_for(smk) -> bool:
    """A cluster job that asked for no GPU (resource `gpu` 0: `models.<name>.resources.gpus: 0`) computes on the CPU:
    CUDA_VISIBLE_DEVICES is emptied before torch first looks for a GPU (it reads it then), so that `compute.device:
    auto` takes the CPU on a node whose GPUs Slurm does not hide from jobs. Whether it hid them."""
    resources = getattr(smk, "resources", {})
    if resources.get("gpu") is None or asked_for_gpus(smk) or not in_slurm_job():  # no model job, or GPUs asked
        return False
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return True


def asked_for_gpus(smk) -> bool:
    """Whether the job asked a cluster for GPUs: its resources give some (`gpu`, or a GPU `gres` over several
    nodes: arithmech.tools.cluster.rule_resources) and it runs in a Slurm job. A local run ignores the resources:
    there `compute.device: auto` takes the CPU when no GPU is visible."""
    resources = getattr(smk, "resources", {})
    gpus = int(resources.get("gpu", 0) or 0) > 0 or str(resources.get("gres", "") or "").startswith("gpu")
    return gpus and in_slurm_job()


def no_gpu_causes(torch_version: str, torch_cuda: str | None, visible: str | None) -> list[str]:
    """What likely keeps a job from its GPUs: torch's version and CUDA build (`torch.version.cuda`, None in a CPU
    build) and CUDA_VISIBLE_DEVICES (None: unset)."""
    causes = []
    if torch_cuda is None:
        causes.append(f"the jobs' torch ({torch_version}, at {sys.executable}) is a CPU build (torch.version.cuda "
                      "is None): install a CUDA build of torch in the jobs' environment (docs/cluster.md)")
    if not (visible or "").strip():
        causes.append(f"Slurm gave the job no GPU (CUDA_VISIBLE_DEVICES is {'unset' if visible is None else 'empty'})"
                      ": check that the partition's nodes have GPUs (sinfo -o '%P %G')")
    if torch_cuda is not None and (visible or "").strip():
        causes.append(f"torch {torch_version} is built for CUDA {torch_cuda} and sees none of the GPUs "
                      f"{visible}: the node's NVIDIA driver may be older than CUDA {torch_cuda} needs (nvidia-smi on "
                      "the node shows the newest CUDA its driver takes): install a torch built for that CUDA")
    return causes


def check_gpus_visible(smk) -> None:
    """Raise `NoGpuError` at once when the job asked a cluster for GPUs (`asked_for_gpus`) and CUDA shows none,
    unless the rule's `compute.device` is `cpu`: `auto` would otherwise compute on the CPU, in float32, until the
    job's time limit. Imports torch only for such a job (the jobs that ask for GPUs import it anyway)."""
    device = (smk.params.get("compute") or {}).get("device", "auto")
    if device == "cpu" or not asked_for_gpus(smk):
        return
    import torch

    if torch.cuda.is_available():
        return
    build = torch.version.cuda or getattr(torch.version, "hip", None)  # a ROCm build is no CPU build
    causes = no_gpu_causes(torch.__version__, build, os.environ.get("CUDA_VISIBLE_DEVICES"))
    raise NoGpuError(f"rule {smk.rule} asked for GPUs and sees none (compute.device: {device}); it stops rather than "
                     "compute on the CPU. Likely: " + "; ".join(causes) + ". To compute on the CPU on purpose, set "
                     "compute.device: cpu.")


def is_gpu_oom(err: BaseException) -> bool:
    """torch's out-of-memory error of an accelerator (checked by name: this module does not import torch)."""
    return type(err).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(err)


def gpu_oom_advice(smk) -> str:
    """The log's lines after running out of GPU memory: what the retry does and the keys to change."""
    model = getattr(smk.wildcards, "model", "<model>") if hasattr(smk, "wildcards") else "<model>"
    batches = [f"{n}.{k}" for n, k in INFERENCE_BATCHES if isinstance(smk.params.get(n), dict)]
    batches += [f"{n}.{k}.batch_size" for n, k in TRAINING_BLOCKS
                if isinstance(smk.params.get(n), dict) and k in smk.params.get(n)]
    return (f"{GPU_OOM_MARK} in rule {smk.rule}. A retry (the SLURM profile's `retries`) splits the batch in "
            f"two per attempt. To change it for good: give the rule more GPUs (models.{model}.resources.gpus, "
            f"or its `finetune` / `evaluate` block) or lower {' or '.join(batches) or 'its batch size'}.")


def gpu_peaks_mb() -> dict[str, float] | None:
    """Peak allocated memory of every accelerator this process used, in MB (None: torch or CUDA unused)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return {f"cuda:{i}": round(torch.cuda.max_memory_allocated(i) / 2**20, 1) for i in range(torch.cuda.device_count())}


def usage_path(log: str | Path) -> Path:
    """Where a job's usage record lies: `<log>.usage.json` beside its rule log (`<log>.log`)."""
    log = Path(log)
    return log.with_name(log.name.removesuffix(".log") + ".usage.json")


def write_usage(smk, wall_s: float, ok: bool, batch_split: int) -> None:
    """The job's own record next to its log (`<log>.usage.json`): wall time, peak host and GPU memory."""
    if not smk.log:
        return
    from arithmech.io import write_json

    log = Path(smk.log[0])
    # Linux: kilobytes; a training job over several GPUs runs its ranks as child processes (the largest one's)
    host_mb = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024
    write_json({"rule": smk.rule, "wildcards": dict(smk.wildcards.items()), "ok": ok, "wall_s": round(wall_s, 3),
                "host_peak_mb": round(host_mb, 1), "gpu_peak_mb": gpu_peaks_mb(), "batch_split": batch_split},
               usage_path(log))


@contextlib.contextmanager
def job(smk):
    """Set up a rule script: stderr/stdout (tqdm progress included) to the rule's log, seeds and threads
    from the rule, the batch split of a retry (resource `batch_split`), a stop when the job asked a cluster for GPUs
    and sees none (`check_gpus_visible`); a failure's traceback goes to the log
    before Snakemake reports it (after running out of GPU memory, with what to change); the job's usage is
    written next to its log either way."""
    log = open(smk.log[0], "w", buffering=1) if smk.log else None
    with contextlib.ExitStack() as stack:
        if log is not None:
            stack.enter_context(log)
            stack.enter_context(contextlib.redirect_stderr(log))
            stack.enter_context(contextlib.redirect_stdout(log))
        seed_everything(smk.params.get("seed", 0), smk.threads)
        split = int(getattr(smk, "resources", {}).get("batch_split", 1) or 1)
        if split > 1:
            for change in split_batches(smk.params, split):
                print(f"retry after running out of GPU memory: {change}", file=sys.stderr)
        start, ok = time.perf_counter(), False
        try:
            if hide_gpus_not_asked_for(smk):
                print("a cluster job without a GPU: it computes on the CPU", file=sys.stderr)
            check_gpus_visible(smk)
            yield
            ok = True
        except BaseException as err:
            traceback.print_exc(file=sys.stderr)
            if is_gpu_oom(err):
                print(gpu_oom_advice(smk), file=sys.stderr)
            elif isinstance(err, MemoryError):
                print(f"{HOST_OOM_MARK} in rule {smk.rule}: a retry asks for more host memory", file=sys.stderr)
            raise
        finally:
            write_usage(smk, time.perf_counter() - start, ok, split)
