"""`snakemake --profile slurm` from the checkout, and the user's own profiles beside the workflow's (docs/cluster.md).

The workflow's SLURM profile lives in `workflow/profiles/slurm/`; the checkout's top-level `slurm` links to it, so
that `snakemake --profile slurm` typed in the checkout finds it (Snakemake looks for a bare profile name in the
working directory first, then in the user's and the site's configuration directories). That same order hides a
profile of the user's or the site's that is also named `slurm`, and a user's `--profile` layered under the
workflow profile (`--workflow-profile`) loses its `jobs` to the workflow's. Where a user's profile and the
workflow's meet, the user's limits win: `fold_in_user_profiles` (called by the Snakefile while it parses, in the
submitting process) applies their `jobs` and, for a hidden profile, their `default-resources` (account, partition,
QOS, ...), and says which of their other keys it could not apply. Snakemake copies its job limit into the workflow's
global resources (`_nodes`, which the scheduler and the line "Provided remote nodes: N" read) when the workflow object
is made, before the Snakefile parses: the limit is set there too, and the note says "jobs N" only once it holds.

Read by the Snakefile while it parses: standard library and Snakemake only.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

PROFILE_NAME = "slurm"
WORKFLOW_PROFILE = Path("workflow/profiles") / PROFILE_NAME  # relative to the checkout
# Keys of a user's profile that the workflow applies itself (the rest is reported, not applied).
FOLDED_KEYS = ("jobs", "default-resources")


class ProfileError(ValueError):
    """A user's profile that cannot be combined with the workflow's; the message names the file and the key."""


def profile_args(argv: list[str]) -> tuple[list[str], str | None]:
    """The `--profile` values and the `--workflow-profile` value of a Snakemake command line."""
    profiles, workflow_profile, current = [], None, None
    for arg in argv:
        if arg.startswith("--profile="):
            profiles.append(arg.split("=", 1)[1])
            current = None
        elif arg.startswith("--workflow-profile="):
            workflow_profile, current = arg.split("=", 1)[1], None
        elif arg in ("--profile", "--workflow-profile"):
            current = arg
        elif current == "--profile" and not arg.startswith("-"):
            profiles.append(arg)  # --profile takes one or more values
        elif current == "--workflow-profile" and not arg.startswith("-"):
            workflow_profile, current = arg, None
        else:
            current = None
    return profiles, workflow_profile


def is_snakemake_command(argv: list[str]) -> bool:
    """Whether this process is Snakemake's command line (`snakemake ...`, `python -m snakemake ...`), not
    Snakemake's Python API inside another program (whose command line and environment are its own)."""
    program = Path(argv[0]) if argv else Path()
    return program.name == "snakemake" or program.parent.name == "snakemake"


def snakemake_argv(argv: list[str]) -> list[str]:
    """The options of `argv` when it is a Snakemake command line; an empty list otherwise."""
    return argv[1:] if is_snakemake_command(argv) else []


def profile_file(where: Path) -> Path | None:
    """The YAML file of the profile at `where` (a folder or the file itself), as Snakemake picks it."""
    from snakemake.cli import get_profile_dir

    found = get_profile_dir(str(where)) if where.exists() else None
    return Path(found[1]) if found else None


def config_dirs() -> list[Path]:
    """The user's and the site's Snakemake configuration directories, in Snakemake's search order."""
    from snakemake.cli import get_appdirs

    dirs = get_appdirs()
    return [Path(dirs.user_config_dir), Path(dirs.site_config_dir)]


def is_workflow_profile(path: Path, checkout: Path) -> bool:
    try:
        return path.resolve() == (checkout / WORKFLOW_PROFILE).resolve() or \
            path.resolve() == (checkout / WORKFLOW_PROFILE / "config.yaml").resolve()
    except OSError:
        return False


def user_profiles(argv: list[str], cwd: Path, checkout: Path) -> list[tuple[Path, bool]]:
    """The user's or site's profile files in play beside the workflow's: (file, hidden). `hidden`: named `slurm`
    in a configuration directory while `--profile slurm` found the checkout's own first; otherwise a `--profile`
    of the command line that is not the workflow's, used when the workflow profile is layered over it."""
    profiles, workflow_profile = profile_args(argv)
    workflow_layered = workflow_profile is not None and is_workflow_profile(
        Path(workflow_profile) if Path(workflow_profile).is_absolute() else cwd / workflow_profile, checkout)
    out = []
    for name in profiles:
        here = Path(name) if Path(name).is_absolute() else cwd / name
        if here.exists() and is_workflow_profile(here, checkout):
            if name == PROFILE_NAME:  # found in the working directory: a user's or site's `slurm` is hidden
                hidden = next((f for d in config_dirs() if (f := profile_file(d / name))), None)
                if hidden is not None:
                    out.append((hidden, True))
            continue
        found = profile_file(here) if here.exists() else next(
            (f for d in config_dirs() if (f := profile_file(d / name))), None)
        if found is not None and workflow_layered:
            out.append((found, False))
    return out


def resource_exprs(value, source: Path) -> list[str]:
    """A profile's `default-resources` as Snakemake's `KEY=VALUE` expressions."""
    if isinstance(value, dict):
        return [f"{key}={val}" for key, val in value.items()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ProfileError(f"{source}: default-resources must be a mapping or a list of KEY=VALUE strings, "
                       f"not {value!r}")


def read_profile(path: Path) -> dict:
    try:
        settings = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ProfileError(f"{path}: cannot be read as a Snakemake profile ({err})") from None
    if not isinstance(settings, dict):
        raise ProfileError(f"{path}: a Snakemake profile is a YAML mapping of options, not {type(settings).__name__}")
    return settings


def jobs_given(argv: list[str]) -> bool:
    """Whether a Snakemake command line gives the job limit itself (`--jobs N`, `-j N`, `-jN`), which wins over any
    profile's."""
    return any(arg in ("--jobs", "-j") or arg.startswith("--jobs=") or re.fullmatch(r"-j\d+", arg) for arg in argv)


def set_job_limit(workflow, jobs: int) -> bool:
    """Make `jobs` Snakemake's limit of jobs queued at once, while the Snakefile parses: in its resource settings and
    in the copy the scheduler reads (`global_resources["_nodes"]`, made before the parse). Whether it holds."""
    workflow.resource_settings.nodes = jobs
    workflow.global_resources["_nodes"] = jobs
    return workflow.nodes == jobs


def fold_in_user_profiles(workflow, argv: list[str], cwd: Path, checkout: Path) -> list[str]:
    """Apply the user's limits over the workflow profile's (see the module's docstring) to Snakemake's `workflow`
    (while it parses): its job limit (`set_job_limit`) and its `resource_settings`; returns one note per profile
    saying what was applied and what was not. Raises `ProfileError` for a profile that names another executor."""
    from snakemake.resources import Resources

    resource_settings = workflow.resource_settings
    ours = read_profile(checkout / WORKFLOW_PROFILE / "config.yaml")
    notes = []
    for path, hidden in user_profiles(argv, cwd, checkout):
        theirs = read_profile(path)
        executor = theirs.get("executor")
        if hidden and executor not in (None, ours["executor"]):
            raise ProfileError(f"{path}: executor is {executor!r}, and `--profile {PROFILE_NAME}` in this checkout "
                               f"runs the workflow's SLURM profile ({WORKFLOW_PROFILE}); name your profile "
                               "otherwise, or give its path to --profile")
        applied = []
        if "jobs" in theirs and jobs_given(argv):
            applied.append(f"not jobs {theirs['jobs']} (the command line's --jobs wins)")
        elif "jobs" in theirs:
            jobs = int(theirs["jobs"])
            if set_job_limit(workflow, jobs):
                applied.append(f"jobs {jobs}")
            else:
                raise ProfileError(f"{path}: jobs {jobs} could not be applied (Snakemake's limit stays "
                                   f"{workflow.nodes}): give --jobs {jobs} on the command line")
        if hidden and theirs.get("default-resources"):
            exprs = resource_exprs(theirs["default-resources"], path)
            if resource_settings.default_resources is None:
                resource_settings.default_resources = Resources.default("full")  # what Snakemake gives a cluster
            resource_settings.default_resources.update(Resources.parse(exprs, allow_expressions=True))
            applied.append("default-resources " + " ".join(exprs))
        skipped = sorted(key for key in theirs if hidden and key not in FOLDED_KEYS and key != "executor"
                         and theirs[key] != ours.get(key))
        note = f"profile {path}: " + (", ".join(applied) if applied else "nothing to apply")
        if skipped:
            note += (f"; not applied (the workflow's SLURM profile is used): {', '.join(skipped)}: give them on the "
                     "command line")
        notes.append(note)
    return notes


def check_per_cpu_memory(default_resources, model_memory: dict[str, int | None]) -> list[str]:
    """Raise `ProfileError` when the run's default resources carry `mem_mb_per_cpu`: the SLURM plugin passes it
    instead of a job's `mem_mb` (`--mem-per-cpu` wins over `--mem`), so every rule's memory and the retries'
    growth would be silently ignored. `model_memory`: each model's `resources.mem_mb`, named in the message."""
    if default_resources is None or "mem_mb_per_cpu" not in default_resources.keys():
        return []
    value = default_resources["mem_mb_per_cpu"].value
    ours = ", ".join(f"models.{model}.resources.mem_mb {mb}" for model, mb in model_memory.items())
    raise ProfileError(f"default-resources sets mem_mb_per_cpu={value} (a profile or the command line), which the "
                       f"SLURM plugin passes instead of every job's mem_mb ({ours}) and of a retry's larger memory: "
                       "remove mem_mb_per_cpu from default-resources; set a model's memory in "
                       "models.<name>.resources.mem_mb")
