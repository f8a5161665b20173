"""The findings page (arithmech.report.page) repeats the stages' own numbers, formatted for reading."""

import base64
import html

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from arithmech.report.page import key_component_rows, knockout_rows, study_rows  # noqa: E402
from arithmech.stages.findings import run_findings  # noqa: E402
from arithmech.io import write_parquet  # noqa: E402
from claims_example import example_claims  # noqa: E402


def _key():
    return pd.DataFrame({
        "node": ["L1H0", "L2H3", "L4MLP"], "layer": [1, 2, 4], "head": [0, 3, -1], "component": ["head", "head", "mlp"],
        "mean_effect": [-0.01, -0.05, -0.02], "n_heads_total": 40, "metric": "relative_logit",
        "rule": "mean effect < median - 5 x 1.4826 MAD",
    })


def knockout_table():
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
    assert row["key heads (effect)"] == "L2H3 -5.00%, L1H0 -1.00%" and row["key MLPs (effect)"] == "L4MLP -2.00%"
    assert row["heads selected"] == "2 of 40 (5.0%)"
    empty = key_component_rows({"division": _key().iloc[:0].assign(n_heads_total=[])})
    assert empty.loc[0, "key heads (effect)"] == "none"
    diff = key_component_rows({"addition": _key().assign(metric="logit_diff")})
    assert diff.loc[0, "key heads (effect)"] == "L2H3 -0.0500, L1H0 -0.0100"


def test_knockout_rows_read_the_largest_k_and_the_random_draws():
    row, every = knockout_rows({"addition": knockout_table()}).to_dict("records")
    assert row["K"] == 2 and row["n"] == "20" and row["positions"] == "end"
    assert row["first token: none"] == "100.0%" and row["first token: top K"] == "30.0%"
    assert row["full answer: top K"] == "20.0%"
    assert row["first token: random K"] == "80.0% [70.0%, 90.0%]"
    assert row["first token: layer-matched K"] == "50.0% [40.0%, 60.0%]"
    assert every["positions"] == "all" and every["n"] == "8" and every["first token: top K"] == "15.0%"


def study_tables():
    study = pd.DataFrame({
        "arm": ["base", "precise", "precise", "full"], "run": ["base", "chosen", "seed1", "chosen"],
        "accuracy": [0.2, 0.7, 0.6, 0.8], "accuracy_low": [0.1, 0.6, 0.5, 0.7], "accuracy_high": [0.3, 0.8, 0.7, 0.9],
        "kl_to_base": [0.0, 0.01, float("nan"), 0.002], "trainable_params": [0, 10, 10, 1179648],
    })
    comp = pd.DataFrame({
        "arm_a": ["precise", "precise", "full"], "arm_b": ["full", "full", "base"],
        "metric": ["accuracy", "kl_to_base", "accuracy"], "difference": [-0.1, 0.008, 0.6],
        "ci_low": [-0.2, 0.001, 0.5], "ci_high": [0.0, 0.01, 0.7], "p_value": [1.79e-58, 0.01, 0.001],
        "p_holm": [0.08, 0.03, 0.003], "test": "paired_cluster_bootstrap",
    })
    return study, comp


def test_study_rows_format_for_reading():
    study, comp = study_tables()
    arms, rows = study_rows(study, comp)
    precise = arms.set_index("arm").loc["precise"]
    assert precise["exact match (chosen run)"] == "70.0% [60.0%, 80.0%]" and precise["mean over runs"] == "65.0%"
    assert arms.set_index("arm").loc["full", "trainable parameters"] == "1,179,648"
    assert list(rows["comparison"]) == ["precise - full", "precise - full"]  # only the precise arm's rows
    assert rows["difference"].iloc[0] == "-10.0 points" and rows["interval"].iloc[0] == "[-20.0, 0.0]"
    assert rows["difference"].iloc[1] == "0.0080 nats" and rows["p"].iloc[1] == "0.010"
    assert rows["p"].iloc[0] == "< 0.001" and rows["p (Holm)"].iloc[0] == "0.080"


def write_figure(path):
    plt.figure(figsize=(2, 1))
    plt.plot([0, 1])
    plt.savefig(path)
    plt.close()
    return path


def test_page_opens_on_the_scorecard_and_embeds_its_figures(tmp_path):
    study, comp = study_tables()
    root = tmp_path / "results/m"
    (root / "effects").mkdir(parents=True)
    (root / "knockout").mkdir()
    paths = {"claims": root / "claims.parquet"}
    write_parquet(example_claims(), paths["claims"])
    for name, frame in [("key", _key()), ("ko", knockout_table()), ("study", study), ("comp", comp)]:
        paths[name] = root / f"{name}.parquet"
        meta = {"model_sha256": "b179c9523d0e", "versions": {"torch": "2.13.0"}} if name == "ko" else None
        write_parquet(frame, paths[name], meta)
    figures = [write_figure(root / "effects/addition.png"), write_figure(root / "knockout/addition.png")]
    out = tmp_path / "findings.html"
    run_findings(model="m", claims_path=paths["claims"], key_paths={"addition": paths["key"]},
                 knockout_paths={"addition": paths["ko"]}, figure_paths=figures, study_path=paths["study"],
                 comparisons_path=paths["comp"], out_html=out)
    page = out.read_text()
    assert page.index("Scorecard") < page.index("Figures") < page.index("Key components")
    assert "class='verdict does-not-hold'" in page and "Of 9 claims: 4 hold" in page
    # rows whose figure is on the page link to it; the others name the report entry of their table
    assert "<a href='#fig-knockout-addition'>figure below</a>" in page and "id='fig-knockout-addition'" in page
    assert "<span class='source'>4. Precise SFT: finetune/study.md</span>" in page
    assert "2. Validate: knockout/addition.png" in page
    png = base64.b64encode(figures[0].read_bytes()).decode()
    assert f"data:image/png;base64,{png}" in page and "src='effects" not in page  # self-contained
    assert "L2H3 -5.00%" in page and "80.0% [70.0%, 90.0%]" in page and "1,179,648" in page
    assert "model sha256 b179c952, torch 2.13.0" in page
    run_findings(model="m", claims_path=paths["claims"], key_paths={"addition": paths["key"]},
                 knockout_paths={"addition": paths["ko"]}, figure_paths=figures[:1], out_html=out)
    page = out.read_text()
    assert "Precise SFT study" not in page and "#fig-knockout-addition" not in page
    # the study could not run (no format inside its band): the page says why instead of its tables
    reason = "The precise-SFT study could not run: no candidate format's base exact match lies inside the band."
    write_parquet(study.iloc[:0], paths["study"], {"ran": False, "reason": reason})
    write_parquet(comp.iloc[:0], paths["comp"], {"ran": False, "reason": reason})
    run_findings(model="m", claims_path=paths["claims"], key_paths={"addition": paths["key"]},
                 knockout_paths={"addition": paths["ko"]}, figure_paths=figures, study_path=paths["study"],
                 comparisons_path=paths["comp"], out_html=out)
    page = out.read_text()
    assert "Precise SFT study" in page and reason in html.unescape(page) and "precise - random_heads" not in page
    (root / "finetune").mkdir()
    figure = write_figure(root / "finetune/study.png")  # it only repeats the reason: not on the page
    run_findings(model="m", claims_path=paths["claims"], key_paths={"addition": paths["key"]},
                 knockout_paths={"addition": paths["ko"]}, figure_paths=[*figures, figure], study_path=paths["study"],
                 comparisons_path=paths["comp"], out_html=out)
    assert "fig-finetune-study" not in out.read_text() and reason in html.unescape(out.read_text())


def test_provenance_names_the_models_checksum_whether_one_file_or_a_directory(tmp_path):
    from arithmech.report.page import provenance_text

    one, folder = tmp_path / "one.parquet", tmp_path / "folder.parquet"
    write_parquet(pd.DataFrame({"x": [1]}), one, {"model_sha256": "b179c9523d0e", "versions": {"torch": "2.13.0"}})
    write_parquet(pd.DataFrame({"x": [1]}), folder,
                  {"model_sha256": {"model-2.safetensors": "22222222ff", "model-1.safetensors": "11111111ee"}})
    assert provenance_text(one) == "model sha256 b179c952, torch 2.13.0"
    assert provenance_text(folder) == "model sha256 11111111 22222222"
