"""The command line: the plan as a readable table per model, or as JSON.

    python -m arithmech.tools.plan configs/paper.yaml configs/llama2-7b.yaml        (make plan)
    python -m arithmech.tools.plan --json --tflops 300
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from arithmech.tools.plan.costmodel import Throughput
from arithmech.tools.plan.errors import PlanError
from arithmech.tools.plan.planner import plan


def _hours(value: float) -> str:
    return f"{value:.3f}" if value < 0.1 else f"{value:.2f}"


def render_text(report: dict) -> str:
    """The plan as a readable table per model, then the totals and the warnings."""
    t = report["throughput"]
    lines = [
        f"arithmech cost plan: {' + '.join(report['config_files'])}",
        "An upper bound: every candidate prompt counted as answered correctly, every greedy answer at its "
        "longest.",
        f"Assumed: {t['tflops']:g} TFLOP/s (bf16), {t['bandwidth']:g} TB/s, {t['startup_s']:g} s start-up per GPU "
        f"job, {t['gpu_memory_gb']:g} GB per GPU. Formulas: docs/plan.md.",
    ]
    header = f"{'rule':<26}{'jobs':>5}{'GPU h/job':>11}{'GPU h':>9}{'GPU GB':>8}{'host GB':>9}  notes"
    for name, entry in report["models"].items():
        res = entry["resources"]
        lines += ["", f"{name}: {entry['shape']}", f"  shape: {entry['shape_source']}; tokens {entry['tokens']}; "
                  f"{entry['dtype_bytes']} bytes a weight",
                  f"  resources per job: {res['gpus']} GPU, {res['mem_mb']} MB, {res['runtime']} min", "", header]
        lines += [_text_row(row) for row in report["rules"] if row["model"] == name]
    shared = [row for row in report["rules"] if not row["model"]]
    if shared:
        lines += ["", "no model", header] + [_text_row(row) for row in shared]
    total = report["totals"]
    lines += ["", f"total: {total['jobs']} jobs, {total['gpu_jobs']} on a GPU, {total['gpu_hours']:.2f} GPU hours; "
                  f"largest job {total['gpu_gb']:.1f} GB of GPU memory, {total['host_gb']:.1f} GB of host memory"]
    warnings = report["warnings"]
    lines += ["", f"warnings ({len(warnings)}):" if warnings else "warnings: none"]
    lines += [f"  {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def _text_row(row: dict) -> str:
    if row["kind"] != "gpu":
        label = {"local": "local", "cpu": "CPU", "unknown": "unknown"}[row["kind"]]
        return f"{row['rule']:<26}{row['jobs']:>5}{label:>11}{'-':>9}{'-':>8}{'-':>9}  {row['note']}"
    return (f"{row['rule']:<26}{row['jobs']:>5}{_hours(row['gpu_hours_per_job']):>11}{_hours(row['gpu_hours']):>9}"
            f"{row['gpu_gb']:>8.1f}{row['host_gb']:>9.1f}  {row['note']}")


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
    parser.add_argument("--root", type=Path, default=None,
                        help="the checkout (its Snakefile, config.yaml, data; default: the current directory)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)
    root = (args.root or Path.cwd()).resolve()
    throughput = Throughput(tflops=args.tflops, bandwidth=args.bandwidth, startup_s=args.startup_s,
                            gpu_memory_gb=args.gpu_memory_gb)
    try:
        report = plan(args.configs, root=root, throughput=throughput)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render_text(report), end="" if not args.json else "\n")
    return 0
