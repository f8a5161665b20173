"""The findings page (arithmech.report.page) repeats the stages' own numbers, formatted for reading."""

import base64
import html
import re

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402

from arithmech.io import write_parquet  # noqa: E402
from arithmech.report import display  # noqa: E402
from arithmech.report.claims.common import COMBINE_RULE  # noqa: E402
from arithmech.report.page import key_component_rows, knockout_rows, study_rows  # noqa: E402
from arithmech.report.scorecard import claims_html, claims_markdown, scorecard_table  # noqa: E402
from arithmech.stages.findings import run_findings  # noqa: E402
from claims_example import example_claims  # noqa: E402
from helpers import knockout_table, study_tables, write_figure  # noqa: E402


def _key():
    return pd.DataFrame({
        "node": ["L1H0", "L2H3", "L4MLP"], "layer": [1, 2, 4], "head": [0, 3, -1], "component": ["head", "head", "mlp"],
        "mean_effect": [-0.01, -0.05, -0.02], "n_heads_total": 40, "metric": "relative_logit",
        "rule": "mean effect < median - 5 x 1.4826 MAD",
    })


def test_key_components_strongest_first():
    (row,) = key_component_rows({"addition": _key()}).to_dict("records")
    assert row["key heads (effect)"] == "L2H3 -5.00%, L1H0 -1.00%" and row["key MLPs (effect)"] == "L4MLP -2.00%"
    assert row["heads selected"] == "2 of 40 (5.0%)"
    empty = key_component_rows({"division": _key().iloc[:0].assign(n_heads_total=[])})
    assert empty.loc[0, "key heads (effect)"] == "none"
    diff = key_component_rows({"addition": _key().assign(metric="logit_diff")})
    assert diff.loc[0, "key heads (effect)"] == "L2H3 -0.0500, L1H0 -0.0100"
    # with resampled intervals, each effect at its interval's precision
    ci = _key().assign(mean_effect=[-0.01, -0.0422, -0.02], ci_low=[-0.0131, -0.0612, -0.0201],
                       ci_high=[-0.0072, -0.0266, -0.0199])
    (row,) = key_component_rows({"addition": ci}).to_dict("records")
    assert row["key heads (effect)"] == "L2H3 -4.2%, L1H0 -1.0%" and row["key MLPs (effect)"] == "L4MLP -2.0%"


def test_knockout_rows_read_the_largest_k_and_the_random_draws():
    row, every = knockout_rows({"addition": knockout_table()}).to_dict("records")
    assert row["K"] == 2 and row["n"] == "20" and row["positions"] == "end"
    assert row["first token: none"] == "100.0%" and row["first token: top K"] == "30.0%"
    assert row["full answer: top K"] == "20.0%"
    assert row["first token: random K"] == "80.0% [70.0%, 90.0%]"
    assert row["first token: layer-matched K"] == "50.0% [40.0%, 60.0%]"
    assert every["positions"] == "all" and every["n"] == "8" and every["first token: top K"] == "15.0%"


def test_study_rows_format_for_reading():
    study, comp = study_tables()
    arms, rows = study_rows(study, comp)
    precise = arms.set_index("arm").loc["precise"]
    assert precise["exact match (chosen run)"] == "70.0% [60.0%, 80.0%]" and precise["mean over runs"] == "65.0%"
    assert arms.set_index("arm").loc["full", "trainable parameters"] == "1,179,648"
    assert list(rows["comparison"]) == ["precise - full", "precise - full"]  # the precise arm's rows, not full's
    circuit = comp.iloc[:1].assign(arm_a="circuit", arm_b="precise")
    _, rows = study_rows(study, pd.concat([comp, circuit], ignore_index=True))
    assert list(rows["comparison"]) == ["precise - full", "precise - full", "circuit - precise"]
    # differences at their resampled interval's precision (two significant digits of its width or larger end)
    assert rows["difference"].iloc[0] == "-10 points" and rows["interval"].iloc[0] == "[-20, 0]"
    assert rows["difference"].iloc[1] == "0.008 nats" and rows["interval"].iloc[1] == "[0.001, 0.010]"
    assert rows["p"].iloc[1] == "0.010"
    assert rows["p"].iloc[0] == "< 0.001" and rows["p (Holm)"].iloc[0] == "0.080"
    assert arms.set_index("arm").loc["precise", "KL to base (nats/token)"] == "0.010"
    assert arms.set_index("arm").loc["full", "KL to base (nats/token)"] == "2e-3"  # below 0.01: one digit


def test_study_rows_show_each_head_arms_overlap_with_precise_and_the_circuit_arms_comparisons():
    study, comp = study_tables()
    study = pd.concat([study, study.iloc[[1]].assign(arm="circuit_disjoint")], ignore_index=True)
    study = study.assign(n_heads=[float("nan"), 16, 16, float("nan"), 12], overlap_precise=[float("nan"), 16, 16,
                         float("nan"), 0], jaccard_precise=[float("nan"), 1.0, 1.0, float("nan"), 0.0])
    arms, rows = study_rows(study, pd.concat([comp, comp.iloc[:1].assign(arm_a="circuit_disjoint", arm_b="precise")]))
    shared = arms.set_index("arm")["heads (shared with precise)"]
    assert shared["precise"] == "16 (16 shared, Jaccard 1.00)"
    assert shared["circuit_disjoint"] == "12 (0 shared, Jaccard 0.00)"
    assert shared["full"] == "" and shared["base"] == ""
    assert "circuit_disjoint - precise" in list(rows["comparison"])


def test_study_rows_print_the_same_text_when_the_last_digits_move():
    """Two CPUs that differ in a statistic's last digits (docs/performance.md, Reproducibility) print the same
    rows; a zero-width interval falls back to the unit's own digits."""
    study, comp = study_tables()
    kl = comp.assign(metric="kl_to_base", difference=-0.000955, ci_low=-0.002459, ci_high=0.000549)
    moved = kl.assign(difference=-0.000956, ci_low=-0.0024592, ci_high=0.0005488)
    acc = comp.iloc[:1].assign(difference=-0.1162, ci_low=-0.16574, ci_high=-0.0576)
    acc_moved = acc.assign(ci_low=-0.16576)
    for one, other in [(kl, moved), (acc, acc_moved)]:
        assert study_rows(study, one)[1].equals(study_rows(study, other)[1])
    _, rows = study_rows(study, pd.concat([kl.iloc[:1], acc]))
    assert list(rows["difference"]) == ["-0.0010 nats", "-12 points"]
    assert list(rows["interval"]) == ["[-0.0025, 0.0005]", "[-17, -6]"]
    flat = comp.assign(metric=["accuracy", "kl_to_base", "accuracy"], ci_low=comp["difference"],
                       ci_high=comp["difference"])
    _, rows = study_rows(study, flat)
    assert list(rows["difference"]) == ["-10 points", "8e-3 nats"]  # two significant digits; `display.nats`
    assert list(rows["interval"]) == ["[-10, -10]", "[8e-3, 8e-3]"]


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
    assert page.index("id='scorecard'") < page.index("Figures") < page.index("Key components")
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


def claim_blocks(table: str) -> dict[str, str]:
    """Each claim's <details> element of the scorecard's HTML, by claim id."""
    return dict(re.findall(r"<details class='claim' id='claim-([^']+)'>(.*?)</details>", table, flags=re.S))


def test_the_scorecard_opens_on_one_line_per_claim_and_folds_the_rest():
    """The first screen answers the question: one line (a <summary>) per claim with its statement, verdict,
    deciding number and the paper's; the parts and the rule open on demand, inside the claim's <details>."""
    claims = example_claims()
    claims.loc[(claims["claim"] == "few_key_heads") & (claims["scope"] == "all"), "rule"] = COMBINE_RULE
    table = scorecard_table(claims)
    blocks = claim_blocks(table)
    assert list(blocks) == list(claims["claim"].drop_duplicates())  # every claim once, in order
    assert table.count("<summary") == claims["claim"].nunique() and "<script" not in table
    for claim, block in blocks.items():
        rows = claims[claims["claim"] == claim]
        head, subs = rows[rows["scope"] == "all"].iloc[0], rows[rows["scope"] != "all"]
        summary, more = block.split("</summary>")
        assert (html.escape(head["statement"]) in summary
                and f"class='verdict {head['verdict'].replace(' ', '-')}'" in summary)
        assert html.escape(head["paper"]) in summary
        # the parts: rows of a table inside the claim's <details>, below its line
        assert more.count("<tr>") == (len(subs) + 1 if len(subs) else 0)
        for scope in subs["scope"]:
            assert f"<td>{html.escape(scope)}</td>" in more
        # each rule's text once per claim (the combining rule once for the page, under the table)
        for rule in rows["rule"].unique():
            if rule != COMBINE_RULE:
                assert block.count(html.escape(rule)) == 1, (claim, rule)
    assert html.escape(COMBINE_RULE.removeprefix("headline: ")) in table.split("</details>")[-1]
    assert COMBINE_RULE not in "".join(blocks.values())
    # the deciding number on the claim's line: the value, else the parts' verdicts
    assert display.measured(-41.3, -55.0, -28.4, "points", 120) in blocks["knockout_collapse"].split("</summary>")[0]
    assert "2 parts: 2 hold" in blocks["few_key_heads"].split("</summary>")[0]
    assert "the transfer rule did not run" in blocks["transfer"].split("</summary>")[0]
    assert claims_html(claims).count("<summary") == claims["claim"].nunique()


def test_markdown_gives_each_rule_once_per_claim():
    claims = example_claims()
    md = claims_markdown(claims)
    for claim, rows in claims.groupby("claim"):
        lines = [l for l in md.splitlines() if any(html.escape(s) in l or s in l for s in rows["statement"] if s)]
        assert lines  # the headline line
    rule = "holds if the share is below 5% for every operator"  # the headline's and both parts' rule
    assert md.count(rule) == 1
    knock = "holds if the interval of key minus layer-matched random excludes 0 in the paper's direction"
    assert md.count(knock) == 1


def test_the_page_says_what_the_models_own_circuit_is(tmp_path):
    from arithmech.report.page import circuit_sentences

    values = {"correct": {"resample": 0.6, "mean": 0.7}, "key_correct": {"resample": 0.05, "mean": 0.15},
              "random_diff": {"resample": 0.5, "mean": 0.6}}

    def row(task, target, chosen, heads, mlps, shift):
        return {"task": task, "target": target, "chosen": chosen, "n_heads": heads, "n_mlps": mlps,
                "share": (heads + mlps) / 300,
                **{f"tf_{k}_{m}{x}": v + shift + d for m, by_kind in values.items() for k, v in by_kind.items()
                   for x, d in (("", 0.0), ("_low", -0.05), ("_high", 0.05))}}

    summary = pd.DataFrame([row("addition", 0.8, False, 30, 10, -0.3), row("addition", 0.9, True, 35, 19, 0.1),
                            row("addition", 0.95, True, 50, 20, 0.2), row("union", 0.9, True, 60, 24, 0.0)])
    text = circuit_sentences(summary)
    assert text.startswith("Over all operators, the circuit that pruning finds on the identification pairs has 60 "
                           "heads and 24 MLPs (28")
    assert "50 heads" not in text and "30 heads" not in text
    assert "no circuit" in circuit_sentences(summary.assign(chosen=False))
    # teacher-forced (what pruning and the verdicts read): its faithfulness under each ablation, at its resampled
    # interval's precision, the key circuit's and the margin over random circuits beside it; nothing of the old
    # END-mean protocol
    assert ("is 60% [55%, 65%] under resample ablation and 70% [65%, 75%] under mean ablation, the key heads and key "
            "MLPs' 5% and 15%, +50 and +60 points above random circuits of its size. ") in text
    assert "old protocol" not in text
    # the smallest chosen target's circuit per operator
    assert "Per operator (teacher-forced, resample / mean ablation), addition: 35 heads + 19 MLPs at 70% / 80%." in text
    assert "sanity check" not in text
    # the shared circuit (pruned on every operator's pairs together) beside the union, not among the operators
    shared = pd.concat([summary, pd.DataFrame([row("shared", 0.9, True, 20, 8, 0.0)])])
    text = circuit_sentences(shared)
    assert ("Pruned on every operator's identification pairs together, the shared circuit has 20 heads and 8 MLPs"
            in text and "ablation, +50 and +60 points above random circuits of its size. Per operator" in text)
    assert "shared: " not in text
    # each circuit's fit gap (identification minus validation, per ablation), where the summary has it
    assert "fit gap" not in text
    gaps = shared.assign(tf_resample_gap=0.14, tf_mean_gap=[0.06, 0.06, 0.06, -0.02, float("nan")])
    text = circuit_sentences(gaps)
    assert "addition: 35 heads + 19 MLPs at 70% / 80%, fit gap +14 / +6 points." in text
    assert "+50 and +60 points above random circuits of its size, fit gap +14 / -2 points. Pruned on" in text
    assert "fit gap +14 / n/a points. Per operator" in text
    # a failed sanity check (circuit.discover.sanity: warn) is said on the page, naming the check and the operators
    failed = "sanity check 'one node ablated' failed: the median draw keeps 0.5 of the model's accuracy"
    warned = summary.assign(tf_resample_sanity_failed=[failed, failed, failed, "addition: " + failed],
                            tf_mean_sanity_failed="")
    assert circuit_sentences(warned).endswith(
        " The resample ablation failed its sanity check 'one node ablated' on addition, union: every row of the "
        "scorecard read from it is inconclusive.")
    study, comp = study_tables()
    root = tmp_path / "results/m"
    root.mkdir(parents=True)
    paths = {}
    for name, frame in [("claims", example_claims()), ("key", _key()), ("ko", knockout_table()),
                        ("discover", summary)]:
        paths[name] = root / f"{name}.parquet"
        write_parquet(frame, paths[name])
    out = tmp_path / "findings.html"
    common = dict(model="m", claims_path=paths["claims"], key_paths={"addition": paths["key"]},
                  knockout_paths={"addition": paths["ko"]}, figure_paths=[], out_html=out)
    run_findings(**common, discover_path=paths["discover"])
    page = out.read_text()
    assert page.index("id='scorecard'") < page.index("The model's own circuit") < page.index("Figures")
    run_findings(**common)
    assert "own circuit" not in out.read_text()
