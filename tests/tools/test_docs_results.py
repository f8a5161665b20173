"""`make docs` (arithmech.tools.docs_results): README's scorecard block and docs/results.md generated from a results
tree, the same bytes every time, README untouched outside its markers, a clear error when results are absent."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from arithmech.interp import effects as fx
from arithmech.io import write_parquet
from arithmech.tools.docs_results import (
    BEGIN,
    END,
    HISTORY_MARKERS,
    KEPT_CLAIM_COLUMNS,
    KEPT_RECORD,
    PERFORMANCE_PAGE,
    PLAN_CONFIGS,
    PLAN_MARKERS,
    PLAN_OUTPUT_MARKERS,
    RULES_MARKERS,
    RUN_TIME_MARKERS,
    MissingResults,
    claims_across_models,
    history_table,
    keep_claims,
    main,
    make_docs,
    plan_output,
    plan_text,
    read_history,
    replace_block,
    rules_table,
    run_time_text,
)
from arithmech.tools.run_record import HISTORY, HISTORY_COLUMNS, append_history, history_row, read_record
from claims_example import example_claims
from helpers import ROOT, check_docs, knockout_table, scorecard_readme, study_tables, write_figure

TASKS = ["addition", "division"]


README = scorecard_readme()  # the README these tests fill (helpers.scorecard_readme)


def _effects(task_seed: int) -> pd.DataFrame:
    """A patching effects table of 3 layers x 4 heads and 3 MLPs, as effects.aggregate and bootstrap write it."""
    rng = np.random.default_rng(task_seed)
    rows = [(f"L{l}H{h}", l, h, "head") for l in range(3) for h in range(4)] + [(f"L{l}MLP", l, pd.NA, "mlp")
                                                                              for l in range(3)]
    frame = pd.DataFrame(rows, columns=["node", "layer", "head", "component"]).astype({"head": "Int64"})
    frame["mean_effect"] = rng.normal(-0.002, 0.004, len(frame))
    frame.loc[1, "mean_effect"] = -0.01311  # one strong head
    frame["ci_low"], frame["ci_high"] = frame["mean_effect"] - 0.002, frame["mean_effect"] + 0.002
    frame["stability"], frame["metric"], frame["n"] = 0.9, "relative_logit", 8
    return frame


def results_tree(root, study: bool = True):
    """results/m/ as the workflow leaves it, written with the workflow's own writers and rule functions."""
    model = root / "m"
    for d in ["effects", "key_components", "knockout", "analysis", "finetune"]:
        (model / d).mkdir(parents=True, exist_ok=True)
    write_parquet(example_claims(), model / "claims.parquet", {"stage": "claims"})
    for i, task in enumerate(TASKS):
        effects = _effects(i)
        write_parquet(effects, model / f"effects/{task}.parquet")
        key = fx.key_components(effects, {"rule": "top_k", "k": 2}, {"rule": "top_k", "k": 1})
        write_parquet(key, model / f"key_components/{task}.parquet")
        write_parquet(knockout_table(), model / f"knockout/{task}.parquet",
                      {"model_sha256": "b179c9523d0e", "versions": {"arithmech": "0.1.0", "torch": "2.13.0"}})
        write_figure(model / f"effects/{task}.png")
        write_figure(model / f"knockout/{task}.png")
    transfer = pd.DataFrame([
        {"source": s, "heads": h, "seed": sd, "target": t, "n": 6, "accuracy": acc, "base_accuracy": 0.8}
        for s in TASKS for t in [*TASKS, "SVAMP", "qa_wikidata"]
        for h, sd, acc in [("key", -1, 0.1), ("random", 0, 0.7), ("random", 1, 0.75)]
    ])
    write_parquet(transfer, model / "knockout/transfer.parquet")
    roles = pd.DataFrame([{"node": "L0H1", "rank": 1, "layer": 0, "head": 1, "role": r, "attention": a}
                          for r, a in zip(["operand_a", "operand_b", "operator", "other"], [0.4, 0.3, 0.2, 0.1])])
    write_parquet(roles, model / "analysis/addition_roles.parquet")
    probes = pd.DataFrame([{"variant": "paper", "subset": "all", "layer": l, "vector": "output", "target": t,
                            "mean": 0.01 * l * (3 if t == "c" else 1)} for l in range(3) for t in "abc"])
    write_parquet(probes, model / "analysis/addition_probes.parquet")
    if study:
        s, c = study_tables()
        write_parquet(s, model / "finetune/study.parquet")
        write_parquet(c, model / "finetune/comparisons.parquet")
        write_figure(model / "finetune/study.png")
    return model


def _docs(tmp_path, results):
    readme, out, figures = tmp_path / "README.md", tmp_path / "docs/results.md", tmp_path / "docs/figures"
    if not readme.exists():
        readme.write_text(README)
    make_docs(results_dir=results, model="m", tasks=TASKS, readme=readme, out_md=out, figures_dir=figures)
    return readme, out, figures


def test_docs_fill_the_block_and_write_results(tmp_path):
    results_tree(tmp_path / "results")
    readme, out, figures = _docs(tmp_path, tmp_path / "results")
    text = readme.read_text()
    before, rest = text.split(BEGIN)
    block, after = rest.split(END)
    assert before == README.split(BEGIN)[0] and after == README.split(END)[1]  # untouched outside the markers
    assert "54.7" not in block and "| Claim | Paper (LLaMA2-7B) |" in block and "↳" not in block
    assert "[Fewer than 5% of heads are key heads.](docs/figures/key_components_shared.png)" not in block  # absent
    assert "(docs/figures/knockout_addition.png)" in block
    assert "Model `m` (model sha256 b179c952, arithmech 0.1.0, torch 2.13.0)" in block
    page = out.read_text()
    for heading in ["## Scorecard", "## Key components", "### addition", "## Knockout", "## Transfer",
                    "## Attention and MLP probes", "## Precise SFT study"]:
        assert heading in page
    # effects in percent with intervals, at the interval's precision; shares of resamples in whole percent
    assert "| L0H1 | 0 | -1.3% | [-1.5%, -1.1%] | 90% |" in page
    assert "10.0% / 72.5%" in page  # transfer: key / random (mean of draws)
    # no raw float (a small value in nats may read "1e-3", one significant digit)
    assert "1,179,648" in page and "< 0.001" in page and not re.search(r"\d\.\d+e-\d", page)
    assert "![" in page and "(figures/knockout_addition.png)" in page
    assert sorted(p.name for p in figures.iterdir()) == [
        "effects_addition.png", "effects_division.png", "finetune_study.png", "knockout_addition.png",
        "knockout_division.png"]


def test_docs_are_byte_identical_on_a_second_run(tmp_path):
    results_tree(tmp_path / "results")
    readme, out, figures = _docs(tmp_path, tmp_path / "results")
    first = {p: p.read_bytes() for p in [readme, out, *figures.iterdir()]}
    stamps = {p: p.stat().st_mtime_ns for p in first}
    _docs(tmp_path, tmp_path / "results")
    assert {p: p.read_bytes() for p in [readme, out, *figures.iterdir()]} == first
    assert {p: p.stat().st_mtime_ns for p in first} == stamps  # nothing rewritten


def test_an_operator_without_key_components_says_so(tmp_path):
    model = results_tree(tmp_path / "results")
    key = pd.read_parquet(model / "key_components/division.parquet")
    write_parquet(key.iloc[:0], model / "key_components/division.parquet")
    _, out, _ = _docs(tmp_path, tmp_path / "results")
    assert "### division\n\nNo head or MLP passed the rule." in out.read_text()


def test_docs_without_the_study_drop_its_figures(tmp_path):
    results = tmp_path / "results"
    results_tree(results)
    _docs(tmp_path, results)
    (results / "m/finetune/study.png").unlink()
    (results / "m/finetune/study.parquet").unlink()
    _, out, figures = _docs(tmp_path, results)
    assert "The study did not run" in out.read_text()
    assert not (figures / "finetune_study.png").exists()


def test_docs_when_the_study_could_not_run_say_why(tmp_path):
    from arithmech.io import write_parquet

    results = tmp_path / "results"
    results_tree(results)
    reason = "The precise-SFT study could not run: no candidate format's base exact match lies inside the band."
    for name in ("study", "comparisons"):
        path = results / f"m/finetune/{name}.parquet"
        write_parquet(pd.read_parquet(path).iloc[:0], path, {"ran": False, "reason": reason})
    _, out, _ = _docs(tmp_path, results)
    assert reason in out.read_text() and "results/m/finetune/study.md" in out.read_text()


def test_missing_results_name_the_file(tmp_path, capsys):
    results_tree(tmp_path / "results")
    (tmp_path / "results/m/knockout/division.parquet").unlink()
    with pytest.raises(MissingResults, match="knockout/division.parquet is missing"):
        _docs(tmp_path, tmp_path / "results")
    (tmp_path / "config.yaml").write_text("run: {models: [m], tasks: [addition, division]}\n")
    code = main(["--config", str(tmp_path / "config.yaml"), "--results", str(tmp_path / "nothing"),
                 "--readme", str(tmp_path / "README.md")])
    assert code == 1 and "nothing/m/claims.parquet is missing" in capsys.readouterr().err


def test_a_readme_without_markers_is_an_error():
    with pytest.raises(ValueError, match="no generated block"):
        replace_block("# no markers\n", "table")
    assert replace_block(README, "new\n") == README.replace("an old, hand-typed table: 54.7\n", "new\n")


def test_docs_and_findings_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, arithmech.tools.docs_results, arithmech.report.page, arithmech.report.scorecard, "
            "arithmech.report.display; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_check_docs_on_a_results_tree(tmp_path):
    results_tree(tmp_path / "results")
    assert "## Knockout" in check_docs(tmp_path / "results", "m", TASKS, tmp_path)


def test_a_timing_is_left_out_of_the_docs(tmp_path):
    """The step-time ratio differs on every run: the docs keep its verdict and point to the run's claims.md,
    so that `make docs` after a re-run writes the same bytes."""
    results_tree(tmp_path / "results")
    readme, out, _ = _docs(tmp_path, tmp_path / "results")
    for text in (readme.read_text(), out.read_text()):  # README's block and the page, each
        assert "3.3x" not in text.replace("3.3x faster", "")  # the paper's number stays, the measured 3.29 goes
        assert "3.29" not in text and "results/m/claims.md of your run" in text


def test_a_retired_rules_figures_are_left_out(tmp_path):
    """A results tree from before the circuit rule was retired: its faithfulness curve is neither shown nor copied."""
    model = results_tree(tmp_path / "results")
    (model / "circuit").mkdir(exist_ok=True)
    write_figure(model / "circuit/addition_faithfulness.png")
    readme, out, figures = _docs(tmp_path, tmp_path / "results")
    assert "faithfulness.png" not in out.read_text() + readme.read_text()
    assert not [p for p in figures.iterdir() if "faithfulness" in p.name]


def _tf(kind, correct, logprob=(1.234, 1.1, 1.4), key_correct=(0.0, 0.0, 0.0), random_diff=(0.8312, 0.6911, 0.9333)
        ) -> dict:
    """One ablation's teacher-forced columns of a discover summary row: (value, low, high) per measure."""
    return {f"tf_{kind}_{name}{x}": v for name, values in (("correct", correct), ("logprob", logprob),
                                                           ("key_correct", key_correct), ("random_diff", random_diff))
            for x, v in zip(("", "_low", "_high"), values)}


def _discover_tables(model) -> None:
    """discover/: each operator's validation table (the discover rule's sets: model, empty, key, the discovered
    circuit), the union's, and summary.parquet with the columns discover_union writes, plus the two figures."""
    from arithmech.interp import protocol
    from arithmech.interp.nodes import CircuitSet

    (model / "discover").mkdir(exist_ok=True)
    every = tuple((l, h) for l in range(3) for h in range(4))
    key = CircuitSet("key", "key", 2, -1, ((0, 1), (1, 2)), (2,))
    circuits = {"addition": ((0, 1), (2, 3)), "division": ((1, 2), (2, 0), (2, 3)),
                "union": ((0, 1), (1, 2), (2, 0), (2, 3))}
    n = 10
    for task, heads in circuits.items():
        sets = [CircuitSet("model", "all", 12, -1, every, (0, 1, 2)),
                CircuitSet("empty", "none", 0, -1, (), ()),
                key, CircuitSet("discovered", "discovered", len(heads), -1, heads, (1,))]
        values = {m: np.array([[1.0] * n, [0.0] * n, [0.2] * n, [0.9] * n]) + (np.arange(n) % 2) * 0.05
                  for m in ("tf_resample_tail_correct", "tf_mean_tail_correct")}
        table = protocol.faithfulness_table(sets, values, np.arange(n) // 2, n_boot=50, seed=0, confidence=0.95)
        table = table.assign(task=task, target=0.8, chosen=True)
        write_parquet(table, model / f"discover/{task}_validation.parquet")
    rows = []
    for task, heads in circuits.items():
        for target in ([0.8, 0.9] if task != "union" else [np.nan]):
            chosen = task == "union" or target == 0.8
            rows.append({"task": task, "target": target, "chosen": chosen, "pruned_on": "tf_mean_logprob",
                         "n_heads": len(heads) + (target == 0.9), "n_mlps": 1, "share": (len(heads) + 1) / 15,
                         **_tf("resample", correct=(0.8712, 0.7311, 0.9644)), **_tf("mean", correct=(0.9, 0.8, 0.95)),
                         "full_share": 0.87, "tf_n_items": 20 if task == "union" else n, "draws": 5,
                         "smallest_target_validation": np.nan if task == "union" else 0.9,
                         "share_reached": np.nan if task == "union" else task != "division"})
            if task == "division":  # random circuits as faithful as it, on every resample: a zero-width interval
                rows[-1] |= {f"tf_{k}_random_diff{x}": 0.0 for k in ("resample", "mean") for x in ("", "_low", "_high")}
    # the shared circuit's row, as discover_union appends it: teacher-forced columns only (none here), the old
    # protocol's empty
    rows.append({"task": "shared", "target": 0.8, "chosen": True, "n_heads": 2, "n_mlps": 1, "share": 3 / 15,
                 "n_items": 20, "draws": 5, "smallest_target_validation": np.nan, "share_reached": True})
    write_parquet(pd.DataFrame(rows), model / "discover/summary.parquet")
    for task in TASKS:
        write_figure(model / f"discover/{task}_path.png")
        write_figure(model / f"discover/{task}_circuit.png")


def test_the_discover_section_and_readme_sentences(tmp_path):
    model = results_tree(tmp_path / "results")
    _discover_tables(model)
    readme, out, figures = _docs(tmp_path, tmp_path / "results")
    page, block = out.read_text(), readme.read_text().split(BEGIN)[1].split(END)[0]
    section = page.split("## The model's own circuit (discover)")[1].split("\n## ")[0]
    # per operator at its chosen target, and the union last: size, teacher-forced faithfulness under each ablation at
    # the interval's precision, the key circuit, the paired difference from random circuits, the key heads kept
    assert ("| addition | 0.80 | 10 | 2 heads + 1 MLPs (20.0%) | 87% [73%, 96%] | 90% [80%, 95%] | 123% [110%, 140%] | "
            "123% [110%, 140%] | 0.0% [0.0%, 0.0%] | 0.0% [0.0%, 0.0%] | +83 points [+69, +93] | "
            "+83 points [+69, +93] | 1 of 2 key heads (L0H1); 1 added |") in section
    assert "| division | 0.80 | 10 | 3 heads + 1 MLPs" in section and "1 of 2 key heads (L1H2); 2 added |" in section
    assert "| all (union) | each operator's | 20 | 4 heads + 1 MLPs (33.3%)" in section
    assert "2 of 2 key heads (L0H1, L1H2); 2 added |" in section
    assert section.index("| addition |") < section.index("| all (union) |")
    assert "| addition | 0.90 | 3 heads + 1 MLPs (20.0%) | 87% [73%, 96%] | 90% [80%, 95%] |  | 0.90 |" in section
    # division's chosen target is the largest (none kept the share of full answers): said; its zero-width
    # difference from random circuits reads with its unit once
    assert ("| division | 0.80 | 3 heads + 1 MLPs (26.7%) | 87% [73%, 96%] | 90% [80%, 95%] | "
            "yes (the largest: none kept enough) |" in section)
    assert "| 0.0 points [0.0, 0.0] |" in section and "points points" not in section
    assert "`tf_mean_logprob`" in section and "old protocol" not in section
    # the findings page's two sentences, in both places, with the figures of the first operator
    from arithmech.report.page import circuit_sentences
    sentences = circuit_sentences(pd.read_parquet(model / "discover/summary.parquet"))
    assert sentences.startswith("Over all operators") and sentences in section and sentences in block
    assert "addition: 2 heads + 1 MLPs at 87% / 90%;" in sentences  # at the interval's precision, not "87.1%"
    assert "(figures/discover_addition_path.png)" in section and "(figures/discover_addition_circuit.png)" in section
    assert ("[the pruning path](docs/figures/discover_addition_path.png), [the circuit over the key heads]"
            "(docs/figures/discover_addition_circuit.png), [the study](docs/figures/finetune_study.png)") in block
    assert {"discover_addition_path.png", "discover_addition_circuit.png"} <= {p.name for p in figures.iterdir()}
    assert "discover_division_path.png" not in {p.name for p in figures.iterdir()}
    (tmp_path / "again").mkdir()
    check_docs(tmp_path / "results", "m", TASKS, tmp_path / "again")  # byte-identical again, every link a file


def test_docs_without_discover_outputs_say_the_rule_has_not_run(tmp_path):
    model = results_tree(tmp_path / "results")
    _discover_tables(model)  # a summary without its validation tables: the overlap column stays empty
    for path in (model / "discover").glob("*_validation.parquet"):
        path.unlink()
    _, out, _ = _docs(tmp_path, tmp_path / "results")
    assert "| addition | 0.80 | 10 | 2 heads + 1 MLPs (20.0%) |" in out.read_text()
    assert "key heads (L0H1)" not in out.read_text()
    for path in (model / "discover").iterdir():
        path.unlink()
    readme, out, figures = _docs(tmp_path, tmp_path / "results")
    section = out.read_text().split("## The model's own circuit (discover)\n")[1].split("\n## ")[0]
    assert "The discover rule has not run on these results (no `discover/summary.parquet`)" in section
    assert "own circuit" not in readme.read_text() and not any("discover" in p.name for p in figures.iterdir())


# ---------------------------------------------------------------------------------------------------
# README's run time of `make run` and the paper plan's jobs and GPU hours: generated, never typed

NUMBERS_README = README + f"""
{RUN_TIME_MARKERS[0]}
**`make run`** takes about half an hour: 26 min 2 s for its 80 jobs, typed by hand
{RUN_TIME_MARKERS[1]}

{PLAN_MARKERS[0]}
5.19 GPU hours, typed by hand
{PLAN_MARKERS[1]}
"""
# A record as `make run` (arithmech.tools.run_record) writes it, complete
RECORD = {"recorded_by": "written by `make run`", "started": "2026-11-28T09:00:00Z", "date": "2026-11-28",
          "seconds": 1501.6, "command": ".venv/bin/snakemake --cores 2 --max-threads 1", "jobs_run": 80,
          "jobs_at_start": 80, "workflow_jobs": 80, "from_scratch": True,
          "machine": {"cpu": "AMD EPYC 7B13", "cores": 2, "memory_gib": 8, "system": "Linux", "gpus": []},
          "arithmech": "0.1.0", "commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False}
PLAN = {"totals": {"jobs": 141, "gpu_jobs": 102, "gpu_hours": 5.18607, "gpu_gb": 66.84, "host_gb": 17.72,
                   "allocations": 81, "submitted": 102, "queue_hours": 6.75, "weight_loads": 156, "load_hours": 0.58},
        "throughput": {"tflops": 100.0, "bandwidth": 1.5, "startup_s": 60.0, "gpu_memory_gb": 80.0,
                       "fs_gbs": 1.0, "queue_wait_min": 5.0},
        "config_files": ["config.yaml", "/somewhere/configs/paper.yaml"], "models": {}, "rules": [], "warnings": []}
PLAN_PAGE = (f"# The cost plan\n\n{PLAN_OUTPUT_MARKERS[0]}\nan old plan: 8.3 GPU hours\n"
             f"{PLAN_OUTPUT_MARKERS[1]}\n\nMore.\n")


def _block(text: str, markers: tuple[str, str]) -> str:
    return text.split(markers[0] + "\n")[1].split(markers[1])[0]


def _numbers_docs(tmp_path, record: dict | None, plans: list | None = None):
    """make docs on a results tree whose results/run_record.json is `record` (None: none), README with the run-time
    and plan blocks; returns (README, the kept record docs/run_record.json)."""
    results, readme, kept = tmp_path / "results", tmp_path / "README.md", tmp_path / "docs/run_record.json"
    page = tmp_path / "docs/plan.md"
    if not (results / "m").is_dir():
        results_tree(results)
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(PLAN_PAGE)
    if not readme.exists():
        readme.write_text(NUMBERS_README)
    (results / "run_record.json").unlink(missing_ok=True)
    if record is not None:
        (results / "run_record.json").write_text(json.dumps(record))

    def plan_report():
        if plans is not None:
            plans.append(1)
        return PLAN

    make_docs(results_dir=results, model="m", tasks=TASKS, readme=readme, out_md=tmp_path / "docs/results.md",
              figures_dir=tmp_path / "docs/figures", kept_record=kept, plan_report=plan_report, plan_page=page)
    return readme, kept


def test_the_run_time_and_plan_blocks_come_from_the_record_and_the_plan(tmp_path):
    plans = []
    readme, kept = _numbers_docs(tmp_path, RECORD, plans)
    text = readme.read_text()
    assert _block(text, RUN_TIME_MARKERS) == run_time_text(RECORD, "docs/run_record.json")
    assert _block(text, PLAN_MARKERS) == plan_text(PLAN) and plans == [1]  # the plan computed once
    page = (tmp_path / "docs/plan.md").read_text()  # docs/plan.md: the whole plan, as make plan prints it
    assert _block(page, PLAN_OUTPUT_MARKERS) == plan_output(PLAN) and page.endswith("\n\nMore.\n")
    assert "8.3 GPU hours" not in page and "```text\narithmech cost plan: config.yaml + configs/paper.yaml + " in page
    assert "total: 141 jobs, 102 on a GPU, 5.19 GPU hours" in page
    assert json.loads(kept.read_text()) == RECORD  # kept for the checkout: README's number has its source in git
    run_time = " ".join(_block(text, RUN_TIME_MARKERS).split())
    assert run_time.startswith("**`make run`** took 25 min 2 s for its 80 jobs (every job of the workflow) on "
                               "2026-11-28: `.venv/bin/snakemake --cores 2 --max-threads 1` once `.venv` was set up, "
                               "on AMD EPYC 7B13, 2 cores, 8 GiB, Linux, no GPU; arithmech 0.1.0; commit 0123456789.")
    assert "[docs/run_record.json](docs/run_record.json), written by `make run`;" in run_time
    assert "141 jobs, 102 of them on a GPU, and 5.19 GPU hours at an assumed 100 TFLOP/s" in " ".join(
        _block(text, PLAN_MARKERS).split())
    assert "typed by hand" not in text and "More text after the block.\n" in text  # the rest untouched
    lines = (_block(text, RUN_TIME_MARKERS) + _block(text, PLAN_MARKERS)).splitlines()
    assert len(lines) > 2 and all(len(line) <= 115 for line in lines)  # wrapped as README's own paragraphs
    first = readme.read_bytes(), kept.read_bytes(), page
    _numbers_docs(tmp_path, RECORD)
    assert (readme.read_bytes(), kept.read_bytes(), (tmp_path / "docs/plan.md").read_text()) == first  # again


def test_a_partial_rerun_leaves_the_run_time_to_the_last_complete_run(tmp_path):
    _numbers_docs(tmp_path, RECORD)
    partial = {**RECORD, "started": "2026-11-29T09:00:00Z", "date": "2026-11-29", "seconds": 60.0, "jobs_run": 3,
               "jobs_at_start": 3, "from_scratch": False, "last_complete": RECORD}
    readme, kept = _numbers_docs(tmp_path, partial)
    assert json.loads(kept.read_text()) == RECORD and "25 min 2 s for its 80 jobs" in readme.read_text()
    older = {**RECORD, "started": "2026-11-20T09:00:00Z", "date": "2026-11-20", "seconds": 100.0}
    readme, kept = _numbers_docs(tmp_path, older)  # a complete run older than the kept one does not replace it
    assert json.loads(kept.read_text()) == RECORD
    newer = {**RECORD, "started": "2026-11-30T09:00:00Z", "date": "2026-11-30", "seconds": 1400.0}
    readme, kept = _numbers_docs(tmp_path, {**partial, "last_complete": newer})  # its kept complete run is newer
    assert json.loads(kept.read_text()) == newer and "23 min 20 s for its 80 jobs" in readme.read_text()


def test_without_a_record_the_run_time_is_said_not_measured(tmp_path):
    readme, kept = _numbers_docs(tmp_path, None)
    block = " ".join(_block(readme.read_text(), RUN_TIME_MARKERS).split())
    assert "has not been measured on this checkout" in block and not kept.exists()
    assert not re.search(r"\d+ min \d+ s", block)
    readme, kept = _numbers_docs(tmp_path, {**RECORD, "from_scratch": False})  # a partial run alone: the same
    assert "has not been measured on this checkout" in readme.read_text() and not kept.exists()


@pytest.mark.parametrize("left_out", [RUN_TIME_MARKERS, PLAN_MARKERS])
def test_a_readme_without_a_numbers_block_is_an_error_and_nothing_is_written(tmp_path, left_out):
    (tmp_path / "README.md").write_text(NUMBERS_README.replace(left_out[0], "").replace(left_out[1], ""))
    with pytest.raises(ValueError, match=left_out[0].split(" (")[0].removeprefix("<!-- ")):
        _numbers_docs(tmp_path, RECORD)
    assert not (tmp_path / "docs/run_record.json").exists() and not (tmp_path / "docs/results.md").exists()


def test_readme_run_time_is_the_kept_records():
    """README's run time, job count, date and machine are those of docs/run_record.json, as make docs writes them
    (README's plan block against the plan: tests/tools/test_plan.py)."""
    record = read_record(ROOT / KEPT_RECORD)
    assert record is not None and record["from_scratch"] and record["jobs_run"] == record["workflow_jobs"]
    readme = (ROOT / "README.md").read_text()
    assert _block(readme, RUN_TIME_MARKERS) == run_time_text(record, "docs/run_record.json")


# The run history (docs/run_history.csv, which `make run` adds to) and docs/performance.md's table of it


def _history_csv(path, rows: list[dict]) -> list[dict]:
    """The run history at `path` from `rows` (the columns left out empty), written as `make run` appends."""
    full = [{c: "" for c in HISTORY_COLUMNS} | {"cores": 2, "gpus": "none"} | row for row in rows]
    for row in full:
        append_history(row, path)
    return full


HISTORY_ROWS = [
    {"date": "2026-11-20", "commit": "aaaaaaa", "configuration": "config.yaml", "jobs": 60, "workflow_jobs": 60,
     "every_job": "true", "wall_s": 1500, "machine": "x86-64 CPU", "note": "an older complete run"},
    {"date": "2026-11-21", "commit": "bbbbbbb", "configuration": "configs/gemma3-270m.yaml", "jobs": 80,
     "workflow_jobs": 80, "every_job": "true", "wall_s": 2835, "job_s": 5477, "machine": "AMD EPYC"},
    {"date": "2026-11-22", "commit": "ccccccc", "configuration": "config.yaml", "jobs": 80, "workflow_jobs": 80,
     "every_job": "true", "wall_s": 1689.2, "job_s": 3348, "machine": "AMD EPYC"},
    {"date": "2026-11-23", "commit": "ddddddd", "configuration": "configs/gemma3-270m.yaml", "jobs": 30,
     "workflow_jobs": 80, "every_job": "false", "wall_s": 1080, "machine": "AMD EPYC", "note": "stopped | early"},
    {"date": "2026-11-24", "commit": "eeeeeee", "configuration": "config.yaml", "jobs": 3, "workflow_jobs": 80,
     "every_job": "false", "wall_s": 60, "machine": "AMD EPYC"},
]


def test_the_history_table_gives_the_last_complete_run_per_configuration(tmp_path):
    """A row per configuration (config.yaml first): its last complete run, never a partial or stopped one; the run
    README's run time comes from is marked, or added when it is another; no history yet says so."""
    rows = read_history(tmp_path / "none.csv")
    assert rows == [] and "No complete run is recorded yet" in history_table(rows)
    _history_csv(tmp_path / "h.csv", HISTORY_ROWS)
    rows = read_history(tmp_path / "h.csv")
    table = history_table(rows)
    lines = table.splitlines()
    assert lines[0] == "| configuration | date | commit | machine | jobs | wall time | job time | note |"
    assert lines[2] == ("| `config.yaml` | 2026-11-22 | ccccccc | AMD EPYC, 2 cores, no GPU | 80 | 28 min 9 s "
                        "| 55 min 48 s |  |")
    assert lines[3].startswith("| `configs/gemma3-270m.yaml` | 2026-11-21 | bbbbbbb | AMD EPYC, 2 cores, no GPU | 80 "
                               "| 47 min 15 s | 1 h 31 min 17 s |")
    assert len([l for l in lines if l.startswith("| `")]) == 2 and "Generated by `make docs` from" in table
    assert "(5 runs)" in table and "ddddddd" not in table and "eeeeeee" not in table
    record = {"date": "2026-11-22", "commit": "ccccccc" + "0" * 33, "command": ".venv/bin/snakemake --cores 2",
              "machine": {"cpu": "AMD EPYC", "cores": 2, "gpus": []}, "jobs_run": 80, "workflow_jobs": 80,
              "from_scratch": True, "seconds": 1689.2}
    marked = history_table(rows, record).splitlines()
    assert marked[2].startswith("| `config.yaml` (README's run time) | 2026-11-22 | ccccccc |")
    assert len(marked) == len(lines)
    older = {**record, "date": "2026-11-20", "commit": "aaaaaaa", "jobs_run": 60, "workflow_jobs": 60, "seconds": 1500}
    beside = history_table(rows, older).splitlines()  # README's run is not the last complete one: a row beside it
    assert beside[2] == lines[2] and beside[4].startswith("| `config.yaml` (README's run time) | 2026-11-20 | aaaaaaa")
    assert beside[4].endswith("| an older complete run |")
    unknown = {**record, "date": "2026-11-19", "commit": "fffffff", "seconds": 1400.0}
    assert history_table(rows, unknown).splitlines()[4].startswith(
        "| `config.yaml` (README's run time) | 2026-11-19 | fffffff | AMD EPYC, 2 cores, no GPU | 80 | 23 min 20 s |")


def test_a_history_that_is_not_the_run_historys_is_an_error(tmp_path):
    (tmp_path / "h.csv").write_text("date,wall_s\n2026-11-20,1500\n")
    with pytest.raises(ValueError, match="h.csv: its columns are"):
        read_history(tmp_path / "h.csv")
    _history_csv(tmp_path / "g.csv", [{**HISTORY_ROWS[0], "every_job": "yes"}])
    with pytest.raises(ValueError, match="g.csv, line 2: every_job must be true or false"):
        read_history(tmp_path / "g.csv")


# The job time per rule of a run (run_record.rule_seconds), in name order as the record keeps it: five rules of
# 1% of the job time or more, four under it (prepare_model, plot_effects, findings, study_summary: 32.9 s of
# 2,751.9 s), the discovery's three 1,673 s and the study's two 718.7 s
RULES = {"analyze": {"jobs": 4, "seconds": 79.0, "min": 19.2, "max": 21.0},
         "discover": {"jobs": 4, "seconds": 798.0, "min": 132.4, "max": 268.1},
         "discover_shared": {"jobs": 1, "seconds": 633.0, "min": 633.0, "max": 633.0},
         "discover_union": {"jobs": 1, "seconds": 242.0, "min": 242.0, "max": 242.0},
         "findings": {"jobs": 1, "seconds": 3.2, "min": 3.2, "max": 3.2},
         "knockout": {"jobs": 4, "seconds": 253.0, "min": 40.0, "max": 80.0},
         "plot_effects": {"jobs": 4, "seconds": 6.0, "min": 0.4, "max": 2.1},
         "prepare_model": {"jobs": 1, "seconds": 19.0, "min": 19.0, "max": 19.0},
         "study_summary": {"jobs": 1, "seconds": 4.7, "min": 4.7, "max": 4.7},
         "study_train": {"jobs": 13, "seconds": 714.0, "min": 37.0, "max": 85.0}}


def test_the_rules_table_gives_the_rules_longest_first_the_small_ones_in_one_row():
    """docs/performance.md's per-rule block: the run, its job time and jobs at a time; a row per rule by job time,
    the rules under 1% of it in one row; the discovery's and the study's shares (a folded study rule counted)."""
    block = rules_table({**RECORD, "seconds": 1959.2, "rules": RULES})
    words = " ".join(block.split())
    assert words.startswith("Job time per rule of README's run (`docs/run_record.json`, commit 0123456, 2026-11-28, "
                            "`.venv/bin/snakemake --cores 2 --max-threads 1` on AMD EPYC 7B13, 2 cores, 8 GiB, Linux, "
                            "no GPU), from the Snakemake benchmark files it wrote: 2,752 s of job time in 34 jobs, "
                            "1.40 jobs at a time.")
    rows = [line for line in block.splitlines() if line.startswith("| ")]
    assert rows == ["| rule | jobs | job time | per job |",
                    "| `discover` | 4 | 798 s | 132-268 s |",
                    "| `study_train` | 13 | 714 s | 37-85 s |",
                    "| `discover_shared` | 1 | 633 s |  |",
                    "| `knockout` | 4 | 253 s | 40-80 s |",
                    "| `discover_union` | 1 | 242 s |  |",
                    "| `analyze` | 4 | 79 s | 19-21 s |",
                    "| the 4 rules under 1% of the job time each: `findings`, `plot_effects`, `prepare_model`, "
                    "`study_summary` | 7 | 33 s | 0-19 s |"]
    assert words.endswith("Of the job time, the circuit discovery (`discover`, `discover_shared`, `discover_union`) "
                          "takes 1,673 s (61%) and the study (`study_train`, `study_summary`) 719 s (26%).")
    # a lone rule under 1% keeps a row of its own; without discovery or study rules, no sentence on them
    lone = {r: RULES[r] for r in ("analyze", "knockout", "findings")}  # findings: 3.2 s of 335.2 s
    block = rules_table({**RECORD, "rules": lone})
    assert "| `findings` | 1 | 3 s |  |" in block and "rules under" not in block
    assert "Of the job time" not in block and "335 s of job time in 9 jobs" in " ".join(block.split())


def test_without_a_job_time_per_rule_the_block_says_so_in_a_line():
    """A record from before `rules` (docs/run_record.json's of b55e273), one with a job's seconds unknown, or no
    record at all: a sentence instead of a table."""
    older = " ".join(rules_table(RECORD).split())
    assert older == ("The record of README's run (`docs/run_record.json`, commit 0123456, 2026-11-28) holds no job "
                     "time per rule: the table comes with the next complete run that `make docs` keeps.")
    unknown = rules_table({**RECORD, "rules": {**RULES, "knockout": {**RULES["knockout"], "seconds": None}}})
    assert "has no job time for `knockout`" in unknown and "|" not in unknown
    assert rules_table(None).startswith("No complete run is recorded yet") and rules_table({**RECORD, "rules": {}})


def test_make_docs_writes_the_performance_pages_table(tmp_path):
    """make docs fills docs/performance.md's blocks from the history, README's run marked, and from that run's
    record, its job time per rule; the rest of the page and a second make docs leave the same bytes."""
    results, page, history = tmp_path / "results", tmp_path / "docs/performance.md", tmp_path / "docs/run_history.csv"
    results_tree(results)
    page.parent.mkdir(parents=True)
    page.write_text(f"# Performance\n\n{HISTORY_MARKERS[0]}\nan old table\n{HISTORY_MARKERS[1]}\n\nBetween.\n\n"
                    f"{RULES_MARKERS[0]}\na typed table\n{RULES_MARKERS[1]}\n\nMore.\n")
    _history_csv(history, [*HISTORY_ROWS, history_row(RECORD)])
    (tmp_path / "README.md").write_text(NUMBERS_README)
    record = {**RECORD, "rules": RULES}
    (results / "run_record.json").write_text(json.dumps(record))

    def docs():
        make_docs(results_dir=results, model="m", tasks=TASKS, readme=tmp_path / "README.md",
                  out_md=tmp_path / "docs/results.md", figures_dir=tmp_path / "docs/figures",
                  kept_record=tmp_path / "docs/run_record.json", history=history, performance_page=page)

    docs()
    text = page.read_text()
    assert _block(text, HISTORY_MARKERS) == history_table(read_history(history), RECORD)
    assert "| `config.yaml` (README's run time) | 2026-11-28 | 0123456 |" in text and text.endswith("\n\nMore.\n")
    assert json.loads((tmp_path / "docs/run_record.json").read_text()) == record  # kept with its rules
    assert _block(text, RULES_MARKERS) == rules_table(record) and "| `discover` | 4 | 798 s | 132-268 s |" in text
    assert "a typed table" not in text and "\n\nBetween.\n\n" in text
    docs()
    assert page.read_text() == text


def test_the_committed_history_parses_and_the_page_shows_it():
    """docs/run_history.csv is the run history (its columns, every row readable, oldest first), and
    docs/performance.md's blocks are what make docs writes from it and docs/run_record.json."""
    rows = read_history(ROOT / HISTORY)
    assert rows and [r["date"] for r in rows] == sorted(r["date"] for r in rows)
    assert all(float(r["wall_s"]) > 0 and (not r["job_s"] or float(r["job_s"]) > 0) for r in rows)
    page = (ROOT / PERFORMANCE_PAGE).read_text()
    assert _block(page, HISTORY_MARKERS) == history_table(rows, read_record(ROOT / KEPT_RECORD))
    assert _block(page, RULES_MARKERS) == rules_table(read_record(ROOT / KEPT_RECORD))


def _outside_generated_blocks(text: str) -> str:
    return re.sub(r"<!-- BEGIN GENERATED: (.+?) \(.*?-->.*?<!-- END GENERATED: \1 -->", "", text, flags=re.S)


# How the run time of `make run` and the paper plan's totals were once typed by hand
RUN_TIME_TYPED = [r"\d+ min \d+ s for (its )?\d+ jobs", r"\d+ min \d+ s (default )?run\b"]
PLAN_TYPED = [r"\d+(\.\d+)? GPU hours", r"\d+ jobs, \d+ (of them )?on a GPU"]


@pytest.mark.parametrize("name,patterns", [("README.md", RUN_TIME_TYPED + PLAN_TYPED),
                                           ("docs/circuit.md", RUN_TIME_TYPED),
                                           ("docs/performance.md", RUN_TIME_TYPED)])
def test_no_run_time_or_plan_total_is_typed_outside_the_generated_blocks(name, patterns):
    text = _outside_generated_blocks((ROOT / name).read_text())
    assert "GENERATED" not in text  # every block closed, so all were removed
    typed = [m.group(0) for pattern in patterns for m in re.finditer(pattern, " ".join(text.split()))]
    assert not typed, f"{name} types {typed}: take them from a generated block (make docs) or link to one"
    assert not _outside_generated_blocks("a <!-- BEGIN GENERATED: plan (make docs) -->\n5.19 GPU hours\n"
                                         "<!-- END GENERATED: plan --> b").count("GPU hours")


def test_the_plan_block_names_make_plans_default():
    """The Makefile's CONFIGS default (what `make plan` plans) is what README's plan block is computed for."""
    default = re.search(r"^CONFIGS \?= (.+)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1).split()
    assert default == PLAN_CONFIGS


def test_claims_across_models_keep_every_models_column(tmp_path):
    """docs/models.md's table: a column per model (the documented model first) from each results/<model>/claims.parquet,
    kept in docs/claims/ so that a machine with one model's results keeps the other's column as it was; a headline
    decided by its parts lists each part's verdict; a claim one model's scorecard lacks says so."""
    claims = example_claims()
    results, kept = tmp_path / "results", tmp_path / "kept"
    meta = {"versions": {"arithmech": "0.1.0", "torch": "2.13.0"}}
    a = claims.copy()
    a.loc[(a["claim"] == "few_key_heads") & (a["scope"] == "all"), "value"] = np.nan  # decided by its operators
    b = claims[claims["claim"] != "key_attention"].copy()
    b.loc[(b["claim"] == "middle_layers") & (b["scope"] == "all"), "verdict"] = "holds"
    write_parquet(a, results / "a" / "claims.parquet", meta)
    write_parquet(b, results / "b" / "claims.parquet", meta)
    assert keep_claims(results, kept) == ["a", "b"]
    table = claims_across_models(kept, "b")
    lines = table.splitlines()
    assert lines[0] == "| Claim | Paper (LLaMA2-7B) | `b` | `a` |"

    def cells(statement: str) -> list[str]:
        return next(l for l in lines if l.startswith(f"| {statement}")).split(" | ")

    middle = cells("Key heads sit in the middle layers.")
    assert middle[2].startswith("🟢 **holds**") and middle[3].startswith("🟡 **partly**")
    assert "71% [60, 80], n = 9 (identification)" in middle[3]
    assert cells("Fewer than 5% of heads are key heads.")[3] == "🟢 **holds**<br>addition 🟢, division 🟢 |"
    assert cells("Key heads attend from END")[2] == "not in this model's scorecard"
    assert "`a`: arithmech 0.1.0, torch 2.13.0" in table
    # b's results gone from this machine: its column stays as it was kept
    (results / "b" / "claims.parquet").unlink()
    assert keep_claims(results, kept) == ["a"]
    again = claims_across_models(kept, "a")
    assert again.splitlines()[0] == "| Claim | Paper (LLaMA2-7B) | `a` | `b` |"
    assert cells("Key heads sit in the middle layers.")[2] in again  # b's cell, as kept


def _budget_claims(larger: bool) -> pd.DataFrame:
    """The example claims with a discover claim (its headline decided by two parts) and a circuit claim; `larger`: as
    a run of configs/circuit-full.yaml would change them, the discover and circuit rows on 1,000 pairs and the addition
    part's verdict turned (the division part and the circuit claim keep theirs)."""
    rows = [("circuit_faithful", "all", "discover", "A small circuit is faithful.", "not in the paper",
             "per operator, below", np.nan, np.nan, np.nan, "", pd.NA, "validation", "does not hold", "headline", "",
             ""),
            ("circuit_faithful", "addition", "discover", "", "", "faithfulness", 31.7, 23.7, 39.6, "percent", 120,
             "validation", "does not hold", "holds if above 80%", "", ""),
            ("circuit_faithful", "division", "discover", "", "", "faithfulness", 61.8, 47.8, 73.4, "percent", 87,
             "validation", "inconclusive", "holds if above 80%", "", ""),
            ("heads_via_mlps", "all", "circuit", "The key heads act through the MLPs.", "a hypothesis",
             "share through the MLPs", 102.4, 94.5, 111.2, "percent", 60, "validation", "holds", "holds if above 50%",
             "", "")]
    claims = pd.concat([example_claims(), pd.DataFrame(rows, columns=example_claims().columns)], ignore_index=True)
    claims = claims.astype({"n": "Int64"})
    if larger:
        enlarged = claims["stage"].isin(["discover", "circuit"]) & claims["n"].notna()
        claims.loc[enlarged, "n"] = 1000
        claims.loc[(claims["claim"] == "circuit_faithful") & (claims["scope"] == "addition"), "verdict"] = "holds"
    return claims


def _budget_docs(tmp_path, budget_runs=None):
    results, kept = tmp_path / "results", tmp_path / "docs/claims/budget"
    readme, out, figures = tmp_path / "README.md", tmp_path / "docs/results.md", tmp_path / "docs/figures"
    if not readme.exists():
        readme.write_text(README)
    make_docs(results_dir=results, model="m", tasks=TASKS, readme=readme, out_md=out, figures_dir=figures,
              kept_budget=kept, budget_runs=budget_runs)
    return readme, out, kept / "m"


def test_the_budget_table_without_a_larger_run_is_a_whole_table(tmp_path):
    """With no larger run kept, every row of the budget table has as many cells as its header (no empty column for
    the runs that are not there)."""
    meta = {"versions": {"arithmech": "0.1.0", "torch": "2.13.0"}}
    results_tree(tmp_path / "results")
    write_parquet(_budget_claims(larger=False), tmp_path / "results/m/claims.parquet", meta)
    _, out, _ = _budget_docs(tmp_path)
    section = out.read_text().split("## Budget sensitivity\n")[1].split("\n## ")[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert table[0] == "| Claim | default run | budget |"
    assert {len(line[2:-2].split(" | ")) for line in table[2:]} == {3}
    assert table[1] == "|---|---|---|"


def test_the_budget_table_sets_each_verdict_beside_the_larger_runs(tmp_path):
    """docs/results.md's budget section: the discover and circuit rows beside a kept circuit-full run (a turned
    verdict "depends on the run's size", an equal one "stands"), the finetune rows "no larger run kept" (sft-study is
    not kept), no identify row; both scorecards mark the claim whose part turned, with the sizes, and no other; a
    second make docs without the run keeps its file and writes the same bytes."""
    meta = {"versions": {"arithmech": "0.1.0", "torch": "2.13.0"}}
    results_tree(tmp_path / "results")
    write_parquet(_budget_claims(larger=False), tmp_path / "results/m/claims.parquet", meta)
    write_parquet(_budget_claims(larger=True), tmp_path / "full/results/m/claims.parquet", meta)
    readme, out, kept = _budget_docs(tmp_path, {"circuit-full": tmp_path / "full/results"})
    page = out.read_text()
    section = page.split("## Budget sensitivity\n")[1].split("\n## ")[0]
    lines = section.splitlines()

    def row(label: str) -> str:
        return next(line for line in lines if line.startswith(f"| {label} |"))

    assert "| Claim | default run | `circuit-full` | budget |" in lines
    assert row("&nbsp;&nbsp;↳ addition") == (
        "| &nbsp;&nbsp;↳ addition | 🔴 **does not hold**<br>32% [24, 40], n = 120 | 🟢 **holds**<br>32% [24, 40], "
        "n = 1,000 | **depends on the run's size** |")
    assert row("&nbsp;&nbsp;↳ division").endswith("n = 1,000 | stands |")
    assert row("A small circuit is faithful.").endswith("| stands |")  # its headline's own verdict: the same
    assert row("The key heads act through the MLPs.").endswith("n = 1,000 | stands |")
    for statement in ("Precise SFT matches or beats full fine-tuning on the math target.",
                      "Precise SFT steps are faster than full fine-tuning."):
        assert row(statement).endswith(" |  | no larger run kept |")
    assert "Fewer than 5% of heads are key heads." not in section  # identify: no larger configuration
    assert ("1 of 4 verdicts depend on the run's size. 3 rows have no larger run kept (`configs/sft-study.yaml`)."
            in lines)
    mark = "depends on the run's size: addition n 120 -> 1,000 (configs/circuit-full.yaml)"
    block = readme.read_text().split(BEGIN)[1].split(END)[0]
    faithful = next(line for line in block.splitlines() if line.startswith("| A small circuit is faithful."))
    assert f"🔴 **does not hold**<br>*{mark}*" in faithful
    assert block.count("depends on the run's size") == 1  # not on the claim whose verdicts agree
    scorecard = page.split("## Budget sensitivity")[0]
    assert mark in scorecard
    assert ("| &nbsp;&nbsp;↳ addition | | faithfulness: 32% [24, 40], n = 120 (validation) | 🔴 **does not hold**<br>"
            "*depends on the run's size: n 120 -> 1,000 (configs/circuit-full.yaml)* |") in scorecard
    kept_file = kept / "circuit-full.csv"
    assert pd.read_csv(kept_file).columns.tolist() == [*KEPT_CLAIM_COLUMNS, "origin"]
    written = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (readme, out, kept_file)}
    # the larger run's results gone from this machine: its kept file is compared as before, and stays as it was
    (tmp_path / "full/results/m/claims.parquet").unlink()
    _budget_docs(tmp_path)
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in written} == written


def test_without_a_larger_run_every_row_says_none_is_kept(tmp_path):
    results_tree(tmp_path / "results")
    write_parquet(_budget_claims(larger=False), tmp_path / "results/m/claims.parquet")
    readme, out, _ = _budget_docs(tmp_path)
    section = out.read_text().split("## Budget sensitivity\n")[1].split("\n## ")[0]
    assert "No verdict is compared: no larger run is kept. 4 rows have no larger run kept" in section
    assert "| stands |" not in section and "depends on the run's size**" not in section
    assert "depends on the run's size:" not in readme.read_text()


@pytest.mark.parametrize("value,message", [
    ("circuit-full", "--budget-run 'circuit-full': expected NAME=RESULTS"),
    ("paper={full}", "'paper' is no larger configuration make docs compares; known: circuit-full, sft-study"),
    ("circuit-full={tmp}/nowhere", "--budget-run circuit-full={tmp}/nowhere: {tmp}/nowhere is not a folder"),
    ("circuit-full={tmp}/empty", "--budget-run circuit-full={tmp}/empty: {tmp}/empty/m/claims.parquet is missing"),
])
def test_a_bad_budget_run_is_an_error_naming_it_and_nothing_is_written(tmp_path, capsys, value, message):
    results_tree(tmp_path / "results")
    (tmp_path / "empty").mkdir()
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "config.yaml").write_text("run: {models: [m], tasks: [addition, division]}\n")
    fill = {"tmp": tmp_path, "full": tmp_path / "results"}
    where = {"--readme": "README.md", "--out": "docs/results.md", "--figures": "docs/figures", "--plan-page":
             "docs/plan.md", "--kept-claims": "docs/claims", "--models-page": "docs/models.md", "--run-record":
             "docs/run_record.json", "--history": "docs/run_history.csv", "--performance-page": "docs/performance.md",
             "--kept-budget": "kept"}
    code = main(["--config", str(tmp_path / "config.yaml"), "--results", str(tmp_path / "results"),
                 *[a for option, path in where.items() for a in (option, str(tmp_path / path))],
                 "--budget-run", value.format(**fill)])
    assert code == 1 and message.format(**fill) in capsys.readouterr().err
    assert (tmp_path / "README.md").read_text() == README
    assert not (tmp_path / "docs").exists() and not (tmp_path / "kept").exists()
