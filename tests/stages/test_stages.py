"""Stage functions (what the rule scripts call) on the tiny model, without Snakemake."""


import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from arithmech.interp import ablation
from arithmech.interp.activations import cache_means
from arithmech.interp.patching import reference_logits
from arithmech.io import read_parquet_meta, source_digest
from arithmech.model.loading import load_model
from arithmech.stages import identify, validate
from arithmech.stages.validate import run_plot_knockout, run_plot_transfer
from arithmech.tools.plan.interp_rules import knockout_sets
from helpers import COMPUTE, PROMPTS, ROOT


def test_pairs_and_provenance(prepared):
    pairs = pd.read_parquet(prepared / "pairs.parquet")
    assert len(pairs) == 12
    assert (pairs["a"] == pairs["b"] * pairs["answer"]).all()  # exact division
    # 16 operand pairs, half held out: no operand pair in both splits
    ident, val = (set(zip(g["a"], g["b"])) for _, g in pairs.groupby("split"))
    assert not ident & val and pairs["split"].value_counts().to_dict() == {"identification": 6, "validation": 6}
    meta = read_parquet_meta(prepared / "pairs.parquet")
    assert meta["counts"] == {"candidates": 2 * 16, "kept": 12, "over_max_samples": 20, "kept_identification": 6,
                              "kept_validation": 6}
    # the leak: the counterfactual's own answers, checked
    assert set(meta["leak"]) == {"identification", "validation"}
    assert meta["leak"]["validation"]["full"] == pytest.approx(
        pairs.loc[pairs["split"] == "validation", "cf_correct_full"].mean())
    assert {"full_answer", "correct_full", "correct_first_token", "cf_full_answer"} <= set(pairs)
    assert meta["model_source"] == {"path": str(prepared / "src")}
    assert set(meta["versions"]) >= {"torch", "transformers", "python", "arithmech"}
    assert meta["arithmech_source_sha256"] == source_digest() and len(source_digest()) == 64


def test_cache_contents(prepared):
    from arithmech.intervention.hooks import capture

    t = load_file(str(prepared / "cache.safetensors"))
    n, lm = 6, load_model(prepared / "model", device="cpu")
    assert t["ref_heads"].shape == (n, 2, lm.n_heads, lm.head_dim)
    assert t["cf_mlps"].shape == (n, 2, lm.d_model)
    # The END mean is the mean of the END states.
    torch.testing.assert_close(t["cf_mean_heads"][0], t["cf_heads"].mean(0), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(t["cf_mean_mlps"][0], t["cf_mlps"].mean(0), atol=1e-6, rtol=1e-5)
    pairs = pd.read_parquet(prepared / "pairs.parquet")
    ident = pairs[pairs["split"] == "identification"]
    assert t["sample_ids"].tolist() == ident["sample_id"].tolist()
    # Per-template means at every offset from END, against one unpadded forward per prompt.
    for template, group in ident.groupby("template_id"):
        states = []
        for text in group["cf_prompt"]:
            with capture(lm, end_only=False) as cap, torch.no_grad():
                lm.model(**lm.tokenizer(text, return_tensors="pt"))
            states.append((cap.stacked_heads()[0].flip(0), cap.stacked_mlps()[0].flip(0)))  # offset order
        longest = max(h.shape[0] for h, _ in states)
        assert int((t["cf_template_counts"][template] > 0).sum()) == longest
        for j in range(longest):
            reach = [(h[j], m[j]) for h, m in states if h.shape[0] > j]
            assert t["cf_template_counts"][template, j] == len(reach)
            torch.testing.assert_close(t["cf_template_heads"][template, j], torch.stack([h for h, _ in reach]).mean(0),
                                       atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(t["cf_template_mlps"][template, j], torch.stack([m for _, m in reach]).mean(0),
                                       atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["direct", "total"])
def test_patch_layer_matches_reference(prepared, mode):
    out = prepared / f"layer1-{mode}.parquet"
    patching = {"mode": mode, "with_probs": True, "copies_per_forward": 7}
    identify.run_patch_layers(model_dir=prepared / "model", layers=[1], patching=patching, compute=COMPUTE,
                              pairs_paths=[prepared / "pairs.parquet"], cache_paths=[prepared / "cache.safetensors"],
                              out_paths=[out])
    frame = pd.read_parquet(out)
    lm = load_model(prepared / "model", device="cpu")
    ref, cf, answers, _ = identify.load_states(prepared / "cache.safetensors")
    pairs = pd.read_parquet(prepared / "pairs.parquet")
    texts = list(pairs.loc[pairs["split"] == "identification", "prompt"])
    logits, logprobs = reference_logits(lm, texts, answers, ref, cf, layers=[1], mode=mode)
    assert len(frame) == 6 * (lm.n_heads + 1)
    assert frame["logit_p"].to_numpy() == pytest.approx(logits.reshape(-1).double().numpy(), abs=1e-4)
    assert frame["prob_p"].to_numpy() == pytest.approx(logprobs.exp().reshape(-1).double().numpy(), abs=1e-5)
    assert frame["logit_o"].to_numpy() == pytest.approx(ref.logits.repeat_interleave(lm.n_heads + 1).double().numpy(),
                                                        abs=1e-5)


def test_aggregate_effects_intervals_stability_and_exclusions(prepared):
    """Both layers patched, then aggregated: every node with its interval and stability, the key components
    carrying theirs, and the samples left out by relative_logit (logit_o <= 0) counted in the metadata."""
    paths = [prepared / f"agg-layer{layer}.parquet" for layer in (0, 1)]
    for layer, path in enumerate(paths):
        identify.run_patch_layers(model_dir=prepared / "model", layers=[layer],
                                  patching={"mode": "direct", "with_probs": False}, compute=COMPUTE,
                                  pairs_paths=[prepared / "pairs.parquet"],
                                  cache_paths=[prepared / "cache.safetensors"],
                                  out_paths=[path])
    patching = pd.concat(pd.read_parquet(p) for p in paths)
    n_bad = patching.loc[patching["logit_o"] <= 0, "sample_id"].nunique()
    assert 0 < n_bad < 6  # 6 identification samples of a random model: some of each, so the exclusion is exercised
    rules = {"heads": {"rule": "top_k", "k": 2}, "mlps": {"rule": "top_k", "k": 1},
             "bootstrap": {"resamples": 100, "confidence": 0.9}}
    out = {k: prepared / f"agg-{k}" for k in ("effects.parquet", "key.parquet", "key.html")}
    with pytest.warns(UserWarning, match=f"{n_bad} of 6 samples have logit_o <= 0") as caught:
        identify.run_aggregate_effects(model="tiny", task="division", layer_paths=paths,
                                       pairs_path=prepared / "pairs.parquet", metric="relative_logit", key_rules=rules,
                                       seed=0, out_effects=out["effects.parquet"], out_key=out["key.parquet"],
                                       out_key_html=out["key.html"])
    assert sum("logit_o <= 0" in str(w.message) for w in caught) == 1  # filtered once, not in every helper
    effects, key = pd.read_parquet(out["effects.parquet"]), pd.read_parquet(out["key.parquet"])
    assert len(effects) == 2 * 5 and (effects["n"] == 6 - n_bad).all()
    assert (effects["ci_low"] <= effects["mean_effect"]).all() and (effects["mean_effect"] <= effects["ci_high"]).all()
    assert effects["stability"].between(0, 1).all()
    total = effects.groupby("component")["stability"].sum()
    assert total["head"] <= 2 + 1e-9 and total["mlp"] <= 1 + 1e-9  # top 2 heads and top 1 MLP per resample
    assert len(key) and (key["stability"] > 0).all()  # selected on all samples: also on some resamples
    assert set(key["node"]) <= set(effects["node"])
    meta = read_parquet_meta(out["effects.parquet"])
    assert meta["excluded_nonpositive_logit_o"] == n_bad and meta["seed"] == 0


def test_patch_layer_rejects_a_layer_out_of_range(prepared):
    with pytest.raises(ValueError, match="layer 5 out of range: the model has 2 layers"):
        identify.run_patch_layers(model_dir=prepared / "model", layers=[0, 5],
                                  patching={"mode": "direct", "with_probs": False}, compute=COMPUTE,
                                  pairs_paths=[prepared / "pairs.parquet"],
                                  cache_paths=[prepared / "cache.safetensors"],
                                  out_paths=[prepared / "never.parquet"])
    assert not (prepared / "never.parquet").exists()


@pytest.mark.parametrize("mode", ["direct", "total"])
def test_one_table_of_all_layers_is_the_per_layer_tables_concatenated(prepared, tmp_path, mode):
    """What patch_all_layers writes (layers=None) equals what the patch_layer jobs write, concatenated in layer
    order, value for value: the rules can take either without changing the effects."""
    patching = {"mode": mode, "with_probs": True, "copies_per_forward": 7}
    common = dict(patching=patching, compute=COMPUTE, pairs_paths=[prepared / "pairs.parquet"],
                  cache_paths=[prepared / "cache.safetensors"])
    identify.run_patch_layers(model_dir=prepared / "model", layers=None, out_paths=[tmp_path / "all.parquet"], **common)
    for layer in (0, 1):
        identify.run_patch_layers(model_dir=prepared / "model", layers=[layer],
                                  out_paths=[tmp_path / f"layer{layer}.parquet"], **common)
    per_layer = pd.concat([pd.read_parquet(tmp_path / f"layer{layer}.parquet") for layer in (0, 1)], ignore_index=True)
    together = pd.read_parquet(tmp_path / "all.parquet")
    assert together["layer"].tolist() == sorted(together["layer"]) and set(together["layer"]) == {0, 1}
    pd.testing.assert_frame_equal(together, per_layer, check_exact=True)


def test_build_pairs_fails_clearly_when_nothing_is_correct(prepared, tmp_path):
    prompts = {**PROMPTS, "keep_only_correct": "full", "operands": {"min": 7, "max": 9}}
    with pytest.raises(RuntimeError, match="no identification pair is left of 18 candidates"):
        identify.run_build_pairs(model_dir=prepared / "model", task="addition", prompts=prompts,
                                 compute=COMPUTE, seed=0,
                                 out_pairs=tmp_path / "p.parquet", out_dropped=tmp_path / "d.parquet")
    assert list(tmp_path.iterdir()) == []


TRANSFER = {
    "max_samples": 8,
    "random_seeds": 2,
    "formats": {"n": 4, "multi_digit": {"min": 10, "max": 99}, "decimal": {"min": 0.1, "max": 9.9}},
    "svamp": {"file": "unused", "n": 5, "n_shots": 1},
    "non_math": {"file": "unused", "n": 5, "n_shots": 1, "max_new_tokens": 3},
}


def test_transfer_matches_an_explicit_ablated_generation(prepared, tmp_path):
    from arithmech.data.answers import answer_correct, answer_tokens
    from arithmech.data.arithmetic import split_pairs
    from arithmech.data.datasets import subsample
    from arithmech.interp.ablation import mean_ablate
    from arithmech.intervention.generation import greedy_answers
    from arithmech.intervention.means import AlignedMean

    root = ROOT / "resources/data"
    key = pd.DataFrame({"component": ["head", "head", "mlp"], "layer": [1, 0, 1], "head": [2, 3, -1]})
    key.to_parquet(tmp_path / "key.parquet")
    out = [tmp_path / "t.parquet", tmp_path / "t.html", tmp_path / "t.png"]
    validate.run_transfer(model="tiny", model_dir=prepared / "model", tasks=["division"],
                        pairs_paths=[prepared / "pairs.parquet"], cache_paths=[prepared / "cache.safetensors"],
                        key_paths=[tmp_path / "key.parquet"], svamp_path=root / "svamp/SVAMP.json",
                        non_math_path=root / "bigbench/qa_wikidata/task.json", transfer=TRANSFER, prompts_cfg=PROMPTS,
                        compute=COMPUTE, seed=0, out_table=out[0], out_items=tmp_path / "items.parquet")
    run_plot_transfer(model="tiny", transfer_path=out[0], out_html=out[1], out_png=out[2])
    table = pd.read_parquet(out[0])
    targets = ["division", "division multi-digit", "division decimal", "SVAMP", "qa_wikidata"]
    assert list(dict.fromkeys(table["target"])) == targets
    assert len(table) == len(targets) * (1 + 1 + 2)  # none, key, 2 random sets
    none = table[table["heads"] == "none"]
    assert (none["accuracy"] == none["base_accuracy"]).all()
    key_rows = table[table["heads"] == "key"]
    assert (key_rows["nodes"] == "L1H2 L0H3").all() and (table.loc[table["heads"] == "random", "n_heads"] == 2).all()
    # the key-heads cell on the source task, recomputed by plain generation inside mean_ablate
    lm = load_model(prepared / "model", device="cpu")
    pairs = subsample(split_pairs(pd.read_parquet(prepared / "pairs.parquet"), "validation"), 8, 0)
    cache = load_file(str(prepared / "cache.safetensors"))
    mean = AlignedMean(cache["cf_mean_heads"], cache["cf_mean_mlps"])
    n_new = answer_tokens(lm.tokenizer, pairs["answer"])
    plain = greedy_answers(lm, list(pairs["prompt"]), n_new, 3)
    with mean_ablate(lm, [(1, 2), (0, 3)], [], mean):
        ablated = greedy_answers(lm, list(pairs["prompt"]), n_new, 3)
    base = [answer_correct(t, g) for t, g in zip(plain, pairs["answer"])]
    after = [answer_correct(t, g) for t, g in zip(ablated, pairs["answer"])]
    cell = key_rows[key_rows["target"] == "division"].iloc[0]
    assert cell["accuracy"] == pytest.approx(sum(after) / len(pairs))
    assert none.iloc[0]["accuracy"] == pytest.approx(sum(base) / len(pairs))
    kept = [a for a, b in zip(after, base) if b]
    assert cell["retained"] == (pytest.approx(sum(kept) / len(kept)) if kept
                                else pytest.approx(float("nan"), nan_ok=True))
    # the per-item table holds the same answers, item by item, with each item's operand pair
    items = pd.read_parquet(tmp_path / "items.parquet")
    own = items[(items["source"] == "division") & (items["heads"] == "key") & (items["target"] == "division")]
    assert (list(own["correct"]) == after
            and list(own["cluster"]) == [f"{a},{b}" for a, b in zip(pairs["a"], pairs["b"])])
    assert list(items[(items["heads"] == "none") & (items["target"] == "division")]["correct"]) == base
    assert out[2].read_bytes()[:4] == b"\x89PNG" and "retained" in out[1].read_text()


@pytest.mark.parametrize("positions", ["end", "all"])
def test_knockout_scores_first_tokens_and_full_answers(prepared, tmp_path, positions):
    from arithmech.data.answers import answer_correct, answer_tokens
    from arithmech.data.datasets import subsample
    from arithmech.interp.ablation import mean_ablate
    from arithmech.intervention.generation import greedy_answers
    from arithmech.intervention.means import AlignedMean, GroupedMean

    lm = load_model(prepared / "model", device="cpu")
    heads = [(l, h) for l in range(lm.n_layers) for h in range(lm.n_heads)]
    effects = pd.DataFrame({"node": [f"L{l}H{h}" for l, h in heads], "layer": [l for l, _ in heads],
                            "head": [h for _, h in heads], "component": "head",
                            "mean_effect": [-0.01 * i for i in range(len(heads))]})
    effects.to_parquet(tmp_path / "effects.parquet")
    pd.DataFrame({"component": ["head", "mlp"], "layer": [1, 0], "head": [3, -1]}).to_parquet(tmp_path / "key.parquet")
    ablation = {"positions": [positions], "max_heads": 2, "random_seeds": 1, "random_k": [1, 2],
                "all_positions_samples": 5}
    out = [tmp_path / "k.parquet", tmp_path / "k.png"]
    validate.run_knockout(model="tiny", task="division", model_dir=prepared / "model",
                        pairs_path=prepared / "pairs.parquet",
                        cache_path=prepared / "cache.safetensors", effects_path=tmp_path / "effects.parquet",
                        key_path=tmp_path / "key.parquet", ablation=ablation, compute=COMPUTE, seed=0, out_table=out[0],
                        out_items=tmp_path / "items.parquet")
    run_plot_knockout(model="tiny", task="division", knockout_path=out[0], key_path=tmp_path / "key.parquet",
                      out_png=out[1])
    assert out[1].read_bytes()[:4] == b"\x89PNG"
    table = pd.read_parquet(out[0])
    randoms = 2 if positions == "end" else 1  # k = 1..2, or k = max_heads only
    assert list(table["curve"]) == (["top_heads"] * 3 + ["random_heads"] * randoms + ["random_layer_matched"] * randoms
                                    + ["key_mlps"])
    assert table["nodes"].iloc[2] == "L1H3 L1H2" and table["nodes"].iloc[-1] == "L0MLP"
    # `make plan` counts the sets the stage runs (its knockout cost model)
    assert knockout_sets(ablation, n_layers=lm.n_layers, n_heads=lm.n_heads)[positions == "all"] == len(table)
    matched = table[table["curve"] == "random_layer_matched"]["nodes"].iloc[-1].split()
    assert [n[:2] for n in matched] == ["L1", "L1"] and not {"L1H3", "L1H2"} & set(matched)  # the top heads' layer
    assert (table["split"] == "validation").all() and (table["positions"] == positions).all()
    # the top-2 full-answer accuracy, recomputed by plain generation inside the ablation, on validation pairs
    pairs = pd.read_parquet(prepared / "pairs.parquet")
    pairs = pairs[pairs["split"] == "validation"].reset_index(drop=True)
    if positions == "all":
        pairs = subsample(pairs, 5, 0).reset_index(drop=True)
    assert (table["n"] == len(pairs)).all()
    cache = load_file(str(prepared / "cache.safetensors"))
    n_new = answer_tokens(lm.tokenizer, pairs["answer"])
    correct = 0
    for template, group in pairs.groupby("template_id"):
        if positions == "end":
            mean, where = AlignedMean(cache["cf_mean_heads"], cache["cf_mean_mlps"]), "end"
        else:  # the template's own mean at every position its counterfactuals reach
            grouped = GroupedMean(cache["cf_template_heads"], cache["cf_template_mlps"], cache["cf_template_counts"])
            mean, where = grouped.group(template), "aligned"
        with mean_ablate(lm, [(1, 3), (1, 2)], [], mean, positions=where):
            texts = greedy_answers(lm, list(group["prompt"]), n_new, 4)
        correct += sum(answer_correct(t, g) for t, g in zip(texts, group["answer"]))
    assert table["full_accuracy"].iloc[2] == pytest.approx(correct / len(pairs))
    assert (table["full_accuracy"] <= table["accuracy"] + 1e-9).all()
    items = pd.read_parquet(tmp_path / "items.parquet")
    top2 = items[(items["curve"] == "top_heads") & (items["k"] == 2)]
    assert top2["full_correct"].sum() == correct and sorted(top2["sample_id"]) == sorted(pairs["sample_id"])


def test_all_positions_answers_batched_across_sets_are_each_sets_own_generation(prepared):
    """positions "all" runs every node set at once per template (greedy_end_sets, positions "aligned": the
    prefix the template's mean does not reach is shared); each set's tokens are those of a plain greedy
    generation inside that set's per-template mean ablation, up to where the answer is settled."""
    from arithmech.data.answers import answer_correct, decided_answers
    from arithmech.interp.ablation import mean_ablate
    from arithmech.intervention.generation import greedy_generate
    from arithmech.intervention.means import GroupedMean

    lm = load_model(prepared / "model", device="cpu")
    pairs = pd.read_parquet(prepared / "pairs.parquet")
    assert pairs["template_id"].nunique() > 1
    cache = load_file(str(prepared / "cache.safetensors"))
    grouped = GroupedMean(cache["cf_template_heads"], cache["cf_template_mlps"], cache["cf_template_counts"])
    pairs = pairs[pairs["template_id"].isin([t for t in range(len(grouped.counts)) if grouped.counts[t, 0] > 0])]
    head_sets = [[], [(1, 3)], [(1, 3), (0, 1)], [(0, 2)], []]
    mlp_sets = [[], [], [1], [], [0]]
    texts, templates = list(pairs["prompt"]), pairs["template_id"].to_numpy()
    golds = list(pairs["answer"])
    got = ablation.set_answers(lm, texts, golds, template_ids=templates, head_sets=head_sets, mlp_sets=mlp_sets,
                               means=cache_means(cache, "all"), positions="all", max_new_tokens=3,
                               batch_size=4, copies=256).tokens
    assert got.shape == (len(head_sets), len(texts), 3)
    decided = decided_answers(lm.tokenizer, golds)
    for s, (hs, ms) in enumerate(zip(head_sets, mlp_sets)):
        for t in set(templates):
            rows = [i for i, x in enumerate(templates) if x == t]
            with mean_ablate(lm, hs, ms, grouped.group(int(t)), positions="aligned"):
                want = greedy_generate(lm, [texts[i] for i in rows], 3, 2)
            for i, row in zip(rows, want):  # equal up to where the score is decided, then the pad id
                stop = next((j for j in range(3) if decided(i, row[: j + 1].tolist())), 2)
                assert torch.equal(got[s, i, : stop + 1], row[: stop + 1]), (hs, ms, t)
                assert (got[s, i, stop + 1 :] == lm.tokenizer.pad_token_id).all()
                text, gold = lm.tokenizer.decode(row, skip_special_tokens=True), golds[i]
                assert answer_correct(lm.tokenizer.decode(got[s, i], skip_special_tokens=True), gold) == (
                    answer_correct(text, gold))
    assert not torch.equal(got[0], got[2])  # the ablations change some tokens, so the check has teeth
