"""One job's cost (`Cost`), the configuration the rules' cost functions read (`Setting`), and the cost
functions of the rules that run no model on a GPU. A rule's cost function takes (setting, model, job):

    cost = build_pairs(setting, setting.models["llama2-7b"], Job("build_pairs", (("task", "addition"),)))
    cost.work.flops, cost.gpu_bytes
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from arithmech.tools.plan.costmodel import CUDA_CONTEXT_BYTES, HOST_BASE_BYTES, Model, Work
from arithmech.tools.plan.dryrun import Job
from arithmech.tools.plan.workload import SetStats, TaskPrompts, set_stats, task_prompts


@dataclass(frozen=True)
class Cost:
    """One job's cost: `work` (FLOPs, weight reads), peak GPU memory and host memory (bytes), what it runs
    (`note`), and whether it holds a GPU (`gpu`; False: a CPU job, or a local one with `local`).

    `ranks`: the processes a training job runs, one per GPU (`arithmech.sft.distributed`: data parallel, full
    fine-tuning sharded with FSDP2): its work is split over them (the job's wall time is work / ranks) and
    `gpu_bytes` is one rank's peak, to fit one GPU. 1: one process, whose model a job with several GPUs spreads
    over them (device_map: `gpu_bytes` is the whole job's, to fit all of them; the time is not divided).

    `models`: the model copies each process loads from the shared file system (a study model scored against the
    base model: 2); the job loads `models` x `ranks` copies of the weights."""

    work: Work = Work()
    gpu_bytes: float = 0.0
    host_bytes: float = 0.0
    note: str = ""
    gpu: bool = True
    local: bool = False
    unknown: bool = False
    ranks: int = 1
    models: int = 1

    @property
    def weight_loads(self) -> int:
        """How many times the job reads the model's weights: each of its processes loads its own copies."""
        return self.models * self.ranks if self.gpu else 0


class Setting:
    """The configuration, its models and the data they read, with what is computed once (prompts, data sets)."""

    def __init__(self, config: dict, *, root: Path, models: dict[str, Model]):
        self.config, self.root, self.models = config, root, models
        self._memo: dict = {}

    def memo(self, key, compute: Callable):
        """`compute()`, computed once per key."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def prompts(self, model: Model, task: str) -> TaskPrompts:
        return self.memo(("prompts", model.name, task),
                         lambda: task_prompts(self.config["prompts"], task, model.tokens))

    def eval_set(self, model: Model, name: str) -> SetStats:
        cfg = self.config["evaluation"][name]
        return self.memo(("set", model.name, name), lambda: set_stats(name, cfg, root=self.root, tokens=model.tokens))

    def batch(self) -> int:
        return self.config["compute"]["batch_size"]


def gpu_cost(model: Model, *, work: Work, activations: float, note: str, loaded: float = 0.0,
             models: int = 1) -> Cost:
    """A GPU job's cost: `models` copies of the weights, `activations` and the CUDA context on the GPU; in host
    memory the weights (loaded through it), `loaded` bytes of files it reads and the libraries."""
    gpu = models * model.weight_bytes + activations + CUDA_CONTEXT_BYTES
    return Cost(work=work, gpu_bytes=gpu, host_bytes=model.weight_bytes + loaded + HOST_BASE_BYTES, note=note,
                models=models)


def cpu_rule(s: Setting, m: Model | None, job: Job) -> Cost:
    """A rule that runs no model (tables, figures, summaries): no GPU."""
    return Cost(gpu=False, note="CPU: tables and figures")


def local_rule(s: Setting, m: Model | None, job: Job) -> Cost:
    """prepare_model and fetch_dataset: downloads on the machine that runs Snakemake (a login node)."""
    return Cost(gpu=False, local=True, note="local: downloads on the login node")


def target_rule(s: Setting, m: Model | None, job: Job) -> Cost:
    """`all`, the default target: it names the outputs and runs nothing."""
    return Cost(gpu=False, note="the target; runs nothing")

