"""The analyze stage (what the `analyze` rule runs) on the tiny model, without Snakemake: role attention
of the key heads, the fallback to the top heads when no head is key, the MLP probes and the figures."""

import numpy as np
import pandas as pd
import pytest

from arithmech.interp.analysis import ROLES
from arithmech.io import read_parquet_meta, write_parquet
from arithmech.model.tiny import build_tiny_model
from arithmech.stages import analyze as analyze_stage
from arithmech.stages import identify

PROMPTS = {
    "operands": {"min": 1, "max": 4},
    "n_shots": 1,
    "shot_separator": ".\n",
    "templates": ["{a} {op} {b} is equal to ", "What is {a} {op} {b}? The answer is "],
    "operators": {"addition": ["plus"]},
    "null_words": ["nothing"],
    "counterfactual_shots": "zero_shot",
    "keep_only_correct": False,
    "splits": {"validation_share": 0.5, "max_samples": {"identification": 12, "validation": 12}},
}
COMPUTE = {"device": "cpu", "dtype": "float32", "batch_size": 5}
ANALYSIS = {"max_samples": 8, "fallback_heads": 2, "n_random": 32}
N_LAYERS, N_HEADS = 3, 4


def effects_table() -> pd.DataFrame:
    """Made-up patching effects: head (l, h) gets -(10 l + h) / 100, except the two strongest heads."""
    rows = [{"node": f"L{l}H{h}", "layer": l, "head": h, "component": "head", "mean_effect": (l * 10 + h) / -100}
            for l in range(N_LAYERS) for h in range(N_HEADS)]
    rows[5]["mean_effect"], rows[1]["mean_effect"] = -0.9, -0.8  # L1H1 then L0H1 are the strongest heads
    rows += [{"node": f"L{l}MLP", "layer": l, "head": None, "component": "mlp", "mean_effect": -0.5}
             for l in range(N_LAYERS)]
    return pd.DataFrame(rows).astype({"head": "Int64"})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyze")
    src = build_tiny_model(root / "src", n_layers=N_LAYERS, n_heads=N_HEADS, n_kv_heads=2)
    identify.run_prepare_model(source={"path": str(src)}, out_dir=root / "model")
    identify.run_build_pairs(model_dir=root / "model", task="addition", prompts=PROMPTS, compute=COMPUTE, seed=0,
                             out_pairs=root / "pairs.parquet", out_dropped=root / "dropped.parquet")
    write_parquet(effects_table(), root / "effects.parquet")
    # key heads listed out of rank order: the stage follows `rank`
    key = pd.DataFrame({"node": ["L2H0", "L0H3", "L1MLP"], "layer": [2, 0, 1], "head": [0, 3, None],
                        "component": ["head", "head", "mlp"], "rank": [2, 1, 1]}).astype({"head": "Int64"})
    write_parquet(key, root / "key.parquet")
    write_parquet(key[key["component"] == "mlp"], root / "key_none.parquet")  # no key head
    return root


def analyze(root, key_name: str, out: str):
    out_dir = root / out
    paths = {name: out_dir / f"addition_{name}" for name in
             ("roles.parquet", "roles_all.parquet", "example.parquet", "probes.parquet", "roles.png", "example.png",
              "probes.png")}
    analyze_stage.run_analyze(model="tiny", task="addition", model_dir=root / "model",
                              pairs_path=root / "pairs.parquet",
                              key_path=root / key_name, effects_path=root / "effects.parquet", analysis=ANALYSIS,
                              compute=COMPUTE, seed=0, out_roles=paths["roles.parquet"],
                              out_roles_all=paths["roles_all.parquet"], out_example=paths["example.parquet"],
                              out_probes=paths["probes.parquet"])
    analyze_stage.run_plot_analysis(model="tiny", task="addition", roles_path=paths["roles.parquet"],
                              example_path=paths["example.parquet"], probes_path=paths["probes.parquet"],
                              out_roles_png=paths["roles.png"], out_example_png=paths["example.png"],
                              out_probes_png=paths["probes.png"])
    return paths


@pytest.fixture(scope="module")
def key_run(prepared):
    return analyze(prepared, "key.parquet", "key")


def test_role_attention_of_the_key_heads(key_run):
    roles = pd.read_parquet(key_run["roles.parquet"])
    assert list(dict.fromkeys(roles["node"])) == ["L0H3", "L2H0"]  # rank order
    assert (roles["selection"] == "key").all() and (roles["task"] == "addition").all()
    assert len(roles) == 2 * len(ROLES)
    for node, part in roles.groupby("node"):
        assert list(part["role"]) == list(ROLES)
        assert part["attention"].sum() == pytest.approx(1.0, abs=1e-5)
        assert part["rank"].nunique() == 1
    assert (roles["n_texts"] == ANALYSIS["max_samples"]).all()  # 12 validation pairs, 8 drawn
    tokens = roles.drop_duplicates("role").set_index("role")["tokens"]
    assert tokens["operand_a"] >= 1 and tokens["operand_b"] >= 1 and tokens["operator"] >= 1
    assert tokens["equals"] >= 1 and tokens["prefix"] >= 1  # one solved example before each query
    meta = read_parquet_meta(key_run["roles.parquet"])
    assert meta["stage"] == "analyze" and meta["params"]["heads"] == ["L0H3", "L2H0"]
    assert meta["params"]["analysis"] == ANALYSIS



def test_attention_of_every_head_marks_the_analysed_ones(key_run):
    """The baseline the scorecard compares the key heads with: every head of the model by role, the analysed
    heads' rows equal to the key-head table's."""
    roles = pd.read_parquet(key_run["roles.parquet"])
    every = pd.read_parquet(key_run["roles_all.parquet"])
    assert len(every) == N_LAYERS * N_HEADS * len(ROLES)
    analysed = every[every["analysed"]]
    assert sorted({f"L{l}H{h}" for l, h in zip(analysed["layer"], analysed["head"])}) == ["L0H3", "L2H0"]
    merged = analysed.merge(roles, on=["layer", "head", "role"], suffixes=("", "_key"))
    assert len(merged) == len(roles)
    np.testing.assert_allclose(merged["attention"], merged["attention_key"], atol=1e-6)
    np.testing.assert_allclose(every.groupby(["layer", "head"])["attention"].sum(), 1.0, atol=1e-5)

def test_mlp_probes_table(key_run):
    probes = pd.read_parquet(key_run["probes.parquet"])
    # variants x subsets x layers x (input, output, delta) x (a, b, c, random); in addition of operands 1..4
    # the answer's digit is never an operand's, so answer_distinct holds every prompt
    assert len(probes) == 2 * 2 * N_LAYERS * 3 * 4
    assert set(probes["variant"]) == {"paper", "normed"} and set(probes["subset"]) == {"all", "answer_distinct"}
    assert set(probes["vector"]) == {"input", "output", "delta"} and set(probes["target"]) == {"a", "b", "c", "random"}
    assert probes.groupby(["variant", "subset", "layer", "vector", "target"]).size().eq(1).all()
    assert np.isfinite(probes["mean"]).all()
    assert set(probes.loc[probes["target"] == "random", "n"]) == {ANALYSIS["n_random"]}
    assert set(probes.loc[probes["target"] != "random", "n"]) == {ANALYSIS["max_samples"]}
    assert set(probes["n_texts"]) == {ANALYSIS["max_samples"]}
    by_subset = [part.drop(columns="subset").reset_index(drop=True) for _, part in probes.groupby("subset")]
    pd.testing.assert_frame_equal(*by_subset)


def test_example_table_is_one_prompt_per_head(prepared, key_run):
    """The example figure's table: the first drawn pair's tokens, in order, for each key head in rank order,
    with the attention END pays each of them (the whole prompt, so each head's row sums to one)."""
    example = pd.read_parquet(key_run["example.parquet"])
    pairs = pd.read_parquet(prepared / "pairs.parquet")
    prompt = pairs.set_index("sample_id").loc[example["sample_id"].iloc[0], "prompt"]
    assert list(dict.fromkeys(example["node"])) == ["L0H3", "L2H0"] and example["sample_id"].nunique() == 1
    for node, part in example.groupby("node"):
        assert part["position"].tolist() == list(range(len(part)))
        assert "".join(part["token"]).endswith(prompt)
        assert {"operand_a", "operand_b", "operator"} <= set(part["role"])
        assert part["attention"].sum() == pytest.approx(1.0, abs=1e-5)
    first, second = (example[example["node"] == n]["attention"].to_numpy() for n in ("L0H3", "L2H0"))
    assert not np.allclose(first, second)  # two heads, two attention patterns


def test_figures_are_drawn(key_run):
    """Each figure decodes as an image of a figure's size with something drawn on it, not a blank canvas."""
    import matplotlib.image

    for name in ("roles.png", "example.png", "probes.png"):
        image = matplotlib.image.imread(key_run[name])  # [height, width, RGB(A)] floats in [0, 1]
        assert image.ndim == 3 and min(image.shape[:2]) >= 200, (name, image.shape)
        rgb = image[..., :3].reshape(-1, 3)
        assert len(np.unique(rgb, axis=0)) >= 20, name  # colours: cells, lines, anti-aliased text
        assert 0.001 < (rgb.max(1) < 0.5).mean() < 0.9, name  # dark marks on a light background


def test_no_key_head_falls_back_to_the_top_heads(prepared):
    paths = analyze(prepared, "key_none.parquet", "top")
    roles = pd.read_parquet(paths["roles.parquet"])
    assert list(dict.fromkeys(roles["node"])) == ["L1H1", "L0H1"]  # fallback_heads = 2, most negative first
    assert (roles["selection"] == "top").all()
    assert list(dict.fromkeys(roles["rank"])) == [1, 2]
    assert read_parquet_meta(paths["roles.parquet"])["params"]["selection"] == "top"
    assert paths["example.png"].stat().st_size > 0


def test_same_draw_same_tables(prepared, key_run):
    again = analyze(prepared, "key.parquet", "again")
    for name in ("roles.parquet", "probes.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(again[name]), pd.read_parquet(key_run[name]))
