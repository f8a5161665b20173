"""Every configuration example of the user's guide works as written: each ```yaml block of README.md,
docs/configuration.md and docs/cluster.md is written to a file and given to the real workflow as
`--configfile` over config.yaml, in a dry run (`snakemake -n`), as a user would run it.

Only ```yaml blocks are examples; the docs write any YAML that is not a runnable overlay in another fence.
A local model directory that does not exist on this machine (`source: {path: /data/models/my-model}`) is
replaced by the tiny offline model, so the example's shape is what is tested, not the reader's disk."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT

PAGES = ["README.md", "docs/configuration.md", "docs/cluster.md"]
FENCE = re.compile(r"^```yaml[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def yaml_examples() -> list[tuple[str, str]]:
    """(page:line, text) of every ```yaml block of the pages that exist."""
    found = []
    for page in PAGES:
        path = ROOT / page
        if not path.is_file():
            continue
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page}:{line}", match.group(1)))
    return found


EXAMPLES = yaml_examples()


def test_the_readme_has_configuration_examples():
    assert any(where.startswith("README.md:") for where, _ in EXAMPLES), "no ```yaml example found in README.md"


def local_paths_to(example: dict, model_dir: Path) -> dict:
    """The example with every model's local `source.path` that does not exist here pointed at `model_dir`."""
    for model in (example.get("models") or {}).values():
        source = (model or {}).get("source") or {}
        if "path" in source and not Path(source["path"]).exists():
            source["path"] = str(model_dir)
    return example


@pytest.mark.parametrize("where,text", EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_example_dry_runs(where, text, tiny_dir, tmp_path):
    example = yaml.safe_load(text)
    assert isinstance(example, dict), f"{where}: a configuration example is a YAML mapping"
    (tmp_path / "example.yaml").write_text(yaml.safe_dump(local_paths_to(example, tiny_dir), sort_keys=False))
    shutil.copy2(ROOT / "config.yaml", tmp_path / "config.yaml")  # what `configfile:` reads, as in a checkout
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
           "--cores", "1", "--dry-run", "--configfile", "example.yaml"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{where}: the example fails a dry run:\n{text}\n{log[-3000:]}"
    assert "Job stats" in log, f"{where}: the dry run planned no job:\n{log[-3000:]}"
    assert not (tmp_path / "results").exists()
