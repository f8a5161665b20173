"""Shared fixtures: one offline tiny Llama model for the whole test run, loaded on CPU (and a tiny model of each
other family, `tiny_family`), a prompt config, the default config.yaml, `check_fails` (a bad config raises a
ConfigError naming the expected fragments), the stage tests' prepared tiny model (`prepared`) and the real test
Slurm (`slurm_cluster`); the pytest-xdist scheduling of `make test`. Helpers that are not fixtures: helpers.py."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import yaml

from arithmech.config import ConfigError, validate_config
from arithmech.model.loading import load_model
from arithmech.model.tiny import build_tiny_model
from helpers import PROMPT_CFG, ROOT, prepare_tiny

# The test modules that use the real one-node Slurm (`slurm_cluster`): under pytest-xdist they are one unit of work,
# run one after the other on one worker, so no worker idles on their lock (below) while another holds it.
SLURM_MODULES = ("test_slurm.py", "test_slurm_cluster.py", "test_slurm_gpus.py", "test_slurm_groups.py",
                 "test_slurm_qos.py", "test_slurm_limits.py", "test_rehearsal.py")
# The longest units first (the Slurm modules, then the whole tiny workflow), so the two never queue behind short ones.
FIRST = (*SLURM_MODULES, "test_workflow.py", "test_distributed_workflow.py")


def pytest_collection_modifyitems(config, items):
    uses_slurm = {Path(item.path).name for item in items if "slurm_cluster" in getattr(item, "fixturenames", ())}
    if not uses_slurm <= set(SLURM_MODULES):
        raise pytest.UsageError(f"tests/conftest.py: add {sorted(uses_slurm - set(SLURM_MODULES))} to SLURM_MODULES")
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.path).name, len(FIRST)))  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (make test) with the Slurm modules as one unit and units in collection order."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlurmModulesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid):
            module = super()._split_scope(nodeid)
            return "the real Slurm" if Path(module).name in SLURM_MODULES else module

    config.option.loadscopereorder = False  # keep FIRST's order, not the largest test count first
    return SlurmModulesTogether(config, log)


def pytest_configure(config):
    # Under pytest-xdist (`make test`: one worker per core) every worker is a process of its own: one torch thread
    # each, so two workers do not fight over the cores (torch takes every core by default).
    if hasattr(config, "workerinput"):
        torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def one_slurm_module_at_a_time(request, tmp_path_factory):
    """The test modules on the real one-node Slurm (SLURM_MODULES) run one at a time, across pytest runs of the same
    user and without the scheduler above (`TEST_ARGS=`, another `--dist`): they share its two CPUs and its queue, and
    one restarts its daemons. An exclusive lock on a file beside every worker's temporary directory, held for the
    whole module (its module-scoped fixtures run workflows on the cluster too)."""
    uses_slurm = Path(request.module.__file__).name in SLURM_MODULES  # collection checks the list is complete
    if not uses_slurm:
        yield
        return
    import fcntl

    with open(tmp_path_factory.getbasetemp().parent / "arithmech-slurm-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
        cancel_left_jobs(tmp_path_factory.getbasetemp().parent)


def cancel_left_jobs(root: Path) -> None:
    """Cancel the jobs a Slurm module left in the queue (a run killed at its timeout cannot cancel its own), so the
    next module does not wait behind them: those submitted from under `root` (this pytest run's temporary
    directories; a `make rehearsal` sharing the node keeps its jobs). Says which it cancelled."""
    from slurm import cluster

    if not cluster.is_up():
        return
    slurm = cluster.SlurmCluster.from_state()
    queue = slurm.run("squeue", "--noheader", "--format=%i %Z", check=False).stdout.splitlines()
    left = [line.split(maxsplit=1) for line in queue if line.strip()]
    left = [job for job, cwd in left if Path(cwd).resolve().is_relative_to(Path(root).resolve())]
    if left:
        slurm.run("scancel", *left, check=False)
        print(f"cancelled the Slurm jobs {', '.join(left)} that a test module left in the queue", file=sys.stderr)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny 3-layer Llama (4 query heads, 2 key/value heads, head_dim 8) with its tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_lm(tiny_family):
    return tiny_family("llama")[1]


@pytest.fixture(scope="session")
def tiny_family(tiny_dir, tmp_path_factory):
    """tiny_family(family) -> (model directory, LoadedModel on CPU) of the tiny model of `family`
    (`tiny.FAMILIES`), built and loaded once per session; "llama" is `tiny_dir` / `tiny_lm`. A test module runs
    on every family by overriding `tiny_lm` with a module fixture parametrized over `tiny.FAMILIES`."""
    built = {}

    def get(family: str):
        if family not in built:
            directory = tiny_dir if family == "llama" else build_tiny_model(
                tmp_path_factory.mktemp(f"tiny-{family}") / "model", family=family)
            built[family] = (directory, load_model(directory, device="cpu"))
        return built[family]

    return get


@pytest.fixture(scope="session")
def base_prompt_cfg():
    """The prompt config for fixtures shared across tests (do not modify it)."""
    return copy.deepcopy(PROMPT_CFG)


@pytest.fixture
def prompt_cfg():
    """A fresh copy per test, so a test that edits it cannot leak into another."""
    return copy.deepcopy(PROMPT_CFG)


SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


@pytest.fixture
def config():
    """The default config.yaml, read afresh for each test (tests edit it)."""
    return yaml.safe_load((ROOT / "config.yaml").read_text())


@pytest.fixture
def check_fails():
    """check_fails(config, *fragments): validating `config` raises a ConfigError whose message holds every
    fragment (the key it names, what was expected)."""

    def check(config, *fragments):
        with pytest.raises(ConfigError) as err:
            validate_config(config, SCHEMA)
        for fragment in fragments:
            assert fragment in str(err.value)

    return check


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The identify stage's first rules run on a 2-layer tiny Llama (helpers.prepare_tiny): its directory."""
    return prepare_tiny(tmp_path_factory.mktemp("stages"))


@pytest.fixture(scope="session")
def slurm_cluster():
    """The real one-node Slurm of tests/slurm/ (cluster.sh; the object is a slurm.cluster.SlurmCluster): started
    here when it is not up and then stopped at the session's end. Where it cannot start (not root, not installed)
    the fixture fails with how to start it, or skips where ARITHMECH_SKIP_SLURM=1."""
    import os

    from slurm import cluster

    try:
        running, started = cluster.ensure_cluster()
    except cluster.ClusterUnavailable as err:
        running, why = None, str(err)
    if running is None:
        if os.environ.get("ARITHMECH_SKIP_SLURM") == "1":
            pytest.skip(f"ARITHMECH_SKIP_SLURM=1 and {why}")
        pytest.fail(why, pytrace=False)
    yield running
    if started:
        cluster.stop()
