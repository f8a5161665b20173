"""The test cluster's state directory is root's alone: tests/slurm/cluster.sh, the pytest fixture's reader
(tests/slurm/cluster.py) and `make rehearsal` refuse one that another user owns or may write (planted first at the
path the cluster would use), and source or run nothing from it. No daemon starts or stops here: each command is
refused before it would touch one, and every command names its state directory (never the live cluster's)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers import ROOT
from slurm import cluster

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants directories as another user: needs root")



@pytest.fixture
def plant_root():
    """A root-owned directory in /tmp that any user may enter (not write): where the planted states go."""
    root = Path(tempfile.mkdtemp(prefix="arithmech-plant-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


def plant(root: Path, how: str) -> Path:
    """A state directory as another user would leave it for the cluster: `foreign` (owned by nobody), `open`
    (root's, but mode 0777), `symlink` (to a root-owned directory), `open_parent` (root's, in a 0777 directory).
    It holds an env.sh that would mark its sourcing, and a slurmd PID file."""
    if how == "open_parent":
        parent = root / "open"
        parent.mkdir(mode=0o777)
        parent.chmod(0o777)
        state = parent / "state"
        state.mkdir()
    elif how == "symlink":
        target = root / "target"
        target.mkdir()
        state = root / "state"
        state.symlink_to(target)
    else:
        state = root / "state"
        state.mkdir()
        if how == "foreign":
            os.chown(state, pwd.getpwnam("nobody").pw_uid, -1)
        else:
            state.chmod(0o777)
    (state / "run").mkdir(exist_ok=True)
    (state / "env.sh").write_text(f"touch {state}/sourced\nexport SLURM_CONF={state}/etc/slurm.conf\n")
    (state / "env.sh").chmod(0o755)
    return state


def script(command: str, state: Path) -> subprocess.CompletedProcess:
    return cluster.run_script(command, timeout=60, state=state)


@pytest.mark.parametrize("how", ["foreign", "open", "symlink", "open_parent"])
def test_cluster_sh_refuses_a_planted_state_directory(plant_root, how):
    """status, env and stop refuse it, naming what is wrong; `stop` kills no process a planted PID file names."""
    state = plant(plant_root, how)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        (state / "run/slurmd.pid").write_text(f"{victim.pid}\n")
        for command in ("status", "env", "stop"):
            proc = script(command, state)
            assert proc.returncode == 1, (command, proc.stdout, proc.stderr)
            assert f"refusing the state directory {state}" in proc.stderr, (command, proc.stderr)
        why = {"foreign": "is owned by uid", "open": "is writable by group or others (mode 777)",
               "symlink": "is a symlink", "open_parent": f"{state.parent} is writable by group or others"}[how]
        assert why in proc.stderr
        assert victim.poll() is None  # still running: stop read no PID from the planted directory
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


def test_a_root_owned_state_directory_is_used(plant_root):
    """The same commands on a directory that root made for itself: nothing refused (no cluster runs there)."""
    state = plant_root / "state"
    state.mkdir(mode=0o755)
    status = script("status", state)
    assert status.returncode == 1 and "refusing" not in status.stderr and "slurmd: stopped" in status.stdout
    env = script("env", state)
    assert env.returncode == 1 and f"the test cluster is not up ({state})" in env.stderr


def test_the_fixture_reads_nothing_from_a_planted_state_directory(plant_root):
    state = plant(plant_root, "foreign")
    with pytest.raises(cluster.ClusterUnavailable, match="refusing the state directory"):
        cluster.SlurmCluster.from_state(state)


def test_make_rehearsal_sources_nothing_from_a_planted_state_directory(plant_root):
    """A user without SLURM_CONF runs `make rehearsal` while another has planted the test cluster's state directory
    (with an env.sh): it stops with what to do, and neither sources the planted file nor runs the rehearsal."""
    state = plant(plant_root, "foreign")
    bin_dir = plant_root / "bin"  # stands in for the venv's python: records that the rehearsal ran
    bin_dir.mkdir(mode=0o755)
    (bin_dir / "python").write_text(f"#!/bin/sh\ntouch {state}/rehearsal-ran\n")
    (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "rehearsal", "-o", ".venv/.arithmech-installed",
                           f"BIN={bin_dir}"], capture_output=True, text=True, timeout=60, user="nobody",
                          env={**env, "ARITHMECH_SLURM_DIR": str(state), "HOME": str(plant_root)})
    assert proc.returncode != 0
    assert "refusing the state directory" in proc.stderr and "no Slurm: set SLURM_CONF" in proc.stderr
    assert not (state / "sourced").exists() and not (state / "rehearsal-ran").exists()

