"""`make run`'s record (arithmech.tools.run_record) on a stand-in Snakemake: a successful run writes its time, jobs
and machine, complete or flagged partial, and adds its row to the run history; a failed run writes nothing; the
record and the history are written whole or not at all; the command's output passes through."""

import csv
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from arithmech.tools import run_record
from arithmech.tools.run_record import (
    HISTORY_COLUMNS,
    Progress,
    append_history,
    configuration,
    duration_text,
    history_row,
    job_seconds,
    last_complete,
    machine_text,
    main,
    record_run,
    rule_seconds,
)

# A stand-in for snakemake: its dry run (--dry-run --forceall) prints the Job stats of WORKFLOW jobs; a run prints
# the Job stats of AT_START jobs, then one "N of M steps" line per job (to stderr, as Snakemake logs), something on
# stdout, and exits with EXIT. "Nothing to be done" when AT_START is 0.
FAKE = textwrap.dedent("""
    import os, sys
    def stats(total):
        print("Job stats:\\njob  count\\n---  -----\\nall      1\\ntotal    %d\\n" % total, file=sys.stderr)
    if "--dry-run" in sys.argv:
        assert "--forceall" in sys.argv
        stats(int(os.environ["WORKFLOW"]))
        sys.exit(0)
    n = int(os.environ["AT_START"])
    if not n:
        print("Nothing to be done (all requested files are present and up to date).", file=sys.stderr)
    else:
        stats(n)
    print("job output on stdout")
    if os.environ.get("BENCHMARK"):  # a job's benchmark file, as Snakemake writes it
        with open(os.environ["BENCHMARK"], "w") as f:
            f.write("s\\th:m:s\\tmax_rss\\n12.5\\t0:00:12\\t300\\n")
    for i in range(1, n + 1):
        print("%d of %d steps (%d%%) done" % (i, n, 100 * i // n), file=sys.stderr)
    sys.exit(int(os.environ.get("EXIT", "0")))
""")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The stand-in's command; set its job counts with `counts(workflow, at_start, exit)`."""
    script = tmp_path / "fake_snakemake.py"
    script.write_text(FAKE)

    def counts(workflow: int, at_start: int, exit: int = 0) -> list[str]:
        monkeypatch.setenv("WORKFLOW", str(workflow))
        monkeypatch.setenv("AT_START", str(at_start))
        monkeypatch.setenv("EXIT", str(exit))
        return [sys.executable, str(script), "--cores", "2"]

    monkeypatch.setattr(run_record, "cuda_devices", lambda: [])  # no torch import in these tests
    return counts


def _history(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_complete_run_is_recorded(fake, tmp_path, capfd):
    record, history = tmp_path / "results" / "run_record.json", tmp_path / "docs" / "run_history.csv"
    assert main(["--record", str(record), "--history", str(history), "--", *fake(workflow=5, at_start=5)]) == 0
    got = json.loads(record.read_text())
    assert got["jobs_run"] == 5 and got["jobs_at_start"] == 5 and got["workflow_jobs"] == 5
    assert got["from_scratch"] is True and "last_complete" not in got
    assert got["command"].endswith("fake_snakemake.py --cores 2") and got["seconds"] >= 0
    assert got["date"] == got["started"][:10] and got["started"].endswith("Z")
    assert got["machine"]["cores"] >= 1 and got["machine"]["gpus"] == [] and got["machine"]["cpu"]
    assert got["arithmech"] and len(got["commit"]) == 40 and isinstance(got["dirty"], bool)  # the checkout's HEAD
    out, err = capfd.readouterr()
    assert "job output on stdout" in out and "5 of 5 steps (100%) done" in err  # Snakemake's output passes through
    assert "every job of the workflow" in err
    (row,) = _history(history)  # its row in the run history, the record's numbers
    assert row["every_job"] == "true" and row["jobs"] == row["workflow_jobs"] == "5"
    assert float(row["wall_s"]) == got["seconds"] and row["date"] == got["date"] and row["commit"] == got["commit"][:7]
    assert row["configuration"] == "config.yaml" and row["command"] == got["command"] and row["gpus"] == "none"


def test_each_successful_run_adds_one_row_and_a_failed_one_none(fake, tmp_path):
    """The header once, then one row per successful run, oldest first, a partial run's flagged; a failed run
    leaves the history's bytes as they were and no temporary file."""
    record, history = tmp_path / "run_record.json", tmp_path / "docs" / "run_history.csv"
    assert record_run(fake(workflow=5, at_start=5, exit=1), record, history=history) == 1
    assert not history.exists()
    assert record_run(fake(workflow=5, at_start=5), record, history=history) == 0
    assert record_run(fake(workflow=5, at_start=2), record, history=history) == 0
    text = history.read_text()
    assert text.splitlines()[0] == ",".join(HISTORY_COLUMNS) and text.count("date,commit") == 1
    rows = _history(history)
    assert [(r["jobs"], r["workflow_jobs"], r["every_job"]) for r in rows] == [("5", "5", "true"), ("2", "5", "false")]
    before = history.read_bytes()
    assert record_run(fake(workflow=5, at_start=3, exit=3), record, history=history) == 3
    assert history.read_bytes() == before and sorted(p.name for p in history.parent.iterdir()) == ["run_history.csv"]
    assert record_run(fake(workflow=5, at_start=5), record) == 0 and history.read_bytes() == before  # no history given


def test_the_history_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """An append that fails half-way leaves the history as it was and no temporary file (the whole file is written
    to a temporary file, then renamed); a history without a final newline gets its row on a line of its own."""
    history = tmp_path / "run_history.csv"
    row = {column: "" for column in HISTORY_COLUMNS} | {"date": "2026-11-29", "every_job": "true", "wall_s": "1.0"}
    append_history(row, history)
    history.write_text(history.read_text().rstrip("\n"))
    before = history.read_bytes()
    write_text = Path.write_text

    def broken(self, text, *args, **kwargs):
        write_text(self, text[: len(text) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", broken)
    with pytest.raises(OSError, match="disk full"):
        append_history(row, history)
    assert history.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["run_history.csv"]
    monkeypatch.setattr(Path, "write_text", write_text)
    append_history({**row, "date": "2026-11-30"}, history)
    assert [r["date"] for r in _history(history)] == ["2026-11-29", "2026-11-30"]


def test_a_records_row():
    entry = {"date": "2026-11-28", "commit": "c8333a364a45109593c1efb7427bf344c5ea464f", "dirty": True,
             "command": ".venv/bin/snakemake --cores 2 --max-threads 1 --configfile configs/gemma3-270m.yaml",
             "machine": {"cpu": "AMD EPYC", "cores": 2, "memory_gib": 24, "system": "Linux", "gpus": ["H100", "H100"]},
             "jobs_run": 3, "workflow_jobs": None, "from_scratch": False, "seconds": 42.5}
    row = history_row(entry, job_s=80.25)
    assert list(row) == HISTORY_COLUMNS
    assert row == {"date": "2026-11-28", "commit": "c8333a3", "configuration": "configs/gemma3-270m.yaml",
                   "command": entry["command"], "machine": "AMD EPYC", "cores": 2, "gpus": "H100; H100", "jobs": 3,
                   "workflow_jobs": "", "every_job": "false", "wall_s": 42.5, "job_s": 80.25,
                   "note": "the checkout had local changes"}
    clean = history_row({**entry, "dirty": False})
    assert clean["job_s"] == "" and clean["note"] == ""


def test_configuration_names_the_config_files_given():
    assert configuration([".venv/bin/snakemake", "--cores", "2"]) == "config.yaml"
    assert configuration(["snakemake", "--configfile", "configs/a.yaml", "b.yaml", "--cores", "2"]) == (
        "configs/a.yaml b.yaml")
    assert configuration(["snakemake", "--configfile=x.yaml", "target"]) == "x.yaml"
    assert configuration(["snakemake", "--configfiles", "a.yaml", "--forcerun", "r"]) == "a.yaml"


def test_job_seconds_sums_the_benchmarks_the_run_wrote(tmp_path):
    """Only benchmark files written since the run started count: an earlier run's stay out."""
    header = "s\th:m:s\tmax_rss\n"
    old = tmp_path / "m" / "benchmarks" / "build_pairs" / "addition.tsv"
    old.parent.mkdir(parents=True)
    old.write_text(header + "100.5\t0:01:40\t600\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    since = time.time() - 60
    assert job_seconds(tmp_path, since) is None
    for name, seconds in (("prepare_model.tsv", "4.86"), ("knockout/division.tsv", "70.25")):
        path = tmp_path / "m" / "benchmarks" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + f"{seconds}\t0:01:10\t700\n")
    assert job_seconds(tmp_path, since) == 75.1
    (tmp_path / "m" / "benchmarks" / "odd.tsv").write_text(header + "NA\tNA\tNA\n")  # no seconds: the sum unknown
    assert job_seconds(tmp_path, since) is None


def _benchmark(path: Path, seconds: str, hours_ago: float = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:00\t600\n")
    os.utime(path, (time.time() - 3600 * hours_ago,) * 2)


def test_rule_seconds_gives_each_rules_jobs_the_run_wrote(tmp_path):
    """Per rule (the first path component under benchmarks/, a file's name without a folder): its jobs, their sum,
    the shortest and longest; files from before the run started stay out, a rule with a job without seconds has
    none; job_seconds sums the same files."""
    bench = tmp_path / "m" / "benchmarks"
    _benchmark(bench / "knockout" / "multiplication.tsv", "500.0", hours_ago=1)  # an earlier run's
    _benchmark(bench / "build_pairs" / "addition.tsv", "100.5", hours_ago=1)
    since = time.time() - 60
    assert rule_seconds(tmp_path, since) == {} and job_seconds(tmp_path, since) is None
    _benchmark(bench / "knockout" / "addition.tsv", "40.26")
    _benchmark(bench / "knockout" / "division.tsv", "80.1")
    _benchmark(bench / "transfer.tsv", "198.0")
    _benchmark(tmp_path / "benchmarks" / "fetch_dataset" / "gsm8k.tsv", "3.0")  # the rules without a model
    assert rule_seconds(tmp_path, since) == {
        "fetch_dataset": {"jobs": 1, "seconds": 3.0, "min": 3.0, "max": 3.0},
        "knockout": {"jobs": 2, "seconds": 120.4, "min": 40.3, "max": 80.1},
        "transfer": {"jobs": 1, "seconds": 198.0, "min": 198.0, "max": 198.0}}
    assert job_seconds(tmp_path, since) == 321.4
    _benchmark(bench / "transfer.tsv", "NA")  # its seconds unknown: that rule's and the sum
    assert rule_seconds(tmp_path, since)["transfer"] == {"jobs": 1, "seconds": None, "min": None, "max": None}
    assert rule_seconds(tmp_path, since)["knockout"]["seconds"] == 120.4 and job_seconds(tmp_path, since) is None


def test_the_record_has_the_job_time_per_rule(fake, tmp_path, monkeypatch):
    """The record keeps the rules of the benchmark files written during the run, beside it, not an earlier run's."""
    record = tmp_path / "results" / "run_record.json"
    _benchmark(tmp_path / "results" / "m" / "benchmarks" / "build_pairs" / "addition.tsv", "100.5", hours_ago=1)
    (tmp_path / "results" / "m" / "benchmarks" / "transfer").mkdir()
    monkeypatch.setenv("BENCHMARK", str(tmp_path / "results" / "m" / "benchmarks" / "transfer" / "all.tsv"))
    assert record_run(fake(workflow=5, at_start=5), record) == 0
    assert json.loads(record.read_text())["rules"] == {"transfer": {"jobs": 1, "seconds": 12.5, "min": 12.5,
                                                                    "max": 12.5}}


def test_a_partial_rerun_is_flagged_and_keeps_the_complete_one(fake, tmp_path):
    record = tmp_path / "run_record.json"
    assert record_run(fake(workflow=5, at_start=5), record) == 0
    complete = json.loads(record.read_text())
    assert record_run(fake(workflow=5, at_start=2), record) == 0
    partial = json.loads(record.read_text())
    assert partial["from_scratch"] is False and partial["jobs_run"] == 2 and partial["workflow_jobs"] == 5
    assert partial["last_complete"] == complete and last_complete(partial) == complete
    assert record_run(fake(workflow=5, at_start=0), record) == 0  # nothing to be done: 0 jobs, still partial
    nothing = json.loads(record.read_text())
    assert nothing["jobs_run"] == 0 and nothing["from_scratch"] is False and last_complete(nothing) == complete


def test_a_failed_run_writes_no_record(fake, tmp_path):
    record = tmp_path / "run_record.json"
    assert record_run(fake(workflow=5, at_start=5, exit=1), record) == 1
    assert not record.exists() and not list(tmp_path.glob("*.tmp"))
    assert record_run(fake(workflow=5, at_start=5), record) == 0
    before = record.read_bytes()
    assert record_run(fake(workflow=5, at_start=3, exit=3), record) == 3
    assert record.read_bytes() == before  # the earlier run's record stays as it was


def test_the_record_is_written_whole_or_not_at_all(fake, tmp_path, monkeypatch):
    """A write that fails half-way leaves the earlier record and no temporary file (write to temp, then rename)."""
    record = tmp_path / "run_record.json"
    assert record_run(fake(workflow=5, at_start=5), record) == 0
    before = record.read_bytes()

    def broken_dumps(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dumps", broken_dumps)
    with pytest.raises(OSError, match="disk full"):
        record_run(fake(workflow=5, at_start=5), record)
    assert record.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "fake_snakemake.py", "run_record.json"]


def test_without_a_workflow_count_a_run_is_not_complete(fake, tmp_path):
    """When the dry run says nothing (it failed), the run's time is recorded but never becomes README's."""
    record = tmp_path / "run_record.json"
    command = fake(workflow=5, at_start=5)
    assert record_run(command, record, count_workflow=False) == 0
    assert json.loads(record.read_text())["from_scratch"] is False


def test_progress_lines():
    progress = Progress()
    for line in ["Building DAG of jobs...", "Job stats:", "total                          80", "",
                 "1 of 80 steps (1%) done", "Updating checkpoint dependencies.", "total   99",
                 "80 of 81 steps (99%) done"]:
        progress.feed(line + "\n")
    assert (progress.jobs_at_start, progress.done, progress.of) == (80, 80, 81)


def test_words():
    assert duration_text(1492.4) == "24 min 52 s" and duration_text(42) == "42 s"
    assert duration_text(3785) == "1 h 3 min 5 s"
    assert machine_text({"cpu": "AMD EPYC 7B13", "cores": 2, "memory_gib": 8, "system": "Linux", "gpus": []}) == (
        "AMD EPYC 7B13, 2 cores, 8 GiB, Linux, no GPU")
    assert machine_text({"cpu": "x", "cores": 16, "system": "Linux", "gpus": ["NVIDIA H100"] * 2}).endswith(
        "Linux, 2 x NVIDIA H100")
    assert machine_text({"cpu": "x86-64", "cores": 2}) == "x86-64, 2 cores"  # GPUs unknown: not said


def test_no_command_is_an_error(capsys):
    with pytest.raises(SystemExit):
        main(["--record", os.devnull])
    assert "give the Snakemake command after --" in capsys.readouterr().err


def test_a_real_snakemake_run_is_read(tmp_path, monkeypatch):
    """Snakemake's own log lines (its Job stats and "N of M steps" lines, its dry run with --forceall) on a workflow
    of three jobs: complete at first, then a re-run of one job flagged partial."""
    monkeypatch.setattr(run_record, "cuda_devices", lambda: [])
    (tmp_path / "Snakefile").write_text(textwrap.dedent("""
        rule all:
            input: "b.txt", "c.txt"
        rule b:
            output: "b.txt"
            shell: "echo b > {output}"
        rule c:
            input: "b.txt"
            output: "c.txt"
            shell: "cat {input} > {output}"
    """))
    monkeypatch.chdir(tmp_path)
    command = [sys.executable, "-m", "snakemake", "--cores", "1"]
    record = tmp_path / "results" / "run_record.json"
    assert record_run(command, record) == 0
    got = json.loads(record.read_text())
    assert (got["jobs_run"], got["jobs_at_start"], got["workflow_jobs"], got["from_scratch"]) == (3, 3, 3, True)
    (tmp_path / "c.txt").unlink()
    assert record_run(command, record) == 0
    again = json.loads(record.read_text())
    assert (again["jobs_run"], again["from_scratch"]) == (2, False) and again["last_complete"] == got
