"""The test suite's real one-node Slurm (tests/slurm/cluster.sh) seen from Python: start it when it is not up,
run Slurm's clients against it, and read back what Slurm recorded (`sacct`, `scontrol show job`).

The `slurm_cluster` fixture of tests/conftest.py returns a `SlurmCluster`; tests import this module as
`slurm.cluster` (tests/ is on sys.path)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).with_name("cluster.sh")
STATE = Path(os.environ.get("ARITHMECH_SLURM_DIR", "/var/lib/arithmech-slurm"))  # cluster.sh's default
HOW_TO_START = f"start it with `sudo bash {SCRIPT.relative_to(SCRIPT.parents[2])} up`"

# What `sacct` reports per job and step, in the order asked for.
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Elapsed", "MaxRSS", "ReqMem", "Timelimit",
                "AllocTRES", "ReqTRES", "Partition", "Account")
# States a job leaves by itself; anything else is final.
ACTIVE_STATES = {"", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}


class ClusterUnavailable(RuntimeError):
    """The cluster is not up and cannot be started here (not root, or Slurm not installed)."""


def run_script(command: str, timeout: float = 300, state: Path | None = None) -> subprocess.CompletedProcess:
    """`cluster.sh COMMAND`, on the cluster whose state is in `state` (default: the script's own default, or
    ARITHMECH_SLURM_DIR's)."""
    env = {**os.environ, "ARITHMECH_SLURM_DIR": str(state)} if state is not None else None
    return subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=timeout, env=env)


def is_up() -> bool:
    return run_script("status", timeout=60).returncode == 0


def start() -> None:
    """`cluster.sh up` as root (installs Slurm if missing), `start` otherwise (which only checks it is up)."""
    proc = run_script("up" if os.geteuid() == 0 else "start")
    if proc.returncode:
        raise ClusterUnavailable(f"the test Slurm cluster is not up and `cluster.sh` could not start it; "
                                 f"{HOW_TO_START}.\n{proc.stdout}{proc.stderr}")


def stop() -> None:
    proc = run_script("stop")
    if proc.returncode:
        raise RuntimeError(f"`cluster.sh stop` failed:\n{proc.stdout}{proc.stderr}")


def read_env(state: Path = STATE) -> dict[str, str]:
    """What a Slurm client needs (SLURM_CONF, the account and partitions), from `cluster.sh env`: only once the
    script has checked that the state directory is root's alone and the cluster is up (a SLURM_CONF from a
    directory another user could write would be their code in every client)."""
    proc = run_script("env", timeout=60, state=state)
    if proc.returncode:
        raise ClusterUnavailable(f"`cluster.sh env` refused: {proc.stderr.strip()}")
    env = {}
    for line in proc.stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0] if value else ""
    return env


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: `env` runs Slurm's clients against it (the process environment plus SLURM_CONF)."""

    env: dict[str, str]
    account: str  # the user's default account
    other_account: str  # an account the user may not use: sbatch refuses it
    partition: str  # the default partition (GPUs)
    cpu_partition: str
    capped_qos: str  # a QOS the user may use, one job of theirs at a time: sbatch refuses a second submission
    state: Path = STATE

    @classmethod
    def from_state(cls, state: Path = STATE) -> SlurmCluster:
        names = read_env(state)
        return cls(env={**os.environ, **names}, account=names["ARITHMECH_SLURM_ACCOUNT"],
                   other_account=names["ARITHMECH_SLURM_OTHER_ACCOUNT"],
                   partition=names["ARITHMECH_SLURM_PARTITION"],
                   cpu_partition=names["ARITHMECH_SLURM_CPU_PARTITION"],
                   capped_qos=names["ARITHMECH_SLURM_CAPPED_QOS"], state=state)

    def run(self, *args: str, check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster; with `check`, a non-zero exit raises with its output."""
        proc = subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=timeout, **kwargs)
        if check and proc.returncode:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        return proc

    def sbatch(self, *args: str, cwd: Path | None = None) -> str:
        """Submit a batch job (`sbatch --parsable ARGS`); returns its id."""
        return self.run("sbatch", "--parsable", *args, cwd=cwd).stdout.strip().split(";")[0]

    def sacct(self, job_ids) -> list[dict[str, str]]:
        """sacct's rows for these jobs and their steps (JobID like 12, 12.batch, 12.0), one dict per row keyed by
        SACCT_FIELDS. State is its first word: sacct writes "CANCELLED by 0" for a job root cancelled."""
        ids = ",".join(str(j) for j in ([job_ids] if isinstance(job_ids, (str, int)) else job_ids))
        out = self.run("sacct", "-P", "--delimiter=|", "-j", ids, "-o", ",".join(SACCT_FIELDS)).stdout
        header, *lines = out.splitlines()
        assert header.split("|") == list(SACCT_FIELDS), header
        rows = [dict(zip(SACCT_FIELDS, line.split("|"))) for line in lines]
        for row in rows:
            row["State"] = row["State"].split(" ")[0]
        return rows

    def wait(self, job_id: str, timeout: float) -> dict[str, str]:
        """Poll sacct until the job reaches a final state; returns the job's own row (not its steps')."""
        deadline = time.monotonic() + timeout
        while True:
            row = next((r for r in self.sacct(job_id) if r["JobID"] == str(job_id)), None)
            # a job shorter than a second can be final in sacct before its start record (Partition, ReqMem,
            # Timelimit) lands there: every job has a partition
            if row and row["State"] not in ACTIVE_STATES and row["Partition"]:
                return row
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {row and row['State']!r} after {timeout} s; "
                                   f"scontrol: {self.job_flags(job_id)}")
            time.sleep(1)

    def wait_running(self, job_id: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (state := self.job_flags(job_id)["JobState"]) != "RUNNING":
            if state not in ACTIVE_STATES or time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {state}, not RUNNING, after {timeout} s")
            time.sleep(0.5)

    def job_flags(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Partition, Account, TimeLimit, MinMemoryNode, TresPerNode...),
        while slurmctld still knows the job (MinJobAge after it ends); raises LookupError after that."""
        proc = self.run("scontrol", "-o", "show", "job", str(job_id), check=False)
        if proc.returncode:
            raise LookupError(f"slurmctld does not know job {job_id}: {proc.stderr.strip()}")
        # one line of Key=Value pairs; a value runs until the next " Key=" (values such as Reason hold spaces)
        return dict(re.findall(r"(?:^| )([A-Za-z][\w:/]*)=(.*?)(?= [A-Za-z][\w:/]*=|$)", proc.stdout.strip()))


def ensure_cluster() -> tuple[SlurmCluster, bool]:
    """The running cluster, started here if it was not up, and whether this call started it."""
    started = not is_up()
    if started:
        start()
    return SlurmCluster.from_state(), started


def gone(pid: int) -> bool:
    """Exited (a zombie counts: PID 1 reaps it later)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def stop_slurmd(state: Path = STATE, timeout: float = 30) -> None:
    """SIGTERM the cluster's slurmd and wait until it has exited (its jobs' slurmstepd run on without it)."""
    pid = int((state / "run/slurmd.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while not gone(pid):
        assert time.monotonic() < deadline, f"slurmd (pid {pid}) still running {timeout:g} s after SIGTERM"
        time.sleep(0.2)
