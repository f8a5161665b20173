"""Plain vs shared-prefix training forward and backward (`training.batch_loss`) on the default model: micro-batches
of 16 add2 training items of results/smollm2-135m/finetune/study/items.parquet, both paths alternating in one
process, CPU time and wall time; "train": a whole study-like run (precise, 16 heads, 20 steps) each way, and how far
their parameters end apart. Usage: THREADS=1 python benchmarks/shared_prefix_speed.py [repeats]
[precise|full|train ...]"""
import statistics
import sys
import time

import pandas as pd
import torch

from arithmech.model.loading import load_model
from arithmech.sft import training as ft

torch.set_num_threads(int(__import__("os").environ.get("THREADS", "2")))
items = pd.read_parquet("results/smollm2-135m/finetune/study/items.parquet")
items = items[(items.format == "add2") & (items.split == "train")]
examples = list(zip(items.prompt, items.target))
heads = [[l, h] for l in (14, 18, 20, 22, 24, 26, 28, 29) for h in (0, 5)]  # 16 heads, layers like the key heads'
methods = {"precise": {"method": "precise", "heads": heads}, "full": {"method": "full"}}
def whole_run():
    config = {"lr": 3e-3, "batch_size": 16, "max_steps": 20, "warmup_steps": 2, "max_length": 64, "seed": 0}
    ends = {}
    for shared in (False, True):
        run = ft.prepare(load_model("results/smollm2-135m/model", device="cpu", dtype="float32"),
                         {"method": "precise", "heads": heads})
        t0, w0 = time.process_time(), time.perf_counter()
        stats = ft.train(run, examples, config, progress=False, append_eos=False, shared_prefix=shared)
        print(f"shared={shared}: CPU {time.process_time() - t0:.1f} s, wall {time.perf_counter() - w0:.1f} s, "
              f"losses {stats.losses[0]:.4f} -> {stats.losses[-1]:.4f}", flush=True)
        ends[shared] = ({k: p.detach().clone() for k, p in run.params.items()}, stats.losses)
    worst = max((ends[True][0][k] - ends[False][0][k]).abs().max().item() for k in ends[False][0])
    scale = max(ends[False][0][k].abs().max().item() for k in ends[False][0])
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(ends[True][1], ends[False][1]))
    print(f"largest parameter difference {worst:.2e} (largest delta {scale:.2e}); "
          f"largest relative loss difference {loss_diff:.2e}")


repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 4
for name in sys.argv[2:] or methods:
    if name == "train":
        whole_run()
        continue
    lm = load_model("results/smollm2-135m/model", device="cpu", dtype="float32")
    run = ft.prepare(lm, methods[name])
    run.model.train()
    tok = lm.tokenizer
    times = {False: [], True: []}
    for r in range(repeats + 1):
        part = examples[16 * r:16 * (r + 1)]
        b = ft.collate([ft.encode_example(tok, p, t, 64, eos=False) for p, t in part],
                       tok.pad_token_id or tok.eos_token_id, "cpu")
        for shared in ((False, True) if r % 2 == 0 else (True, False)):
            for p in run.params.values():
                p.grad = None
            t0, w0 = time.process_time(), time.perf_counter()
            loss, n = ft.batch_loss(run.model, b, shared_prefix=shared)
            loss.backward()
            dt = (time.process_time() - t0, time.perf_counter() - w0)
            if r:  # the first round warms up
                times[shared].append(dt)
        if r == 0:
            print(f"{name}: batch {tuple(b['input_ids'].shape)}, shared prefix {ft.common_prefix(run.model, b)} tokens",
                  flush=True)
    plain, shared = (statistics.median(t[0] for t in times[s]) for s in (False, True))
    wp, ws = (statistics.median(t[1] for t in times[s]) for s in (False, True))
    print(f"{name}: CPU s plain {[round(t[0], 2) for t in times[False]]}, "
          f"shared {[round(t[0], 2) for t in times[True]]}; wall median {wp:.2f} vs {ws:.2f} s; "
          f"median ratio {plain / shared:.2f}x", flush=True)
    del run, lm
