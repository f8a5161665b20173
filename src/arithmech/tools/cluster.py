"""What a job asks a SLURM cluster for, and the checks before anything is queued (docs/cluster.md).

Read by the Snakefile while it parses (so standard library only) and by `make plan`:

- `job_resources(model_cfg, rule)`: a model job's GPUs, memory and runtime, from `models.<name>.resources` with
  its per-rule block (`finetune`, `evaluate`) over the model's own values, and CPUs for every GPU of a job with
  several (`cpus_per_gpu`: a training job runs one process per GPU, `arithmech.sft.distributed`);
- `check_nodes(model, resources, rule)`: a job over several nodes (`nodes`) is a training job with the same
  number of GPUs, at least 2, on each node; `rule_resources(first)`: those resources under the names the SLURM
  plugin reads (a multi-node job as the plugin's MPI job, see `MULTI_NODE`);
- `load_requests(config)`, `planned_request(...)`: a job's host memory and runtime from the plan (`make plan
  --requests FILE`, config `slurm.requests`) with headroom (`HEADROOM`, `FLOOR`), capped by the config's block;
- `attempt_resources(first, log, attempt)`: what a retry asks for, by why each attempt before it failed
  (`failure_cause`: Slurm's state, `slurm_cause`, and the job's own files, `previous_attempt`): cancelled,
  preempted or refused by sbatch, the same again; killed for host memory, more memory; out of time, more time; out
  of GPU memory, a smaller batch (`batch_split`, applied by `arithmech.jobs`) and more time;
- `slurm_settings(settings)`: account and partitions (config block `slurm`), passed only when set;
- `check_slurm(settings, environ)`: the account and partitions exist for this user, before any job is queued;
- `check_node_gpus(models, partition, environ)`: every job's GPUs a node fit on the partition's nodes (`sinfo`),
  before any job is queued.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

from arithmech.jobs import CPUS_PER_GPU, GPU_OOM_MARK, HOST_OOM_MARK, usage_path

# Per-rule blocks of `models.<name>.resources`: a block's keys override the model's own for these rules; every
# other model rule takes the model's own values.
RESOURCE_GROUPS = {
    "finetune": ("finetune", "study_train"),
    "evaluate": ("evaluate", "study_evaluate", "study_format"),
}
RESOURCE_KEYS = ("gpus", "gpu_model", "mem_mb", "runtime", "nodes")
# The rules that run one process per GPU (`arithmech.sft.distributed.run_on_gpus`): the only ones that may span
# several nodes.
TRAINING_RULES = RESOURCE_GROUPS["finetune"]

# A job with several GPUs runs one process per GPU (`arithmech.sft.distributed`), on one node within its one Slurm
# task: it asks for CPUS_PER_GPU CPUs per GPU (the plugin's --cpus-per-gpu; defined in arithmech.jobs, since the
# launcher reads it too; a one-GPU job gets --cpus-per-task=<the rule's threads>), and no --ntasks-per-gpu, which
# would allocate Slurm tasks that the plugin's one-task job step never starts. Over several nodes the processes are
# Slurm tasks (MULTI_NODE), with the same CPUs per GPU.

# A job over several nodes (`nodes` N > 1, `gpus` G in all) is submitted as the SLURM plugin's MPI job
# (snakemake-executor-plugin-slurm 2.8): `mpi` makes its job step run the job's own process directly in the batch
# script instead of inside `srun -n1 --gpus=G --nodes=N` (a one-task step that would hold the GPUs, on one node);
# that process then starts one `srun` task per GPU itself (`arithmech.sft.distributed.srun_command`).
# `tasks_per_node` (G/N) -> --ntasks-per-node, which the plugin requires to be > 1 for an MPI job (hence at
# least 2 GPUs per node), and `tasks` is avoided: on a GPU job the plugin turns it into --ntasks-per-gpu. The
# GPUs are asked for per node, `gres` gpu[:model]:G/N -> --gres (the plugin's `gpu` -> --gpus=G counts GPUs
# over the whole job, which Slurm may place unevenly); `nodes` -> --nodes.
MULTI_NODE = {"mpi": "srun"}

# CPU-only jobs: host memory (MB) and runtime (minutes) of the first attempt.
CPU_JOB = {"mem_mb": 4000, "runtime": 20}

# Where jobs go: the configuration's `slurm` block (null or absent: not passed; a profile's default-resources or
# the scheduler's default applies). Not environment variables: SLURM_ACCOUNT and SLURM_PARTITION are Slurm's own
# input variables (srun reads them), and inside an allocation the SLURM plugin deletes every SLURM_* variable.
SETTINGS = "slurm"
ACCOUNT, PARTITION, CPU_PARTITION, REQUESTS = "account", "partition", "cpu_partition", "requests"
# Variables that earlier versions of the workflow read, named in a note when they are set.
FORMER_VARS = {"SLURM_ACCOUNT": ACCOUNT, "SLURM_PARTITION": PARTITION, "SLURM_CPU_PARTITION": CPU_PARTITION}


class ClusterSettingError(RuntimeError):
    """An account or partition the cluster does not know for this user; the message names what to set."""


def resource_group(rule: str) -> str | None:
    """The per-rule block of `models.<name>.resources` that applies to `rule`, or None (the model's own)."""
    return next((group for group, rules in RESOURCE_GROUPS.items() if rule in rules), None)


def job_resources(resources: dict, rule: str, planned: dict | None = None) -> dict:
    """A model job's first-attempt resources: the model's `resources` with the rule's block over them, and
    `cpus_per_gpu` when it asks for several GPUs. `planned`: the plan's request for the rule (`planned_request`,
    from `load_requests`), which lowers `mem_mb` and `runtime` to it: the config's values are the ceiling."""
    own = {key: resources[key] for key in RESOURCE_KEYS if key in resources}
    group = resource_group(rule)
    out = own | (resources.get(group) or {}) if group else own
    for key, value in (planned or {}).items():
        if key in out:
            out[key] = min(out[key], value)
    if out.get("gpus", 1) > 1:
        out["cpus_per_gpu"] = CPUS_PER_GPU
    return out


def asks_for_gpus(resources: dict) -> bool:
    """Whether any job of a model with these `resources` (`models.<name>.resources`) asks for a GPU: its own `gpus`
    or a block's (0: on the CPU)."""
    own = resources.get("gpus", 1)
    return own > 0 or any((resources.get(group) or {}).get("gpus", own) > 0 for group in RESOURCE_GROUPS)


def rule_resources(first: dict) -> dict:
    """A job's resources (`job_resources`, `retry_resources`) under the names the rules give the SLURM plugin
    (workflow/rules/common.smk): one node: `gpu` (-> --gpus), `gpu_model`, `cpus_per_gpu`, `nodes` 1; several nodes: the
    plugin's MPI job, with GPUs per node (`MULTI_NODE`). A value of None is not passed."""
    out = {key: first.get(key) for key in ("mem_mb", "runtime", "cpus_per_gpu")}
    out["batch_split"] = first.get("batch_split", 1)
    nodes = first.get("nodes", 1)
    if nodes == 1:  # --nodes=1: Slurm may otherwise spread --gpus=G over nodes, and the job step runs on one
        return out | {"gpu": first.get("gpus", 1), "gpu_model": first.get("gpu_model", ""), "nodes": 1}
    per_node = first["gpus"] // nodes
    model = f"{first['gpu_model']}:" if first.get("gpu_model") else ""
    return out | MULTI_NODE | {"gres": f"gpu:{model}{per_node}", "nodes": nodes, "tasks_per_node": per_node}


class ResourceError(ValueError):
    """Resources a job cannot run with; the message names the configuration key."""


def check_nodes(model: str, resources: dict, rule: str) -> None:
    """Raise `ResourceError` when `rule`'s resources of `model` ask for several nodes and the job cannot use
    them: a rule that is not a training rule (one process), GPUs not split evenly over the nodes, or fewer than
    2 GPUs per node (the plugin's MPI jobs need more than one task per node: `MULTI_NODE`)."""
    res = job_resources(resources, rule)
    nodes = res.get("nodes", 1)
    if nodes == 1:
        return
    key = resources_key(model, rule)
    where = key if "nodes" in (resources.get(resource_group(rule) or "") or {}) else f"models.{model}.resources"
    if rule not in TRAINING_RULES:
        raise ResourceError(
            f"{where}.nodes is {nodes}, and it applies to rule {rule}, which runs in one process: only the "
            f"training rules ({', '.join(TRAINING_RULES)}) run over several nodes; set nodes in "
            f"models.{model}.resources.finetune only")
    gpus = res.get("gpus", 1)
    if gpus % nodes:
        raise ResourceError(f"{key}: gpus ({gpus}, the job's GPUs over all its nodes) is not a multiple of nodes "
                            f"({nodes}): every node runs the same number of training processes")
    if gpus // nodes < 2:
        raise ResourceError(f"{key}: gpus {gpus} over nodes {nodes} is {gpus // nodes} GPU a node; a job over "
                            "several nodes needs at least 2 GPUs on each (the SLURM plugin runs it as an MPI job, "
                            "which needs more than one task per node): raise gpus or lower nodes")


def resources_key(model: str, rule: str) -> str:
    """The configuration key of `rule`'s resources, for messages."""
    group = resource_group(rule)
    return f"models.{model}.resources" + (f".{group}" if group else "")


def gpu_oom_logged(log_path: str | Path) -> bool:
    """Whether the job that wrote `log_path` ran out of GPU memory (`arithmech.jobs` marks it)."""
    try:
        return GPU_OOM_MARK in Path(log_path).read_text(errors="replace")
    except OSError:
        return False


# Why an attempt of a job ended without its outputs (`failure_cause`), which decides what the next one asks for
# (`attempt_resources`): more only where more helps.
REFUSED = "refused"  # sbatch refused the submission (a QOS submit limit): it never ran; the same again
CANCELLED = "cancelled"  # ended from outside (scancel, preempted, its node failed): the same again
HOST_OOM = "host oom"  # killed for host memory (sacct OUT_OF_MEMORY, or its log's HOST_OOM_MARK): more memory
TIMEOUT = "timeout"  # past its time limit (sacct TIMEOUT): more time, for every job of a group (their sum)
GPU_OOM = "gpu oom"  # its log carries the GPU out-of-memory mark (any rank's): a split batch, and more time
COMPLETED = "completed"  # its usage record says ok, written after its log: its group failed for another job
ERROR = "error"  # Slurm saw it exit with an error (sacct FAILED) and nothing above: more would not help
FAILED = "failed"  # no word from Slurm and not one of the above: more memory and more time, to be safe
# The causes after which a resource grows by its first value (attempt_resources).
GROWS = {"mem_mb": {HOST_OOM, FAILED}, "runtime": {TIMEOUT, GPU_OOM, FAILED}}
# Slurm's states of a job that ended from outside, not by what it asked for (sacct's first word).
ENDED_FROM_OUTSIDE = {"CANCELLED", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"}

# The cause of each failed attempt, recorded in the submitting Snakemake by arithmech.tools.slurm_plugin (the SLURM
# plugin's failure report, before Snakemake plans the retry) under (the job's rule log, attempt).
FAILURES: dict[tuple[str, int], str] = {}


def previous_attempt(log_path: str | Path) -> str:
    """What the job whose rule log is `log_path` did the last time it ran, from its files (`arithmech.jobs.job`
    opens the log when it starts and writes its usage record, `ok` or not, last): `COMPLETED`, `GPU_OOM`, `HOST_OOM`
    (its own mark: Python ran out of memory) or `FAILED`. A record older than the log is an earlier run's: the last
    attempt was killed before it could write one (host memory, time limit, cancelled); no log at all is a job killed
    before it opened it (or one that did not get its turn in its group): both FAILED."""
    log = Path(log_path)
    try:
        text, log_mtime = log.read_text(errors="replace"), log.stat().st_mtime
    except OSError:
        return FAILED
    if GPU_OOM_MARK in text:
        return GPU_OOM
    if HOST_OOM_MARK in text:
        return HOST_OOM
    record = usage_path(log)
    try:
        ok = json.loads(record.read_text()).get("ok") is True and record.stat().st_mtime >= log_mtime
    except (OSError, ValueError, AttributeError):
        ok = False
    return COMPLETED if ok else FAILED


def slurm_cause(states: list[str]) -> str | None:
    """Why Slurm ended a job, from sacct's State of the job (first) and of its steps: `HOST_OOM` where one was killed
    for memory (a step OUT_OF_MEMORY, the job then FAILED), `TIMEOUT`, `CANCELLED` (`ENDED_FROM_OUTSIDE`), `ERROR`
    for any other end; None without states (sacct did not answer)."""
    words = [state.strip().split(" ", 1)[0] for state in states if state.strip()]
    if not words:
        return None
    if "OUT_OF_MEMORY" in words:
        return HOST_OOM
    if words[0] == "TIMEOUT":
        return TIMEOUT
    return CANCELLED if words[0] in ENDED_FROM_OUTSIDE else ERROR


def failure_cause(slurm: str | None, files: str) -> str:
    """The cause of one job's failed attempt from Slurm's word on its allocation (`slurm_cause`; None: none) and the
    job's own files (`previous_attempt`). A GPU out-of-memory mark is the job's own; an allocation cancelled or out
    of time is every job's of it; a job that completed in a group killed for another job's memory keeps its
    request."""
    if files == GPU_OOM:
        return GPU_OOM
    if slurm in (CANCELLED, TIMEOUT):
        return slurm
    if files == COMPLETED:
        return COMPLETED
    if HOST_OOM in (slurm, files):
        return HOST_OOM
    return FAILED if slurm is None else ERROR


def retry_resources(first: dict, attempt: int, previous: str | None) -> dict:
    """What attempt `attempt` (1, 2, ...) asks for when only the last attempt's files tell what happened
    (`previous_attempt`; ignored on attempt 1): a local run, a cluster job's own Snakemake (which caps every value at
    what its submission asked for), a failure the SLURM plugin did not report. Runtime grows with the attempt
    whatever happened; host memory too after a failure (`FAILED`, `HOST_OOM`), not for a job that completed in a
    group (`COMPLETED`); after running out of GPU memory (`GPU_OOM`) the batch is split into 2^(attempt-1) parts
    instead (examples per optimizer step unchanged)."""
    out = dict(first) | {"batch_split": 1}
    if attempt == 1:
        return out
    out["runtime"] = first["runtime"] * attempt
    if previous == GPU_OOM:
        out["batch_split"] = 2 ** (attempt - 1)
    elif previous != COMPLETED:
        out["mem_mb"] = first["mem_mb"] * attempt
    return out


def attempt_resources(first: dict, log_path: str | Path, attempt: int) -> dict:
    """What attempt `attempt` of the job whose rule log is `log_path` asks for, its first attempt asking for `first`
    (`job_resources`): by the recorded cause of every attempt before it (`FAILURES`), each resource grows by its
    first value once for each cause after which more of it helps (`GROWS`), the batch split doubles after each
    GPU out-of-memory; the same request again after a cancelled or refused attempt, an error or a completed job in a
    failed group. Where a cause was not recorded, what the last attempt's files say (`retry_resources`)."""
    if attempt == 1:
        return retry_resources(first, 1, None)
    causes = [FAILURES.get((str(log_path), n)) for n in range(1, attempt)]
    if None in causes:
        return retry_resources(first, attempt, previous_attempt(log_path))
    out = dict(first) | {"batch_split": 2 ** causes.count(GPU_OOM)}
    for key, grows in GROWS.items():
        out[key] = first[key] * (1 + sum(cause in grows for cause in causes))
    return out


# Requests from the plan (docs/plan.md#requests-from-the-plan). `make plan --requests FILE` writes each model
# rule's largest planned host memory and job time; with `slurm.requests: FILE` a job asks for HEADROOM times them,
# at least FLOOR, at most its `models.<name>.resources` values. Headroom: at the paper's full sizes the jobs' own
# memory was up to 45% above the plan's estimate of it (docs/rehearsal.md, make rehearsal-peak), hence 1.5; the
# plan's time rests on an assumed GPU utilisation (its largest uncertainty, docs/plan.md), hence 3 and a
# 10-minute floor (a job that still runs out of time is retried with attempt x runtime; a group asks for the sum of
# its jobs' runtimes, so a floor of hours would add up).
HEADROOM = {"mem_mb": 1.5, "runtime": 3.0}
FLOOR = {"mem_mb": 8000, "runtime": 10}


def planned_request(host_bytes: float, seconds: float) -> dict:
    """A job's request from the plan's estimates: `mem_mb` and `runtime` (minutes), `HEADROOM` times the
    estimate, at least `FLOOR`."""
    return {"mem_mb": max(FLOOR["mem_mb"], math.ceil(HEADROOM["mem_mb"] * host_bytes / 1e6)),
            "runtime": max(FLOOR["runtime"], math.ceil(HEADROOM["runtime"] * seconds / 60))}


def config_digest(config: dict) -> str:
    """A digest of the configuration the plan was made for, without the `slurm` block (where jobs go changes no
    estimate, and it names the requests file itself)."""
    text = json.dumps({key: value for key, value in config.items() if key != SETTINGS}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_requests(config: dict) -> dict[str, dict[str, dict]]:
    """The plan's request of every model rule (model -> rule -> `planned_request`), from the file `slurm.requests`
    names ({} when it is null: the config's blocks as they are). Raises `ClusterSettingError` naming the key when
    the file cannot be read or was planned for another configuration."""
    path = (config.get(SETTINGS) or {}).get(REQUESTS)
    if not path:
        return {}
    key = f"{SETTINGS}.{REQUESTS}={path}"
    redo = (f"write it again with `make plan CONFIGS='<the run's config files>' PLAN_ARGS='--requests {path}'`, "
            f"or set {SETTINGS}.{REQUESTS}: null to ask for the config's models.<name>.resources")
    try:
        data = json.loads(Path(path).expanduser().read_text())
        digest, estimates = data["config_digest"], data["estimates"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ClusterSettingError(f"{key}: cannot read the plan's requests ({err}): {redo}") from None
    if digest != config_digest(config):
        files = ", ".join(data.get("config_files", []))
        raise ClusterSettingError(f"{key} was planned for another configuration ({files}; digest {digest}, this "
                                  f"run's {config_digest(config)}): {redo}")
    return {model: {rule: planned_request(e["host_bytes"], e["seconds"]) for rule, e in rules.items()}
            for model, rules in estimates.items()}


def slurm_settings(settings: dict | None, *, gpu: bool) -> dict:
    """The account and partition resources of a GPU (`gpu`) or CPU job from the configuration's `slurm` block,
    only those that are set. CPU jobs go to `slurm.cpu_partition` (unset: they run on the submitting host, see
    `cpu_jobs_local`)."""
    settings = settings or {}
    out = {}
    if settings.get(ACCOUNT):
        out["slurm_account"] = settings[ACCOUNT]
    partition = settings.get(PARTITION if gpu else CPU_PARTITION)
    if partition:
        out["slurm_partition"] = partition
    return out


def cpu_jobs_local(settings: dict | None) -> bool:
    """CPU-only jobs (tables, figures, the scorecard: seconds each) run on the submitting host unless a CPU
    partition is named: a queue wait for seconds of work, and no GPU partition's rules to break."""
    return not (settings or {}).get(CPU_PARTITION)


def former_variables(environ: dict) -> list[str]:
    """Notes on exported variables that the workflow no longer reads for where jobs go."""
    return [f"{var} is set and is not read by the workflow (it is Slurm's own input variable): jobs go where "
            f"{SETTINGS}.{key} says" for var, key in FORMER_VARS.items() if environ.get(var)]


def _query(cmd: list[str], environ: dict | None = None) -> list[str] | None:
    """The non-empty output lines of a SLURM client command run in `environ` (None: this process's), or None
    when it is missing or fails."""
    if shutil.which(cmd[0], path=(environ or {}).get("PATH")) is None:
        return None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=environ)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def check_slurm(settings: dict | None, environ: dict, user: str | None = None) -> list[str]:
    """Before any job is queued: every partition of the `slurm` block exists, its account is one of the user's
    (or, when none is named, the user has a default account). The Slurm clients run in `environ`: the submitting
    shell's environment as the workflow saw it while parsing (the SLURM plugin deletes the SLURM_* variables of an
    enclosing allocation, SLURM_CONF among them, before the run starts). Raises `ClusterSettingError` naming the
    key to set; returns notes on what could not be checked (no `sinfo` or `sacctmgr` on this host) and on
    variables no longer read."""
    settings = settings or {}
    user = user or environ.get("USER") or getpass.getuser()
    notes, errors = former_variables(environ), []
    partitions = _query(["sinfo", "-h", "-o", "%R"], environ)
    if partitions is None:
        notes.append("sinfo did not answer: partitions not checked")
    else:
        for key in (PARTITION, CPU_PARTITION):
            name = settings.get(key)
            if name and name not in partitions:
                errors.append(f"{SETTINGS}.{key}={name}: no such partition on this cluster; partitions: "
                              f"{', '.join(sorted(set(partitions)))}")
    rows = _query(["sacctmgr", "-nP", "show", "associations", f"user={user}", "format=account"], environ)
    if rows is None:
        notes.append("sacctmgr did not answer: account not checked")
    else:
        accounts = sorted(set(rows))
        account = settings.get(ACCOUNT)
        if account and account not in accounts:
            errors.append(f"{SETTINGS}.{ACCOUNT}={account}: user {user} may not submit to this account; the user's "
                          f"accounts: {', '.join(accounts) or 'none'}")
        if not account:
            default = _query(["sacctmgr", "-nP", "show", "user", user, "format=defaultaccount"], environ) or []
            if not any(default):
                errors.append(f"{SETTINGS}.{ACCOUNT} is not set and user {user} has no default account: set "
                              f"{SETTINGS}.{ACCOUNT} to one of: {', '.join(accounts) or 'ask your cluster admins'}")
    if errors:
        raise ClusterSettingError("SLURM settings: " + "; ".join(errors))
    return notes


def node_gpus(gres: str, gpu_model: str | None = None) -> int:
    """The GPUs in a node's generic resources as `sinfo -o %G` prints them ('gpu:a100:4(S:0-1),mps:400', 'gpu:2',
    '(null)'), only those of type `gpu_model` when it is given."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):  # (S:0-1): the sockets the GPUs sit on
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        kind, count = (parts[1], parts[2]) if len(parts) > 2 else (None, parts[1])
        digits = re.match(r"\d+", count)
        if digits and (not gpu_model or kind == gpu_model):
            total += int(digits.group())
    return total


def check_node_gpus(models: dict[str, dict], partition: str | None, environ: dict | None = None) -> list[str]:
    """Before any job is queued: each model's jobs (`models`: name -> its `resources`, the model's own values and
    each block's) ask for no more GPUs a node (of their `gpu_model`) than the largest node of the GPU `partition`
    (None: the cluster's default) holds, by `sinfo` (run in `environ`, as `check_slurm`); Slurm would queue such a
    job for good, or refuse it. Raises `ResourceError` naming each key; returns notes on what could not be
    checked."""
    rows = _query(["sinfo", "-h", "-o", "%P|%G"], environ)
    if rows is None:
        return ["sinfo did not answer: GPUs per node not checked"]
    gres_of: dict[str, list[str]] = {}  # partition -> its nodes' generic resources (one row per kind of node)
    default = None
    for row in rows:
        name, _, gres = row.partition("|")
        if name.endswith("*"):  # sinfo marks the default partition
            name = default = name[:-1]
        gres_of.setdefault(name, []).append(gres)
    partition = partition or default
    if partition not in gres_of:
        return []  # an unknown partition: check_slurm names it
    errors = []
    for model, resources in models.items():
        for group in (None, *RESOURCE_GROUPS):
            block = resources.get(group) or {} if group else {}
            if group and not block:
                continue  # the model's own values, checked once
            res = {key: resources[key] for key in RESOURCE_KEYS if key in resources} | block
            per_node, gpu_model = res.get("gpus", 1) // res.get("nodes", 1), res.get("gpu_model")
            most = max(node_gpus(gres, gpu_model) for gres in gres_of[partition])
            if per_node > most:
                where = f"models.{model}.resources" + (f".{group}" if group and "gpus" in block else "")
                kind = f" of type {gpu_model}" if gpu_model else ""
                errors.append(
                    f"{where}.gpus asks for {per_node} GPU{'s' * (per_node > 1)}{kind} on a node, and no node of "
                    f"partition {partition} "
                    f"holds more than {most} (sinfo: {', '.join(sorted(set(gres_of[partition])))}): lower it"
                    + (", or spread fine-tuning over nodes (finetune: nodes)" if group == "finetune" else ""))
    if errors:
        raise ResourceError("GPUs a node: " + "; ".join(errors))
    return []
