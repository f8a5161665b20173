"""The paths a GPU run takes (bf16 weights, the closed form on a bf16 model, precise SFT on a bf16 model, knockout,
peak memory), each on every device this machine has: always the CPU, and CUDA when it is available (those
cases are marked `gpu`; `make gpu-check` runs them on a GPU machine, and CI, without one, skips them)."""

from __future__ import annotations

import pytest
import torch

from arithmech.data.arithmetic import build_prompts
from arithmech.interp.ablation import greedy_end_sets
from arithmech.interp.patching import collect, direct_logits
from arithmech.model.loading import load_model
from arithmech.sft import training as ft

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]),
]
EXAMPLES = [(f"{a} plus {b} is equal to ", str(a + b)) for a, b in [(1, 2), (3, 4), (2, 2), (4, 1)]]


@pytest.fixture(scope="module")
def prompts(tiny_dir, base_prompt_cfg):
    lm = load_model(tiny_dir, device="cpu")
    df = build_prompts(lm.tokenizer, "addition", base_prompt_cfg, seed=0).head(12)
    return df["prompt"].tolist(), df["cf_prompt"].tolist(), torch.tensor(df["answer_token_id"].to_numpy())


@pytest.fixture(scope="module")
def fp32_direct(tiny_dir, prompts):
    """The closed form on the float32 model on the CPU (PatchedLogits: logit_o [samples], logit_p [samples, nodes])."""
    lm = load_model(tiny_dir, device="cpu")
    texts, cf_texts, answers = prompts
    ref, _ = collect(lm, texts, answers, batch_size=4)
    cf, _ = collect(lm, cf_texts, answers, batch_size=4)
    return direct_logits(lm, ref, cf, answers, list(range(lm.n_layers)), batch_size=8)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_closed_form_tracks_fp32(tiny_dir, prompts, fp32_direct, device):
    """bf16 weights and activations: the patched logits stay within bf16 rounding of the fp32 ones (a bf16
    step near |x| is |x| / 128), and the ranking of the nodes by effect barely moves."""
    lm = load_model(tiny_dir, device=device, dtype="bfloat16")
    assert lm.dtype == torch.bfloat16 and lm.device.type == device
    texts, cf_texts, answers = prompts
    ref, _ = collect(lm, texts, answers, batch_size=4)
    cf, _ = collect(lm, cf_texts, answers, batch_size=4)
    want = fp32_direct.logit_p
    got = direct_logits(lm, ref, cf, answers, list(range(lm.n_layers)), batch_size=8).logit_p.cpu()
    assert got.shape == want.shape and torch.isfinite(got).all()
    scale = want.abs().max()
    assert (got - want).abs().max() <= 4 * scale / 128  # measured on the CPU: about 1 step
    mean_bf16, mean_fp32 = got.mean(0), want.mean(0)
    assert torch.corrcoef(torch.stack([mean_bf16, mean_fp32]))[0, 1] > 0.99


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_model_effects_from_the_float32_closed_form(tiny_dir, prompts, fp32_direct, device):
    """On a bf16 model the closed form still runs in float32, logit_o included (the same computation at
    zero change): logit_p - logit_o then differs from the float32 model's only by the bf16 activations, well
    within a bf16 step of the logits, and by less than a bf16-rounded logit_p minus the forward's bf16
    logit (the path before: ref.logits as logit_o)."""
    lm = load_model(tiny_dir, device=device, dtype="bfloat16")
    texts, cf_texts, answers = prompts
    ref, _ = collect(lm, texts, answers, batch_size=4)
    cf, _ = collect(lm, cf_texts, answers, batch_size=4)
    out = direct_logits(lm, ref, cf, answers, list(range(lm.n_layers)), batch_size=8)
    assert out.logit_o.dtype == out.logit_p.dtype == torch.float32
    want = fp32_direct.logit_p - fp32_direct.logit_o[:, None]  # [samples, nodes]
    err = (out.logit_p - out.logit_o[:, None]).cpu() - want
    step = fp32_direct.logit_o.abs().max() / 128  # a bf16 step at the largest unpatched logit
    assert err.abs().max() <= step  # measured on the CPU: about step / 2
    before = out.logit_p.bfloat16().float().cpu() - ref.logits.float().cpu()[:, None] - want
    assert err.abs().mean() < 0.75 * before.abs().mean()  # measured on the CPU: 0.0005 against 0.0012


@pytest.mark.parametrize("device", DEVICES)
def test_knockout_answers_match_the_cpu(tiny_dir, prompts, device):
    """Greedy answers with head sets mean-ablated (the validate stage) on the device, in float32, are the
    CPU's tokens."""
    texts, cf_texts, answers = prompts
    sets = [[], [(1, 0)], [(0, 1), (2, 3)]]

    def answers_on(dev):
        lm = load_model(tiny_dir, device=dev)
        mean = collect(lm, cf_texts, answers, batch_size=4, groups=[0] * len(cf_texts))[1].end()
        return greedy_end_sets(lm, texts, sets, means=mean, max_new_tokens=3, batch_size=5).tokens

    cpu, other = answers_on("cpu"), answers_on(device)
    assert torch.equal(other.cpu(), cpu)


@pytest.mark.parametrize("device", DEVICES)
def test_precise_sft_on_a_bf16_model_keeps_frozen_weights_and_fp32_deltas(tiny_dir, device):
    lm = load_model(tiny_dir, device=device, dtype="bfloat16")
    base = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    run = ft.prepare(lm, {"method": "precise", "heads": [[1, 0], [2, 3]], "delta_dtype": "float32"})
    stats = ft.train(run, EXAMPLES, {"lr": 3e-2, "batch_size": 2, "max_grad_norm": 1.0, "seed": 0, "max_steps": 4},
                     progress=False)
    assert all(torch.isfinite(torch.tensor(stats.losses)))
    for name, p in lm.model.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, base[name]), name
    assert all(p.dtype == torch.float32 and p.device.type == device and p.abs().sum() > 0
               for p in run.params.values())
    assert stats.peak_memory_bytes > 0
    assert stats.peak_memory_kind == ("cuda_max_memory_allocated" if device == "cuda" else "process_peak_rss")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_tiny_workflow_end_to_end_on_cuda_in_bf16(tmp_path):
    """Every rule of the smoke configuration (tests/config/tiny.yaml) on CUDA with bf16 weights, as a cluster
    job runs it (`run_tiny_workflow`)."""
    run_tiny_workflow(tmp_path, "cuda", "bfloat16")


def run_tiny_workflow(tmp_path, device: str, dtype: str) -> None:
    """The smoke configuration with compute.device/dtype set: the run completes, its effect and knockout tables
    hold finite numbers, and every fine-tuning run reports the device's peak memory. (The CPU case is
    test_workflow's; this is the GPU test's body, callable on the CPU in bf16 to check the test itself.)"""
    import json
    import os
    import shutil

    import numpy as np
    import pandas as pd
    import yaml

    from helpers import ROOT, TINY_CONFIG, copy_project, snakemake

    work = copy_project(tmp_path)
    shutil.copy2(ROOT / "config.yaml", work / "config.yaml")
    overlay = yaml.safe_load(TINY_CONFIG.read_text())
    overlay["compute"] = {**overlay.get("compute", {}), "device": device, "dtype": dtype}
    (work / "device.yaml").write_text(yaml.safe_dump(overlay, sort_keys=False))
    cores = str(max(2, min(8, os.cpu_count() or 2)))  # a GPU node's CPUs run the figure and table jobs beside it
    proc = snakemake(work, "--cores", cores, "--configfile", "device.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    res = work / "results/tiny"
    for task in ("addition", "division"):
        effects = pd.read_parquet(res / f"effects/{task}.parquet")
        assert len(effects) and np.isfinite(effects["mean_effect"]).all()
        knockout = pd.read_parquet(res / f"knockout/{task}.parquet")
        assert set(knockout["positions"]) == {"end", "all"} and knockout["accuracy"].between(0, 1).all()
    kind = "cuda_max_memory_allocated" if device == "cuda" else "process_peak_rss"
    for method in ("precise", "full", "random_heads", "lora"):
        stats = json.loads((res / f"finetune/{method}/stats.json").read_text())
        assert stats["peak_memory_kind"] == kind and stats["peak_memory_bytes"] > 0, method
