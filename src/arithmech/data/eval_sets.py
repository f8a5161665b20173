"""The evaluation data sets, in one registry: each set's kind (how it is scored), its loader, the config keys
its evaluate job reads, and the Hub data set whose layout its loader reads (when it reads one).

Adding a set: one `EvalSet` entry here plus its block under `evaluation` in
workflow/schemas/config.schema.yaml; a config then names it in `evaluation.datasets` and gives its block
(`file:` or `hub:` plus the kind's keys). The Snakefile reads this module while Snakemake parses the
workflow, so it needs the standard library alone: each entry names its loader in `arithmech.data.datasets`,
imported (with pandas) when a job loads the set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from arithmech import layout

# The settings each kind of set reads from its config block (besides file or hub, which give the data).
KIND_KEYS = {
    "math": ("n", "max_new_tokens"),  # greedy answers after few-shot solved GSM8K train examples
    "choice": ("n",),  # the choice of highest log-likelihood as continuation
    "qa": ("n", "max_new_tokens"),  # a generated answer against accepted strings
    "perplexity": ("max_tokens", "max_length", "stride"),  # sliding-window perplexity of one text
}


@dataclass(frozen=True)
class EvalSet:
    """`load(path)`, the function `loader` of `arithmech.data.datasets`, gives a frame with the columns its
    kind is scored on (math: id, question, gold; choice: id, input, choices, correct; qa: id, input,
    targets) or, for perplexity, the text. `hub` is the Hub data set whose layout the loader reads (None:
    only the vendored file's layout, so no `hub:` source); `hub_rows`, the rows of the Hub split
    configs/paper.yaml evaluates on, where the repository has no copy (`make plan` counts them, the
    rehearsal generates as many)."""

    name: str
    kind: str
    loader: str
    hub: str | None = None
    hub_rows: int | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return KIND_KEYS[self.kind]

    @property
    def load(self) -> Callable:
        from arithmech.data import datasets

        return getattr(datasets, self.loader)


REGISTRY = {
    s.name: s
    for s in (
        EvalSet("gsm8k", "math", "load_gsm8k", hub="openai/gsm8k"),
        EvalSet("svamp", "math", "load_svamp", hub="ChilleD/SVAMP"),
        EvalSet("social_iqa", "choice", "load_bigbench_choice"),
        EvalSet("strategyqa", "choice", "load_bigbench_choice"),
        EvalSet("qa_wikidata", "qa", "load_bigbench_generation"),
        EvalSet("mmlu", "choice", "load_mmlu", hub="cais/mmlu", hub_rows=14042),  # all, test
        EvalSet("commonsense_qa", "choice", "load_commonsense_qa", hub="tau/commonsense_qa",
                hub_rows=1221),  # validation
        EvalSet("wikitext", "perplexity", "load_text", hub="Salesforce/wikitext"),
    )
}


def hub_file(name: str) -> str:
    """Where the fetch_dataset rule puts a Hub-sourced set, relative to the working directory."""
    return layout.shared(layout.DATASET, dataset=name)


def config_problems(evaluation: dict) -> list[str]:
    """What the schema cannot say about the `evaluation` section: every set in `datasets` is a registry
    name with a block, whose source is exactly one of file and hub (hub only where the loader reads the
    Hub's layout), and a perplexity set's stride is below its window."""
    problems = []
    for i, name in enumerate(evaluation["datasets"]):
        spec, cfg = REGISTRY.get(name), evaluation.get(name)
        if spec is None:
            problems.append(f"config key 'evaluation.datasets.{i}': unknown data set {name!r}; "
                            f"known: {', '.join(REGISTRY)}")
            continue
        if cfg is None:
            problems.append(f"config key 'evaluation.{name}': missing; data set {name!r} is in evaluation.datasets")
            continue
        if (cfg.get("file") is None) == (cfg.get("hub") is None):
            problems.append(f"config key 'evaluation.{name}': give exactly one of file and hub "
                            f"(an overlay config replaces a file by `file: null` plus hub)")
        elif cfg.get("hub") is not None and spec.hub is None:
            problems.append(f"config key 'evaluation.{name}.hub': the {name} loader reads only the vendored "
                            f"file's layout; give file")
        if spec.kind == "perplexity" and cfg["stride"] >= cfg["max_length"]:
            problems.append(f"config key 'evaluation.{name}.stride': must be smaller than max_length")
    return problems


def _where(hub: dict) -> str:
    return f"{hub['path']}" + (f" (config {hub['name']})" if hub.get("name") else "") + f", split {hub['split']}"


def check_fetchable(name: str, hub: dict) -> None:
    """Raise one error naming evaluation set `name` and its config key when its Hub split cannot be fetched:
    the data set or its config is not found (or the Hub is out of reach), or it has no such split. Reads
    only the data set's metadata (`datasets.load_dataset_builder`), not its data; the Snakefile calls it
    when a run starts, before any job is queued, for every Hub set not yet fetched."""
    import tempfile

    import datasets

    try:
        with tempfile.TemporaryDirectory(prefix="arithmech-hub-check-") as cache:
            builder = datasets.load_dataset_builder(hub["path"], hub.get("name"), revision=hub.get("revision"),
                                                    cache_dir=cache)
        splits = list(builder.config.data_files or {}) or list(builder.info.splits or {})
    except Exception as err:
        raise RuntimeError(f"evaluation data set {name!r} (config key 'evaluation.{name}.hub': {_where(hub)}) "
                           f"cannot be fetched: {type(err).__name__}: {err}") from err
    if splits and hub["split"] not in splits:
        raise RuntimeError(f"evaluation data set {name!r} (config key 'evaluation.{name}.hub.split'): "
                           f"{hub['path']} has no split {hub['split']!r}; it has {', '.join(map(str, splits))}")


def unfetched_hub_sets(evaluation: dict) -> dict[str, dict]:
    """{name: hub block} of the sets in `evaluation.datasets` given by `hub:` whose Parquet file
    (`hub_file`) is not there yet."""
    return {name: evaluation[name]["hub"] for name in evaluation["datasets"]
            if evaluation[name].get("hub") is not None and not Path(hub_file(name)).is_file()}


def fetch(name: str, hub: dict, out_path: str | Path, lock: str | Path | None = None) -> None:
    """Download the Hub split of evaluation set `name` into `out_path` (Parquet), checked by its loader, at the
    commit the lock file `lock` pinned (`arithmech.hub_lock`), or pinning the one its revision resolves to."""
    from arithmech.data.datasets import fetch_hub

    where = _where(hub)
    try:
        commit = fetch_hub(hub, out_path, REGISTRY[name].load, lock)
    except Exception as err:
        raise RuntimeError(f"evaluation data set {name!r} (config key 'evaluation.{name}.hub': {where}): "
                           f"{type(err).__name__}: {err}") from err
    print(f"{name}: fetched {where}" + (f" at commit {commit}" if commit else "") + f" into {out_path}")
