"""The findings page (arithmech.findings) repeats the stages' own numbers."""

import pandas as pd
import pytest

from arithmech.findings import key_component_rows, knockout_rows, run_findings, study_rows


def _key():
    return pd.DataFrame({
        "node": ["L1H0", "L2H3", "L4MLP"], "layer": [1, 2, 4], "head": [0, 3, -1], "component": ["head", "head", "mlp"],
        "mean_effect": [-0.01, -0.05, -0.02], "n_heads_total": 40,
    })


def _knockout():
    rows = [("top_heads", -1, k, acc, acc - 0.1) for k, acc in [(0, 1.0), (1, 0.8), (2, 0.3)]]
    rows += [("random_heads", s, k, acc, acc) for s, accs in [(0, [0.9, 0.7]), (1, [1.0, 0.9])]
             for k, acc in zip([1, 2], accs)]
    rows += [("random_layer_matched", s, 2, acc, acc) for s, acc in [(0, 0.6), (1, 0.4)]]
    rows.append(("key_mlps", -1, 1, 0.5, 0.5))
    end = pd.DataFrame(rows, columns=["curve", "seed", "k", "accuracy", "full_accuracy"]).assign(n=20, positions="end")
    every = end.assign(positions="all", n=8, accuracy=end["accuracy"] / 2)
    return pd.concat([end, every], ignore_index=True)


def test_key_components_strongest_first():
    (row,) = key_component_rows({"addition": _key()}).to_dict("records")
    assert row["key heads"] == "L2H3 L1H0" and row["key MLPs"] == "L4MLP" and row["heads selected"] == "2 of 40"
    assert row["strongest effect"] == -0.05
    empty = key_component_rows({"division": _key().iloc[:0].assign(n_heads_total=[])})
    assert empty.loc[0, "key heads"] == "none"


def test_knockout_rows_read_the_largest_k_and_the_random_draws():
    row, every = knockout_rows({"addition": _knockout()}).to_dict("records")
    assert row["K"] == 2 and row["n"] == 20 and row["positions"] == "end"
    assert row["first token: none"] == 100 and row["first token: top K"] == pytest.approx(30)
    assert row["full answer: top K"] == pytest.approx(20)
    assert row["first token: random K"] == "80.0 [70.0, 90.0]"
    assert row["first token: layer-matched K"] == "50.0 [40.0, 60.0]"
    assert every["positions"] == "all" and every["n"] == 8 and every["first token: top K"] == pytest.approx(15)


def test_study_rows_and_page(tmp_path):
    study = pd.DataFrame({
        "arm": ["base", "precise", "precise", "full"], "run": ["base", "chosen", "seed1", "chosen"],
        "accuracy": [0.2, 0.7, 0.6, 0.8], "accuracy_low": [0.1, 0.6, 0.5, 0.7], "accuracy_high": [0.3, 0.8, 0.7, 0.9],
        "kl_to_base": [0.0, 0.01, float("nan"), 0.002], "trainable_params": [0, 10, 10, 100],
    })
    comp = pd.DataFrame({
        "arm_a": ["precise", "precise", "full"], "arm_b": ["full", "full", "base"],
        "metric": ["accuracy", "kl_to_base", "accuracy"], "difference": [-0.1, 0.008, 0.6],
        "ci_low": [-0.2, 0.001, 0.5], "ci_high": [0.0, 0.01, 0.7], "p_value": [0.04, 0.01, 0.001],
        "p_holm": [0.08, 0.03, 0.003], "test": "paired_cluster_bootstrap",
    })
    arms, rows = study_rows(study, comp)
    assert arms.set_index("arm").loc["precise", "exact match (chosen run)"] == "70.0 [60.0, 80.0]"
    assert arms.set_index("arm").loc["precise", "mean over runs"] == pytest.approx(65)
    assert list(rows["comparison"]) == ["precise - full", "precise - full"]  # only the precise arm's rows
    assert rows["difference"].iloc[0] == pytest.approx(-10) and rows["interval"].iloc[0] == "[-20.0, 0.0]"
    assert rows["difference"].iloc[1] == pytest.approx(0.008)
    paths = {}
    for name, frame in [("key", _key()), ("ko", _knockout()), ("study", study), ("comp", comp)]:
        paths[name] = tmp_path / f"{name}.parquet"
        frame.to_parquet(paths[name])
    out = tmp_path / "findings.html"
    run_findings(model="m", key_paths={"addition": paths["key"]}, knockout_paths={"addition": paths["ko"]},
                 study_path=paths["study"], comparisons_path=paths["comp"], out_html=out)
    page = out.read_text()
    assert "L2H3 L1H0" in page and "80.0 [70.0, 90.0]" in page and "precise - full" in page
    run_findings(model="m", key_paths={"addition": paths["key"]}, knockout_paths={"addition": paths["ko"]},
                 out_html=out)
    assert "Precise SFT" not in out.read_text()
