"""`make run` with a record of its time: run a Snakemake command, measure its wall-clock time, and when it succeeds
write results/run_record.json (to a temporary file, then renamed), so that the run time README quotes is written by
the run itself (`make docs` puts it there, arithmech.tools.docs_results).

    python -m arithmech.tools.run_record -- .venv/bin/snakemake --cores 2 --max-threads 1        (make run)

The record: when the run started (UTC) and its seconds, the command, how many jobs Snakemake ran (its last
"N of M steps (P%) done" line) and how many its DAG had when it started (its "Job stats" total), the jobs of the
whole workflow (the same command as a dry run with --forceall, before the run), whether the run was complete
(`from_scratch`: it set out to run every job of the workflow), the machine (CPU model, cores, memory, the GPUs torch
sees), the arithmech version, the git commit, and the job time per rule (`rules`: the benchmark files the run wrote,
`rule_seconds`; docs/performance.md's table). Only a complete run's time is README's headline: a partial re-run
is recorded, flagged, and keeps the last complete run's record inside its own (`last_complete`). Every run that
succeeds also adds one row to the run history, docs/run_history.csv (`HISTORY_COLUMNS`; `make docs` shows the last
complete run of each configuration in docs/performance.md). A failed or interrupted run writes nothing; Snakemake's
own output passes through unchanged.

Standard library only, but for torch (when installed) to name the GPUs after the run.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from arithmech import __version__
from arithmech.io import atomic_path, write_json

RECORD = Path("results") / "run_record.json"  # beside the results it timed; `make clean-results` removes both
HISTORY = Path("docs") / "run_history.csv"  # every recorded run, one row each, oldest first; committed
# The history's columns: when (UTC date) and at which commit; the config files given (`configuration`); the command;
# the machine (CPU model, its cores, "none" or the GPUs); the jobs run and the workflow's; whether that was every job
# (true/false); the wall time and the jobs' summed time in seconds (`job_s`: their benchmark files; empty when
# unknown); a note in words (a recorded run's says only whether the checkout had local changes).
HISTORY_COLUMNS = ["date", "commit", "configuration", "command", "machine", "cores", "gpus", "jobs", "workflow_jobs",
                   "every_job", "wall_s", "job_s", "note"]
PROGRESS = re.compile(r"^\s*(\d+) of (\d+) steps \(\d+%\) done\s*$")  # Snakemake's line after each finished job
STATS_TOTAL = re.compile(r"^total\s+(\d+)\s*$")  # the last row of the "Job stats:" table it prints before running


class Progress:
    """What a Snakemake log says, fed line by line: the DAG's job count when the run started (the first "Job
    stats" total) and the last "N of M steps" line (jobs done, of the DAG's jobs then)."""

    def __init__(self):
        self.jobs_at_start: int | None = None
        self.done: int = 0
        self.of: int | None = None
        self._lock = threading.Lock()  # stdout and stderr are read by a thread each

    def feed(self, line: str) -> None:
        line = line.strip()
        with self._lock:
            if self.jobs_at_start is None and (m := STATS_TOTAL.match(line)):
                self.jobs_at_start = int(m.group(1))
            elif m := PROGRESS.match(line):
                self.done, self.of = int(m.group(1)), int(m.group(2))


def run_passing_through(command: Sequence[str], progress: Progress) -> int:
    """Run `command`, copying its stdout and stderr line by line to ours and feeding each line to `progress`;
    its exit status. An interrupt (Ctrl-C reaches the whole process group) waits for the command to stop."""
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                            errors="replace")

    def pump(source, sink) -> None:
        for line in source:
            sink.write(line)
            sink.flush()
            progress.feed(line)

    threads = [threading.Thread(target=pump, args=(proc.stdout, sys.stdout), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, sys.stderr), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        code = proc.wait()
    for thread in threads:
        thread.join()
    return code if code >= 0 else 128 - code  # a signal's death as the shell reports it


def workflow_jobs(command: Sequence[str]) -> int | None:
    """The jobs of the whole workflow for `command` (a Snakemake command): its dry run with --forceall, the
    "Job stats" total; None when the dry run fails or prints none (the run itself then says why)."""
    try:
        proc = subprocess.run([*command, "--dry-run", "--forceall", "--quiet", "rules"], capture_output=True,
                              text=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    progress = Progress()
    for line in (proc.stdout + proc.stderr).splitlines():
        progress.feed(line)
    return progress.jobs_at_start


def machine(gpus: bool = True) -> dict:
    """This machine, for the record beside a timing: CPU model, the cores this process may use, memory (GiB),
    operating system, and (`gpus`) the CUDA devices torch sees ([] without torch or a GPU)."""
    cpu = platform.processor() or platform.machine()
    cpuinfo, meminfo = Path("/proc/cpuinfo"), Path("/proc/meminfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    memory = None
    if meminfo.is_file():
        memory = round(int(meminfo.read_text().split("MemTotal:", 1)[1].split()[0]) / 2**20)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "memory_gib": memory, "system": platform.system(),
            **({"gpus": cuda_devices()} if gpus else {})}


def cuda_devices() -> list[str]:
    """The names of the CUDA devices torch sees: what the jobs ran on ([] without torch or a GPU)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def machine_text(m: dict) -> str:
    """A machine record in words: "AMD EPYC 7B13, 2 cores, 8 GiB, Linux" (", no GPU" or its GPUs when known)."""
    parts = [m.get("cpu") or "unknown CPU", f"{m['cores']} cores" if m.get("cores") else "",
             f"{m['memory_gib']} GiB" if m.get("memory_gib") else "", m.get("system") or ""]
    if "gpus" in m:
        gpus = m["gpus"] or []
        parts.append(", ".join(f"{gpus.count(g)} x {g}" for g in dict.fromkeys(gpus)) if gpus else "no GPU")
    return ", ".join(p for p in parts if p)


def git_commit(root: Path | None = None) -> tuple[str | None, bool | None]:
    """(HEAD's commit, whether tracked files differ from it) of the checkout; (None, None) outside git."""
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", *args], capture_output=True, text=True, cwd=root, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)


def read_record(path: Path) -> dict | None:
    """A record written by `record_run`, or None when there is none."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def last_complete(record: dict | None) -> dict | None:
    """The newest complete run a record knows: itself when complete, else the one it keeps (`last_complete`)."""
    if record is None:
        return None
    if record.get("from_scratch"):
        return {k: v for k, v in record.items() if k != "last_complete"}
    return record.get("last_complete")


def configuration(command: Sequence[str]) -> str:
    """The config files `command` gives Snakemake (--configfile/--configfiles, space-separated), over the
    workflow's config.yaml; "config.yaml" when it gives none."""
    files, taking = [], False
    for arg in command:
        name, _, value = arg.partition("=")
        if name in ("--configfile", "--configfiles"):
            taking = not value
            files += [value] if value else []
        elif taking and not arg.startswith("-"):
            files.append(arg)
        else:
            taking = False
    return " ".join(files) or "config.yaml"


def benchmark_jobs(results: Path, since: float) -> dict[str, list[float | None]]:
    """The jobs whose Snakemake benchmark files under `results` were written at or after `since` (a time.time()),
    by rule: each job's seconds, None where its file has no number there. Every rule has one (`benchmark:`), a TSV
    whose `s` column is the job's seconds (summed over its rows); its rule is the file's first path component under
    benchmarks/ (benchmarks/discover/addition.tsv: discover; benchmarks/transfer.tsv: transfer)."""
    jobs: dict[str, list[float | None]] = {}
    for path in sorted(Path(results).glob("**/benchmarks/**/*.tsv")):
        if path.stat().st_mtime >= since:
            under = path.relative_to(results).parts
            rule = Path(*under[under.index("benchmarks") + 1:]).with_suffix("").parts[0]
            jobs.setdefault(rule, []).append(_benchmark_seconds(path))
    return jobs


def _benchmark_seconds(path: Path) -> float | None:
    rows = list(csv.DictReader(io.StringIO(path.read_text()), delimiter="\t"))
    try:
        return sum(float(row["s"]) for row in rows) if rows else None
    except (KeyError, TypeError, ValueError):  # no `s` column, or a row without its number: unknown
        return None


def job_seconds(results: Path, since: float) -> float | None:
    """The summed seconds of the jobs `benchmark_jobs` finds; None when it finds none or a job's is unknown (the
    run's row is written all the same)."""
    seconds = [s for times in benchmark_jobs(results, since).values() for s in times]
    return round(sum(seconds), 1) if seconds and None not in seconds else None


def rule_seconds(results: Path, since: float) -> dict[str, dict]:
    """Per rule (by name), its jobs among those `benchmark_jobs` finds: {"jobs": how many, "seconds": their sum,
    "min": the shortest job's, "max": the longest's}, to 0.1 s; the three None when a job's seconds are unknown."""
    out = {}
    for rule, times in sorted(benchmark_jobs(results, since).items()):
        if None in times:
            out[rule] = {"jobs": len(times), "seconds": None, "min": None, "max": None}
        else:
            out[rule] = {"jobs": len(times), "seconds": round(sum(times), 1), "min": round(min(times), 1),
                         "max": round(max(times), 1)}
    return out


def history_row(entry: dict, job_s: float | None = None) -> dict:
    """A record (`record_run`'s entry) as a row of the run history (`HISTORY_COLUMNS`)."""
    m = entry["machine"]
    return {"date": entry["date"], "commit": (entry["commit"] or "")[:7],
            "configuration": configuration(shlex.split(entry["command"])), "command": entry["command"],
            "machine": m.get("cpu") or "", "cores": m.get("cores") or "",
            "gpus": "; ".join(m.get("gpus") or []) or "none", "jobs": entry["jobs_run"],
            "workflow_jobs": entry["workflow_jobs"] or "", "every_job": str(bool(entry["from_scratch"])).lower(),
            "wall_s": entry["seconds"], "job_s": "" if job_s is None else job_s,
            "note": "the checkout had local changes" if entry.get("dirty") else ""}


def append_history(row: dict, path: Path = HISTORY) -> None:
    """Add `row` to the run history at `path` (its header first when the file is new): the whole file written
    to a temporary file and renamed, so that an interrupted write leaves the history as it was."""
    path = Path(path)
    old = path.read_text() if path.is_file() else ""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=HISTORY_COLUMNS, lineterminator="\n")
    if not old:
        writer.writeheader()
    elif not old.endswith("\n"):
        old += "\n"
    writer.writerow(row)
    with atomic_path(path) as tmp:
        tmp.write_text(old + out.getvalue())


def record_run(command: Sequence[str], record: Path = RECORD, *, history: Path | None = None,
               count_workflow: bool = True) -> int:
    """Run `command`, and when it succeeds write its record to `record` and add its row to `history` (None: no
    history) (`count_workflow`: first count the workflow's jobs with a dry run, else the run cannot be called
    complete); the command's exit status."""
    record = Path(record)
    commit, dirty = git_commit()
    if count_workflow:
        print("run record: counting the workflow's jobs (a dry run with --forceall)", file=sys.stderr)
    dag_jobs = workflow_jobs(command) if count_workflow else None
    started = datetime.datetime.now(datetime.timezone.utc)
    since = time.time()
    progress = Progress()
    start = time.perf_counter()
    code = run_passing_through(command, progress)
    seconds = time.perf_counter() - start
    if code != 0:
        return code  # nothing measured: the results are not what a run of this command leaves
    jobs_at_start = progress.jobs_at_start or 0  # "Nothing to be done" prints no Job stats
    from_scratch = bool(dag_jobs) and jobs_at_start == dag_jobs and progress.done >= jobs_at_start
    entry = {
        "recorded_by": "written by `make run`",
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "date": started.strftime("%Y-%m-%d"),
        "seconds": round(seconds, 1), "command": shlex.join(command),
        "jobs_run": progress.done, "jobs_at_start": jobs_at_start, "workflow_jobs": dag_jobs,
        "from_scratch": from_scratch, "machine": machine(), "arithmech": __version__, "commit": commit,
        "dirty": dirty, "rules": rule_seconds(record.parent, since),
    }
    if not from_scratch and (kept := last_complete(read_record(record))) is not None:
        entry["last_complete"] = kept
    write_json(entry, record)
    if history is not None:
        append_history(history_row(entry, job_seconds(record.parent, since)), history)
    what = ("every job of the workflow: README's run time after `make docs`" if from_scratch else
            f"a partial run ({progress.done} of the workflow's {dag_jobs if dag_jobs else 'unknown number of'} "
            "jobs): README keeps the last complete run's time")
    print(f"run record: {progress.done} jobs in {duration_text(seconds)} ({what}); {record}"
          + (f", a row in {history}" if history is not None else ""), file=sys.stderr)
    return code


def duration_text(seconds: float) -> str:
    """Seconds as README gives a run time: "24 min 52 s", "1 h 3 min 5 s", "42 s"."""
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min {secs} s"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arithmech.tools.run_record",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, default=RECORD, help=f"where the record goes (default: {RECORD})")
    parser.add_argument("--history", type=Path, default=HISTORY,
                        help=f"the run history the run's row is added to (default: {HISTORY})")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the Snakemake command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: give the Snakemake command after --")
    try:
        return record_run(command, args.record, history=args.history)
    except KeyboardInterrupt:  # during the dry run: nothing ran, nothing is recorded
        return 130


if __name__ == "__main__":
    sys.exit(main())
