"""Shared fixtures: one offline tiny Llama model for the whole test run, loaded on CPU, a prompt config, the default
config.yaml, and `check_fails` (a bad config raises a ConfigError naming the expected fragments)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from arithmech.config import ConfigError, validate_config
from arithmech.model.loading import load_model
from arithmech.model.tiny import build_tiny_model

PROMPT_CFG = {
    "operands": {"min": 1, "max": 4},
    "n_shots": 2,
    "shot_separator": ".\n",
    "templates": ["{a} {op} {b} is equal to ", "What is {a} {op} {b}? The answer is "],
    "operators": {
        "addition": ["plus"],
        "subtraction": ["minus"],
        "multiplication": ["times"],
        "division": ["divided by"],
    },
    "null_words": ["nothing", "@"],
}


def pytest_configure(config):
    # Under pytest-xdist (`make test`: one worker per core) every worker is a process of its own: one torch thread
    # each, so two workers do not fight over the cores (torch takes every core by default).
    if hasattr(config, "workerinput"):
        torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def one_slurm_module_at_a_time(request, tmp_path_factory):
    """The test modules that use the real one-node Slurm run one at a time, across pytest-xdist workers (`make test`)
    and across pytest runs of the same user: they share its two CPUs and its queue, and one restarts its daemons.
    An exclusive lock on a file beside every worker's temporary directory, held for the whole module (its
    module-scoped fixtures run workflows on the cluster too). pytest-xdist's own grouping (`--dist loadgroup`) does
    not work with pytest 9."""
    uses_slurm = any("slurm_cluster" in item.fixturenames for item in request.session.items
                     if getattr(item, "module", None) is request.module)
    if not uses_slurm:
        yield
        return
    import fcntl

    with open(tmp_path_factory.getbasetemp().parent / "arithmech-slurm-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny 3-layer Llama (4 query heads, 2 key/value heads, head_dim 8) with its tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_lm(tiny_dir):
    return load_model(tiny_dir, device="cpu")


@pytest.fixture(scope="session")
def base_prompt_cfg():
    """The prompt config for fixtures shared across tests (do not modify it)."""
    return copy.deepcopy(PROMPT_CFG)


@pytest.fixture
def prompt_cfg():
    """A fresh copy per test, so a test that edits it cannot leak into another."""
    return copy.deepcopy(PROMPT_CFG)


ROOT = Path(__file__).resolve().parents[1]
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


def n_hooks(model: torch.nn.Module) -> int:
    """Hooks on the model (to check that a context manager removed its own), not counting the
    output-capturing hooks transformers installs on first use of output_hidden_states / output_attentions
    (once, for good)."""
    return sum(1 for m in model.modules() for d in (m._forward_hooks, m._forward_pre_hooks) for fn in d.values()
               if "output_capturing_hook" not in getattr(fn, "__qualname__", ""))


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
