"""LoRA is saved as a PEFT adapter directory: peft's own loader and the evaluation's loading path give the
trained model, adapter_config.json names the base model and the LoRA settings, evaluation merges exactly the
update the former layout stored, a resumed run saves the same adapter, and a file in the former layout is
refused with what to do. Every test loads its own model: training mutates it."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from arithmech.data.arithmetic import encode
from arithmech.model.loading import load_model
from arithmech.sft import deltas, runs
from arithmech.sft import training as ft

EXAMPLES = [(f"{a} plus {b} is equal to ", str(a + b)) for a, b in [(1, 2), (3, 4), (2, 2), (4, 1)]]
# alpha / r = 1.5: not a power of two, so scaling lora_B before or after the product rounds differently.
LORA = {"method": "lora", "lora": {"r": 4, "alpha": 6, "target_modules": ["q_proj", "down_proj"]}}
TRAIN = {"lr": 3e-2, "batch_size": 2, "max_steps": 2, "seed": 0}
COMPUTE = {"device": "cpu", "dtype": "float32"}


def logits(model, tokenizer, texts=("3 plus 4 is equal to ", "What is 2 times 1? The answer is ")):
    with torch.no_grad():
        return model(**encode(tokenizer, list(texts))).logits


@pytest.fixture(scope="module")
def saved_run(tiny_dir, tmp_path_factory):
    """LoRA trained 2 steps and saved by the workflow's own save function into a run directory."""
    lm = load_model(tiny_dir, device="cpu")
    run = ft.prepare(lm, LORA)
    stats = ft.train(run, EXAMPLES, TRAIN, progress=False)
    out = tmp_path_factory.mktemp("lora") / "run"
    runs.save_training_run(ft=run, stats=stats, wall_s=0.0, out_dir=out, checkpoints=out.parent / "checkpoints",
                           meta={"stage": "test"}, record={}, tables={})
    return lm, run, out


def test_peft_loads_the_adapter_with_the_evaluations_logits(saved_run, tiny_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lm, run, out = saved_run
    evaluated = runs.load_finetuned(tiny_dir, out, COMPUTE)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_dir), out / runs.ADAPTER_DIR)
    expected = logits(evaluated.model, lm.tokenizer)
    assert not torch.allclose(logits(load_model(tiny_dir, device="cpu").model, lm.tokenizer), expected, atol=1e-4)
    torch.testing.assert_close(logits(peft_model, lm.tokenizer), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits(run.model, lm.tokenizer), expected, atol=1e-5, rtol=0)  # as trained


def test_adapter_config_names_the_base_model_and_the_lora_settings(saved_run, tiny_dir):
    lm, run, out = saved_run
    adapter = out / runs.ADAPTER_DIR
    assert {"adapter_config.json", "adapter_model.safetensors", "finetune.json"} <= {p.name for p in adapter.iterdir()}
    assert (out / runs.STATS_FILE).is_file() and not (out / runs.TRAINED_FILE).exists()
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == str(tiny_dir)
    assert sorted(config["target_modules"]) == ["down_proj", "q_proj"]
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (4, 6, 0.0)
    factors = load_file(str(adapter / "adapter_model.safetensors"))
    assert len(factors) == 2 * 2 * lm.n_layers and sum(t.numel() for t in factors.values()) == run.n_trainable
    meta = deltas.read_trained_meta(adapter)
    assert meta["method"] == "lora" and meta["lora"] == LORA["lora"] | {"dropout": 0.0}
    assert meta["n_trainable"] == run.n_trainable and meta["provenance"] == {"stage": "test"}


def test_evaluation_adds_the_update_the_former_layout_stored(saved_run, tiny_dir):
    """The former file held lora_B * alpha/r and lora_A; evaluation added their product (in float32) to the
    base weight. The adapter gives the same weights bit for bit."""
    _, run, out = saved_run
    base = dict(load_model(tiny_dir, device="cpu").model.named_parameters())
    evaluated = dict(runs.load_finetuned(tiny_dir, out, COMPUTE).model.named_parameters())
    adapted = dict(run.model.get_base_model().named_modules())
    changed = 0
    for name, weight in evaluated.items():
        module = adapted[name.removesuffix(".weight")] if name.endswith(".weight") else None
        if module is None or not hasattr(module, "lora_A"):
            assert torch.equal(weight, base[name]), name
            continue
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
        assert torch.equal(weight, base[name] + (b * 1.5).float() @ a.float()), name
        changed += 1
    assert changed == 2 * 3  # q_proj and down_proj of each of the 3 layers


def test_resumed_run_saves_the_same_adapter(tiny_dir, tmp_path):
    whole = ft.prepare(load_model(tiny_dir, device="cpu"), LORA, seed=1)
    ft.train(whole, EXAMPLES, {**TRAIN, "max_steps": 4}, progress=False)
    killed = ft.prepare(load_model(tiny_dir, device="cpu"), LORA, seed=1)
    ft.train(killed, EXAMPLES, {**TRAIN, "max_steps": 4}, checkpoint_dir=tmp_path / "ckpt", stop_at_step=2,
             progress=False)
    resumed = ft.prepare(load_model(tiny_dir, device="cpu"), LORA, seed=2)  # another init: the checkpoint wins
    stats = ft.train(resumed, EXAMPLES, {**TRAIN, "max_steps": 4}, checkpoint_dir=tmp_path / "ckpt", progress=False)
    assert stats.resumed_from_step == 2
    saved = [load_file(str(deltas.save_trained(r, tmp_path / name) / "adapter_model.safetensors"))
             for r, name in ((whole, "whole"), (resumed, "resumed"))]
    assert saved[0].keys() == saved[1].keys()
    for key in saved[0]:
        assert torch.equal(saved[0][key], saved[1][key]), key


def test_former_layout_and_broken_adapters_are_refused(saved_run, tiny_dir, tmp_path):
    _, _, out = saved_run
    old = tmp_path / "old"
    old.mkdir()
    save_file({"model.layers.0.self_attn.q_proj.weight.lora_A": torch.zeros(4, 32),
               "model.layers.0.self_attn.q_proj.weight.lora_B": torch.zeros(32, 4)}, str(old / runs.TRAINED_FILE))
    refused = re.escape(str(old / runs.TRAINED_FILE)) + r" holds LoRA factors in the former layout"
    with pytest.raises(ValueError, match=refused + r".*re-run the rule that trained it \(finetune"):
        runs.load_finetuned(tiny_dir, old, COMPUTE)
    with pytest.raises(FileNotFoundError, match="holds none of model/, adapter/, trained.safetensors"):
        runs.load_finetuned(tiny_dir, tmp_path / "empty", COMPUTE)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    factors = load_file(str(out / runs.ADAPTER_DIR / "adapter_model.safetensors"))
    key = next(k for k in factors if k.endswith("lora_B.weight"))
    save_file({k: v for k, v in factors.items() if k != key}, str(adapter / "adapter_model.safetensors"))
    config = json.loads((out / runs.ADAPTER_DIR / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has lora_A without its pair"):
        deltas.apply_trained(load_model(tiny_dir, device="cpu"), adapter)
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "use_rslora": True}))
    with pytest.raises(ValueError, match=r"adapter_config.json: expected a plain LoRA adapter.*use_rslora"):
        deltas.apply_trained(load_model(tiny_dir, device="cpu"), adapter)
