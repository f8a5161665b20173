"""The fit gap of discovered circuits against the number of pairs pruned on (issue 57), on the teacher-forced protocol
of one operator of a prepared model: for each --samples n, the discover rule's search (`tf.node_ranking`,
`tf.prune`, two-sided, mean ablation) on a seeded draw of n identification pairs, the target chosen on those
pairs (`stages.discover.choose_target`; the rule chooses on held-out identification pairs), and the chosen circuit's
full-answer faithfulness on those pairs and on a seeded draw of validation pairs under both ablations: the gap is
the difference.

    PYTHONPATH=src .venv/bin/python benchmarks/discover_gap.py MODEL_DIR PAIRS.parquet --samples 16 32 64
        [--validation 120] [--steps 8]

Prints one line per n: the chosen target and circuit size, identification and validation faithfulness and the gap per
ablation, and the search's seconds. At 120 pairs (every identification pair) it takes far longer than the default
run's discover job on a CPU."""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from arithmech.data.arithmetic import split_pairs
from arithmech.data.datasets import subsample
from arithmech.interp import protocol
from arithmech.interp import teacher_forcing as tf
from arithmech.model.loading import load_model
from arithmech.stages.discover import choose_target

TARGETS = (0.8, 0.9, 0.95)  # config.yaml's circuit.discover.targets
MIN_FULL_SHARE = 0.8  # and min_full_share


def correct(lm, items, pool, outputs, masks) -> dict:
    """{kind: teacher-forced full-answer accuracy [circuits]} under both ablations."""
    out = {}
    for kind in protocol.KINDS:
        values = tf.ablation_values(lm, items, pool, kind, pool_outputs=outputs)
        out[kind] = tf.TailTrials(lm, items, values, batch_size=max(32, len(items))).scores(masks)["correct"].mean(1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("pairs")
    parser.add_argument("--samples", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--validation", type=int, default=120)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    lm = load_model(args.model_dir, device="cpu")
    pairs = pd.read_parquet(args.pairs)
    ident_all = split_pairs(pairs, "identification")
    pool = tf.build_items(lm, ident_all, outputs=True)
    outputs = tf.tail_outputs(lm, pool)
    val = tf.build_items(lm, subsample(split_pairs(pairs, "validation"), args.validation, 0))
    n = lm.n_layers * (lm.n_heads + 1)
    ends = np.vstack([np.ones(n, dtype=bool), np.zeros(n, dtype=bool)])
    for samples in args.samples:
        ident = tf.build_items(lm, subsample(ident_all, samples, 0))
        start = time.perf_counter()
        trials = tf.TailTrials(lm, ident, tf.ablation_values(lm, ident, pool, "mean", pool_outputs=outputs),
                               batch_size=max(32, len(ident)))
        ranking, _ = tf.node_ranking(trials, args.steps)
        pruned, _ = tf.prune(trials, TARGETS, ranking=ranking, two_sided=True)
        seconds = time.perf_counter() - start
        masks = np.vstack([ends, [p.kept for p in pruned]])
        acc = trials.scores(masks)["correct"].mean(1)
        table = pd.DataFrame({"target": TARGETS, "full_share": acc[2:] / acc[0]})
        target, reached = choose_target(table, MIN_FULL_SHARE)
        chosen = masks[2 + TARGETS.index(target)]
        rows = np.vstack([ends, chosen])
        fit, held = correct(lm, ident, pool, outputs, rows), correct(lm, val, pool, outputs, rows)
        cells = []
        for kind in protocol.KINDS:
            f_fit = protocol.faithfulness(fit[kind][2], fit[kind][0], fit[kind][1])
            f_val = protocol.faithfulness(held[kind][2], held[kind][0], held[kind][1])
            cells.append(f"{kind}: identification {f_fit:.2f}, validation {f_val:.2f}, gap {f_fit - f_val:+.2f}")
        print(f"{samples} pairs ({len(ident)} items): target {target}{'' if reached else ' (none reached)'}, "
              f"{int(chosen.sum())} nodes; {'; '.join(cells)}; search {seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
