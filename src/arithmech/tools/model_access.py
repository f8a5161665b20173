"""Before any job is queued: can every Hub model of the run be downloaded? The Snakefile's `onstart` calls
`check_models(config)`; one error lists every problem, each naming the model, its config key and what to do.

For each model of `run.models` given as a Hub id and not yet prepared (no results/<model>/model/source.json)
whose snapshot is not already complete in the model cache:
  - the model cache directory (`run.model_cache`, else huggingface_hub's: $HF_HUB_CACHE, $HF_HOME/hub) can be
    created and written, and has room for the models' weights where the plan knows their size: parameters
    (`arithmech.tools.plan.SHAPES`) x 2 bytes, as the shipped models' safetensors are 16-bit, less what the cache
    already holds of them. This needs no network.
  - the Hub gives the repository to the token huggingface_hub finds (HF_TOKEN or `hf auth login`): it exists,
    a gated one's licence was accepted, a given revision exists (`arithmech.model.hub.access_problem`).
The same problems stop prepare_model itself, with the same words, should it run later.
"""

from __future__ import annotations

from pathlib import Path

BYTES_PER_PARAMETER = 2  # the shipped Hub models' safetensors hold fp16 or bf16 weights


class ModelAccessError(RuntimeError):
    """A Hub model of the run that cannot be downloaded as configured."""


def unprepared_hub_models(config: dict, workdir: Path) -> dict[str, dict]:
    """{name: source} of the run's models given by `hub:` that prepare_model has not prepared in `workdir`."""
    sources = {name: config["models"][name]["source"] for name in config["run"]["models"]}
    return {name: source for name, source in sources.items()
            if "hub" in source and not (workdir / "results" / name / "model" / "source.json").is_file()}


def weight_bytes(repo_id: str) -> int | None:
    """The bytes of `repo_id`'s weights when the plan knows its shape (`SHAPES`), else None."""
    from arithmech.tools.plan import SHAPES

    shape = SHAPES.get(repo_id)
    return None if shape is None else shape.n_params * BYTES_PER_PARAMETER


def download_needs(sources: dict[str, dict], directory: Path) -> dict[str, int]:
    """{repo id: bytes still to download into the model cache `directory`} for the Hub `sources` whose size the
    plan knows: their weights less what the cache holds of them already (a repository counts once)."""
    from arithmech.model import hub

    repos = {source["hub"] for source in sources.values()}
    sizes = {repo: weight_bytes(repo) for repo in sorted(repos)}
    return {repo: max(0, size - hub.cached_bytes(directory, repo)) for repo, size in sizes.items() if size is not None}


def check_models(config: dict, *, workdir: str | Path = ".") -> list[str]:
    """Raise ModelAccessError listing every Hub model of the run that cannot be downloaded as configured (see
    the module's docstring). Returns notes on what could not be checked: a Snakemake installed without the
    project's packages (docs/cluster.md, route c) lacks huggingface_hub, and prepare_model, which runs with
    them, checks the same when it runs."""
    pending = unprepared_hub_models(config, Path(workdir))
    if not pending:
        return []
    try:
        import huggingface_hub  # noqa: F401

        from arithmech.model import hub
        from arithmech.tools.plan import SHAPES  # noqa: F401
    except ImportError as err:
        return [f"Hub models {', '.join(pending)} not checked before the run ({err}): prepare_model checks them"]

    model_cache = config["run"].get("model_cache")
    directory = hub.cache_dir(model_cache)
    to_fetch = {name: source for name, source in pending.items()
                if hub.cached_snapshot(source["hub"], source.get("revision"), directory) is None}
    if not to_fetch:
        return []
    needs = download_needs(to_fetch, directory)
    needed_for = (f"the weights still to download ({', '.join(f'{r} {n / 1e9:.1f} GB' for r, n in needs.items())}: "
                  f"parameters x {BYTES_PER_PARAMETER} bytes)")
    problem = hub.cache_problem(directory, hub.cache_origin(model_cache), sum(needs.values()), needed_for)
    problems = [] if problem is None else [f"models {', '.join(to_fetch)}: {problem}"]
    for name, source in to_fetch.items():
        problem = hub.access_problem(source["hub"], source.get("revision"), directory)
        if problem:
            problems.append(f"model '{name}' (config key 'models.{name}.source'): {problem}")
    if problems:
        raise ModelAccessError("cannot download the run's models, so no job was queued:\n  " + "\n  ".join(problems))
    return []
