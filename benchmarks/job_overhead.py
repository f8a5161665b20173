"""What every job pays before it computes anything: interpreter start-up, imports and the model load,
each measured in fresh interpreters in one run (the median of --repeats).

  figure job    the imports of a torch-free figure rule (`arithmech.stages.validate` and `arithmech.report.plots`:
                pandas, seaborn)
  torch         `import torch`
  + load_model  torch, transformers and the default model loaded (`models.load_model`), what every model job
                (patch_all_layers, knockout, analyze, ...) does first
  weights       a second load_model in the same process: reading and placing the weights, imports done

Prints seconds per step and how much of a model job's start-up is the weights rather than imports.

Usage: python benchmarks/job_overhead.py [--model-dir results/smollm2-135m/model] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STEPS = {
    "empty interpreter": "pass",
    "figure job imports": "import arithmech.stages.validate, arithmech.report.plots, seaborn",
    "import torch": "import torch",
    "torch + load_model (default model)": "from arithmech.model.loading import load_model; load_model({model!r})",
}
# The weights alone: a second load_model in the same process, whose imports are all done.
SECOND_LOAD = ("import time; from arithmech.model.loading import load_model; load_model({model!r}); "
               "t = time.perf_counter(); load_model({model!r}); print(time.perf_counter() - t)")


def wall(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - start


def second_load(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=ROOT / "results/smollm2-135m/model", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not (args.model_dir / "source.json").is_file():
        raise SystemExit(f"no prepared model at {args.model_dir}: run the prepare_model rule (make run) first")
    times = {}
    for name, code in STEPS.items():
        times[name] = statistics.median(wall(code.format(model=str(args.model_dir))) for _ in range(args.repeats))
        print(f"{name:38s} {times[name]:6.2f} s")
    weights = statistics.median(second_load(SECOND_LOAD.format(model=str(args.model_dir))) for _ in range(args.repeats))
    print(f"{'load_model again in the same process':38s} {weights:6.2f} s")
    load = times["torch + load_model (default model)"]
    print(f"a model job starts in {load:.2f} s, of which {weights:.2f} s ({100 * weights / load:.0f}%) read and "
          f"place the weights and the rest is the interpreter and imports; a figure job starts in "
          f"{times['figure job imports']:.2f} s ({load / times['figure job imports']:.1f}x less)")


if __name__ == "__main__":
    main()
