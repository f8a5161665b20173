"""The command line: the plan as a readable table per model, or as JSON; with --compare, the plan against a
finished run (`measured`) as a second table per model.

    python -m arithmech.tools.plan configs/paper.yaml configs/llama2-7b.yaml        (make plan)
    python -m arithmech.tools.plan --json --tflops 300
    python -m arithmech.tools.plan tests/config/tiny.yaml --compare results
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Sequence

from arithmech.tools.cluster import FLOOR, HEADROOM, RESOURCE_GROUPS
from arithmech.tools.plan.costmodel import HOST_BASE_BYTES, Throughput
from arithmech.tools.plan.errors import PlanError
from arithmech.tools.plan.measured import compare, measure
from arithmech.tools.plan.planner import plan, requests_file


def _hours(value: float) -> str:
    return f"{value:.3f}" if value < 0.1 else f"{value:.2f}"


def _resources_text(res: dict) -> str:
    """A model's resources as the plan shows them: its own, then each per-rule block's overrides."""
    def text(r):
        parts = [("CPU" if r["gpus"] == 0 else f"{r['gpus']} GPU") if "gpus" in r else "",
                 f"{r['mem_mb']} MB" if "mem_mb" in r else "",
                 f"{r['runtime']} min" if "runtime" in r else ""]
        return ", ".join(p for p in parts if p)
    blocks = [f"{group}: {text(res[group])}" for group in RESOURCE_GROUPS if res.get(group)]
    return "; ".join([text(res), *blocks])


def render_text(report: dict) -> str:
    """The plan as a readable table per model, then the totals and the warnings."""
    t = report["throughput"]
    lines = [
        f"arithmech cost plan: {' + '.join(report['config_files'])}",
        "An upper bound: every candidate prompt counted as answered correctly, every greedy answer at its "
        "longest.",
        f"Assumed: {t['tflops']:g} TFLOP/s (bf16), {t['bandwidth']:g} TB/s, {t['startup_s']:g} s start-up per GPU "
        f"job, {t['gpu_memory_gb']:g} GB per GPU; weights read at {t['fs_gbs']:g} GB/s, {t['queue_wait_min']:g} min "
        "in the queue per allocation. Formulas: docs/plan.md.",
        f"allocs: Slurm allocations in the SLURM profile's groups. request: a job's memory and minutes with "
        f"slurm.requests ({HEADROOM['mem_mb']:g} x host GB, {HEADROOM['runtime']:g} x time,",
        f"at least {FLOOR['mem_mb']} MB and {FLOOR['runtime']} min, at most models.<name>.resources).",
    ]
    header = (f"{'rule':<26}{'jobs':>5}{'allocs':>7}{'GPU h/job':>11}{'GPU h':>9}{'GPU GB':>8}{'host GB':>9}"
              f"{'request':>14}  notes")
    for name, entry in report["models"].items():
        res = entry["resources"]
        lines += ["", f"{name}: {entry['shape']}", f"  shape: {entry['shape_source']}; tokens {entry['tokens']}; "
                  f"{entry['dtype_bytes']} bytes a weight",
                  f"  resources per job: {_resources_text(res)}", "", header]
        lines += [_text_row(row) for row in report["rules"] if row["model"] == name]
    shared = [row for row in report["rules"] if not row["model"]]
    if shared:
        lines += ["", "no model", header] + [_text_row(row) for row in shared]
    total = report["totals"]
    on_cpu = (f", {total['cpu_model_jobs']} model jobs on a CPU node (gpus: 0), {total['cpu_hours']:.2f} CPU job hours "
              f"at {t['cpu_tflops']:g} TFLOP/s and {t['cpu_bandwidth']:g} TB/s") if total.get("cpu_model_jobs") else ""
    lines += ["", f"total: {total['jobs']} jobs, {total['gpu_jobs']} on a GPU, {total['gpu_hours']:.2f} GPU hours"
                  f"{on_cpu}; "
                  f"largest job {total['gpu_gb']:.1f} GB of GPU memory, {total['host_gb']:.1f} GB of host memory",
              f"Slurm: {total['allocations']} allocations for the {total['submitted']} jobs sbatch runs (the SLURM "
              f"profile's groups; {total['submitted']} without them), {total['queue_hours']:.1f} h in the queue at "
              f"{t['queue_wait_min']:g} min each;",
              f"  {total['weight_loads']} weight loads, {total['load_hours']:.2f} h reading weights at "
              f"{t['fs_gbs']:g} GB/s (within each job's start-up)"]
    warnings = report["warnings"]
    lines += ["", f"warnings ({len(warnings)}):" if warnings else "warnings: none"]
    lines += [f"  {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def _text_row(row: dict) -> str:
    allocs = row["allocations"]
    if row["group"]:  # its jobs run in the group's allocations, counted on the group's first row
        row = row | {"note": f"[group {row['group']}] {row['note']}"}
    if row["kind"] != "gpu":
        label = {"local": "local", "cpu": "CPU", "unknown": "unknown"}[row["kind"]]
        return (f"{row['rule']:<26}{row['jobs']:>5}{allocs:>7}{label:>11}{'-':>9}{'-':>8}{'-':>9}{'-':>14}  "
                f"{row['note']}")
    request = f"{row['request']['mem_mb'] / 1000:.0f} GB {row['request']['runtime']} m" if row["request"] else "-"
    if row.get("on_cpu"):  # a model's job with gpus: 0, its hours a CPU node's (a plan without them: none)
        return (f"{row['rule']:<26}{row['jobs']:>5}{allocs:>7}{_hours(row['cpu_hours_per_job']) + ' CPU':>11}"
                f"{_hours(row['cpu_hours']) + ' CPU':>9}{'-':>8}{row['host_gb']:>9.1f}{request:>14}  {row['note']}")
    return (f"{row['rule']:<26}{row['jobs']:>5}{allocs:>7}{_hours(row['gpu_hours_per_job']):>11}"
            f"{_hours(row['gpu_hours']):>9}{row['gpu_gb']:>8.1f}{row['host_gb']:>9.1f}{request:>14}  {row['note']}")


def render_comparison(comparison: dict) -> str:
    """The plan against a finished run: per model and rule, planned against measured jobs, time and memory,
    then the rules only one side has and the failed attempts."""
    cuda = comparison["cuda_records"]
    lines = [
        f"against the finished run in {comparison['results']}: {comparison['jobs_measured']} jobs measured "
        f"(benchmark files), {comparison['job_records']} job records, {cuda} of them on CUDA",
        "jobs: planned/measured. plan s: the costliest planned job's time (its GPU h over its GPUs); longest, mean:",
        "the measured jobs' wall seconds (benchmark s). GPU GB: planned peak against the largest gpu_peak_mb of any",
        "job and device. host GB: planned against the largest max_rss. ratio: measured / planned. GB: 1e9 bytes.",
    ]
    if not comparison["jobs_measured"] + comparison["job_records"]:
        lines += [f"Nothing measured: no benchmark file or job record in {comparison['results']}",
                  "(a run from before every rule had a benchmark, or another directory)."]
    elif not cuda:
        lines += ["No job recorded CUDA: a CPU run. Its seconds are no GPU time, so no time ratio ('cpu'); GPU",
                  f"memory n/a; host memory compared (the plan's includes {HOST_BASE_BYTES / 1e9:g} GB for Python, "
                  "torch and CUDA)."]
    header = (f"{'rule':<26}{'jobs':>7}{'plan s':>9}{'longest':>9}{'mean':>9}{'ratio':>7}{'GPU GB':>8}{'meas.':>7}"
              f"{'ratio':>7}{'host GB':>9}{'meas.':>7}{'ratio':>7}")
    for model in dict.fromkeys(row["model"] for row in comparison["rows"]):
        lines += ["", model or "no model", header]
        lines += [_comparison_row(row) for row in comparison["rows"] if row["model"] == model]
    lines.append("")
    for label, names in (("planned, not measured", comparison["not_measured"]),
                         ("ran, not planned", comparison["not_planned"])):
        lines.append(textwrap.fill(f"{label}: {', '.join(names) if names else 'none'}", width=118,
                                   subsequent_indent="  ", break_on_hyphens=False))
    failed = comparison["failed"]
    if failed:
        lines.append("failed attempts (left out of the peaks): "
                     + ", ".join(f"{name} {count}" for name, count in failed.items()))
    return "\n".join(lines) + "\n"


def _value(value: float | None, missing: str = "-") -> str:
    if value is None:
        return missing
    return f"{value:.2f}" if value < 10 else (f"{value:.1f}" if value < 1000 else f"{value:.0f}")


def _comparison_row(row: dict) -> str:
    wall_ratio = "cpu" if row["measured_on"] == "cpu" and row["planned_wall_s"] else _value(row["wall_ratio"])
    gpu = _value(row["gpu_gb"], "n/a" if row["jobs_measured"] else "-")
    jobs = f"{row['jobs_planned']}/{row['jobs_measured']}"
    return (f"{row['rule']:<26}{jobs:>7}{_value(row['planned_wall_s']):>9}"
            f"{_value(row['longest_s']):>9}{_value(row['mean_s']):>9}{wall_ratio:>7}"
            f"{_value(row['planned_gpu_gb']):>8}{gpu:>7}{_value(row['gpu_ratio']):>7}"
            f"{_value(row['planned_host_gb']):>9}{_value(row['host_gb']):>7}{_value(row['host_ratio']):>7}")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m arithmech.tools.plan [CONFIG ...] [options]`: print the plan; exit status 2 with the message of a
    configuration, model or dry run it cannot read."""
    parser = argparse.ArgumentParser(
        prog="python -m arithmech.tools.plan",
        description="Jobs, GPU hours and peak memory per rule of a configuration, before running it (docs/plan.md).")
    parser.add_argument("configs", nargs="*", help="config files merged over config.yaml, in order (as --configfile)")
    parser.add_argument("--tflops", type=float, default=Throughput.tflops,
                        help="effective bf16 TFLOP/s of one GPU (default: 100, an A100's 312 at 32%%)")
    parser.add_argument("--bandwidth", type=float, default=Throughput.bandwidth,
                        help="effective TB/s of GPU memory (default: 1.5, an A100-80GB's 2.0 at 75%%)")
    parser.add_argument("--startup-s", type=float, default=Throughput.startup_s,
                        help="seconds a GPU job spends starting and loading its model (default: 60)")
    parser.add_argument("--gpu-memory-gb", type=float, default=Throughput.gpu_memory_gb,
                        help="GB of memory per GPU (default: 80)")
    parser.add_argument("--fs-gbs", type=float, default=Throughput.fs_gbs,
                        help="GB/s a job reads the weights at from the shared file system (default: 1, a 10 GbE "
                             "client)")
    parser.add_argument("--cpu-tflops", type=float, default=Throughput.cpu_tflops,
                        help="effective float32 TFLOP/s of a CPU node, for a model's jobs with gpus: 0 (default: "
                             "0.1, about half a 2-core AVX2 node's peak)")
    parser.add_argument("--cpu-bandwidth", type=float, default=Throughput.cpu_bandwidth,
                        help="effective TB/s of a CPU node's memory (default: 0.01)")
    parser.add_argument("--queue-wait-min", type=float, default=Throughput.queue_wait_min,
                        help="minutes each Slurm allocation waits in the queue (default: 5, an assumption)")
    parser.add_argument("--requests", type=Path, default=None, metavar="FILE",
                        help="write each model rule's planned host memory and time to FILE, for the config's "
                             "slurm.requests (jobs then ask for them with headroom)")
    parser.add_argument("--root", type=Path, default=None,
                        help="the checkout (its Snakefile, config.yaml, data; default: the current directory)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--compare", type=Path, default=None, metavar="RESULTS_DIR",
                        help="a finished run's results directory: after the plan, planned against measured jobs, "
                             "wall time and peak memory per rule (its benchmarks/ and logs/*.usage.json)")
    args = parser.parse_args(argv)
    root = (args.root or Path.cwd()).resolve()
    throughput = Throughput(tflops=args.tflops, bandwidth=args.bandwidth, startup_s=args.startup_s,
                            gpu_memory_gb=args.gpu_memory_gb, fs_gbs=args.fs_gbs, queue_wait_min=args.queue_wait_min,
                            cpu_tflops=args.cpu_tflops, cpu_bandwidth=args.cpu_bandwidth)
    try:
        measured = measure(args.compare) if args.compare is not None else None  # first: a bad file fails fast
        report = plan(args.configs, root=root, throughput=throughput)
        if measured is not None:
            report["comparison"] = compare(report, measured, results=args.compare)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.requests is not None:
        args.requests.write_text(json.dumps(requests_file(report), indent=2) + "\n")
        print(f"requests for slurm.requests written to {args.requests}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_text(report), end="")
        if "comparison" in report:
            print("\n" + render_comparison(report["comparison"]), end="")
    return 0
