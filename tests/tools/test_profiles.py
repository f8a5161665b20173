"""`snakemake --profile slurm` from a fresh checkout, and a user's own profiles beside the workflow's
(arithmech.tools.profiles). Dry runs here; the same command through the real test Slurm is in
tests/workflow/test_slurm.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from snakemake.resources import Resources

from arithmech.tools import profiles
from helpers import fresh_checkout, user_profile


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    return fresh_checkout(tmp_path_factory.mktemp("clone") / "arithmech")


def dry_run(checkout: Path, *args: str, config_home: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["XDG_CONFIG_HOME"] = str(config_home or checkout.parent / "no-config-home")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return subprocess.run([sys.executable, "-m", "snakemake", *args, "-n", "--quiet", "rules"], cwd=checkout,
                          env=env, capture_output=True, text=True, timeout=600)


def test_profile_args_reads_the_command_line():
    argv = ["--profile", "slurm", "mine", "-n", "--workflow-profile=workflow/profiles/slurm", "--profile=third"]
    assert profiles.profile_args(argv) == (["slurm", "mine", "third"], "workflow/profiles/slurm")
    assert profiles.profile_args(["--cores", "2"]) == ([], None)
    assert profiles.snakemake_argv(["/x/bin/snakemake", "--profile", "slurm"]) == ["--profile", "slurm"]
    assert profiles.snakemake_argv(["/x/snakemake/__main__.py", "-n"]) == ["-n"]
    assert profiles.snakemake_argv(["/x/bin/pytest", "--profile", "slurm"]) == []


def test_profile_slurm_as_typed_in_a_fresh_clone(checkout):
    proc = dry_run(checkout, "--profile", "slurm")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "Using profile slurm for setting default command line arguments" in log
    assert "note: profile" not in log  # no profile of the user's in play


def test_the_profile_groups_the_short_gpu_jobs_of_a_stage(checkout):
    """`--profile slurm` puts each model's identify stage (build_pairs, cache_activations, patch_all_layers) in one
    group job, the discovery (discover, discover_shared, discover_union) in one, and each of knockout, analyze and
    circuit in one; every other job is its own (Snakemake's listing: the group's jobs indented under it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["XDG_CONFIG_HOME"] = str(checkout.parent / "no-config-home")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--profile", "slurm", "-n"], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    groups: dict[str, set[str]] = {}
    for block in log.split("Group job ")[1:]:
        name = block.split(" ", 1)[0]
        members = {line.strip().removesuffix(":").split()[1] for line in block.splitlines()[1:]
                   if line.startswith("    rule ")}
        groups.setdefault(name, set()).update(members)
    assert groups == {"identify": {"build_pairs", "cache_activations", "patch_all_layers"},
                      "discover": {"discover", "discover_shared", "discover_union"}, "knockout": {"knockout"},
                      "analyze": {"analyze"}}, log[-3000:]
    assert log.count("Group job identify") == 1 and log.count("Group job knockout") == 1  # one allocation each


def test_the_same_name_in_the_checkout_answers_workflow_profile_too(checkout):
    proc = dry_run(checkout, "--workflow-profile", "slurm")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "workflow specific profile slurm" in log, log[-3000:]


def test_a_users_own_slurm_profile_keeps_its_limits_and_account(checkout, tmp_path):
    """The user's `~/.config/snakemake/slurm` (executor and account, a lower job limit, a setting the workflow
    cannot apply after parsing): its jobs and default resources apply, the rest is named."""
    user_profile(tmp_path, "executor: slurm\njobs: 7\ndefault-resources:\n  slurm_account: root\n  qos: low\n"
                           "slurm-requeue: true\n")
    proc = dry_run(checkout, "--profile", "slurm", config_home=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    mine = tmp_path / "snakemake/slurm/config.yaml"
    assert (f"note: profile {mine}: jobs 7, default-resources slurm_account=root qos=low; not applied (the "
            "workflow's SLURM profile is used): slurm-requeue: give them on the command line") in log


def test_a_users_slurm_profile_of_another_executor_is_refused(checkout, tmp_path):
    user_profile(tmp_path, "executor: cluster-generic\njobs: 7\n")
    proc = dry_run(checkout, "--profile", "slurm", config_home=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"{tmp_path / 'snakemake/slurm/config.yaml'}: executor is 'cluster-generic'" in log, log[-3000:]


def test_a_profile_layered_under_the_workflow_profile_keeps_its_job_limit(checkout, tmp_path):
    mine = user_profile(tmp_path, "executor: slurm\njobs: 5\n", name="site")
    proc = dry_run(checkout, "--profile", str(mine), "--workflow-profile", "workflow/profiles/slurm",
                   config_home=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert f"note: profile {mine / 'config.yaml'}: jobs 5" in log


class Settings:
    nodes, default_resources = 100, None


class Workflow:
    """What fold_in_user_profiles reads of Snakemake's workflow (9.27): its resource settings, and the copy of the
    job limit that `Workflow.__post_init__` made before the parse, which the scheduler and `nodes` read."""

    def __init__(self):
        self.resource_settings, self.global_resources = Settings(), Resources()
        self.global_resources["_nodes"] = self.resource_settings.nodes

    @property
    def nodes(self):
        return self.global_resources["_nodes"].value


def test_fold_in_sets_the_users_limits(tmp_path, monkeypatch):
    checkout = fresh_checkout(tmp_path / "co")
    user_profile(tmp_path / "home", "executor: slurm\njobs: 4\ndefault-resources: [slurm_account=root]\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home"))
    workflow = Workflow()
    notes = profiles.fold_in_user_profiles(workflow, ["--profile", "slurm"], checkout, checkout)
    assert len(notes) == 1 and "jobs 4" in notes[0]
    # the limit the scheduler reads, not only the settings the workflow object was made from
    assert workflow.nodes == 4 and workflow.resource_settings.nodes == 4
    settings = workflow.resource_settings
    assert "slurm_account" in settings.default_resources.keys()  # an expression, evaluated per job (as "root")
    assert settings.default_resources["mem_mb"]  # Snakemake's cluster defaults kept beside them
    # a job limit on the command line wins over the profile's, as Snakemake's own order has it
    for given in (["--jobs", "9"], ["-j", "9"], ["-j9"], ["--jobs=9"]):
        workflow = Workflow()
        notes = profiles.fold_in_user_profiles(workflow, ["--profile", "slurm", *given], checkout, checkout)
        assert workflow.nodes == 100 and "not jobs 4 (the command line's --jobs wins)" in notes[0], given
    # from another directory `--profile slurm` is the user's own: nothing is folded in
    elsewhere = Workflow()
    assert profiles.fold_in_user_profiles(elsewhere, ["--profile", "slurm"], tmp_path, checkout) == []
    assert elsewhere.nodes == 100


def test_a_job_limit_that_does_not_hold_stops_the_run(tmp_path, monkeypatch):
    """A Snakemake whose scheduler reads its limit from elsewhere (here: a `nodes` that ignores the copy) would
    leave the user's `jobs` unapplied: the run stops saying so, rather than noting a limit it does not keep."""
    checkout = fresh_checkout(tmp_path / "co")
    user_profile(tmp_path / "home", "executor: slurm\njobs: 3\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home"))

    class Elsewhere(Workflow):
        nodes = 100

    with pytest.raises(profiles.ProfileError, match=r"jobs 3 could not be applied .*limit stays 100.*--jobs 3"):
        profiles.fold_in_user_profiles(Elsewhere(), ["--profile", "slurm"], checkout, checkout)


def test_a_per_cpu_memory_default_is_refused_naming_both():
    given = Resources.parse(["mem_mb_per_cpu=2000"], allow_expressions=True)
    with pytest.raises(profiles.ProfileError, match=r"mem_mb_per_cpu=2000 .*\(models\.llama2-7b\.resources\.mem_mb "
                                                    r"64000"):
        profiles.check_per_cpu_memory(given, {"llama2-7b": 64000})
    assert profiles.check_per_cpu_memory(Resources.parse(["mem_mb=10"], allow_expressions=True), {"m": 1}) == []
    assert profiles.check_per_cpu_memory(None, {"m": 1}) == []
