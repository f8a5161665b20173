"""Training over G processes (a fine-tuning job with `gpus: G > 1`), in plain PyTorch (torch.distributed).

The launcher (`run_on_gpus`, in the job's own process) starts G worker processes, each of which runs the job's
entry point with the same keywords under an initialised process group: rank r owns GPU r of the job (gloo
processes on CPU, so the same code runs in the tests). What training does with them (`arithmech.sft.training`):
each optimizer step's examples are split across the ranks and the loss is divided by the step's GLOBAL count of
target tokens, so a step is the one-process step whatever G; the head methods and LoRA keep the frozen base
replicated and sum the trained tensors' gradients over the ranks (`all_reduce_grads`); full fine-tuning shards
every decoder layer, then the root, with FSDP2 (`shard_model`). Only rank 0 writes outputs.

Why our own launcher rather than torchrun: one code path for a job on one node (G local processes) and on
several (one `srun` task per GPU, `worker_command`), rank and world size passed explicitly (the SLURM plugin's
job step strips SLURM_* variables), the rendezvous store held by the launcher itself (so rank 0 may be on any
node), and a failing rank's traceback copied into the rule's log while the other ranks are stopped.

The rendezvous is the job's alone (`rendezvous`): on one node a file store in the launcher's private (0700)
directory, so no store listens on the network; across nodes a store on the launcher's host that answers only a
client proving it holds the run's random secret (`SecretStore`), which travels in that private directory (on the
shared file system), never on a command line. What the ranks exchange is tensors and JSON, never a pickle; the
one pickle, the call itself, is read from that private directory. The collectives' own connections (gloo's,
NCCL's) are not authenticated: docs/cluster.md says what a multi-node job assumes of the network.

Every multi-process run has a timeout (the store's and the process group's, and the launcher's wall clock), and
workers pass a barrier before `destroy_process_group` (a run can hang at teardown without it).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import os
import pickle
import secrets
import shlex
import signal
import socket
import socketserver
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from arithmech.jobs import CPUS_PER_GPU, is_gpu_oom

DEFAULT_TIMEOUT_S = 24 * 3600  # a job without a runtime (local runs): one day at most
POLL_S = 0.2
FAILED_MARK = "arithmech: rank failed"  # what a failing worker prints before its traceback
# A worker that ran out of GPU memory leaves this file beside the spec (a file, not an exit code: across nodes srun
# reports the tasks it killed, not the rank that failed), and the launcher raises out-of-memory in turn.
GPU_OOM_FILE = "rank{rank}.gpu-oom"


# ---------------------------------------------------------------------------------------------------
# Inside a worker (and in one process: rank 0 of 1)


def world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    """Whether this process writes outputs: rank 0, or the only process."""
    return world()[0] == 0


def rank_seed(seed: int, rank: int) -> int:
    """Rank r's torch seed: `seed` itself on rank 0 (one process trains as before), another stream derived from
    (seed, rank) on the others, so that their dropout masks differ."""
    return seed if rank == 0 else int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def all_reduce_grads(params: list[nn.Parameter]) -> None:
    """Sum the trained tensors' gradients over the ranks (each rank's loss is already divided by the global
    token count: the sum is the one-process gradient). A tensor a rank gave no gradient counts as zeros.
    SUM, not AVG: gloo has no PREMUL_SUM and the loss carries the scale."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def _all_reduce(value, op, dtype: torch.dtype, cast):
    """`value` reduced over the ranks with `op`, as `cast` (itself, untouched, in one process)."""
    if world()[1] == 1:
        return value
    t = torch.tensor([value], dtype=dtype, device=reduce_device())
    dist.all_reduce(t, op=op)
    return cast(t.item())


def all_reduce_sum(value: float) -> float:
    """`value` summed over the ranks (itself in one process)."""
    return _all_reduce(value, dist.ReduceOp.SUM, torch.float64, float)


def all_reduce_max(value: int) -> int:
    """`value`'s maximum over the ranks (itself in one process): the peak memory of a run."""
    return _all_reduce(value, dist.ReduceOp.MAX, torch.int64, int)


def broadcast(value):
    """Rank 0's `value` (a JSON value) on every rank; itself in one process. Sent as the bytes of its JSON in a
    tensor: a rank never unpickles what it receives."""
    if world()[1] == 1:
        return value
    data = json.dumps(value).encode() if is_main() else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=reduce_device())
    dist.broadcast(size, src=0)
    if is_main():
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(reduce_device()), src=0)
        return value
    buf = torch.empty(int(size.item()), dtype=torch.uint8, device=reduce_device())
    dist.broadcast(buf, src=0)
    return json.loads(buf.cpu().numpy().tobytes().decode())


def gather_tensor(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's `tensor` (of one shape and dtype on every rank), by rank, on every rank's CPU."""
    if world()[1] == 1:
        return [tensor]
    local = tensor.to(reduce_device())
    out = [torch.empty_like(local) for _ in range(world()[1])]
    dist.all_gather(out, local)
    return [t.cpu() for t in out]


def barrier() -> None:
    if world()[1] > 1:
        dist.barrier()


def reduce_device() -> torch.device:
    """Where collective tensors live: the rank's GPU under NCCL, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def shard_model(model: nn.Module, compute_dtype: torch.dtype) -> None:
    """Full fine-tuning over the ranks: PyTorch FSDP2 (`fully_shard`) on every decoder layer, then the root, in
    place. The parameters become float32 row shards (DTensors of the parameters' own shapes and names: the
    optimizer, created after this, updates float32 master weights); forwards compute in `compute_dtype` (the
    model's loaded dtype) and gradients are reduced in float32 (MixedPrecisionPolicy)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = next(model.parameters()).device
    model.float()
    policy = MixedPrecisionPolicy(param_dtype=None if compute_dtype == torch.float32 else compute_dtype,
                                  reduce_dtype=torch.float32)
    mesh = init_device_mesh(device.type, (world()[1],))
    for layer in model.get_decoder().layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """A sharded model's whole state dict on rank 0's CPU (None on the others); every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if is_main() else None


def unsharded_copy(model: nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype) -> nn.Module:
    """A plain (unsharded) CPU copy of an FSDP-sharded HF model from its gathered `state`, in `dtype`, in eval
    mode and without gradients: what rank 0 saves. Built on the meta device (no second initialisation of the
    weights); the buffers that state dicts leave out (rotary frequencies) are copied from `model`."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(model.config, dtype=dtype)
    plain.load_state_dict({name: t.to(dtype) for name, t in state.items()}, strict=False, assign=True)
    for name, buf in model.named_buffers():
        owner, _, leaf = name.rpartition(".")
        setattr(plain.get_submodule(owner), leaf, buf.detach().cpu())
    plain.tie_weights()
    missing = [n for n, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"gathering the sharded model left parameters unset: {missing[:4]}")
    plain.eval()
    plain.requires_grad_(False)
    return plain


# ---------------------------------------------------------------------------------------------------
# The rendezvous: a store only the job's own processes can reach

SPEC_FILE = "call.pkl"  # the call (fn, kwargs), pickled: read only from the launcher's private directory
RENDEZVOUS_FILE = "rendezvous.json"  # how a worker joins: the file store's path, or the store's address and secret
STORE_FILE = "store"
_NONCE = 32
_MAX_MESSAGE = 64 << 20  # what the store holds is small (addresses, NCCL ids); a stranger's length is not trusted
_HANDSHAKE_S = 10.0  # a connection that does not prove the secret in time is dropped


def private_dir_problem(path: Path) -> str | None:
    """Why `path` is not a directory that this user alone can read and write (a symlink, another owner, or open
    to group or others), or None."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory (a symlink or a file)"
    if info.st_uid != os.geteuid():
        return f"{path} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    if info.st_mode & 0o077:
        return f"{path} has mode {stat.S_IMODE(info.st_mode):o}: group or others may read or write it"
    return None


def _send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("the store's connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> dict:
    (size,) = struct.unpack(">I", _recv_exact(sock, 4))
    if size > _MAX_MESSAGE:
        raise ConnectionError(f"a store message of {size} bytes")
    return json.loads(_recv_exact(sock, size).decode())


def _proof(secret: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, role + first + second, hashlib.sha256).digest()


class _StoreHandler(socketserver.BaseRequestHandler):
    """One connection: the handshake (both sides prove the secret without sending it), then one request."""

    def handle(self) -> None:
        server: SecretStoreServer = self.server  # type: ignore[assignment]
        sock = self.request
        sock.settimeout(_HANDSHAKE_S)
        try:
            client_nonce = _recv_exact(sock, _NONCE)
            nonce = secrets.token_bytes(_NONCE)
            sock.sendall(nonce + _proof(server.secret, b"server", client_nonce, nonce))
            expected = _proof(server.secret, b"client", nonce, client_nonce)
            if not hmac.compare_digest(_recv_exact(sock, _NONCE), expected):
                return  # not the job's: dropped before it may read or write anything
            sock.settimeout(None)
            request = _recv(sock)
            _send(sock, server.answer(request))
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return


class SecretStoreServer(socketserver.ThreadingTCPServer):
    """The keys of a multi-node run, served on this host (all interfaces: the other nodes connect) to clients that
    prove they hold `secret` (`SecretStore`). Keys are strings, values bytes; no value is ever unpickled."""

    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, secret: bytes):
        super().__init__(("", 0), _StoreHandler)
        self.secret = secret
        self.values: dict[str, bytes] = {}
        self.changed = threading.Condition()
        threading.Thread(target=self.serve_forever, name="arithmech-store", daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def _wait(self, keys: list[str], timeout_s: float) -> bool:  # with self.changed held
        return self.changed.wait_for(lambda: all(k in self.values for k in keys), timeout=timeout_s)

    def answer(self, request: dict) -> dict:
        op, key, timeout_s = request["op"], request.get("key"), float(request.get("timeout_s", 0))
        with self.changed:
            if op == "set":
                self.values[key] = bytes.fromhex(request["value"])
                self.changed.notify_all()
                return {"ok": True}
            if op == "get":
                if not self._wait([key], timeout_s):
                    return {"error": f"timed out after {timeout_s:g} s waiting for key {key!r}"}
                return {"value": self.values[key].hex()}
            if op == "add":
                value = int(self.values.get(key, b"0")) + int(request["amount"])
                self.values[key] = str(value).encode()
                self.changed.notify_all()
                return {"value": value}
            if op == "compare_set":
                expected, desired = bytes.fromhex(request["expected"]), bytes.fromhex(request["desired"])
                if key not in self.values:
                    if expected:
                        return {"value": expected.hex()}
                    self.values[key] = desired
                elif self.values[key] == expected:
                    self.values[key] = desired
                self.changed.notify_all()
                return {"value": self.values[key].hex()}
            if op == "check":
                return {"value": all(k in self.values for k in request["keys"])}
            if op == "wait":
                if not self._wait(request["keys"], timeout_s):
                    return {"error": f"timed out after {timeout_s:g} s waiting for keys {request['keys']!r}"}
                return {"ok": True}
            if op == "delete_key":
                return {"value": self.values.pop(key, None) is not None}
            if op == "num_keys":
                return {"value": len(self.values)}
        return {"error": f"unknown store operation {op!r}"}


class SecretStore(dist.Store):
    """A client of a `SecretStoreServer`: a torch.distributed store (what `init_process_group` takes) whose every
    request opens a connection, proves the secret and checks the server's proof (a process that took the port
    after the launcher ended cannot answer), then sends one JSON request."""

    def __init__(self, host: str, port: int, secret: bytes, timeout: datetime.timedelta):
        super().__init__()
        self.host, self.port, self.secret = host, int(port), secret
        self.set_timeout(timeout)

    def _timeout_s(self, timeout=None) -> float:
        return (timeout or self.timeout).total_seconds()

    def _call(self, request: dict, timeout_s: float) -> dict:
        with socket.create_connection((self.host, self.port), timeout=_HANDSHAKE_S) as sock:
            nonce = secrets.token_bytes(_NONCE)
            sock.sendall(nonce)
            reply = _recv_exact(sock, 2 * _NONCE)
            server_nonce, proof = reply[:_NONCE], reply[_NONCE:]
            if not hmac.compare_digest(proof, _proof(self.secret, b"server", nonce, server_nonce)):
                raise PermissionError(f"the store at {self.host}:{self.port} holds another secret than this run's")
            sock.sendall(_proof(self.secret, b"client", server_nonce, nonce))
            sock.settimeout(timeout_s + _HANDSHAKE_S)
            _send(sock, {**request, "timeout_s": timeout_s})
            try:
                answer = _recv(sock)
            except ConnectionError as err:
                raise PermissionError(f"the store at {self.host}:{self.port} refused this client (a wrong "
                                      "secret?)") from err
        if "error" in answer:
            raise dist.DistStoreError(f"store: {answer['error']}")
        return answer

    @staticmethod
    def _bytes(value) -> bytes:
        return value.encode() if isinstance(value, str) else bytes(value)

    def set(self, key, value):
        self._call({"op": "set", "key": key, "value": self._bytes(value).hex()}, self._timeout_s())

    def get(self, key):
        return bytes.fromhex(self._call({"op": "get", "key": key}, self._timeout_s())["value"])

    def add(self, key, amount):
        return int(self._call({"op": "add", "key": key, "amount": int(amount)}, self._timeout_s())["value"])

    def compare_set(self, key, expected, desired):
        return bytes.fromhex(self._call({"op": "compare_set", "key": key, "expected": self._bytes(expected).hex(),
                                         "desired": self._bytes(desired).hex()}, self._timeout_s())["value"])

    def check(self, keys):
        return bool(self._call({"op": "check", "keys": list(keys)}, self._timeout_s())["value"])

    def wait(self, keys, timeout=None):
        self._call({"op": "wait", "keys": list(keys)}, self._timeout_s(timeout))

    def delete_key(self, key):
        return bool(self._call({"op": "delete_key", "key": key}, self._timeout_s())["value"])

    def num_keys(self):
        return int(self._call({"op": "num_keys"}, self._timeout_s())["value"])

    def clone(self):  # what torch.distributed does where it splits or shrinks a group
        return SecretStore(self.host, self.port, self.secret, self.timeout)


@contextlib.contextmanager
def rendezvous(directory: Path, *, nodes: int) -> Iterator[SecretStoreServer | None]:
    """While the block runs, the store the workers join through (`join_rendezvous`), as directory/rendezvous.json
    says; `directory` is the launcher's private one. One node: a file store in `directory` (nothing listens on the
    network; only this user can open it). Several nodes: a `SecretStoreServer` on this host (yielded) with a fresh
    random secret, which the workers read from the file: it appears on no command line and in no environment."""
    problem = private_dir_problem(directory)
    if problem:
        raise PermissionError(f"the ranks' directory must be private: {problem}")
    server = SecretStoreServer(secrets.token_bytes(32)) if nodes > 1 else None
    try:
        if server is not None:
            how = {"host": socket.gethostname(), "port": server.port, "secret": server.secret.hex()}
        else:
            how = {"file": str(Path(directory) / STORE_FILE)}
        write_private(Path(directory) / RENDEZVOUS_FILE, json.dumps(how).encode())
        yield server
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def write_private(path: Path, data: bytes) -> None:
    """A new file readable by this user alone (it must not exist)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def join_rendezvous(directory: Path, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The store a worker joins the process group through, as directory/rendezvous.json says (`rendezvous`)."""
    how = json.loads((Path(directory) / RENDEZVOUS_FILE).read_text())
    if "file" in how:
        store = dist.FileStore(how["file"], world_size)
        store.set_timeout(timeout)
        return store
    return SecretStore(how["host"], how["port"], bytes.fromhex(how["secret"]), timeout)


# ---------------------------------------------------------------------------------------------------
# The launcher (the job's own process)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (Slurm sets it for a job)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g for g in listed.split(",") if g.strip()]
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def plan_world(gpus: int, device: str, nodes: int = 1) -> tuple[int, str]:
    """(world size, backend) of a job asking for `gpus` with `compute.device` = `device`: G gloo processes on
    the CPU; on CUDA one NCCL process per visible GPU, at most G (a local run on a machine with fewer GPUs than
    the rule asks for runs on those it has, as a local run ignores `gpus`). Over several `nodes` the GPUs are
    Slurm's, on every node: all G, NCCL unless the device is the CPU."""
    gpus = int(gpus or 1)
    if nodes > 1:
        return gpus, "gloo" if device == "cpu" else "nccl"
    cuda = device != "cpu" and torch.cuda.is_available()
    if not cuda:
        return gpus, "gloo"
    have = len(visible_gpus())
    if have < gpus:
        print(f"the job asks for {gpus} GPUs and sees {have}: training on {have}", file=sys.stderr)
    return max(1, min(gpus, have)), "nccl"


def slurm_job_id() -> str | None:
    """The Slurm job this process runs in (the plugin's job step keeps this variable), or None."""
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or None


def worker_command(spec: Path, *, world_size: int, backend: str, timeout_s: float, rank: int | None = None,
                   local_rank: int | None = None) -> list[str]:
    """The command of one worker: `python -m arithmech.sft.distributed` with the spec file (in the launcher's
    private directory, beside the rendezvous file: no address or secret on the command line), the world size, the
    backend and the timeout; rank and local rank given (local processes) or read by the worker from the
    SLURM_PROCID / SLURM_LOCALID that its own `srun` task sets (several nodes)."""
    cmd = [sys.executable, "-m", "arithmech.sft.distributed", str(spec), "--world-size", str(world_size),
           "--backend", backend, "--timeout-s", str(int(timeout_s))]
    if rank is not None:
        cmd += ["--rank", str(rank), "--local-rank", str(local_rank if local_rank is not None else rank)]
    return cmd


def srun_command(worker: list[str], *, job_id: str, nodes: int, world_size: int, cpus_per_task: int) -> list[str]:
    """One `srun` task per GPU over `nodes` nodes, with every count explicit (the plugin's job step strips the
    SLURM_* variables but the job id): `--jobid`, `--nodes`, `--ntasks`, `--ntasks-per-node`, one GPU and
    `cpus_per_task` CPUs a task; `--kill-on-bad-exit` stops every task when one fails."""
    if world_size % nodes:
        raise ValueError(f"{world_size} GPUs cannot be split evenly over {nodes} nodes: make "
                         "models.<name>.resources.finetune.gpus a multiple of its nodes")
    return ["srun", f"--jobid={job_id}", f"--nodes={nodes}", f"--ntasks={world_size}",
            f"--ntasks-per-node={world_size // nodes}", "--gpus-per-task=1", f"--cpus-per-task={cpus_per_task}",
            "--kill-on-bad-exit=1", *worker]


def multi_node_command(worker: list[str], *, tmp: str | Path, job_id: str, nodes: int, world_size: int,
                       cpus_per_task: int) -> list[str]:
    """The `srun` that starts `worker` as one task per GPU over `nodes` nodes (`srun_command`), each task's
    output in `tmp`/rank<r>.log, r being the rank Slurm gives the task (SLURM_PROCID, which the worker reads)."""
    logged = ["bash", "-c", shlex.join(worker) + f' > {shlex.quote(str(tmp))}/rank"$SLURM_PROCID".log 2>&1']
    return srun_command(logged, job_id=job_id, nodes=nodes, world_size=world_size, cpus_per_task=cpus_per_task)


def run_on_gpus(fn: Callable, *, gpus: int = 1, device: str = "auto", nodes: int = 1, timeout_s: float | None = None,
                **kwargs):
    """Run `fn(**kwargs)` (a module-level function: a job's entry point) in this process when the job has one GPU
    (`gpus` 1, the rule's resource), else in G worker processes under one process group (module docstring).

    The workers' output goes into this process's stdout (rank 0's, i.e. the rule's log); a rank that fails
    stops the others and its traceback is written to stderr before this raises (torch's OutOfMemoryError when a
    rank ran out of GPU memory, so that the job marks its log for a retry with a smaller batch: `arithmech.jobs`).
    `timeout_s` (the job's runtime; default a day) ends a run that takes longer, every rank included. `nodes` > 1:
    the workers are `srun` tasks across the job's nodes (`srun_command`), the launcher's host holding the store."""
    if nodes > 1 and not slurm_job_id():
        # a local run of a multi-node config (a local run ignores the cluster resources): this machine only
        print(f"nodes={nodes} outside a Slurm job: training on this machine only", file=sys.stderr)
        nodes = 1
    world_size, backend = plan_world(gpus, device, nodes)
    if world_size == 1:
        return fn(**kwargs)
    timeout_s = float(timeout_s or DEFAULT_TIMEOUT_S)
    # the job's CPUs shared by its ranks on this node (a cluster job asks for cpus_per_gpu: arithmech.tools.cluster)
    threads = max(1, len(os.sched_getaffinity(0)) // (world_size // max(1, nodes)))
    if nodes > 1:  # a task asks for no more CPUs than the job has per GPU (this process's may be the whole node's)
        threads = min(threads, CPUS_PER_GPU)
    # several nodes need a shared file system for the spec and the logs: the working directory's. The directory is
    # private (mkdtemp: 0700), and so is what the workers trust from it: the call and the rendezvous.
    with tempfile.TemporaryDirectory(prefix=".arithmech-ranks-", dir=Path.cwd() if nodes > 1 else None) as tmp, \
            rendezvous(Path(tmp), nodes=nodes):
        spec = Path(tmp) / SPEC_FILE
        write_private(spec, pickle.dumps((fn, kwargs)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": str(threads)}
        if nodes == 1 and backend == "gloo":  # gloo's own connections between the ranks: on loopback only
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        logs = [Path(tmp) / f"rank{r}.log" for r in range(world_size)]
        if nodes > 1:
            worker = worker_command(spec, world_size=world_size, backend=backend, timeout_s=timeout_s)
            print(f"training over {world_size} processes on {nodes} nodes ({backend}); rank 0's output follows "
                  "when it ends", flush=True)
            cmd = multi_node_command(worker, tmp=tmp, job_id=slurm_job_id(), nodes=nodes, world_size=world_size,
                                     cpus_per_task=threads)
            # srun's own messages (a step Slurm refuses, a task it kills) go to a log of their own, shown on failure
            with open(Path(tmp) / "srun.log", "w") as srun_log:
                procs = [subprocess.Popen(cmd, env=env, stdout=srun_log, stderr=subprocess.STDOUT)]
        else:
            print(f"training over {world_size} processes ({backend}); rank 0's output follows", flush=True)
            gpus = visible_gpus() if backend == "nccl" else []
            live = output_fd()  # rank 0 writes straight into the rule's log, so its progress shows as it runs
            procs = []
            for r in range(world_size):
                cmd = worker_command(spec, world_size=world_size, backend=backend, timeout_s=timeout_s, rank=r,
                                     local_rank=r)
                # one GPU each (NCCL): the rank loads the model on it as a one-GPU job does
                own = {"CUDA_VISIBLE_DEVICES": gpus[r]} if backend == "nccl" else {}
                with open(logs[r], "w") as log:
                    out = live if r == 0 and live is not None else log
                    procs.append(subprocess.Popen(cmd, env={**env, **own}, stdout=out, stderr=subprocess.STDOUT))
        failed = wait_all(procs, timeout_s)
        # a local rank that died by itself (a signal such as SIGABRT, or a code other than the launcher's stop),
        # whose log may hold a C++ message rather than a traceback
        crashed = set() if nodes > 1 else {r for r, p in enumerate(procs) if p.returncode not in (0, None, -15, 143)}
        # rank 0's output is the job's (when it could not go to the log directly); another rank's only when it
        # failed: its traceback
        for r, log in enumerate(logs):
            text = log.read_text(errors="replace") if log.is_file() else ""
            if (r == 0 and text) or FAILED_MARK in text or (r in crashed and text):
                print(f"--- rank {r} of {world_size} ---\n{text.rstrip()}", file=sys.stdout if r == 0 else sys.stderr)
        srun_text = (Path(tmp) / "srun.log").read_text(errors="replace").strip() if nodes > 1 else ""
        if failed is not None and srun_text:
            print(f"--- srun ---\n{srun_text}", file=sys.stderr)
        if failed is not None:
            out_of_memory = [r for r in range(world_size) if (Path(tmp) / GPU_OOM_FILE.format(rank=r)).exists()]
            if out_of_memory:
                # as torch's own error, so that the job marks its log for a retry with a smaller batch (arithmech.jobs)
                raise torch.cuda.OutOfMemoryError(
                    f"training over {world_size} processes failed: rank {', '.join(map(str, out_of_memory))} ran "
                    f"out of GPU memory ({failed}); the failing rank's traceback is above")
            raise RuntimeError(f"training over {world_size} processes failed: {failed}; the failing rank's "
                               "traceback is above")
    return None


def output_fd() -> int | None:
    """The file descriptor under this process's stdout (the rule's log in a job), or None (e.g. under pytest's
    capture, which has none)."""
    try:
        sys.stdout.flush()
        return sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> str | None:
    """Wait for every process; when one fails or the time is up, stop the others. Returns None when all
    succeeded, else what went wrong."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                return ", ".join(f"process {i} exited with {c}" for i, c in bad)
            if all(c == 0 for c in codes):
                return None
            if time.monotonic() > deadline:
                return f"timed out after {timeout_s:.0f} s (the job's runtime)"
            time.sleep(POLL_S)
    finally:
        stop(procs)


def stop(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """Terminate the processes still running (SIGTERM: a worker leaves its atomic writes cleaned up), then
    kill those that remain after `grace_s`."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    end = time.monotonic() + grace_s
    for p in running:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def worker_main(argv: list[str]) -> int:
    """One rank: join the process group through the launcher's rendezvous (`join_rendezvous`), run the spec's call
    (after checking that its directory is private), and pass a barrier before tearing the group down. A failure
    prints its traceback and exits 1 (the launcher stops the rest)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m arithmech.sft.distributed")
    parser.add_argument("spec")
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--local-rank", type=int, default=None)
    args = parser.parse_args(argv)
    # several nodes: the rank of this task as its srun sets it
    rank = args.rank if args.rank is not None else int(os.environ["SLURM_PROCID"])
    local_rank = args.local_rank if args.local_rank is not None else int(os.environ.get("SLURM_LOCALID", rank))
    # one GPU per rank (the launcher sets it for local ranks; an srun task may see its node's GPUs): read from the
    # variable, not from CUDA, so that it is set before CUDA starts
    listed = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if args.backend == "nccl" and len(listed) > 1:
        os.environ["CUDA_VISIBLE_DEVICES"] = listed[local_rank]
    # SIGTERM from the launcher: unwind, so that atomic writes remove their temporary directories
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    timeout = datetime.timedelta(seconds=args.timeout_s)
    directory = Path(args.spec).parent
    try:
        problem = private_dir_problem(directory)  # the call is a pickle: only from a directory no one else writes
        if problem:
            raise PermissionError(f"refusing to run the call in {args.spec}: {problem}")
        store = join_rendezvous(directory, args.world_size, timeout)
        dist.init_process_group(args.backend, store=store, rank=rank, world_size=args.world_size, timeout=timeout)
        from arithmech.jobs import seed_everything

        fn, kwargs = pickle.loads(Path(args.spec).read_bytes())
        seed_everything(int(kwargs.get("seed", 0)), int(os.environ.get("OMP_NUM_THREADS", 0)) or None)
        fn(**kwargs)
        dist.barrier()
        dist.destroy_process_group()
        # the work is done and written: leave without the interpreter's teardown, where gloo's threads may still
        # run (a rank once ended with SIGABRT and no traceback in a 2-process test)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except BaseException as err:
        if isinstance(err, SystemExit) and err.code == 143:  # stopped by the launcher after another rank failed
            os._exit(143)
        print(f"{FAILED_MARK}: rank {rank} of {args.world_size}", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        if is_gpu_oom(err):
            Path(args.spec).with_name(GPU_OOM_FILE.format(rank=rank)).touch()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # no teardown: the other ranks may wait in a collective; the launcher stops them
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
