"""The code stays clean under ruff (pyflakes, pycodestyle and import order, configured in pyproject.toml) and the
Snakemake files formatted (snakefmt); both pinned in requirements-test.txt."""

import subprocess
import sys

import pytest

from helpers import ROOT


def test_ruff_is_clean():
    """ruff over the package, the tests, the rule scripts and the benchmarks: a finding fails with ruff's own
    message (file, line, rule)."""
    paths = [ROOT / p for p in ("src", "tests", "workflow/scripts", "benchmarks")]
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           *map(str, paths)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


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
