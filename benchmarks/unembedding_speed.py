"""The unembedding of the last positions, strided view against contiguous copy (`loading.contiguous_unembedding_input`),
on the default model, one thread, as `make run` runs its jobs.

First the unembedding alone (F.linear of the kept positions of [rows, seq, d_model]), then rule entry points with the
hook removed ("before") and installed ("after"), alternating in one process, CPU time and wall time, and whether the
two wrote equal tables (`DataFrame.equals`). Rules: build_pairs (addition), knockout (addition), transfer (tasks
[addition]: its key heads on its pairs and number formats, SVAMP and the non-math control), off_target (the base
model's off-target rows, most of a `study_evaluate` job). Inputs from RESULTS (default results/smollm2-135m).
Usage: python benchmarks/unembedding_speed.py [rounds] [build_pairs,knockout,transfer,off_target] [RESULTS] [OUT]"""
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from arithmech.model import loading
from arithmech.stages.identify import run_build_pairs
from arithmech.stages.validate import run_knockout

torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
rules = sys.argv[2].split(",") if len(sys.argv) > 2 else ["build_pairs", "knockout", "transfer", "off_target"]
results = Path(sys.argv[3] if len(sys.argv) > 3 else "results/smollm2-135m")
out = Path(sys.argv[4] if len(sys.argv) > 4 else "/tmp/unembedding_speed")
out.mkdir(parents=True, exist_ok=True)
cfg = yaml.safe_load(open("config.yaml"))
model_dir = results / "model"


def cpu_seconds(f, n=3):
    f()
    start = time.process_time()
    for _ in range(n):
        f()
    return (time.process_time() - start) / n


weight = loading.load_model(model_dir).unembed.weight
with torch.no_grad():
    for rows, seq in ((16, 40), (64, 32), (256, 10)):
        view = torch.randn(rows, seq, weight.shape[1])[:, -1:]
        a = cpu_seconds(lambda: torch.nn.functional.linear(view, weight))
        b = cpu_seconds(lambda: torch.nn.functional.linear(view.contiguous(), weight))
        print(f"unembedding of {rows} rows' last position (of {seq}): view {a:.3f} s, contiguous {b:.3f} s, "
              f"{a / b:.1f}x", flush=True)

installed = {"hook": True}
load_model = loading.load_model


def load(*args, **kwargs):
    lm = load_model(*args, **kwargs)
    if not installed["hook"]:
        hooks = lm.unembed._forward_pre_hooks
        for key in [k for k, fn in hooks.items() if fn is loading.contiguous_unembedding_input]:
            del hooks[key]
    return lm


loading.load_model = load  # the stages load their model through it


def build_pairs(tag):
    run_build_pairs(model_dir=model_dir, task="addition", prompts=cfg["prompts"], compute=cfg["compute"],
                    seed=cfg["seed"], out_pairs=out / f"pairs_{tag}.parquet",
                    out_dropped=out / f"dropped_{tag}.parquet")
    return ["pairs", "dropped"]


def knockout(tag):
    run_knockout(model="smollm2-135m", task="addition", model_dir=model_dir,
                 pairs_path=results / "pairs/addition.parquet",
                 cache_path=results / "activations/addition.safetensors",
                 effects_path=results / "effects/addition.parquet",
                 key_path=results / "key_components/addition.parquet",
                 ablation=cfg["ablation"], compute=cfg["compute"], seed=cfg["seed"],
                 out_table=out / f"knockout_{tag}.parquet", out_items=out / f"knockout_items_{tag}.parquet")
    return ["knockout", "knockout_items"]


def transfer(tag):
    from arithmech.stages.validate import run_transfer

    transfer = cfg["transfer"]
    run_transfer(model="smollm2-135m", model_dir=model_dir, tasks=["addition"],
                 pairs_paths=[results / "pairs/addition.parquet"],
                 cache_paths=[results / "activations/addition.safetensors"],
                 key_paths=[results / "key_components/addition.parquet"], svamp_path=transfer["svamp"]["file"],
                 non_math_path=transfer["non_math"]["file"], transfer=transfer, prompts_cfg=cfg["prompts"],
                 compute=cfg["compute"], seed=cfg["seed"], out_table=out / f"transfer_{tag}.parquet",
                 out_items=out / f"transfer_items_{tag}.parquet")
    return ["transfer", "transfer_items"]


def off_target(tag):
    from arithmech.sft.scoring import off_target_rows

    study = cfg["study"]["off_target"]
    frames = off_target_rows(loading.load_model(model_dir), None, study, study["files"], seed=cfg["seed"],
                             batch_size=cfg["compute"]["batch_size"])
    pd.concat(frames, ignore_index=True).to_parquet(out / f"off_target_{tag}.parquet")
    return ["off_target"]


for name in rules:
    for r in range(rounds):
        for tag in ("before", "after") if r % 2 == 0 else ("after", "before"):
            installed["hook"] = tag == "after"
            cpu, wall = time.process_time(), time.perf_counter()
            tables = globals()[name](tag)
            print(f"{name} round {r} {tag}: CPU {time.process_time() - cpu:.1f} s, "
                  f"wall {time.perf_counter() - wall:.1f} s, load average {os.getloadavg()[0]:.1f}", flush=True)
    for table in tables:
        equal = pd.read_parquet(out / f"{table}_before.parquet").equals(pd.read_parquet(out / f"{table}_after.parquet"))
        print(f"{name}: {table} tables equal: {equal}", flush=True)
