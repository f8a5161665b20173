"""The precise-SFT study's parts on the tiny CPU model: teacher-forced exact match against greedy decoding,
KL windows against a one-forward reference, the item splits, the layer-matched random heads, the arms, the
lr choice, learning-curve callbacks across a resume, comparisons and the config checks."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from arithmech.config import ConfigError, validate_config
from arithmech.data.arithmetic import continuation_ids
from arithmech.interp.nodes import layer_matched_heads
from arithmech.intervention.generation import greedy_generate
from arithmech.model.loading import load_model
from arithmech.sft import design as sd
from arithmech.sft import study_config
from arithmech.sft import training as ft
from arithmech.sft.scoring import divergence_windows, score_targets
from arithmech.stages.study import run_study_format, run_study_items, run_study_summary
from helpers import ROOT, prepared_model_dir, tiny_config

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


def _study() -> dict:
    return tiny_config()["study"]


# ---------------------------------------------------------------------------------------------------
# scoring


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("biased", [True, False])
def test_greedy_match_is_greedy_decoding_and_nll_is_the_unbatched_sum(tiny_lm, shared, biased):
    """greedy_match is whether greedy decoding starts with the target's tokens, and the NLL is the sum of
    -log p of the target tokens from one plain forward per item. `biased`: a hook on the unembedding makes
    "7" every greedy token, so targets "777" match and "778" / "77" + "." fail on their last token."""
    prefix = "12 + 13 = 25.\n14 + 11 = 25.\n" if shared else ""
    prompts = [f"{prefix}{a} + {b} = " for a, b in [(10, 12), (17, 19), (15, 11), (13, 13), (19, 10)]]
    prompts[2] = ("x " if not shared else "") + prompts[2]
    targets = ["777", "778", "777", "77.", "777"]
    seven = tiny_lm.tokenizer("7", add_special_tokens=False)["input_ids"][-1]

    def bias(module, args, output):
        output = output.clone()
        output[..., seven] += 100.0
        return output

    handle = tiny_lm.model.lm_head.register_forward_hook(bias) if biased else None
    try:
        scores = score_targets(tiny_lm, prompts, targets, batch_size=2)
        generated = greedy_generate(tiny_lm, prompts, 4, batch_size=8)
        for i, (p, t) in enumerate(zip(prompts, targets)):
            ctx, cont = continuation_ids(tiny_lm.tokenizer, p, t)
            with torch.no_grad():
                logp = tiny_lm.model(input_ids=torch.tensor([ctx + cont])).logits[0].float().log_softmax(-1)
            steps = logp[len(ctx) - 1 : len(ctx) - 1 + len(cont)]
            assert scores["n_tokens"][i] == len(cont)
            assert scores["nll"][i] == pytest.approx(-float(steps.gather(-1, torch.tensor(cont)[:, None]).sum()),
                                                     rel=1e-4, abs=1e-4)
            assert bool(scores["greedy_match"][i]) == (generated[i].tolist()[: len(cont)] == cont)
    finally:
        if handle is not None:
            handle.remove()
    assert scores["greedy_match"].tolist() == ([True, False, True, False, True] if biased else [False] * 5)


def test_score_targets_errors(tiny_lm):
    with pytest.raises(ValueError, match="2 prompts but 1 targets"):
        score_targets(tiny_lm, ["a", "b"], ["c"], 2)


def test_divergence_windows_against_one_forward(tiny_dir, tiny_lm):
    text = " ".join(f"{i} plus {i + 1} is {2 * i + 1}." for i in range(40))
    base_rows = divergence_windows(tiny_lm, None, text, max_tokens=150, window=64)
    assert (base_rows["kl"] == 0).all() and np.allclose(base_rows["nll"], base_rows["ref_nll"])
    ids = tiny_lm.tokenizer(text)["input_ids"][:150]
    assert base_rows["n_tokens"].sum() == sum(len(ids[s : s + 64]) - 1 for s in range(0, 149, 64))
    other = load_model(tiny_dir, device="cpu")
    with torch.no_grad():
        other.model.model.layers[1].mlp.down_proj.weight.mul_(1.5)
    rows = divergence_windows(other, tiny_lm, text, max_tokens=150, window=64)
    with torch.no_grad():  # the first window by hand
        chunk = torch.tensor([ids[:64]])
        p = tiny_lm.model(input_ids=chunk).logits[0, :-1].float().log_softmax(-1)
        q = other.model(input_ids=chunk).logits[0, :-1].float().log_softmax(-1)
    assert rows["kl"][0] == pytest.approx(float((p.exp() * (p - q)).sum()), rel=1e-4)
    assert rows["ref_nll"].sum() == pytest.approx(base_rows["nll"].sum(), rel=1e-6)
    assert (rows["kl"] > 0).all()


# ---------------------------------------------------------------------------------------------------
# items and arms


def _items(tiny_dir, study, identify=None):
    from arithmech.model.loading import LoadedModel

    tok = LoadedModel.load_tokenizer(tiny_dir)
    return sd.build_items(tok, study, identify or {}, ".\n", seed=0)


def test_items_split_operand_pairs_without_overlap(tiny_dir):
    study = _study()
    identify = {"addition": {(10, 10), (11, 12)}, "multiplication": {(2, 3)}}
    items = _items(tiny_dir, study, identify)
    add = items[items["format"] == "add2"]
    sizes = add.groupby("split").size()
    assert sizes.to_dict() == {"test": 10, "train": 12, "validation": 6}
    assert add["pair"].is_unique  # one item per operand pair, so splits are disjoint in pairs
    assert not {(10, 10), (11, 12)} & set(zip(items.loc[items["task"] == "addition", "a"],
                                              items.loc[items["task"] == "addition", "b"]))
    assert not ((items["task"] == "multiplication") & (items["a"] == 2) & (items["b"] == 3)).any()
    mul = items[items["format"] == "mul_words"]
    assert set(mul["split"]) == {"test"} and len(mul) == 4  # transfer_test
    assert (items["answer"] == [sd.answer(t, a, b) for t, a, b in zip(items["task"], items["a"], items["b"])]).all()
    for r in items.to_dict("records"):  # the prompt ends where the answer starts; the target ends the line
        fmt = study["formats"][r["format"]]
        question = fmt["template"].format(a=r["a"], op=fmt["operator"], b=r["b"])
        assert (r["prompt"] + r["target"]).endswith(f"{question}{r['answer']}.")
        shots = {tuple(p) for p in json.loads(r["shots"])}
        test_pairs = set(zip(items.loc[(items["format"] == r["format"]) & (items["split"] == "test"), "a"],
                             items.loc[(items["format"] == r["format"]) & (items["split"] == "test"), "b"]))
        assert not shots & test_pairs
    prefixes = items["prompt"].map(lambda p: p[: p.rfind("\n") + 1])
    assert (prefixes.groupby(items["format"]).nunique() == 1).all()  # one fixed few-shot prefix per format
    assert prefixes.str.count("\n").eq(study["n_shots"]).all()


def test_transfer_tests_skip_the_trained_formats_train_pairs(tiny_dir):
    study = _study()
    study["formats"]["add_words"] = {"task": "addition", "template": "{a} {op} {b} is equal to ", "operator": "plus",
                                     "a": [10, 19], "b": [10, 19]}
    study["transfer_test"] = 100
    items = _items(tiny_dir, study)
    trained = items[(items["format"] == "add2") & (items["split"] != "test")]
    other = items[items["format"] == "add_words"]
    assert not set(trained["pair"]) & set(other["pair"])
    assert len(other) == 100 - 12 - 6 - study["n_shots"]  # every pair left but the shots


def test_too_few_pairs_names_the_key(tiny_dir):
    study = _study()
    study["splits"]["train"] = 1000
    with pytest.raises(ValueError, match="config key 'study.splits'.*add2"):
        _items(tiny_dir, study)


# ---------------------------------------------------------------------------------------------------
# choosing the trained format


def _measured(*rows) -> pd.DataFrame:
    """(format, exact match) rows, measured on 50 items; exact match None: too few pairs, not measured."""
    return pd.DataFrame([{"format": name, "eligible": value is not None, "n": 0 if value is None else 50,
                          "exact_match": np.nan if value is None else value,
                          "reason": "not measured: too few operand pairs" if value is None else ""}
                         for name, value in rows])


def test_choice_is_the_format_inside_the_band_closest_to_its_middle():
    measured = _measured(("easy", 0.9), ("wide", 0.56), ("good", 0.36), ("hard", 0.1), ("tiny", None))
    table, choice = sd.choose_format(measured, [0.2, 0.6], "auto")
    assert choice["chosen"] == "good" and list(table["chosen"]) == [False, False, True, False, False]
    assert list(table["in_band"]) == [False, True, True, False, False]
    assert table["distance"].tolist()[:4] == pytest.approx([0.5, 0.16, 0.04, 0.3])
    reasons = dict(zip(table["format"], table["reason"]))
    assert reasons["good"].startswith("chosen: inside the band") and "good is closer" in reasons["wide"]
    assert reasons["easy"].startswith("above the band") and reasons["hard"].startswith("below the band")
    assert reasons["tiny"].startswith("not measured: too few operand pairs")
    assert "good: base exact match 36.0% on 50 items" in choice["reason"] and not choice["nearest"]
    # the band's ends are inside it; a format that was not measured is never chosen
    assert sd.choose_format(_measured(("edge", 0.6), ("x", None)), [0.2, 0.6], "auto")[1]["chosen"] == "edge"


def test_a_tie_goes_to_the_format_listed_first():
    for order in (["low", "high"], ["high", "low"]):
        values = {"low": 0.35, "high": 0.45}  # both 0.05 from the middle of [0.2, 0.6]
        table, choice = sd.choose_format(_measured(*((n, values[n]) for n in order)), [0.2, 0.6], "auto")
        assert choice["chosen"] == order[0]
        assert "listed first" in table.set_index("format").loc[order[1], "reason"]


def test_none_in_the_band_chooses_nothing_and_names_the_nearest():
    measured = _measured(("add2", 0.95), ("add3", 0.7), ("mul2", 0.12), ("div2", 0.03), ("add1", None))
    table, choice = sd.choose_format(measured, [0.2, 0.6], "auto")
    assert choice["chosen"] is None and not table["chosen"].any()
    assert choice["nearest"] == [{"format": "mul2", "exact_match": 0.12, "side": "below"},
                                 {"format": "add3", "exact_match": 0.7, "side": "above"}]
    assert list(table.loc[table["nearest"], "format"]) == ["add3", "mul2"]
    assert "nearest: mul2 12.0% (below), add3 70.0% (above)" in choice["reason"]
    assert "study.base_band [0.2, 0.6]" in choice["reason"] and "study.train_format" in choice["reason"]
    assert "the nearest above it" in table.set_index("format").loc["add3", "reason"]
    # nothing measurable at all: the reason says so
    _, choice = sd.choose_format(_measured(("add1", None)), [0.2, 0.6], "auto")
    assert choice["chosen"] is None and "enough operand pairs" in choice["reason"]


def test_a_named_format_is_chosen_wherever_it_lies():
    table, choice = sd.choose_format(_measured(("add2", 0.95), ("mul2", 0.4)), [0.2, 0.6], "add2")
    assert choice["chosen"] == "add2" and "outside study.base_band" in choice["reason"]
    assert table.set_index("format").loc["add2", "reason"] == "named by study.train_format; above the band"
    assert "mul2 is closer" not in table.set_index("format").loc["mul2", "reason"]
    with pytest.raises(ValueError, match="'nope' was not measured"):
        sd.choose_format(_measured(("add2", 0.5)), [0.2, 0.6], "nope")


def _with_candidates(study: dict, **candidates) -> dict:
    study = copy.deepcopy(study)
    study["format_choice"] = {"items": 4, "candidates": candidates}
    return study


ADD = {"task": "addition", "template": "{a} {op} {b} = ", "operator": "+"}


def test_measured_items_are_the_first_validation_items_of_the_format_when_trained(tiny_dir):
    """The items a candidate is measured on are exactly the first validation items build_items makes when it
    is trained (same pairs, same few-shot prefix): the choice never sees a test item of the chosen format."""
    from arithmech.model.loading import LoadedModel

    tok = LoadedModel.load_tokenizer(tiny_dir)
    study = _with_candidates(_study(), add2=_study()["formats"]["add2"], sub=dict(ADD, task="subtraction", operator="-",
                                                                                 a=[20, 40], b=[10, 19]))
    identify = {"addition": {(10, 10), (12, 13)}}
    for name in ("add2", "sub"):
        trained = study | {"formats": study_config.study_formats(study, name), "train_format": name}
        items = sd.build_items(tok, trained, identify, ".\n", seed=3)
        candidate = study_config.candidate_formats(study)[name]
        measured = sd.measurement_items(tok, candidate, identify, study, ".\n", seed=3)
        val = items[(items["format"] == name) & (items["split"] == "validation")].head(4)
        pd.testing.assert_frame_equal(measured.reset_index(drop=True), val.reset_index(drop=True))
        test = items[(items["format"] == name) & (items["split"] == "test")]
        assert not set(measured["pair"]) & set(test["pair"])
    assert "sub" in study_config.study_formats(study, "sub")
    assert set(study_config.study_formats(study, None)) == set(study["formats"])
    small = study_config.Format.from_config("small", dict(ADD, a=[1, 3], b=[1, 3]))  # 9 pairs, 30 needed
    assert sd.measurement_items(tok, small, {}, study, ".\n", seed=3) is None


def test_format_stage_measures_every_candidate_and_records_the_choice(tiny_dir, tmp_path):
    from arithmech.io import read_parquet_meta

    pairs = tmp_path / "addition.parquet"
    pd.DataFrame({"a": [10, 11], "b": [10, 11]}).to_parquet(pairs)
    study = _with_candidates(_study(), add2=_study()["formats"]["add2"], big=dict(ADD, a=[100, 999], b=[100, 999]),
                             small=dict(ADD, a=[1, 3], b=[1, 3]))
    compute = {"device": "cpu", "dtype": "float32", "batch_size": 4}
    def run(s, out):
        return run_study_format(model_dir=prepared_model_dir(tiny_dir, tmp_path / out), pairs_paths={"addition": pairs},
                                study=s, prompts={"shot_separator": ".\n"}, compute=compute, seed=0,
                                out_table=tmp_path / out / "formats.parquet")
    (tmp_path / "named").mkdir()
    run(study | {"train_format": "sub_words"}, "named")  # a named format is measured alone, and chosen
    table = pd.read_parquet(tmp_path / "named/formats.parquet")
    assert list(table["format"]) == ["sub_words"] and list(table["n"]) == [4] and table["chosen"].all()
    choice = read_parquet_meta(tmp_path / "named/formats.parquet")["choice"]
    assert choice == study_config.read_choice(tmp_path / "named/formats.parquet") and choice["chosen"] == "sub_words"
    (tmp_path / "few").mkdir()
    run(study | {"train_format": "mul_words"}, "few")  # 16 pairs: named, not measured, and the reason says why
    choice = study_config.read_choice(tmp_path / "few/formats.parquet")
    assert choice["chosen"] == "mul_words" and "too few operand pairs (16 left" in choice["reason"]
    # auto with a band holding everything: the random model's scores tie, the first candidate listed wins
    (tmp_path / "auto").mkdir()
    run(study | {"train_format": "auto", "base_band": [0.0, 1.0]}, "auto")
    table = pd.read_parquet(tmp_path / "auto/formats.parquet")
    assert list(table["format"]) == ["add2", "big", "small"] and list(table["n"]) == [4, 4, 0]
    assert list(table["eligible"]) == [True, True, False] and table["chosen"].sum() == 1
    assert table.loc[2, "reason"].startswith("not measured: too few operand pairs (9 left")
    assert table.loc[0, "pairs"] == 98  # 100 pairs of 10-19, two used by the identify stage
    assert ((table["ci_low"] <= table["exact_match"]) & (table["exact_match"] <= table["ci_high"])).iloc[:2].all()
    expected = table.loc[table["eligible"]].sort_values("distance", kind="stable")["format"].iloc[0]
    assert study_config.read_choice(tmp_path / "auto/formats.parquet")["chosen"] == expected


def test_summary_says_when_the_study_could_not_run(tmp_path):
    """No format inside the band: empty tables whose metadata says why, pages and figures that say so, and
    the scorecard's study rows `not measured` with that reason."""
    from arithmech.io import read_parquet_meta, write_json, write_parquet
    from arithmech.report.page import study_not_run
    from claim_tables import study_claims

    table, choice = sd.choose_format(_measured(("add2", 0.95), ("mul2", 0.1)), [0.2, 0.6], "auto")
    table = table.assign(task="addition", template="{a} {op} {b} = ", operator="+", a="10-99", b="10-99", pairs=8100,
                         correct=0, ci_low=0.0, ci_high=1.0)
    write_parquet(table, tmp_path / "formats.parquet", {"choice": choice})
    write_json(choice, study_config.choice_path(tmp_path / "formats.parquet"))
    out = {k: tmp_path / f"{k}.{ext}" for k, ext in (("study", "parquet"), ("comparisons", "parquet"), ("md", "md"),
                                                     ("html", "html"), ("png", "png"), ("curves", "png"))}
    run_study_summary(model="m", study=_study(), formats_path=tmp_path / "formats.parquet", items_path=None,
                      selection_paths={}, eval_paths={}, stats_paths={}, seed=0, out_study=out["study"],
                      out_comparisons=out["comparisons"], out_md=out["md"], out_html=out["html"], out_png=out["png"],
                      out_curves=out["curves"])
    assert pd.read_parquet(out["study"]).empty and pd.read_parquet(out["comparisons"]).empty
    meta = read_parquet_meta(out["study"])
    assert meta["ran"] is False and "nearest: mul2 10.0% (below), add2 95.0% (above)" in meta["reason"]
    assert study_not_run(out["study"]) == meta["reason"]
    md = out["md"].read_text()
    assert "could not run" in md and "## The trained format" in md and "| mul2 |" in md
    assert "could not run" in out["html"].read_text()
    assert all(out[k].read_bytes()[:4] == b"\x89PNG" for k in ("png", "curves"))
    rows = study_claims(pd.read_parquet(out["study"]), pd.read_parquet(out["comparisons"]), None, {},
                        not_run=meta["reason"])
    assert {r["claim"] for r in rows} == {"sft_vs_full", "sft_vs_random", "sft_off_target", "sft_speed",
                                         "sft_circuit_vs_precise"}
    assert all(r["verdict"] == "not measured" and r["note"] == meta["reason"] for r in rows)


def test_training_precision_in_study_md_and_the_sft_vs_full_note():
    """study.md names the precision each arm trained in; the scorecard's sft_vs_full row says it for precise and
    full, and flags optimizers that updated different dtypes (bf16 weights updated in place lose small updates)."""
    from arithmech.report.claims import sft_vs_full
    from arithmech.report.tables import precision_markdown

    fair = {"model_dtype": "bfloat16", "master_dtype": "float32"}
    table = pd.DataFrame([{"arm": "base", "run": "base", "model_dtype": "", "master_dtype": ""},
                          {"arm": "precise", "run": "chosen", **fair}, {"arm": "precise", "run": "seed1", **fair},
                          {"arm": "full", "run": "chosen", **fair}])
    md = precision_markdown(table)
    assert md.startswith("## Training precision") and "base" not in md
    assert md.count("- precise: model in bfloat16, optimizer updating float32 tensors") == 1
    assert "- full: model in bfloat16, optimizer updating float32 tensors" in md
    comp = pd.DataFrame([{"arm_a": "precise", "arm_b": "full", "metric": "accuracy", "difference": -0.01,
                          "ci_low": -0.04, "ci_high": 0.02, "p_value": 0.5, "p_holm": 0.5, "test": "mcnemar",
                          "n_items": 100}])
    cfg = {"non_inferiority": 0.05, "min_difference": 0.02, "min_speedup": 2.0}

    def note(study: pd.DataFrame) -> str:
        return sft_vs_full.score(study, comp, "add2", cfg)[0]["note"]

    assert "trained in (model / optimizer): precise bfloat16 / float32, full bfloat16 / float32" in note(table)
    assert "different dtypes" not in note(table)
    in_place = table.assign(master_dtype=np.where(table["arm"] == "full", "bfloat16", table["master_dtype"]))
    assert "full bfloat16 / bfloat16 (the optimizers updated different dtypes" in note(in_place)
    assert note(table.drop(columns=["model_dtype", "master_dtype"])).endswith("training precision not recorded")


def test_layer_matched_heads():
    key = [(5, 0), (5, 3), (7, 1), (9, 2)]
    drawn = layer_matched_heads(key, n_heads=6, seed=3)
    assert [layer for layer, _ in drawn] == [layer for layer, _ in key]  # in rank order: every prefix matches
    assert not set(drawn) & set(key) and len(set(drawn)) == len(drawn)
    assert drawn == layer_matched_heads(key, n_heads=6, seed=3)
    assert any(layer_matched_heads(key, n_heads=6, seed=s) != drawn for s in range(4, 10))
    assert not set(layer_matched_heads(key, n_heads=6, seed=3, exclude=[(7, 0), (7, 2)])) & {(7, 0), (7, 2)}
    # layer 5 has one free head: the second draw comes from the nearest layer with one, the lower first
    first, second, third = layer_matched_heads([(5, 0), (5, 1), (7, 1)], n_heads=3, seed=0)
    assert first == (5, 2) and second[0] == 4 and third[0] == 7
    assert layer_matched_heads([(1, 0), (1, 1)], n_heads=2, seed=0, n_layers=2)[0][0] == 0  # no layer 2
    with pytest.raises(ValueError, match="no head left"):
        layer_matched_heads([(0, 0), (0, 1)], n_heads=2, seed=0)


def test_arm_methods():
    study = _study() | {"heads": 2, "mlps": 1, "kv": "none"}
    ranked, mlps = [[2, 1], [0, 3], [1, 1], [2, 0]], [2, 0, 1]
    nodes = {"ranked_heads": ranked, "ranked_mlps": mlps, "n_layers": 3, "n_heads": 4, "seed": 0}
    precise = sd.arm_method("precise", "lr0", study, **nodes)
    assert precise == {"method": "precise", "heads": [[2, 1], [0, 3]], "mlp_layers": [], "train_kv": False}
    with_mlp = sd.arm_method("precise_mlp", "seed1", study, **nodes)
    assert with_mlp["mlp_layers"] == [2] and with_mlp["heads"] == precise["heads"]
    assert sd.arm_method("precise", "lr0", study | {"kv": "shared"}, **nodes)["train_kv"] is True
    draws = [sd.arm_method("random_heads", r, study, **nodes)["heads"] for r in ("lr0", "lr1", "draw1", "draw2")]
    assert draws[0] == draws[1]  # every grid point trains draw 0
    assert len({json.dumps(sorted(d)) for d in draws}) > 1
    for d in draws:
        assert sorted(h[0] for h in d) == [0, 2] and not {tuple(h) for h in d} & {(2, 1), (0, 3)}
    assert sd.arm_method("random_heads", "lr0", study, **nodes)["method"] == "random_heads"
    assert with_mlp["method"] == "precise"  # trains as precise, with its MLP layers
    uniform = [sd.arm_method("uniform_heads", r, study, **nodes) for r in ("lr0", "seed1", "draw1", "draw2")]
    assert {u["method"] for u in uniform} == {"uniform_heads"} and all(u["mlp_layers"] == [] for u in uniform)
    assert uniform[0]["heads"] == uniform[1]["heads"] and len({json.dumps(u["heads"]) for u in uniform}) > 1
    assert all(not {tuple(h) for h in u["heads"]} & {(2, 1), (0, 3)} for u in uniform)
    assert sd.arm_method("full", "lr0", study, **nodes) == {"method": "full"}
    assert sd.arm_method("lora", "lr0", study, **nodes)["lora"] == study["lora"]
    with pytest.raises(ValueError, match="run name 'best'"):
        sd.arm_method("full", "best", study, **nodes)
    with pytest.raises(ValueError, match="study arm 'random'"):
        sd.arm_method("random", "lr0", study, **nodes)


def test_an_arm_draws_the_heads_the_recipe_method_of_its_name_draws():
    """One selection (sft.methods.select_nodes) for the study and the GSM8K recipe: draw d of an arm is the
    recipe's draw of the same name with the same seed."""
    from arithmech.sft.methods import select_nodes

    study = _study() | {"heads": 3, "mlps": 2, "kv": "none"}
    heads = [(l, h) for l in range(4) for h in range(4)]
    ranked = [heads[i] for i in np.random.default_rng(0).permutation(len(heads))]
    nodes = {"ranked_heads": ranked, "ranked_mlps": [3, 1, 0, 2], "n_layers": 4, "n_heads": 4, "seed": 5}
    for arm in ("precise", "random_heads", "uniform_heads"):
        for run, draw in (("lr0", 0), ("draw2", 2)):
            spec = sd.arm_method(arm, run, study, **nodes)
            want, _ = select_nodes(arm, ranked, [3, 1, 0, 2], heads=3, mlps=0, n_layers=4, n_heads=4, seed=5,
                                   draw=draw)
            assert spec["heads"] == [list(h) for h in want]


def test_final_runs_and_select_lr():
    study = _study() | {"seeds": {"precise": 3}, "random_draws": 4}
    assert study_config.final_runs("precise", study) == ["chosen", "seed1", "seed2"]
    assert study_config.final_runs("random_heads", study) == ["chosen", "draw1", "draw2", "draw3"]
    assert study_config.final_runs("uniform_heads", study) == ["chosen", "draw1", "draw2", "draw3"]
    assert study_config.final_runs("full", study) == ["chosen"]
    vals = {"lr0": _val([1, 0, 0], [1.0, 1, 1]), "lr1": _val([1, 1, 0], [9.0, 9, 9]),
            "lr2": _val([0, 1, 1], [2.0, 2, 2])}
    choice = sd.select_lr(vals, [1e-4, 3e-4, 1e-3], {run: [1.0, 0.5] for run in vals}, COLLAPSE)
    assert choice["run"] == "lr2" and choice["lr"] == 1e-3  # tie on accuracy: the lower NLL
    assert [g["val_accuracy"] for g in choice["grid"]] == pytest.approx([1 / 3, 2 / 3, 2 / 3])
    assert choice["chosen"] and choice["edge"] == "upper"
    assert choice["note"] == "lr 0.001 at the grid's upper edge: the best may lie above"


COLLAPSE = {"distinct_ratio": 0.5, "loss_spike": 2.0}


def _val(correct, nll, answers=None) -> pd.DataFrame:
    """A grid run's val.parquet: by default every item answered differently, by the run and (the base model's
    answers, which lr0 alone records in a real run) by the base model."""
    n = len(correct)
    return pd.DataFrame({"correct": correct, "nll": nll, "n_tokens": [2] * n,
                         "answer": answers or [str(i) for i in range(n)], "base_answer": [str(i) for i in range(n)]})


def test_a_collapsed_run_is_never_chosen_even_with_the_best_exact_match():
    """Validation answers that take fewer than half as many values as the base model's (here 1 of 4 against 4:
    the run answers everything alike, and happens to be right on the most items), or a training loss that rose
    above twice its first step's, make a run collapsed: the next best run is chosen, and the note says which lrs
    collapsed. The choice is inside the grid: no edge flag."""
    vals = {"lr0": _val([1, 0, 0, 0], [1.0] * 4), "lr1": _val([1, 1, 0, 0], [1.0] * 4),
            "lr2": _val([1, 1, 1, 0], [1.0] * 4, answers=["7"] * 4),
            "lr3": _val([1, 1, 1, 1], [1.0] * 4)}
    losses = {"lr0": [1.0, 0.9], "lr1": [1.0, 0.5], "lr2": [1.0, 0.5], "lr3": [1.0, 2.5, 0.1]}
    choice = sd.select_lr(vals, [1e-4, 3e-4, 1e-3, 3e-3], losses, COLLAPSE)
    assert choice["chosen"] and choice["run"] == "lr1" and choice["lr"] == 3e-4 and choice["edge"] == ""
    grid = pd.DataFrame(choice["grid"]).set_index("run")
    assert list(grid["collapsed"]) == [False, False, True, True]
    assert list(grid["val_distinct"]) == [4, 4, 1, 4] and set(grid["base_distinct"]) == {4}
    assert grid.loc["lr2", "collapse_reason"] == ("1 distinct validation answers, fewer than 0.5 x the base "
                                                  "model's 4")
    assert grid.loc["lr3", "collapse_reason"] == "training loss 2.5 at step 2, more than 2 x its first step's 1"
    assert choice["note"] == "collapsed, never chosen: lr 0.001, lr 0.003"
    # exactly half the base model's distinct answers is not a collapse; a loss of exactly 2x is not a spike
    half = sd.select_lr({"lr0": _val([1, 0, 0, 0], [1.0] * 4, answers=["1", "1", "2", "2"])}, [1e-3],
                        {"lr0": [1.0, 2.0]}, COLLAPSE)
    assert half["chosen"] and half["note"] == "" and half["edge"] == ""  # one grid point: no edge


def test_every_lr_collapsed_chooses_none_and_says_so():
    """With every grid run collapsed the arm is not chosen (`chosen` False: the study reports it as not measured,
    study.parquet's measured False); `run` still names one run, which the workflow trains and scores on."""
    vals = {"lr0": _val([1, 0, 0], [1.0] * 3, answers=["3"] * 3), "lr1": _val([1, 1, 0], [1.0] * 3)}
    choice = sd.select_lr(vals, [1e-3, 1e-2], {"lr0": [1.0, 1.0], "lr1": [1.0, 9.0]}, COLLAPSE)
    assert not choice["chosen"] and choice["edge"] == "" and choice["run"] == "lr1"
    assert choice["note"].startswith("not measured: every learning rate of the grid collapsed (lr 0.001: 1 distinct")
    assert "lr 0.01: training loss 9 at step 2" in choice["note"]
    assert sd.selection_columns(choice) == {"lr_grid": "0.001, 0.01", "lr_edge": "", "lr_collapsed": "0.001, 0.01",
                                            "lr_note": choice["note"], "measured": False}


def test_a_choice_at_the_lower_edge_is_flagged():
    vals = {"lr0": _val([1, 1], [1.0, 1]), "lr1": _val([1, 0], [1.0, 1])}
    choice = sd.select_lr(vals, [1e-4, 1e-3], {"lr0": [1.0], "lr1": [1.0]}, COLLAPSE)
    assert choice["run"] == "lr0" and choice["edge"] == "lower"
    assert choice["note"] == "lr 0.0001 at the grid's lower edge: the best may lie below"
    table = sd.selection_table({"precise": choice})
    assert list(table["chosen"]) == [True, False] and list(table["edge"]) == ["lower", ""]


def test_comparisons_pair_items_and_pick_the_test():
    rng = np.random.default_rng(0)
    n = 300
    clusters = [f"addition:{i // 2}:{i % 2}" for i in range(n)]
    base = rng.random(n) < 0.3
    good = base | (rng.random(n) < 0.5)
    frames = {("base", "base"): base, ("precise", "chosen"): good, ("random_heads", "chosen"): base.copy(),
              ("random_heads", "draw1"): base ^ (rng.random(n) < 0.05)}  # a few flips both ways
    rows = sd.per_item({key: pd.DataFrame({"dataset": "add2", "kind": "arithmetic", "item": clusters,
                                           "cluster": clusters,
                                           "correct": c.astype(float), "nll": 1.0, "n_tokens": 2})
                        for key, c in frames.items()})
    comp = sd.comparisons(rows, "add2", 0.95, 500, 0).set_index(["arm_a", "arm_b", "metric"])
    one = comp.loc[("precise", "base", "accuracy")]
    assert one["test"] == "mcnemar_exact" and one["p_value"] < 1e-6
    assert one["difference"] == pytest.approx(good.mean() - base.mean())
    two = comp.loc[("precise", "random_heads", "accuracy")]
    assert two["test"] == "paired_cluster_bootstrap" and two["n_models_b"] == 2
    assert two["difference"] == pytest.approx(good.mean()
                                              - (base.mean() + frames[("random_heads", "draw1")].mean()) / 2)
    assert comp.loc[("random_heads", "base", "accuracy")]["p_value"] > 0.01
    assert (comp["p_holm"] >= comp["p_value"] - 1e-12).all()
    table = sd.model_rows(rows, "add2", 0.95, 200, 0)
    assert list(table["arm"]) == ["base", "precise", "random_heads", "random_heads"]
    assert ((table["accuracy_low"] <= table["accuracy"]) & (table["accuracy"] <= table["accuracy_high"])).all()


# ---------------------------------------------------------------------------------------------------
# training callbacks, the items stage and the config


def test_evaluation_callback_points_survive_a_resume(tiny_dir, tmp_path):
    examples = [(f"{a} + {b} = ", f"{a + b}.") for a in range(10, 14) for b in range(10, 13)]
    cfg = {"lr": 1e-3, "batch_size": 4, "max_steps": 5, "checkpoint_every": 1}
    calls = []

    def run(stop):
        lm = load_model(tiny_dir, device="cpu")
        run = ft.prepare(lm, {"method": "precise", "heads": ["L1H0"]})

        def evaluate(step):
            calls.append(step)
            assert not lm.model.training and not torch.is_grad_enabled()
            return {"val_accuracy": 0.5, "delta_norm": float(run.deltas.deltas["L1_q_proj"].norm())}

        return ft.train(run, examples, cfg, checkpoint_dir=tmp_path, stop_at_step=stop, progress=False,
                        append_eos=False, evaluate=evaluate, evaluate_every=2)

    run(3)
    stats = run(None)
    assert calls == [2, 4, 5]
    assert [p["step"] for p in stats.evaluations] == [2, 4, 5]
    uninterrupted = ft.train(ft.prepare(load_model(tiny_dir, device="cpu"), {"method": "precise", "heads": ["L1H0"]}),
                             examples, cfg, progress=False, append_eos=False)
    assert stats.losses == pytest.approx(uninterrupted.losses, rel=1e-6)  # evaluating does not change training


def test_items_stage_leaves_out_identify_pairs(tiny_dir, tmp_path):
    pairs = tmp_path / "addition.parquet"
    pd.DataFrame({"a": [10, 11], "b": [10, 11]}).to_parquet(pairs)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "source.json").write_text(json.dumps({"source": {"path": str(tiny_dir)}, "load_from": str(tiny_dir)}))
    out = tmp_path / "items.parquet"
    run_study_items(model_dir=model_dir, pairs_paths={"addition": pairs}, study=_study(),
                    prompts={"shot_separator": ".\n"}, seed=0, out_items=out)
    items = pd.read_parquet(out)
    assert not {"addition:10:10", "addition:11:11"} & set(items["pair"])
    from arithmech.io import read_parquet_meta

    assert read_parquet_meta(out)["params"]["identify_pairs"] == {"addition": 2}


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.update(train_format="nope"), "config key 'study.train_format'"),
    (lambda s: s["format_choice"]["candidates"]["add3"].update(template="{a} {b}"),
     "config key 'study.format_choice.candidates.add3.template'"),
    (lambda s: s["format_choice"]["candidates"]["add3"].update(a=[999, 100]), "study.format_choice.candidates.add3"),
    (lambda s: s["format_choice"]["candidates"]["add3"].update(a=[1000, 9999]),
     "config key 'study.format_choice.candidates.add3': 8,100,000 operand pairs"),
    (lambda s: s["format_choice"]["candidates"]["add2"].update(operator="plus"),
     "config key 'study.format_choice.candidates.add2': defined differently under study.formats.add2"),
    (lambda s: s["format_choice"].update(items=151), "config key 'study.format_choice.items'"),
    (lambda s: s["format_choice"].update(items=0), "config key 'study.format_choice.items'"),
    (lambda s: s["format_choice"].pop("candidates"), "config key 'study.format_choice'"),
    (lambda s: s["format_choice"]["candidates"].update(auto=s["formats"]["add2"]),
     "config key 'study.format_choice.candidates.auto'"),
    (lambda s: s["lr_grid"].pop("full"), "config key 'study.lr_grid.full'"),
    (lambda s: s["formats"]["add2"].update(template="{a} plus {b}"), "config key 'study.formats.add2.template'"),
    (lambda s: s["formats"]["add2"].update(a=[20, 10]), "study.formats.add2"),
    (lambda s: s["train"].update(epochs=2), "config key 'study.train'"),
    (lambda s: s.update(kv="all"), "config key 'study.kv'"),
    (lambda s: (s["arms"].append("low_effect"), s["lr_grid"].pop("low_effect")),
     "config key 'study.lr_grid.low_effect'"),
    (lambda s: s["seeds"].update(circuit_disjoint=0), "config key 'study.seeds.circuit_disjoint'"),
    (lambda s: s["collapse"].update(distinct_ratio=1.5), "config key 'study.collapse.distinct_ratio'"),
    (lambda s: s["collapse"].update(loss_spike=1.0), "config key 'study.collapse.loss_spike'"),
    (lambda s: s["collapse"].pop("loss_spike"), "config key 'study.collapse'"),
    (lambda s: s["arms"].append("disjoint"),
     "config key 'study.arms.3': unknown method 'disjoint'; *circuit_disjoint *low_effect *the negative control"),
])
def test_bad_study_config_names_the_key(edit, message):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    edit(config["study"])
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("*", ".*")):
        validate_config(copy.deepcopy(config), SCHEMA)


@pytest.mark.parametrize("name", ["auto", "add2", "add3", "mul_words"])
def test_train_format_is_auto_or_a_format_or_a_candidate(name):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["study"]["train_format"] = name
    validate_config(config, SCHEMA)


def test_the_powered_study_runs_the_head_set_arms_at_three_seeds():
    """configs/sft-study.yaml: precise, circuit, the disjoint arm and the negative control, 3 seeds each, each
    with its lr grid; the merged config passes the checks. The default config.yaml names both arms' grids, so
    adding them to study.arms is enough."""
    from snakemake.utils import update_config

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    update_config(config, yaml.safe_load((ROOT / "configs/sft-study.yaml").read_text()))
    validate_config(config, SCHEMA)
    study = config["study"]
    for arm in ("precise", "circuit", "circuit_disjoint", "low_effect"):
        assert arm in study["arms"] and study["seeds"][arm] >= 3, arm
        assert study_config.final_runs(arm, study) == ["chosen", "seed1", "seed2"]
        assert len(study["lr_grid"][arm]) == len(study["lr_grid"]["precise"])
    default = yaml.safe_load((ROOT / "config.yaml").read_text())
    default["study"]["arms"] += ["circuit_disjoint", "low_effect"]
    validate_config(default, SCHEMA)


def test_each_model_has_its_own_grids_of_at_most_three_points():
    """config.yaml's grids: at most 3 points per arm (the default run's time), increasing; configs/gemma3-270m.yaml
    replaces the head arms' lists whole (Snakemake's merge: lists replace) and keeps config.yaml's for the others."""
    from snakemake.utils import update_config

    default = yaml.safe_load((ROOT / "config.yaml").read_text())["study"]
    for arm, grid in default["lr_grid"].items():
        assert 1 <= len(grid) <= 3 and grid == sorted(set(grid)), arm
    merged = yaml.safe_load((ROOT / "config.yaml").read_text())
    gemma = yaml.safe_load((ROOT / "configs/gemma3-270m.yaml").read_text())
    update_config(merged, gemma)
    validate_config(merged, SCHEMA)
    grids = merged["study"]["lr_grid"]
    for arm in ("precise", "circuit", "circuit_disjoint", "low_effect", "random_heads"):
        assert grids[arm] == gemma["study"]["lr_grid"][arm] == [1e-5, 3e-5, 1e-4], arm
    assert grids["full"] == default["lr_grid"]["full"] and grids["lora"] == default["lr_grid"]["lora"]


def test_summary_carries_each_runs_head_overlap_and_says_where_the_heads_were_found(tmp_path):
    """study.parquet gets n_heads, overlap_precise and jaccard_precise from each run's stats.json (empty for base
    and for arms without heads); study.md shows them under "Head sets" and the operand range under its heading."""
    from arithmech.io import write_json, write_parquet
    from claim_tables import study_claims

    table, choice = sd.choose_format(_measured(("add2", 0.4)), [0.2, 0.6], "add2")
    table = table.assign(task="addition", template="{a} {op} {b} = ", operator="+", a="10-19", b="10-19", pairs=98,
                         correct=20, ci_low=0.3, ci_high=0.5)
    write_parquet(table, tmp_path / "formats.parquet", {"choice": choice})
    write_json(choice, study_config.choice_path(tmp_path / "formats.parquet"))
    items = tmp_path / "items.parquet"
    pd.DataFrame({"format": ["add2"], "split": ["train"]}).to_parquet(items)
    pairs = [f"addition:{10 + i}:{11 + i % 3}" for i in range(40)]
    rng = np.random.default_rng(0)
    evals, stats, selections = {}, {}, {}
    overlap = {"precise": (16, 16, 1.0), "circuit": (16, 13, 13 / 19), "low_effect": (16, 0, 0.0)}
    for arm in ("base", "precise", "circuit", "low_effect", "full", "random_heads"):
        run = "base" if arm == "base" else "chosen"
        path = tmp_path / f"eval_{arm}.parquet"
        pd.DataFrame({"dataset": "add2", "kind": "arithmetic", "item": pairs, "cluster": pairs,
                      "correct": (rng.random(40) < 0.5).astype(float), "nll": 1.0, "n_tokens": 2}).to_parquet(path)
        evals[(arm, run)] = path
        if arm == "base":
            continue
        record = {"lr": 1e-3, "seed": 0, "steps": 2, "n_trainable": 10, "mean_step_s": 0.1, "step_times_s": [0.1],
                  "peak_memory_bytes": 0, "optimizer_state_bytes": 0, "artifact_bytes": 0, "losses": [1.0]}
        if arm in overlap:
            record |= dict(zip(("n_heads", "overlap_precise", "jaccard_precise"), overlap[arm]))
        stats[(arm, "lr0")] = tmp_path / f"stats_{arm}.json"
        write_json(record, stats[(arm, "lr0")])
        selections[arm] = tmp_path / f"select_{arm}.json"
        # random_heads: every lr collapsed; precise: the chosen lr at the grid's lower edge
        losses = {"lr0": [1.0, 0.5], "lr1": [1.0, 5.0 if arm == "random_heads" else 0.5]}
        vals = {"lr0": _val([1, 0, 0], [1.0] * 3, answers=["3"] * 3 if arm == "random_heads" else None),
                "lr1": _val([0, 0, 1] if arm == "precise" else [1, 0, 0], [1.0] * 3)}
        write_json(sd.select_lr(vals, [1e-3, 1e-2], losses, COLLAPSE), selections[arm])
    out = {k: tmp_path / f"{k}.{ext}" for k, ext in (("study", "parquet"), ("comparisons", "parquet"), ("md", "md"),
                                                     ("html", "html"), ("png", "png"), ("curves", "png"))}
    # what rule study_summary passes (its `study` params), no more
    study = {k: _study()[k] for k in ("confidence", "bootstrap", "base_band", "splits", "n_shots")}
    study |= {"arms": ["precise", "circuit", "low_effect", "full", "random_heads"], "collapse": COLLAPSE}
    run_study_summary(model="m", study=study, formats_path=tmp_path / "formats.parquet", items_path=items,
                      selection_paths=selections, eval_paths=evals, stats_paths=stats, seed=0, out_study=out["study"],
                      out_comparisons=out["comparisons"], out_md=out["md"], out_html=out["html"], out_png=out["png"],
                      out_curves=out["curves"], operands={"min": 1, "max": 9})
    result = pd.read_parquet(out["study"]).set_index("arm")
    assert result.loc["circuit", "overlap_precise"] == 13 and result.loc["circuit", "n_heads"] == 16
    assert result.loc["low_effect", "jaccard_precise"] == 0.0
    assert np.isnan(result.loc["full", "n_heads"]) and np.isnan(result.loc["base", "overlap_precise"])
    comp = pd.read_parquet(out["comparisons"])
    assert ((comp["arm_a"] == "precise") & (comp["arm_b"] == "low_effect")).any()  # the positive control
    md = out["md"].read_text()
    assert "## Head sets" in md
    assert "- circuit (chosen): 16 heads, 13 of them trained by precise too (Jaccard 0.68)" in md
    assert "## Operand range" in md and "found on operands 1-9" in md and "`add2`, a in 10-19, b in 10-19" in md
    assert "no circuit_disjoint arm" in md
    assert "found on operands 1-9" in out["html"].read_text()
    # the lr choice: the grid and its flags per row; an arm whose every lr collapsed has one row and no number
    assert result.loc["precise", "lr_edge"] == "lower" and result.loc["precise", "lr_grid"] == "0.001, 0.01"
    assert bool(result.loc["circuit", "measured"]) and result.loc["circuit", "lr_collapsed"] == ""
    lost = result.loc["random_heads"]
    assert not lost["measured"] and np.isnan(lost["accuracy"]) and lost["lr_collapsed"] == "0.001, 0.01"
    assert lost["lr_note"].startswith("not measured: every learning rate of the grid collapsed")
    assert not (comp[["arm_a", "arm_b"]] == "random_heads").any().any()
    assert "## Learning-rate grids" in md and "| random_heads | 0.01 |" in md
    assert "yes, at the grid's lower edge" in md and "| random_heads | chosen |" not in md
    rows = {r["claim"]: r for r in study_claims(pd.read_parquet(out["study"]), comp, "add2", tiny_config()["claims"])
            if r["scope"] == "all"}
    assert rows["sft_vs_random"]["verdict"] == "not measured"
    assert rows["sft_vs_random"]["note"].startswith("random_heads: not measured: every learning rate")
    assert "precise: lr 0.001 at the grid's lower edge" in rows["sft_vs_full"]["note"]
