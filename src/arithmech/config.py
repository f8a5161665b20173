"""Configuration checks that run before any job: the JSON schema (draft 2020-12) plus the cross-references
a schema cannot express. Every error names the offending key. They run while Snakemake parses the workflow,
so they import nothing beyond the standard library and Snakemake's own dependencies (pyyaml, jsonschema)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator


class ConfigError(ValueError):
    pass


# Keys that the workflow no longer reads, with why: a configuration still setting one gets an error naming it (the
# schema alone would only say that the section holds an unexpected key).
RETIRED_KEYS = {
    **{f"circuit.{key}": "the circuit rule and its END curves are retired: the key circuit is scored on the "
                         "teacher-forced protocol by the discover rule (docs/circuit.md)"
       for key in ("max_samples", "positions", "all_positions_samples", "grid", "random_draws", "band_draws",
                   "contrast_means")},
    "circuit.discover.protocol": "the old END-mean protocol is retired: discovery is always teacher-forced "
                                 "(docs/circuit.md)",
    "circuit.discover.measure": "the old END-mean protocol is retired: the pruning measure is "
                                "circuit.discover.tf_measure (logprob or kl)",
}


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def validate_config(config: dict, schema_path: str | Path) -> None:
    """Fill in the defaults the schema gives (a model's `resources`), then raise ConfigError listing every
    problem, each as "config key 'a.b.c': what was expected"."""
    from arithmech.data.eval_sets import config_problems

    schema = yaml.safe_load(Path(schema_path).read_text())
    _fill_model_defaults(config, schema)
    retired = _retired_problems(config)
    checked = _without_retired(config) if retired else config
    errors = sorted(Draft202012Validator(schema).iter_errors(checked), key=lambda e: list(map(str, e.absolute_path)))
    problems = retired + [f"config key '{_key(e.absolute_path)}': {_message(e, schema)}" for e in errors]
    if not problems:
        for i, name in enumerate(config["run"]["models"]):
            if name not in config["models"]:
                problems.append(
                    f"config key 'run.models.{i}': unknown model name {name!r}; "
                    f"defined under 'models': {', '.join(sorted(config['models']))}"
                )
        for task in config["run"]["tasks"]:
            if task not in config["prompts"]["operators"]:
                problems.append(f"config key 'prompts.operators.{task}': missing; task {task!r} is in run.tasks")
        ops = config["prompts"]["operands"]
        if ops["min"] > ops["max"]:
            problems.append(f"config key 'prompts.operands': min ({ops['min']}) is larger than max ({ops['max']})")
        from arithmech.data.arithmetic import FORMATS

        for fmt in FORMATS:
            rng = config["transfer"]["formats"][fmt]
            if rng["min"] > rng["max"]:
                problems.append(f"config key 'transfer.formats.{fmt}': min ({rng['min']}) is larger than max "
                                f"({rng['max']})")
        for i, method in enumerate(config["finetune"]["methods"]):
            if method not in config["finetune"]["lr"]:
                problems.append(f"config key 'finetune.lr.{method}': missing; method {method!r} is in finetune.methods")
        problems += _length_problems(config["finetune"]["train"], "finetune.train")
        problems += config_problems(config["evaluation"])  # the evaluation sets (arithmech.data.eval_sets)
        problems += _study_problems(config["study"])
        low, high = config["claims"]["middle_band"]
        if low >= high:
            problems.append(f"config key 'claims.middle_band': low ({low}) is not below high ({high})")
        problems += _split_problems(config["prompts"], config["run"]["tasks"])
        pairs = (ops["max"] - ops["min"] + 1) ** 2
        if config["prompts"]["n_shots"] >= pairs // 2:
            problems.append(f"config key 'prompts.n_shots': {config['prompts']['n_shots']} is too many for the "
                            "operand range")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def _retired_problems(config: dict) -> list[str]:
    """One problem per key of RETIRED_KEYS that the configuration sets."""
    return [f"config key '{key}': retired ({why}); remove it" for key, why in RETIRED_KEYS.items()
            if _has_key(config, key.split("."))]


def _has_key(config, path: list[str]) -> bool:
    for part in path:
        if not isinstance(config, dict) or part not in config:
            return False
        config = config[part]
    return True


def _without_retired(config: dict) -> dict:
    """A copy of the configuration without its retired keys: the schema then checks the rest."""
    config = copy.deepcopy(config)
    for key in RETIRED_KEYS:
        *parents, last = key.split(".")
        if _has_key(config, key.split(".")):
            section = config
            for part in parents:
                section = section[part]
            del section[last]
    return config


def _message(error, schema: dict) -> str:
    """The schema's message, or for an unknown fine-tuning method or study arm every valid name with what it
    trains (`sft.methods.METHODS`: a name means the same in both sections), or for a model name that is not
    one plain folder name why it is refused."""
    from arithmech.sft.methods import METHODS, RECIPE_METHODS, unknown_method

    section = list(error.absolute_path)[:2]
    if error.validator == "pattern" and error.schema == schema["$defs"]["model_name"]:
        # '..', '.' or 'a/b' would put the model's results outside results/<name>/ (or in a hidden folder)
        return (f"model name {error.instance!r} is not one plain folder name under results/: use letters, digits, "
                "'.', '_' and '-', not starting with '.'")
    if error.validator == "enum" and section in (["finetune", "methods"], ["study", "arms"]):
        return unknown_method(error.instance, RECIPE_METHODS if section[0] == "finetune" else tuple(METHODS))
    if error.validator == "pattern" and list(error.absolute_path)[-1:] == ["gpu_model"]:
        return (f"{error.instance!r} is not a GPU model the SLURM plugin submits (letters, digits, '_' and '.' "
                "only; it refuses every job of such a model): leave gpu_model out, or name a partition that holds "
                "only that GPU")
    return error.message


def _fill_model_defaults(config: dict, schema: dict) -> None:
    """Give every model without `resources` the schema's default (JSON Schema only checks; it fills nothing
    in), in place, so the rules that read `config["models"][name]["resources"]` find it."""
    default = schema["properties"]["models"]["additionalProperties"]["properties"]["resources"].get("default")
    models = config.get("models")
    if default is None or not isinstance(models, dict):
        return
    for model in models.values():
        if isinstance(model, dict) and "resources" not in model:
            model["resources"] = copy.deepcopy(default)


def _length_problems(train: dict, key: str) -> list[str]:
    """The training-length rule (`methods.length_problem`) of the section at config key `key`."""
    from arithmech.sft.methods import length_problem

    problem = length_problem(train.get("epochs"), train.get("max_steps"), f"config key '{key}'")
    return [] if problem is None else [problem]


def _split_problems(prompts: dict, tasks: list[str]) -> list[str]:
    """Each task's operand pairs must leave at least one pair in each split."""
    from arithmech.data.arithmetic import operand_pairs

    share = prompts["splits"]["validation_share"]
    problems = []
    for task in tasks:
        n = len(operand_pairs(task, prompts["operands"]["min"], prompts["operands"]["max"]))
        n_val = round(share * n)
        if not 0 < n_val < n:
            problems.append(f"config key 'prompts.splits.validation_share': {share} of the {n} operand pairs of "
                            f"{task} leaves {'no validation' if n_val == 0 else 'no identification'} pair")
    return problems


def _study_problems(study: dict) -> list[str]:
    """What the schema cannot say about the `study` section: cross-references, ranges, split sizes."""
    from arithmech.sft.study_config import AUTO, Format

    problems = []
    candidates = study["format_choice"]["candidates"]
    for section, formats in (("study.formats", study["formats"]), ("study.format_choice.candidates", candidates)):
        for name, cfg in formats.items():
            try:
                Format.from_config(name, cfg, section)
            except ValueError as err:  # bad task, ranges (low > high included) or template fields
                problems.append(str(err))
    for section, formats in (("study.formats", study["formats"]), ("study.format_choice.candidates", candidates)):
        if AUTO in formats:
            problems.append(f"config key '{section}.{AUTO}': the name '{AUTO}' is reserved (study.train_format: auto)")
    for name in set(study["formats"]) & set(candidates):
        if study["formats"][name] != candidates[name]:
            problems.append(f"config key 'study.format_choice.candidates.{name}': defined differently under "
                            f"study.formats.{name}; one name is one format (give one of them another name)")
    name = study["train_format"]
    if name != AUTO and name not in study["formats"] and name not in candidates:
        problems.append(f"config key 'study.train_format': {name!r} is neither '{AUTO}' nor one of study.formats "
                        f"({', '.join(study['formats'])}) or study.format_choice.candidates "
                        f"({', '.join(candidates)})")
    if study["format_choice"]["items"] > study["splits"]["validation"]:
        problems.append(f"config key 'study.format_choice.items': {study['format_choice']['items']} items are "
                        f"measured on the validation split, which has {study['splits']['validation']} "
                        "(study.splits.validation)")
    for arm in study["arms"]:
        if arm not in study["lr_grid"]:
            problems.append(f"config key 'study.lr_grid.{arm}': missing; arm {arm!r} is in study.arms")
    problems += _length_problems(study["train"], "study.train")
    low, high = study["base_band"]
    if low > high:
        problems.append(f"config key 'study.base_band': low ({low}) is larger than high ({high})")
    return problems
