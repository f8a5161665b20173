"""Where every result lives under results/: one name for each file or directory the rules write, read by the rules
(workflow/rules/*.smk), `make docs` (arithmech.tools.docs_results), the scorecard and the findings page
(arithmech.report), `make plan` and the rehearsal. Standard library only: the Snakefile imports it while it parses.

A name is a pattern relative to a model's directory, `results/{model}/`, with the rules' wildcards in braces
(`task`, `layer`, `method`, `dataset`, `arm`, `run`); `under(pattern)` puts it under `results/{model}/`,
`pattern.format(task=...)` fills it in. Every rule also writes its log under `<model>/logs/` and Snakemake's
benchmark under `<model>/benchmarks/` (`LOGS`, `BENCHMARKS`: `make plan --compare` reads them), named after the rule
and its wildcards.
"""

from __future__ import annotations

import re

RESULTS = "results"
MODEL_DIR = RESULTS + "/{model}"
LOGS = "logs"
BENCHMARKS = "benchmarks"

# Shared by every model: the Hub sets that rule fetch_dataset downloads, relative to results/
DATASET = "data/{dataset}.parquet"

# The model, prepared once (weights in the workflow's dtype, tokenizer)
MODEL = "model"

# Identify: the prompt pairs, their activations, path patching, the key components
PAIRS = "pairs/{task}.parquet"
PAIRS_DROPPED = "pairs/{task}_dropped.parquet"
ACTIVATIONS = "activations/{task}.safetensors"
PATCHING_LAYER = "patching/{task}/layer{layer}.parquet"
PATCHING_ALL_LAYERS = "patching/{task}/all_layers.parquet"
EFFECTS = "effects/{task}.parquet"
EFFECTS_FIGURE = "effects/{task}.png"
KEY = "key_components/{task}.parquet"
KEY_HTML = "key_components/{task}.html"
SHARED = "key_components/shared.parquet"
SHARED_HTML = "key_components/shared.html"
SHARED_FIGURE = "key_components/shared.png"

# Validate: the knockout and the transfer
KNOCKOUT = "knockout/{task}.parquet"
KNOCKOUT_ITEMS = "knockout/{task}_items.parquet"
KNOCKOUT_FIGURE = "knockout/{task}.png"
TRANSFER = "knockout/transfer.parquet"
TRANSFER_ITEMS = "knockout/transfer_items.parquet"
TRANSFER_HTML = "knockout/transfer.html"
TRANSFER_FIGURE = "knockout/transfer.png"

# Analyze: attention roles and MLP probes
ROLES = "analysis/{task}_roles.parquet"
ROLES_ALL = "analysis/{task}_roles_all.parquet"
EXAMPLE = "analysis/{task}_example.parquet"
PROBES = "analysis/{task}_probes.parquet"
ROLES_FIGURE = "analysis/{task}_roles.png"
EXAMPLE_FIGURE = "analysis/{task}_example.png"
PROBES_FIGURE = "analysis/{task}_probes.png"

# Circuit: the key heads' edges cut, the edge curve
EDGE_PATHS = "circuit/{task}_edge_paths.parquet"
EDGE_CURVE = "circuit/{task}_edge_curve.parquet"
EDGE_CURVE_FIGURE = "circuit/edge_curve.png"

# Discover: circuits chosen by pruning, scored on held-out pairs
DISCOVER = "discover/{task}.parquet"
DISCOVER_PATH = "discover/{task}_path.parquet"
DISCOVER_VALIDATION = "discover/{task}_validation.parquet"
DISCOVER_ITEMS = "discover/{task}_items.parquet"
DISCOVER_ADDED = "discover/{task}_added.parquet"
DISCOVER_PATH_FIGURE = "discover/{task}_path.png"
DISCOVER_CIRCUIT_FIGURE = "discover/{task}_circuit.png"
UNION_VALIDATION = "discover/union_validation.parquet"
SHARED_CIRCUITS = "discover/shared.parquet"  # the shared circuit: pruned on every operator's pairs together
SHARED_VALIDATION = "discover/shared_validation.parquet"
SHARED_ITEMS = "discover/shared_items.parquet"
SHARED_SUMMARY = "discover/shared_summary.parquet"
DISCOVER_SUMMARY = "discover/summary.parquet"

# Fine-tuning and evaluation
FINETUNED = "finetune/{method}"
FINETUNE_CHECKPOINTS = "finetune/.checkpoints"
EVAL = "eval/{method}/{dataset}.parquet"
EVAL_SUMMARY = "eval/summary.parquet"
EVAL_SUMMARY_MD = "eval/summary.md"
EVAL_SUMMARY_HTML = "eval/summary.html"
EVAL_SUMMARY_FIGURE = "eval/summary.png"

# The precise-SFT study
STUDY_DIR = "finetune/study"
STUDY_CHECKPOINTS = STUDY_DIR + "/.checkpoints"
STUDY_FORMATS = STUDY_DIR + "/formats.parquet"
STUDY_ITEMS = STUDY_DIR + "/items.parquet"
STUDY_RUN = STUDY_DIR + "/runs/{arm}/{run}"
STUDY_SELECT = STUDY_DIR + "/select/{arm}.json"
STUDY_EVAL = STUDY_DIR + "/eval/{arm}/{run}.parquet"
STUDY = "finetune/study.parquet"
COMPARISONS = "finetune/comparisons.parquet"
STUDY_MD = "finetune/study.md"
STUDY_HTML = "finetune/study.html"
STUDY_FIGURE = "finetune/study.png"
STUDY_CURVES_FIGURE = "finetune/study_curves.png"

# The scorecard and the findings page
CLAIMS = "claims.parquet"
CLAIMS_MD = "claims.md"
CLAIMS_HTML = "claims.html"
FINDINGS = "findings.html"


class _KeepMissing(dict):
    def __missing__(self, key):
        return "{" + key + "}"


def under(pattern: str, model: str = "{model}", **values: object) -> str:
    """`pattern` under its model's directory, `results/{model}/<pattern>`, with the wildcards given filled in and
    the others kept for Snakemake (`under(KEY, "smollm2-135m")` -> results/smollm2-135m/key_components/{task}.parquet;
    `under(KEY, task="addition")` -> results/{model}/key_components/addition.parquet)."""
    return MODEL_DIR.format(model=model) + "/" + pattern.format_map(_KeepMissing(values))


def shared(pattern: str, **values: object) -> str:
    """A result every model shares (`DATASET`), `results/<pattern>`, with the wildcards given filled in."""
    return f"{RESULTS}/" + pattern.format_map(_KeepMissing(values))


def match(pattern: str, path: str) -> dict[str, str] | None:
    """The wildcards' values when `path` is an instance of `pattern` (each wildcard within one path component),
    else None: `match(KNOCKOUT_FIGURE, "knockout/addition.png")` -> {"task": "addition"}."""
    parts = re.split(r"\{(\w+)\}", pattern)  # literal, name, literal, name, ..., literal
    regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
    found = re.fullmatch(regex, path)
    return found.groupdict() if found else None
