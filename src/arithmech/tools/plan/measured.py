"""A finished run read back and set against the plan (`--compare RESULTS_DIR`): per model and rule, the jobs
measured, their wall time and peak host memory from Snakemake's `benchmark:` files, their peak GPU memory from
each job's own record (`arithmech.jobs.write_usage`), beside what the plan estimated.

    measured = measure(Path("results"))
    comparison = compare(plan([...], root=Path(".")), measured, results=Path("results"))

Where the run keeps them (every rule has a `benchmark:`; every job run through `arithmech.jobs.job` writes
its record next to its log):

    results/<model>/benchmarks/<rule>/<wildcards...>.tsv or results/<model>/benchmarks/<rule>.tsv
    results/<model>/logs/<...>.usage.json     {"rule", "wildcards", "ok", "wall_s", "host_peak_mb", "gpu_peak_mb"}
    results/benchmarks/..., results/logs/...  the rules without a model (fetch_dataset)

Snakemake's benchmark TSV has a header (s, h:m:s, max_rss, ...) and one row per run of the job (more than
one with `repeat()`): `s` is the job's wall seconds, its whole process included; `max_rss` its peak resident
memory in MiB ("NA" when the job ended before Snakemake's first sample). `gpu_peak_mb` is
torch.cuda.max_memory_allocated per device in MiB, null in a job that did not use CUDA. The plan's GB are
1e9 bytes; measured MiB are converted (x 2^20 / 1e9).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from arithmech.tools.cluster import job_resources
from arithmech.tools.plan.errors import PlanError
from arithmech.tools.plan.jobcost import target_rule
from arithmech.tools.plan.planner import RULE_COSTS

BENCHMARK_COLUMNS = ("s", "max_rss")  # of Snakemake's header (`snakemake.benchmark.BenchmarkRecord`)
NOT_SAMPLED = ("NA", "-")  # Snakemake's max_rss of a job it could not sample
USAGE_KEYS = ("rule", "ok", "wall_s", "gpu_peak_mb")
MIB_TO_GB = 2**20 / 1e9


def read_benchmark(path: Path) -> list[dict[str, float | None]]:
    """The runs of one Snakemake benchmark TSV, one per row: {"s": wall seconds, "max_rss": MiB or None}."""
    try:
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise PlanError(f"benchmark file '{path}': cannot read it ({err})") from err
    header = lines[0].split("\t") if lines else []
    if any(column not in header for column in BENCHMARK_COLUMNS) or len(lines) < 2:
        raise PlanError(f"benchmark file '{path}': expected a Snakemake benchmark TSV, a tab-separated header with "
                        f"the columns {', '.join(BENCHMARK_COLUMNS)} and a row per run; found "
                        f"{len(lines)} line(s) and the header {header}")
    runs = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise PlanError(f"benchmark file '{path}', line {number}: {len(fields)} fields, expected {len(header)} "
                            f"(the header's)")
        row = dict(zip(header, fields))
        rss = row["max_rss"]
        runs.append({"s": _number(row["s"], path, number, "s"),
                     "max_rss": None if rss in NOT_SAMPLED else _number(rss, path, number, "max_rss")})
    return runs


def _number(text: str, path: Path, line: int, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise PlanError(f"benchmark file '{path}', line {line}: column {column} is '{text}', expected a number >= 0")
    return value


def read_usage(path: Path) -> dict:
    """One job's own record (`<log>.usage.json`, written by `arithmech.jobs.write_usage`), checked."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PlanError(f"job record '{path}': cannot read it as JSON ({err})") from err
    if not isinstance(record, dict) or any(key not in record for key in USAGE_KEYS):
        raise PlanError(f"job record '{path}': expected a JSON object with the keys {', '.join(USAGE_KEYS)} "
                        f"(arithmech.jobs.write_usage)")
    peaks = record["gpu_peak_mb"]
    if peaks is not None and not (isinstance(peaks, dict) and
                                  all(isinstance(v, (int, float)) for v in peaks.values())):
        raise PlanError(f"job record '{path}': gpu_peak_mb is {peaks!r}, expected null or MiB by device")
    return record


@dataclass
class Measured:
    """One rule's jobs of one model as the run measured them."""

    walls: dict[str, float] = field(default_factory=dict)  # job (its benchmark file) -> seconds, mean of runs
    rss_mb: list[float] = field(default_factory=list)  # every sampled run's max_rss
    records: int = 0  # job records (usage JSONs)
    failed: int = 0  # ... of attempts that failed (their peaks are left out)
    cuda: int = 0  # ... of jobs that used CUDA
    gpu_mb: list[float] = field(default_factory=list)  # every device's peak of every CUDA job that finished

    def add_benchmark(self, job: str, runs: list[dict]) -> None:
        self.walls[job] = sum(run["s"] for run in runs) / len(runs)
        self.rss_mb += [run["max_rss"] for run in runs if run["max_rss"] is not None]

    def add_usage(self, record: dict) -> None:
        self.records += 1
        if not record["ok"]:
            self.failed += 1
            return
        if record["gpu_peak_mb"] is not None:
            self.cuda += 1
            self.gpu_mb += list(record["gpu_peak_mb"].values())


def measure(results: Path) -> dict[tuple[str, str], Measured]:
    """Every rule's measurements in a finished run's results directory, by (model, rule); model "" for the
    rules without one (results/benchmarks, results/logs)."""
    results = Path(results)
    if not results.is_dir():
        raise PlanError(f"--compare '{results}': no such directory (expected a run's results/, with "
                        f"<model>/benchmarks/ and <model>/logs/)")
    found: dict[tuple[str, str], Measured] = {}
    places = [("", results)] + [(d.name, d) for d in sorted(results.iterdir())
                                if d.is_dir() and d.name not in ("benchmarks", "logs")]
    for model, base in places:
        benchmarks = base / "benchmarks"
        for path in sorted(benchmarks.rglob("*.tsv")):
            job = path.relative_to(benchmarks).with_suffix("")
            rule = job.parts[0]  # <rule>/<wildcards...>.tsv or <rule>.tsv
            found.setdefault((model, rule), Measured()).add_benchmark(str(job), read_benchmark(path))
        for path in sorted((base / "logs").rglob("*.usage.json")):
            record = read_usage(path)
            found.setdefault((model, str(record["rule"])), Measured()).add_usage(record)
    return found


def compare(report: dict, measured: dict[tuple[str, str], Measured], *, results: Path | str) -> dict:
    """The plan `report` against a run's measurements, per (model, rule): jobs planned and measured; the
    costliest planned job's time (its GPU hours / its GPUs) against the longest and mean measured wall time;
    planned peak GPU and host GB against the measured peaks (max over jobs and devices of gpu_peak_mb; max
    over jobs of max_rss); measured / planned where both exist. Wall and GPU ratios only for rules whose jobs
    recorded CUDA: a CPU run's seconds are no GPU time. JSON-able."""
    planned = {(row["model"], row["rule"]): row for row in report["rules"]
               if RULE_COSTS.get(row["rule"]) is not target_rule}  # the target runs nothing, so no benchmark
    rows = [_row(key, planned.get(key), measured.get(key), report["models"])
            for key in [*planned, *sorted(k for k in measured if k not in planned)]]
    return {
        "results": str(results),
        "jobs_measured": sum(len(m.walls) for m in measured.values()),
        "job_records": sum(m.records for m in measured.values()),
        "cuda_records": sum(m.cuda for m in measured.values()),
        "rows": rows,
        "not_measured": [_name(row) for row in rows if row["jobs_planned"] and not row["jobs_measured"]],
        "not_planned": [_name(row) for row in rows if row["kind"] == "not planned"],
        "failed": {_name(row): row["failed"] for row in rows if row["failed"]},
    }


def _name(row: dict) -> str:
    return f"{row['model']}/{row['rule']}" if row["model"] else row["rule"]


def _ratio(measured: float | None, planned: float | None) -> float | None:
    return measured / planned if measured is not None and planned else None


def _row(key: tuple[str, str], plan_row: dict | None, m: Measured | None, models: dict) -> dict:
    model, rule = key
    m = m or Measured()
    gpu = plan_row is not None and plan_row["kind"] == "gpu"
    gpus = job_resources(models[model]["resources"], rule)["gpus"] if gpu else 0
    on_cpu = gpu and plan_row.get("on_cpu")  # a model's job with gpus: 0
    if gpu:
        planned_wall = plan_row["cpu_hours_per_job"] * 3600 if on_cpu else plan_row["gpu_hours_per_job"] * 3600 / gpus
    else:
        planned_wall = None
    walls = list(m.walls.values())
    longest = max(m.walls, key=m.walls.get) if walls else None
    on = "cuda" if m.cuda else ("cpu" if m.records > m.failed else None)
    measured_gpu = max(m.gpu_mb) * MIB_TO_GB if m.gpu_mb else None
    host = max(m.rss_mb) * MIB_TO_GB if m.rss_mb else None
    row = {
        "model": model, "rule": rule, "kind": plan_row["kind"] if plan_row else "not planned",
        "jobs_planned": plan_row["jobs"] if plan_row else 0, "jobs_measured": len(walls),
        "job_records": m.records, "failed": m.failed, "measured_on": on,
        "gpu_hours_per_job": plan_row["gpu_hours_per_job"] if gpu else None,
        "costliest": plan_row["costliest"] if gpu else None, "gpus": gpus or None, "planned_wall_s": planned_wall,
        "longest_s": m.walls[longest] if walls else None, "longest_job": longest,
        "mean_s": sum(walls) / len(walls) if walls else None,
        "planned_gpu_gb": plan_row["gpu_gb"] if gpu else None, "gpu_gb": measured_gpu,
        "planned_host_gb": plan_row["host_gb"] if gpu else None, "host_gb": host,
    }
    row["wall_ratio"] = _ratio(row["longest_s"], planned_wall) if on == ("cpu" if on_cpu else "cuda") else None
    row["gpu_ratio"] = _ratio(measured_gpu, row["planned_gpu_gb"])
    row["host_ratio"] = _ratio(host, row["planned_host_gb"])
    return row
