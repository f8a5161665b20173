"""The evaluation data sets, in one registry: each set's kind (how it is scored), its loader, the config keys
its evaluate job reads, and the Hub data set whose layout its loader reads (when it reads one).

Adding a set: one `EvalSet` entry here plus its block under `evaluation` in
workflow/schemas/config.schema.yaml; a config then names it in `evaluation.datasets` and gives its block
(`file:` or `hub:` plus the kind's keys). The Snakefile reads this module when it builds the DAG, so it
imports no torch (the loaders import `datasets` only when called).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .data import (
    fetch_hub,
    load_bigbench_choice,
    load_bigbench_generation,
    load_commonsense_qa,
    load_gsm8k,
    load_mmlu,
    load_svamp,
    load_text,
)

# The settings each kind of set reads from its config block (besides file or hub, which give the data).
KIND_KEYS = {
    "math": ("n", "max_new_tokens"),  # greedy answers after few-shot solved GSM8K train examples
    "choice": ("n",),  # the choice of highest log-likelihood as continuation
    "qa": ("n", "max_new_tokens"),  # a generated answer against accepted strings
    "perplexity": ("max_tokens", "max_length", "stride"),  # sliding-window perplexity of one text
}


@dataclass(frozen=True)
class EvalSet:
    """`load(path)` gives a frame with the columns its kind is scored on (math: id, question, gold; choice:
    id, input, choices, correct; qa: id, input, targets) or, for perplexity, the text. `hub` is the Hub
    data set whose layout the loader reads (None: only the vendored file's layout, so no `hub:` source)."""

    name: str
    kind: str
    load: Callable
    hub: str | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return KIND_KEYS[self.kind]


REGISTRY = {
    s.name: s
    for s in (
        EvalSet("gsm8k", "math", load_gsm8k, hub="openai/gsm8k"),
        EvalSet("svamp", "math", load_svamp, hub="ChilleD/SVAMP"),
        EvalSet("social_iqa", "choice", load_bigbench_choice),
        EvalSet("strategyqa", "choice", load_bigbench_choice),
        EvalSet("qa_wikidata", "qa", load_bigbench_generation),
        EvalSet("mmlu", "choice", load_mmlu, hub="cais/mmlu"),
        EvalSet("commonsense_qa", "choice", load_commonsense_qa, hub="tau/commonsense_qa"),
        EvalSet("wikitext", "perplexity", load_text, hub="Salesforce/wikitext"),
    )
}


def hub_file(name: str) -> str:
    """Where the fetch_dataset rule puts a Hub-sourced set, relative to the working directory."""
    return f"results/data/{name}.parquet"


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


def fetch(name: str, hub: dict, out_path: str | Path) -> None:
    """Download the Hub split of evaluation set `name` into `out_path` (Parquet), checked by its loader."""
    where = f"{hub['path']}" + (f" (config {hub['name']})" if hub.get("name") else "") + f", split {hub['split']}"
    try:
        fetch_hub(hub, out_path, REGISTRY[name].load)
    except Exception as err:
        raise RuntimeError(f"evaluation data set {name!r} (config key 'evaluation.{name}.hub': {where}): "
                           f"{type(err).__name__}: {err}") from err
    print(f"{name}: fetched {where} into {out_path}")
