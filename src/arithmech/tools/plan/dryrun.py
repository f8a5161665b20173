"""The configuration and the jobs as the workflow sees them: config.yaml with overlays merged as Snakemake
merges a --configfile (`snakemake.utils.update_config`) and checked as the Snakefile checks it, and the jobs a
Snakemake dry run lists, one `Job` each.

    config = load_config(["configs/paper.yaml"], root=Path("."))
    jobs = parse_dry_run(snakemake_dry_run(["configs/paper.yaml"], root=Path(".")))
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import yaml
from snakemake.utils import update_config

from arithmech.tools.plan.errors import PlanError

if TYPE_CHECKING:
    from arithmech.tools.plan.shapes import Shape


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise PlanError(f"config file '{path}': cannot read it ({err})") from err
    if not isinstance(data, dict):
        raise PlanError(f"config file '{path}': expected a YAML mapping")
    return data


def load_config(config_files: Sequence[str | Path], *, root: Path) -> dict:
    """root/config.yaml with `config_files` merged over it in order, checked as the Snakefile checks it
    (`config.validate_config`, which also fills in a model's default resources)."""
    from arithmech.config import ConfigError, validate_config

    for file in config_files:
        if not Path(file).is_file():
            raise PlanError(f"config file '{file}' not found")
    config = _read_yaml(root / "config.yaml")
    for file in config_files:
        update_config(config, _read_yaml(Path(file)))
    try:
        validate_config(config, root / "workflow" / "schemas" / "config.schema.yaml")
    except ConfigError as err:
        raise PlanError(f"{' + '.join(map(str, ['config.yaml', *config_files]))}: {err}") from err
    return config


@dataclass(frozen=True)
class Job:
    """One job of the workflow: its rule and wildcards. `added`: not in the dry run, added by the plan. `group`:
    the group job it runs in (Snakemake's group, as the dry run lists it: "<group>#<n>"), "" when it is its own."""

    rule: str
    wildcards: tuple[tuple[str, str], ...] = ()
    added: bool = False
    group: str = ""

    def get(self, key: str, default: str | None = None) -> str | None:
        return dict(self.wildcards).get(key, default)

    @property
    def label(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.wildcards if k != "model")
        return f"{self.rule}[{shown}]" if shown else self.rule


_JOB_LINE = re.compile(r"^(\s*)(?:local)?(?:rule|checkpoint) (\w+):\s*$")
_GROUP_LINE = re.compile(r"Group job (\S+) \(jobs in lexicogr\. order\):\s*$")
_WILDCARDS_LINE = re.compile(r"^\s+wildcards: (.*)$")
_STATS_LINE = re.compile(r"^(\w+)\s+(\d+)\s*$")


def parse_dry_run(text: str) -> list[Job]:
    """The jobs a `snakemake --dry-run` listing names ("rule <name>:" and its "wildcards:" line), each in the
    group job it is listed under ("Group job <group> ...:", its jobs indented below it), checked against the
    counts of its first "Job stats" table."""
    jobs: list[Job] = []
    group, groups = "", 0
    for line in text.splitlines():
        found = _GROUP_LINE.search(line)
        if found:
            group, groups = f"{found[1]}#{groups}", groups + 1
            continue
        header = _JOB_LINE.match(line)
        if header:
            if not header[1]:
                group = ""  # a job listed on its own ends the group job above it
            jobs.append(Job(header[2], group=group))
            continue
        found = _WILDCARDS_LINE.match(line)
        if found and jobs:
            pairs = tuple(tuple(part.split("=", 1)) for part in found[1].split(", "))
            jobs[-1] = replace(jobs[-1], wildcards=pairs)
    listed: dict[str, int] = {}
    for job in jobs:
        listed[job.rule] = listed.get(job.rule, 0) + 1
    stats = job_stats(text)
    if not jobs or listed != stats:
        raise PlanError(f"the dry run's job listing ({listed}) does not match its Job stats ({stats})")
    return jobs


def job_stats(text: str) -> dict[str, int]:
    """Jobs per rule from the first "Job stats" table of Snakemake's output (without its total)."""
    lines = text.splitlines()
    if "Job stats:" not in lines:
        return {}
    counts = {}
    for line in lines[lines.index("Job stats:") + 3:]:
        row = _STATS_LINE.match(line)
        if row is None or row[1] == "total":
            break
        counts[row[1]] = int(row[2])
    return counts


SLURM_PROFILE = Path("workflow/profiles/slurm/config.yaml")  # the workflow's SLURM profile, under the checkout
GROUP_KEYS = ("groups", "group-components")  # its keys that group jobs into allocations (Snakemake's options)


def profile_groups(root: Path) -> dict[str, list[str]]:
    """The SLURM profile's grouping (root/`SLURM_PROFILE`): {"groups": ["rule=group", ...], "group-components":
    ["group=n", ...]}, each as the profile lists it."""
    data = _read_yaml(root / SLURM_PROFILE)
    out = {}
    for key in GROUP_KEYS:
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
            raise PlanError(f"{SLURM_PROFILE}: {key} is expected as a list of 'name=value' strings, found {value!r}")
        out[key] = value
    return out


def snakemake_dry_run(config_files: Sequence[str | Path], *, root: Path, quiet: bool = False,
                      groups: dict[str, list[str]] | None = None) -> str:
    """The output of `snakemake --dry-run` with `config_files` over root/config.yaml in an empty temporary
    working directory, so that no result already computed is left out; `quiet`: only the counts
    (`--quiet rules`); `groups`: the SLURM profile's grouping (`profile_groups`), which the listing then shows as
    group jobs."""
    with tempfile.TemporaryDirectory(prefix="arithmech-plan-") as work:
        shutil.copy2(root / "config.yaml", Path(work) / "config.yaml")  # the Snakefile's `configfile:`
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(root / "Snakefile"), "--directory", work,
               "--dry-run", "--cores", "1", *(["--quiet", "rules"] if quiet else [])]
        for key, values in (groups or {}).items():
            if values:
                cmd += [f"--{key}", *values]
        if config_files:
            cmd += ["--configfile", *(str(Path(f).resolve()) for f in config_files)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work, timeout=600)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise PlanError(f"the dry run failed ({' '.join(cmd)}):\n{log[-3000:]}")
    return log


def checkpoint_jobs(jobs: list[Job], config: dict, shapes: dict[str, Shape], grouped: dict[str, str] | None = None
                    ) -> list[Job]:
    """Jobs a dry run cannot list yet: in total mode the per-layer `patch_layer` jobs follow from the
    layers prepare_model (a checkpoint) finds; one per layer of each model, from its shape. `grouped`: rule ->
    group of the SLURM profile; a `patch_layer` job reads every operator's pairs and cache, so with its rule grouped
    it joins the group jobs of its model that hold them, which it connects into one: those jobs (in `jobs`, changed
    in place) and the added ones get one group id."""
    if config["patching"]["mode"] != "total" or any(job.rule == "patch_layer" for job in jobs):
        return []
    group = (grouped or {}).get("patch_layer", "")
    added = []
    for name, shape in shapes.items():
        joined = f"{group}#{name}" if group else ""
        for i, job in enumerate(jobs):
            if group and job.get("model") == name and job.group.split("#")[0] == group:
                jobs[i] = replace(job, group=joined)
        added += [Job("patch_layer", (("model", name), ("layer", str(layer))), added=True, group=joined)
                  for layer in range(shape.n_layers)]
    return added

