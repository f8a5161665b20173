"""A cost plan before the first GPU hour: for a configuration (config.yaml and overlays, merged as the
workflow merges them), each rule's job count, GPU hours and peak GPU and host memory, and the totals.

    python -m arithmech.tools.plan configs/paper.yaml configs/llama2-7b.yaml        (make plan)

Job counts come from the workflow itself: a Snakemake dry run with the same configuration files in an empty
working directory, read job by job (`snakemake_dry_run`, `parse_dry_run`). Each job's cost comes from its
rule's function in `RULE_COSTS`, from the token counts the configuration implies and the model's shape
(`Shape`). The formulas (docs/plan.md has them all, with the assumed throughput):

  forward FLOPs of n new tokens on p cached positions, the unembedding at k of them:
      2 N n + 4 L d_attn (n p + n (n + 1) / 2) + 2 d V k          (N: parameters of the decoder layers)
  training: full fine-tuning 3 forwards; other methods 2 forwards (the gradient still flows back through
      the frozen layers) + 6 FLOPs per token and trained parameter; AdamW 16 FLOPs per trained parameter
      and step
  a job's time: max(FLOPs / throughput, memory reads / bandwidth) + start-up (the reads: the weights
      once per forward, every row's KV cache once per step)
  GPU memory: weights + activations (KV cache, one layer's intermediates, float32 logits); training adds
      gradients, optimizer state and the activations kept for the backward

The plan is an upper bound: every candidate prompt counts as answered correctly (the correct-only filter can
only lower the counts) and every greedy answer runs to its longest length. Tokens are counted by the model's
tokenizer when its local directory has a tokenizer.json, else estimated from characters (`TokenCounter`).
No torch is imported unless a shape is read from a local config.json or the tiny model's spec
(`arithmech.model.loading.config_shape`, `arithmech.model.tiny` own those).

Against a finished run (`--compare RESULTS_DIR`): per model and rule, the jobs planned and measured, the
costliest job's planned time against the measured wall times, planned against measured peak GPU and host
memory (`measured`: Snakemake's benchmark files and the jobs' own records, `arithmech.jobs.write_usage`).

The modules, in the order they build on each other: `errors`, `shapes` (model sizes), `tokens` (token
counts), `dryrun` (the merged configuration and the dry run's jobs), `costmodel` (throughput, FLOPs, bytes,
trained parameters), `workload` (prompts and data sets the configuration implies), `jobcost` (`Cost`,
`Setting`), `interp_rules` and `sft_rules` (one cost function per rule), `planner` (`RULE_COSTS`, `plan`),
`measured` (a finished run read back, `measure`, and set against the plan, `compare`), `cli` (the tables and
`main`).
"""

from arithmech.tools.plan.cli import main, render_comparison, render_text
from arithmech.tools.plan.costmodel import Throughput
from arithmech.tools.plan.dryrun import load_config
from arithmech.tools.plan.errors import PlanError
from arithmech.tools.plan.measured import compare, measure
from arithmech.tools.plan.planner import RULE_COSTS, plan
from arithmech.tools.plan.shapes import SHAPES
from arithmech.tools.plan.workload import HUB_SETS, data_path, read_records

__all__ = ["HUB_SETS", "RULE_COSTS", "SHAPES", "PlanError", "Throughput", "compare", "data_path", "load_config", "main",
           "measure", "plan", "read_records", "render_comparison", "render_text"]
