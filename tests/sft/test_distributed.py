"""Training over several processes (`arithmech.sft.distributed`) on CPU: 2 gloo processes against one, for full
fine-tuning (FSDP2), every head method and LoRA (data parallel); resuming a run checkpointed under 2
processes; only rank 0 writes; a failing rank fails the run with its traceback and leaves nothing
half-written; the multi-node launch (its srun command, and 4 ranks started through a stand-in srun). Every run has a
timeout (`run_on_gpus`'s and the test's)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from arithmech import jobs
from arithmech.model.loading import load_model
from arithmech.sft import distributed
from arithmech.sft import training as ft
from helpers import report_rank

EXAMPLES = [(f"{a} plus {b} is equal to ", str(a + b)) for a, b in [(1, 2), (3, 4), (2, 2), (4, 1), (3, 3)]]
HEADS = [[1, 0], [2, 3]]
# 5 examples, 4 a step in micro-batches of 2: each split 1 + 1 over the ranks; the second step's one example
# leaves rank 1 without a share (FSDP2: a forward with factor 0); a clip that binds
CONFIG = {"lr": 1e-3, "batch_size": 2, "grad_accumulation": 2, "max_grad_norm": 0.05, "seed": 0, "max_steps": 2,
          "warmup_steps": 0}
SPECS = {
    "full": {"method": "full"},
    "precise": {"method": "precise", "heads": HEADS, "train_kv": True, "mlp_layers": [1]},
    "random_heads": {"method": "random_heads", "heads": HEADS},
    "lora": {"method": "lora", "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}},
}
TIMEOUT_S = 240


def trained_tensors(run: ft.FineTune) -> dict[str, torch.Tensor] | None:
    """What `run` trained, whole, on rank 0 (None on the others); every rank calls it."""
    if run.sharded:
        return distributed.full_state_dict(run.model)
    return {n: p.detach().clone() for n, p in run.params.items()} if distributed.is_main() else None


def train_tiny(*, model_dir, spec, config, out, checkpoint_dir=None, stop_at_step=None, fail_rank=None,
               seed=0):
    """A worker (and the one-process reference): train the tiny model and, on rank 0, save what was trained,
    the losses and the world size to `out`."""
    rank, world = distributed.world()
    if rank == fail_rank:
        raise ValueError(f"rank {rank} fails on purpose")
    lm = load_model(model_dir, device="cpu")
    run = ft.prepare(lm, spec, seed=0)
    stats = ft.train(run, EXAMPLES, config, checkpoint_dir=checkpoint_dir, stop_at_step=stop_at_step, progress=False)
    tensors = trained_tensors(run)
    if distributed.is_main():
        torch.save({"tensors": tensors, "losses": stats.losses, "world": stats.world_size,
                    "peak_kind": stats.peak_memory_kind, "n_trainable": stats.n_trainable}, out)


def launch(tmp_path, name, **kwargs) -> dict:
    out = tmp_path / f"{name}.pt"
    distributed.run_on_gpus(train_tiny, gpus=2, device="cpu", timeout_s=TIMEOUT_S, out=out, **kwargs)
    return torch.load(out, weights_only=False)


def one_process(tmp_path, name, **kwargs) -> dict:
    out = tmp_path / f"{name}-1.pt"
    train_tiny(out=out, **kwargs)
    return torch.load(out, weights_only=False)


def assert_close(two: dict, one: dict, atol=1e-4):
    assert set(two["tensors"]) >= set(one["tensors"]) - {"lm_head.weight"}
    worst = max((two["tensors"][n] - t).abs().max().item() for n, t in one["tensors"].items() if n in two["tensors"])
    assert worst <= atol, worst
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)


@pytest.mark.parametrize("method", list(SPECS))
def test_two_processes_train_as_one(method, tiny_dir, tmp_path):
    """2 steps with the examples of each step split over 2 ranks (one step 2 + 1, clipping on) end within 1e-4 of
    one process, and the parameters actually moved."""
    args = {"model_dir": tiny_dir, "spec": SPECS[method], "config": CONFIG}
    two, one = launch(tmp_path, method, **args), one_process(tmp_path, method, **args)
    assert two["world"] == 2 and one["world"] == 1 and two["n_trainable"] == one["n_trainable"]
    assert two["peak_kind"] == "process_peak_rss_max_over_ranks"
    assert_close(two, one)
    base = load_model(tiny_dir, device="cpu").model.state_dict()
    if method == "full":
        moved = max((one["tensors"][n] - base[n]).abs().max().item() for n in base)
        assert moved > 1e-4  # a step of lr 1e-3 moves the weights by far more than the tolerance
    else:
        assert max(t.abs().max().item() for t in one["tensors"].values() if t.abs().max() > 0) > 1e-4


@pytest.mark.parametrize("method", ["full", "precise"])
def test_resume_under_two_processes(method, tiny_dir, tmp_path):
    """Stopped after step 1 under 2 processes, resumed under 2: the same result as uninterrupted."""
    args = {"model_dir": tiny_dir, "spec": SPECS[method], "config": {**CONFIG, "checkpoint_every": 1}}
    whole = launch(tmp_path, "whole", checkpoint_dir=tmp_path / "ckpt-whole", **args)
    launch(tmp_path, "first", checkpoint_dir=tmp_path / "ckpt", stop_at_step=1, **args)
    assert (tmp_path / "ckpt" / "step-00000001").is_dir()
    resumed = launch(tmp_path, "resumed", checkpoint_dir=tmp_path / "ckpt", **args)
    assert resumed["losses"] == whole["losses"]
    for name, t in whole["tensors"].items():
        assert torch.equal(resumed["tensors"][name], t), name


def test_a_failing_rank_fails_the_run_with_its_traceback(tiny_dir, tmp_path, capsys):
    """Rank 1 raises: the launcher stops rank 0, raises, prints rank 1's traceback, and nothing is written."""
    with pytest.raises(RuntimeError, match="training over 2 processes failed"):
        distributed.run_on_gpus(train_tiny, gpus=2, device="cpu", timeout_s=TIMEOUT_S, model_dir=tiny_dir,
                                spec=SPECS["precise"], config=CONFIG, out=tmp_path / "never.pt", fail_rank=1)
    err = capsys.readouterr().err
    assert "rank 1 of 2" in err and "ValueError: rank 1 fails on purpose" in err and "Traceback" in err
    assert list(tmp_path.iterdir()) == []


def test_a_hung_run_times_out(tiny_dir, tmp_path):
    """A run past its time limit is stopped (every rank) and fails, naming the limit."""
    with pytest.raises(RuntimeError, match="timed out after 3 s"):
        distributed.run_on_gpus(sleep_forever, gpus=2, device="cpu", timeout_s=3, seed=0)


def test_rank_zeros_output_goes_straight_into_the_rule_log(tmp_path):
    """In a job, stdout is the rule's log (`jobs.job`): rank 0 writes into it as it runs, the others' output
    stays out unless they fail."""
    import contextlib

    log = tmp_path / "rule.log"
    with open(log, "w") as out, contextlib.redirect_stdout(out):
        distributed.run_on_gpus(say_hello, gpus=2, device="cpu", timeout_s=TIMEOUT_S, seed=0)
    lines = log.read_text().splitlines()
    assert lines == ["training over 2 processes (gloo); rank 0's output follows", "hello from rank 0 of 2"]


def say_hello(seed):
    rank, world = distributed.world()
    print(f"hello from rank {rank} of {world}")


def sleep_forever(seed):
    import time

    time.sleep(3600)


def abort_on_rank_one(seed):
    if distributed.world()[0] == 1:
        print("rank 1 aborts", flush=True)
        os.abort()  # SIGABRT, as a C++ abort ends a process: no Python traceback


def test_a_rank_ended_by_a_signal_shows_its_log(capsys):
    """A rank that dies without a traceback (no failure mark in its log) still has its log shown."""
    with pytest.raises(RuntimeError, match="process 1 exited with -6"):
        distributed.run_on_gpus(abort_on_rank_one, gpus=2, device="cpu", timeout_s=TIMEOUT_S, seed=0)
    assert "--- rank 1 of 2 ---\nrank 1 aborts" in capsys.readouterr().err


def out_of_memory_on_rank_one(seed):
    if distributed.world()[0] == 1:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    time.sleep(60)  # rank 0 still working when rank 1 fails: the launcher stops it


def test_a_rank_out_of_gpu_memory_marks_the_jobs_log_for_a_retry_with_a_smaller_batch(tmp_path):
    """Rank 1 of a 2-process fine-tuning job runs out of GPU memory: the job's process (the launcher, inside
    `jobs.job` as in a rule script) fails with out-of-memory too, so its log carries the mark and the retry's
    resources split the batch instead of asking for more host memory (before: "process 1 exited with 1", the
    host-memory retry, the same batch)."""
    from types import SimpleNamespace

    from snakemake.iocontainers import Namedlist

    from arithmech.tools import cluster

    log = tmp_path / "finetune" / "full.log"
    log.parent.mkdir()
    smk = SimpleNamespace(log=Namedlist([str(log)]), rule="finetune", threads=1,
                          wildcards=Namedlist(fromdict={"model": "tiny", "method": "full"}),
                          params=Namedlist(fromdict={"seed": 0, "finetune": {"train": {"batch_size": 4}}}),
                          resources=Namedlist(fromdict={"batch_split": 1}))
    with pytest.raises(torch.cuda.OutOfMemoryError, match="rank 1 ran out of GPU memory"):
        with jobs.job(smk):
            distributed.run_on_gpus(out_of_memory_on_rank_one, gpus=2, device="cpu", timeout_s=TIMEOUT_S, seed=0)
    text = log.read_text()
    assert "--- rank 1 of 2 ---" in text and "OutOfMemoryError: CUDA out of memory" in text  # rank 1's traceback
    assert cluster.gpu_oom_logged(log) and cluster.previous_attempt(log) == cluster.GPU_OOM
    first = cluster.job_resources({"gpus": 1, "mem_mb": 8000, "runtime": 30, "finetune": {"gpus": 2}}, "finetune")
    retry = cluster.retry_resources(first, 2, cluster.previous_attempt(log))
    assert (retry["batch_split"], retry["mem_mb"]) == (2, 8000)
    assert not list(tmp_path.glob("**/*.gpu-oom"))  # the launcher's temporary folder is gone


def test_one_gpu_runs_in_this_process(tmp_path):
    """gpus 1: the entry point runs here, with no process group (the one-process path is unchanged)."""
    seen = []
    distributed.run_on_gpus(lambda **kw: seen.append((distributed.world(), kw)), gpus=1, device="cpu", a=1)
    assert seen == [((0, 1), {"a": 1})]


def test_multi_node_launch_command():
    """Across nodes: one srun task per GPU, every count explicit (the plugin's job step strips SLURM_*)."""
    worker = distributed.worker_command(Path("/shared/call.pkl"), world_size=8, backend="nccl", timeout_s=7200)
    # the store's address and secret are in the spec's private directory, not on the command line
    assert worker[1:] == ["-m", "arithmech.sft.distributed", "/shared/call.pkl", "--world-size", "8",
                          "--backend", "nccl", "--timeout-s", "7200"]
    cmd = distributed.srun_command(worker, job_id="4242", nodes=2, world_size=8, cpus_per_task=4)
    assert cmd[:8] == ["srun", "--jobid=4242", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--gpus-per-task=1",
                       "--cpus-per-task=4", "--kill-on-bad-exit=1"]
    assert cmd[8:] == worker
    with pytest.raises(ValueError, match="multiple of its nodes"):
        distributed.srun_command(worker, job_id="1", nodes=3, world_size=8, cpus_per_task=1)
    local = distributed.worker_command(Path("c.pkl"), world_size=2, backend="gloo", timeout_s=60, rank=1,
                                       local_rank=1)
    assert local[-4:] == ["--rank", "1", "--local-rank", "1"]


# Stands in for Slurm's `srun` across nodes (this machine has one node): records its arguments, then starts the
# command --ntasks times as Slurm would on --ntasks-per-node tasks a node, each with the SLURM_PROCID /
# SLURM_LOCALID / SLURM_NODEID Slurm gives it, and fails when a task fails.
FAKE_SRUN = """#!/usr/bin/env python3
import json, os, subprocess, sys
args = sys.argv[1:]
opts = {}
while args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
open(os.environ["SRUN_RECORD"], "w").write(json.dumps(sys.argv[1:]))
if os.environ.get("SRUN_REFUSE"):
    print("srun: error: Unable to create step for job 4242: More processors requested than permitted")
    sys.exit(1)
n, per_node = int(opts["ntasks"]), int(opts["ntasks-per-node"])
procs = [subprocess.Popen(args, env={**os.environ, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r % per_node),
                                     "SLURM_NODEID": str(r // per_node)}) for r in range(n)]
sys.exit(max(p.wait() for p in procs))
"""


def test_a_two_node_job_launches_one_srun_task_per_gpu(tmp_path, monkeypatch, capsys):
    """A fine-tuning job with gpus 4 over nodes 2 (the resources of tests/tools/test_cluster.py's 2 x 2 job):
    the launcher runs one `srun` with every count explicit (the plugin's job step passes only SLURM_JOB_ID), and
    the 4 ranks it starts, 2 a node, join one process group with ranks from SLURM_PROCID. `srun` here is a
    stand-in that starts the tasks on this machine (FAKE_SRUN): a second node cannot be had here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    monkeypatch.chdir(work)  # the spec and the ranks' logs go to the (shared) working directory
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SRUN_RECORD", str(tmp_path / "srun.json"))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    distributed.run_on_gpus(report_rank, gpus=4, nodes=2, device="cpu", timeout_s=TIMEOUT_S, out=str(out), seed=0)
    argv = json.loads((tmp_path / "srun.json").read_text())
    # CPUs a task: this process's over the node's 2 ranks, at most what the job has per GPU
    cpus = min(jobs.CPUS_PER_GPU, max(1, len(os.sched_getaffinity(0)) // 2))
    assert argv[:7] == ["--jobid=4242", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--gpus-per-task=1",
                        f"--cpus-per-task={cpus}", "--kill-on-bad-exit=1"]
    worker = argv[-1]  # bash -c '<python -m arithmech.sft.distributed ...> > <dir>/rank"$SLURM_PROCID".log'
    assert "-m arithmech.sft.distributed" in worker and "--world-size 4" in worker and "--backend gloo" in worker
    assert "--rank" not in worker  # the rank is Slurm's
    ranks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(4)}
    assert [(v["world"], v["node"], v["local"], v["sum"]) for v in ranks.values()] == [
        (4, "0", "0", 4.0), (4, "0", "1", 4.0), (4, "1", "0", 4.0), (4, "1", "1", 4.0)]
    assert "hello from rank 0 of 4" in capsys.readouterr().out  # rank 0's output is the job's
    assert list(work.iterdir()) == []  # the spec and the logs are removed


def test_a_multi_node_launch_that_srun_refuses_fails_with_srun_s_message(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SRUN_RECORD", str(tmp_path / "srun.json"))
    monkeypatch.setenv("SRUN_REFUSE", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with pytest.raises(RuntimeError, match="training over 4 processes failed: process 0 exited with 1"):
        distributed.run_on_gpus(report_rank, gpus=4, nodes=2, device="cpu", timeout_s=TIMEOUT_S, out="x", seed=0)
    assert "srun: error: Unable to create step for job 4242" in capsys.readouterr().err


def test_a_local_run_of_a_multi_node_config_trains_on_this_machine(tmp_path, monkeypatch, capsys):
    """Outside a Slurm job (a local run ignores cluster resources) `nodes` 2 runs the ranks here, no srun."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    distributed.run_on_gpus(report_rank, gpus=2, nodes=2, device="cpu", timeout_s=TIMEOUT_S, out=str(tmp_path),
                            seed=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json", "rank1.json"]
    assert "outside a Slurm job: training on this machine only" in capsys.readouterr().err


def test_rank_batches_split_each_micro_batch():
    """Each micro-batch is split over the ranks (rank r: its examples r, r+G, ...); a sharded model's ranks run
    equally many forwards, one with factor 0 where a rank has no share."""
    step = list("abc")
    assert ft.rank_batches(step, 2, 0, 1, False) == [(["a", "b"], 1), (["c"], 1)]
    assert ft.rank_batches(step, 2, 0, 2, False) == [(["a"], 1), (["c"], 1)]
    assert ft.rank_batches(step, 2, 1, 2, False) == [(["b"], 1)]
    assert ft.rank_batches(step, 2, 1, 2, True) == [(["b"], 2), (["c"], 0)]
    assert ft.rank_batches(list("abcd"), 4, 1, 2, True) == [(["b", "d"], 2)]


# --- the rendezvous: the job's alone --------------------------------------------------------------------------


def listening(pid: int) -> list[tuple[str, int]]:
    """The (address, port) of every TCP socket process `pid` listens on (from /proc)."""
    import ipaddress

    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
            ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
            found.append((str(getattr(ip, "ipv4_mapped", None) or ip), int(port, 16)))
    return found


def report_rendezvous(out, seed):
    """A worker: what another user of this machine could reach or read of the run."""
    rank, _ = distributed.world()
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "launcher_listens": listening(os.getppid()), "listens": listening(os.getpid()), "argv": sys.argv,
        "spec_dir_mode": oct(Path(sys.argv[1]).parent.stat().st_mode & 0o777)}))


def test_one_node_rendezvous_listens_on_no_network(tmp_path):
    """One node: the launcher's store is a file in its private (0700) directory, not a TCP listener on every
    interface; gloo's own connections listen on loopback only; no store address is on the workers' command line."""
    distributed.run_on_gpus(report_rendezvous, gpus=2, device="cpu", timeout_s=TIMEOUT_S, out=str(tmp_path), seed=0)
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["launcher_listens"] == [], seen  # the launcher is this (pytest) process
        assert all(address.startswith("127.") for address, _ in seen["listens"]), seen
        assert seen["spec_dir_mode"] == "0o700" and "--store" not in seen["argv"]


def test_a_client_without_the_secret_cannot_join_or_change_a_key(monkeypatch):
    """Several nodes: the store answers only a client that proves the run's secret. A client with another secret,
    PyTorch's own TCPStore client (what the rendezvous used to serve) and raw bytes get nothing: no key read,
    written, added or deleted, and the job's client still reads its own value."""
    import datetime
    import secrets
    import socket

    import torch.distributed as dist

    monkeypatch.setattr(distributed, "_HANDSHAKE_S", 1.0)  # a stranger's connection is dropped after this
    timeout = datetime.timedelta(seconds=5)
    server = distributed.SecretStoreServer(secrets.token_bytes(32))
    try:
        job = distributed.SecretStore("127.0.0.1", server.port, server.secret, timeout)
        job.set("rank_1/address", b"the job's")
        stranger = distributed.SecretStore("127.0.0.1", server.port, secrets.token_bytes(32), timeout)
        for attempt in (lambda: stranger.set("rank_1/address", b"mine"), lambda: stranger.get("rank_1/address"),
                        lambda: stranger.add("barrier", 1), lambda: stranger.delete_key("rank_1/address"),
                        lambda: stranger.num_keys()):
            with pytest.raises(PermissionError, match="another secret"):
                attempt()
        with pytest.raises(Exception):
            dist.TCPStore("127.0.0.1", server.port, None, False, datetime.timedelta(seconds=3)).set(
                "rank_1/address", "mine")
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            raw.sendall(b"\0" * 100 + json.dumps({"op": "set", "key": "rank_1/address", "value": "00"}).encode())
            assert raw.recv(1 << 16)[:32]  # the server's nonce and proof, then nothing
        assert server.values == {"rank_1/address": b"the job's"}
        assert job.get("rank_1/address") == b"the job's" and job.num_keys() == 1
    finally:
        server.shutdown()
        server.server_close()


def test_the_secret_store_answers_as_torch_s_stores_do():
    """What torch.distributed asks of a store: set/get (waiting for a key, up to the timeout), add, compare_set
    (TCPStore's semantics), check, wait, delete_key, num_keys, clone."""
    import datetime
    import secrets

    import torch.distributed as dist

    server = distributed.SecretStoreServer(secrets.token_bytes(32))
    try:
        store = distributed.SecretStore("127.0.0.1", server.port, server.secret, datetime.timedelta(seconds=2))
        store.clone().set("a", "b")
        assert store.get("a") == b"b" and store.add("n", 2) == 2 and store.add("n", 3) == 5
        assert store.compare_set("n", "5", "7") == b"7" and store.compare_set("n", "5", "9") == b"7"
        assert store.compare_set("new", "", "x") == b"x" and store.compare_set("absent", "q", "x") == b"q"
        assert store.check(["a", "n"]) and not store.check(["absent"])
        store.wait(["a", "n"])
        assert store.num_keys() == 3 and store.delete_key("a") and not store.delete_key("a")
        with pytest.raises(dist.DistStoreError, match="timed out after 2 s waiting for key 'absent'"):
            store.get("absent")
        with pytest.raises(dist.DistStoreError, match="timed out after 0.5 s"):
            store.wait(["absent"], datetime.timedelta(seconds=0.5))
    finally:
        server.shutdown()
        server.server_close()


def write_marker(path, seed):
    Path(path).write_text("ran")


def test_a_worker_runs_no_call_from_a_directory_others_may_write(tmp_path):
    """The call is a pickle: a worker runs it only from a directory that is this user's alone (0700)."""
    import pickle
    import subprocess

    shared = tmp_path / "ranks"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    (shared / distributed.RENDEZVOUS_FILE).write_text(json.dumps({"file": str(shared / "store")}))
    (shared / distributed.SPEC_FILE).write_bytes(pickle.dumps((write_marker, {"path": str(tmp_path / "m"), "seed": 0})))
    cmd = distributed.worker_command(shared / distributed.SPEC_FILE, world_size=1, backend="gloo", timeout_s=30,
                                     rank=0, local_rank=0)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert proc.returncode == 1 and "refusing to run the call" in proc.stderr and "mode 755" in proc.stderr
    assert not (tmp_path / "m").exists()


def test_no_collective_unpickles():
    """What ranks send each other is tensors (JSON as bytes), never a pickle: no *_object collective in the package."""
    import arithmech

    unpickling = ("broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
                  "recv_object_list")
    found = [(p.name, name) for p in Path(arithmech.__file__).parent.rglob("*.py") for name in unpickling
             if name in p.read_text()]
    assert found == []
