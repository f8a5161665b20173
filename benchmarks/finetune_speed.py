"""Cost of precise SFT (the selected heads only) against full fine-tuning and LoRA, measured in one run.

For each method, on the same synthetic batch (--batch-size examples of exactly --seq-len tokens, the prompt
cut from the left by max_length) it measures:
  - the mean wall time of one training step (forward, backward, clip, AdamW), after --warmup steps,
  - the trainable parameters (delta elements for precise) and the bytes of the optimizer state,
  - the peak memory (CUDA: max allocated; CPU: the peak RSS of a process that did only this method),
  - the size of the saved artifact (deltas file; the whole HF directory for full).
Each method runs in its own subprocess, so a CPU peak RSS belongs to that method alone. Then it prints the
ratios full/precise of step time and optimizer state.

Usage: python benchmarks/finetune_speed.py [--model-dir results/smollm2-135m/model] [--batch-size 4]
           [--seq-len 64] [--steps 5] [--warmup 2] [--heads L20H8,L14H6 | --n-heads 10] [--mlps 24,29]
The arithmetic study's sequences are about 30 tokens in batches of 16: --batch-size 16 --seq-len 32.
Without --model-dir it builds the tiny test model. The default heads are the last --n-heads heads of the
model (the last layers'), where the backward is shortest; give the key heads with --heads for the real case.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from arithmech.model.loading import load_model
from arithmech.model.tiny import build_tiny_model
from arithmech.sft import deltas
from arithmech.sft import training as ft

METHODS = ("full", "precise", "lora")


def synthetic_examples(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n arithmetic examples with prompts far longer than any --seq-len (cut to it by max_length)."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        sums = [(rng.randint(1, 999), rng.randint(1, 999)) for _ in range(60)]
        prompt = " ".join(f"{a} plus {b} is equal to {a + b}." for a, b in sums[:-1])
        a, b = sums[-1]
        examples.append((f"{prompt} {a} plus {b} is equal to ", str(a + b)))
    return examples


def last_heads(n_layers: int, n_heads: int, k: int) -> list[str]:
    return [f"L{n_layers - 1 - i // n_heads}H{i % n_heads}" for i in range(k)]


def artifact_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def run_one(args, method: str) -> dict:
    """Train `method` for warmup + steps optimizer steps on one synthetic batch; what it measured."""
    torch.manual_seed(0)
    lm = load_model(args.model_dir, device=args.device, dtype=args.dtype)
    heads = args.heads.split(",") if args.heads else last_heads(lm.n_layers, lm.n_heads, args.n_heads)
    cfg = {"method": method}
    if method in ("precise", "precise_mlp"):  # precise_mlp: the same heads plus the whole --mlps layers
        cfg = {"method": "precise", "heads": heads, "train_kv": args.train_kv,
               "mlp_layers": [int(x) for x in args.mlps.split(",")] if method == "precise_mlp" else []}
    if method == "lora":
        cfg["lora"] = {"r": args.lora_r, "alpha": 2 * args.lora_r, "dropout": 0.0,
                       "target_modules": args.lora_targets.split(",")}
    run = ft.prepare(lm, cfg)
    config = {"lr": 1e-5, "batch_size": args.batch_size, "max_steps": args.warmup + args.steps,
              "max_length": args.seq_len, "max_grad_norm": 1.0}
    stats = ft.train(run, synthetic_examples(args.batch_size), config, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        out = deltas.save_trained(run, Path(tmp) / ("model" if method == "full" else "deltas.safetensors"))
        size = artifact_bytes(out)
    times = stats.step_times_s[args.warmup:]
    return {"method": method, "heads": heads if method.startswith("precise") else None,
            "n_trainable": stats.n_trainable,
            "optimizer_state_bytes": stats.optimizer_state_bytes, "step_s": statistics.mean(times),
            "step_sd": statistics.stdev(times) if len(times) > 1 else 0.0, "peak_memory_bytes": stats.peak_memory_bytes,
            "peak_memory_kind": stats.peak_memory_kind, "artifact_bytes": size, "device": str(lm.device),
            "dtype": str(lm.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
            "model": lm.describe()}


def mb(n: int) -> str:
    return f"{n / 2**20:10.2f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None, help="default: build the tiny test model")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per method")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--heads", default=None, help="comma-separated heads such as L20H8,L14H6")
    parser.add_argument("--n-heads", type=int, default=10, help="without --heads: this many heads of the last layers")
    parser.add_argument("--train-kv", action="store_true", help="precise also trains the heads' K/V rows")
    parser.add_argument("--mlps", default=None, help="comma-separated MLP layers: also time precise + these MLPs")
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--lora-targets", default="q_proj,v_proj")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # JSON: the arguments of a one-method subprocess
    args = parser.parse_args()

    if args.child:
        child = json.loads(args.child)
        args = argparse.Namespace(**child["args"])
        Path(child["result"]).write_text(json.dumps(run_one(args, child["method"])))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_dir is None:
            args.model_dir = build_tiny_model(Path(tmp) / "tiny")
        results = []
        for method in (*METHODS, "precise_mlp") if args.mlps else METHODS:
            result = Path(tmp) / f"{method}.json"
            child = {"args": {**vars(args), "model_dir": str(args.model_dir)}, "method": method, "result": str(result)}
            subprocess.run([sys.executable, __file__, "--child", json.dumps(child)], check=True)
            results.append(json.loads(result.read_text()))

    by = {r["method"]: r for r in results}
    first = results[0]
    print(f"model {first['model']}")
    print(f"device {first['device']}, dtype {first['dtype']}, threads {first['threads']}; batch {args.batch_size} x "
          f"{args.seq_len} tokens, mean of {args.steps} steps after {args.warmup} warmup steps")
    print(f"precise heads ({len(by['precise']['heads'])}{', with K/V' if args.train_kv else ''}): "
          f"{','.join(by['precise']['heads'])}; lora r={args.lora_r} on {args.lora_targets}")
    print()
    print(f"{'method':11s} {'trainable':>12s} {'optimizer state':>16s} {'step time':>18s} {'peak memory':>14s} "
          f"{'artifact':>13s}")
    for r in results:
        print(f"{r['method']:11s} {r['n_trainable']:12,d} {mb(r['optimizer_state_bytes']):>16s} "
              f"{r['step_s']:9.4f} ± {r['step_sd']:.4f} s {mb(r['peak_memory_bytes']):>14s} {mb(r['artifact_bytes'])}")
    print(f"(peak memory: {first['peak_memory_kind']})")
    print()
    for label, key in (("step time", "step_s"), ("optimizer state", "optimizer_state_bytes"),
                       ("trainable", "n_trainable")):
        full = by["full"][key]
        ratios = (full / by["precise"][key], full / by["lora"][key])
        print(f"{label:16s} full / precise: {ratios[0]:8.2f}x   full / lora: {ratios[1]:8.2f}x")


if __name__ == "__main__":
    main()
