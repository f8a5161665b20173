"""Fine-tuning: per-head deltas leave the base untouched and train exactly the selected slices, the saved
deltas reproduce the trained model, the loss sees only the target, and a resumed run equals an
uninterrupted one. Every test loads its own model: training mutates it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arithmech.data import formatting
from arithmech.data.arithmetic import encode
from arithmech.model.loading import load_model
from arithmech.model.tiny import FAMILIES
from arithmech.sft import deltas, methods
from arithmech.sft import training as ft

EXAMPLES = [(f"{a} plus {b} is equal to ", str(a + b)) for a, b in [(1, 2), (3, 4), (2, 2), (4, 1)]]
HEADS = [(1, 0), (2, 3)]  # two layers; head 3 reads key/value head 1 (4 query heads, 2 kv heads)
FAST = {"lr": 3e-2, "batch_size": 2, "max_grad_norm": 1.0, "seed": 0}


def fresh(tiny_dir):
    return load_model(tiny_dir, device="cpu")


def logits(model, tokenizer, texts=("3 plus 4 is equal to ", "What is 2 times 1? The answer is ")):
    with torch.no_grad():
        return model(**encode(tokenizer, list(texts))).logits


def q_rows(h, hd=8):
    return slice(h * hd, (h + 1) * hd)


@pytest.fixture(scope="module")
def precise_run(tiny_dir, tmp_path_factory):
    """Precise SFT of HEADS (no K/V) for 20 steps, with the base weights as they were before."""
    lm = fresh(tiny_dir)
    base = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    run = ft.prepare(lm, {"method": "precise", "heads": [list(h) for h in HEADS]})
    stats = ft.train(run, EXAMPLES, {**FAST, "max_steps": 20}, progress=False)
    path = deltas.save_trained(run, tmp_path_factory.mktemp("precise") / "deltas.safetensors")
    return lm, run, stats, base, path


def test_precise_leaves_base_bit_identical_and_changes_only_selected_slices(precise_run):
    lm, run, stats, base, _ = precise_run
    for name, p in lm.model.named_parameters():
        assert torch.equal(p, base[name]), name
        assert not p.requires_grad and p.grad is None, name
    for layer in range(lm.n_layers):
        prefix = f"model.layers.{layer}.self_attn"
        q = run.deltas.effective_weight(f"{prefix}.q_proj")
        o = run.deltas.effective_weight(f"{prefix}.o_proj")
        k = run.deltas.effective_weight(f"{prefix}.k_proj")
        assert torch.equal(k, base[f"{prefix}.k_proj.weight"])  # train_kv is off
        for head in range(lm.n_heads):
            rows, q0, o0 = q_rows(head), base[f"{prefix}.q_proj.weight"], base[f"{prefix}.o_proj.weight"]
            selected = (layer, head) in HEADS
            assert torch.equal(q[rows], q0[rows]) != selected, (layer, head)
            assert torch.equal(o[:, rows], o0[:, rows]) != selected, (layer, head)


def test_precise_loss_decreases_and_stats(precise_run):
    lm, run, stats, _, _ = precise_run
    assert stats.steps == stats.total_steps == 20 and len(stats.losses) == len(stats.step_times_s) == 20
    assert sum(stats.losses[-4:]) < 0.7 * sum(stats.losses[:4])  # single steps are noisy (batches of 2)
    n = len(HEADS) * 2 * lm.head_dim * lm.d_model
    assert stats.n_trainable == run.n_trainable == n
    # AdamW keeps exp_avg and exp_avg_sq per trained element (fp32) plus one step counter per tensor.
    assert 2 * 4 * n <= stats.optimizer_state_bytes <= 2 * 4 * n + 8 * len(run.params)
    assert stats.peak_memory_kind == "process_peak_rss" and stats.peak_memory_bytes > 0


def test_apply_trained_reproduces_the_trained_model(precise_run, tiny_dir):
    lm, run, _, _, path = precise_run
    trained = logits(lm.model, lm.tokenizer)
    base = fresh(tiny_dir)
    assert not torch.allclose(logits(base.model, base.tokenizer), trained, atol=1e-3)
    model = deltas.apply_trained(base, path)
    assert model is base.model and not model._forward_hooks
    torch.testing.assert_close(logits(model, base.tokenizer), trained, atol=1e-5, rtol=0)
    meta = deltas.read_trained_meta(path)
    assert meta["method"] == "precise" and meta["heads"] == [list(h) for h in HEADS]
    assert meta["shapes"]["model.layers.2.self_attn.o_proj.weight.head.3"] == [lm.d_model, lm.head_dim]
    # load_trained is the same for an evaluation job.
    torch.testing.assert_close(logits(deltas.load_trained(tiny_dir, path, device="cpu").model, base.tokenizer),
                               trained, atol=1e-5, rtol=0)


@pytest.mark.parametrize("train_kv, mlp_layers", [(False, []), (True, []), (True, [0, 2])])
def test_trainable_count_is_closed_form(tiny_dir, train_kv, mlp_layers):
    lm = fresh(tiny_dir)
    heads = [(1, 0), (1, 1), (2, 3)]  # heads 0 and 1 of layer 1 share key/value head 0
    run = ft.prepare(lm, methods.Method("precise", tuple(heads), train_kv, tuple(mlp_layers)))
    hd, d, inter = lm.head_dim, lm.d_model, lm.model.config.intermediate_size
    expected = len(heads) * 2 * hd * d + train_kv * 2 * 2 * hd * d + len(mlp_layers) * 3 * d * inter
    assert run.n_trainable == expected
    assert run.deltas.deltas["L1_k_proj" if train_kv else "L1_q_proj"].shape[0] == (1 if train_kv else 2)


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_deltas_leave_logits_identical(tiny_family, family):
    lm = fresh(tiny_family(family)[0])
    before = logits(lm.model, lm.tokenizer)
    ft.prepare(lm, {"method": "precise", "heads": ["L0H2", "L2H3"], "train_kv": True, "mlp_layers": [1]})
    assert torch.equal(logits(lm.model, lm.tokenizer), before)


@pytest.mark.parametrize("family", FAMILIES)
def test_delta_gradients_are_the_weight_slices_gradients(tiny_family, family):
    """d loss / d delta_h equals d loss / d W on head h's slice; no base weight gets a gradient. On every family:
    Gemma 3's q/k norms act per head after q_proj / k_proj, so a head's rows are still its own."""
    tiny_dir = tiny_family(family)[0]
    batch = ft.collate([ft.encode_example(fresh(tiny_dir).tokenizer, p, t, 64) for p, t in EXAMPLES], 0, "cpu")
    lm = fresh(tiny_dir)
    run = ft.prepare(lm, {"method": "precise", "heads": [list(h) for h in HEADS], "train_kv": True,
                          "mlp_layers": [0]})
    loss, _ = ft.batch_loss(lm.model, batch)
    loss.backward()
    assert all(p.grad is None for p in lm.model.parameters())
    full = fresh(tiny_dir)
    full.model.requires_grad_(True)
    loss_full, _ = ft.batch_loss(full.model, batch)
    loss_full.backward()
    torch.testing.assert_close(loss, loss_full, atol=0, rtol=0)
    w = {n: p.grad for n, p in full.model.named_parameters()}
    g = {k: p.grad for k, p in run.params.items()}
    close = dict(atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g["L1_q_proj"][0], w["model.layers.1.self_attn.q_proj.weight"][q_rows(0)], **close)
    torch.testing.assert_close(g["L2_o_proj"][0], w["model.layers.2.self_attn.o_proj.weight"][:, q_rows(3)], **close)
    torch.testing.assert_close(g["L2_k_proj"][0], w["model.layers.2.self_attn.k_proj.weight"][q_rows(1)], **close)
    torch.testing.assert_close(g["L1_v_proj"][0], w["model.layers.1.self_attn.v_proj.weight"][q_rows(0)], **close)
    torch.testing.assert_close(g["L0_down_proj"], w["model.layers.0.mlp.down_proj.weight"], **close)
    assert all(v.abs().sum() > 0 for v in g.values())


def test_labels_mask_the_prompt_and_truncation_keeps_the_target(tiny_lm):
    tok = tiny_lm.tokenizer
    prompt, target = "12 plus 3 is equal to ", "15"
    p_ids, t_ids = tok(prompt)["input_ids"], tok(target, add_special_tokens=False)["input_ids"]
    ids, labels = ft.encode_example(tok, prompt, target, 64)
    assert ids == p_ids + t_ids + [tok.eos_token_id]
    assert labels == [-100] * len(p_ids) + t_ids + [tok.eos_token_id]
    ids, labels = ft.encode_example(tok, prompt, target, len(t_ids) + 3)  # room for the last 2 prompt tokens
    assert ids == p_ids[-2:] + t_ids + [tok.eos_token_id] and labels[:2] == [-100, -100]
    with pytest.raises(ValueError, match="max_length"):
        ft.encode_example(tok, prompt, target, len(t_ids))  # the target and eos do not fit
    batch = ft.collate([ft.encode_example(tok, prompt, target, 64), ft.encode_example(tok, "1 plus 1 is ", "2", 64)],
                       tok.pad_token_id, "cpu")
    short = len(ft.encode_example(tok, "1 plus 1 is ", "2", 64)[0])
    assert batch["attention_mask"][1].tolist() == [1] * short + [0] * (batch["input_ids"].shape[1] - short)
    assert (batch["labels"][1, short:] == -100).all()
    assert ft.batch_loss(tiny_lm.model, batch)[1] == len(t_ids) + 1 + 1 + 1  # targets and eos of both


def sentencepiece_like_tokenizer():
    """A tokenizer that normalizes like LLaMA-2's fast tokenizer: every text gets a leading "▁" and spaces
    become "▁", so " Janet" alone is "▁", "▁Janet" but "▁Janet" after other text."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    corpus = ["Question: Janet has 3 pens and buys 4 more. How many pens? Answer: Janet has 3 + 4 = 7 pens."] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>", "<s>", "</s>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_target_tokens_are_those_that_follow_the_prompt():
    tok = sentencepiece_like_tokenizer()
    prompt, target = "Question: How many pens? Answer:", " Janet has 7"
    whole = tok(prompt + target)["input_ids"]
    alone = tok(target, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(alone)[0] == "▁" and alone[1:] == whole[-3:]  # what a separate call gives
    ids, labels = ft.encode_example(tok, prompt, target, 64)
    assert ids == whole + [tok.eos_token_id]
    n_prompt = len(tok(prompt)["input_ids"])
    assert labels == [-100] * n_prompt + whole[n_prompt:] + [tok.eos_token_id]
    assert tok.convert_ids_to_tokens(ids[n_prompt:-1]) == ["▁Janet", "▁has", "▁7"]
    # a token across the boundary: the prompt keeps its own tokens, the target is tokenized alone
    p_ids, t_ids = tok("Answer: Jan")["input_ids"], tok("et has 7", add_special_tokens=False)["input_ids"]
    assert tok("Answer: Janet has 7")["input_ids"][: len(p_ids)] != p_ids  # "▁Janet" spans the boundary
    ids, labels = ft.encode_example(tok, "Answer: Jan", "et has 7", 64)
    assert ids == p_ids + t_ids + [tok.eos_token_id]
    assert labels == [-100] * len(p_ids) + t_ids + [tok.eos_token_id]


def train_twice(tiny_dir, tmp_path, method, config, first_config=None, stop_at_step=None):
    """An uninterrupted run and a run that stops early (its first call: `first_config`, or `stop_at_step`)
    and then resumes from its checkpoint on a freshly loaded model; returns both [(FineTune, TrainStats)]."""
    lm = fresh(tiny_dir)
    whole = ft.prepare(lm, method, seed=1)
    whole_stats = ft.train(whole, EXAMPLES, config, progress=False)
    ckpt = tmp_path / "checkpoint"
    lm = fresh(tiny_dir)
    killed = ft.prepare(lm, method, seed=1)
    ft.train(killed, EXAMPLES, first_config or config, checkpoint_dir=ckpt, stop_at_step=stop_at_step,
             progress=False)
    lm = fresh(tiny_dir)
    resumed = ft.prepare(lm, method, seed=2)  # another LoRA init: the checkpoint must overwrite it
    resumed_stats = ft.train(resumed, EXAMPLES, config, checkpoint_dir=ckpt, progress=False)
    for name in whole.params:
        assert torch.equal(whole.params[name], resumed.params[name]), name
    assert whole_stats.losses == resumed_stats.losses
    return whole_stats, resumed_stats, ckpt


def test_killed_and_resumed_run_equals_uninterrupted(tiny_dir, tmp_path):
    config = {**FAST, "max_steps": 6, "checkpoint_every": 2}
    _, stats, ckpt = train_twice(tiny_dir, tmp_path, {"method": "precise", "heads": ["L1H0"], "train_kv": True},
                                 config, first_config={**config, "max_steps": 3})  # the "kill": an early max_steps
    assert stats.resumed_from_step == 3 and stats.steps == 6 and len(stats.step_times_s) == 6
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step-00000006"]


def test_resume_restores_dropout_rng_and_schedule(tiny_dir, tmp_path):
    """LoRA with dropout (the RNG), linear decay (depends on the total) and gradient accumulation, stopped
    by stop_at_step at an odd step (between checkpoints)."""
    method = {"method": "lora", "lora": {"r": 2, "alpha": 4, "dropout": 0.3, "target_modules": ["q_proj", "o_proj"]}}
    config = {**FAST, "batch_size": 1, "grad_accumulation": 2, "max_steps": 5, "warmup_steps": 2,
              "schedule": "linear", "checkpoint_every": 2}
    _, stats, _ = train_twice(tiny_dir, tmp_path, method, config, stop_at_step=3)
    assert stats.resumed_from_step == 3


def test_resume_refuses_a_changed_run(tiny_dir, tmp_path):
    lm = fresh(tiny_dir)
    run = ft.prepare(lm, {"method": "precise", "heads": ["L1H0"]})
    ft.train(run, EXAMPLES, {**FAST, "max_steps": 2}, checkpoint_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="finetune.train.lr"):
        ft.train(run, EXAMPLES, {**FAST, "max_steps": 4, "lr": 1e-3}, checkpoint_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="data"):
        ft.train(run, EXAMPLES[:3], {**FAST, "max_steps": 4}, checkpoint_dir=tmp_path, progress=False)


def test_full_saves_a_loadable_model(tiny_dir, tmp_path):
    lm = fresh(tiny_dir)
    run = ft.prepare(lm, {"method": "full"})
    stats = ft.train(run, EXAMPLES, {**FAST, "epochs": 2}, progress=False)
    assert stats.total_steps == 4 and stats.n_trainable == sum(p.numel() for p in lm.model.parameters())
    out = deltas.save_trained(run, tmp_path / "full")
    loaded = load_model(out, device="cpu")
    assert torch.equal(logits(loaded.model, loaded.tokenizer), logits(run.merged_model(), lm.tokenizer))
    with pytest.raises(ValueError, match="load_model"):
        deltas.apply_trained(fresh(tiny_dir), out)


def test_eval_summary_records_each_methods_training_precision(tmp_path):
    """The recipe's Table 1 ends with each run's model_dtype and master_dtype (empty for the base model and for a
    stats.json written before they were recorded); the other columns keep their order."""
    import json

    import pandas as pd

    from arithmech.stages.finetune import eval_summary

    pd.DataFrame({"correct": [True, False]}).to_parquet(tmp_path / "eval.parquet")
    record = {"n_trainable": 10, "n_parameters": 100, "steps": 2, "mean_step_s": 0.1, "step_times_s": [0.1, 0.1],
              "peak_memory_bytes": 2**20, "peak_memory_kind": "process_peak_rss", "optimizer_state_bytes": 80,
              "artifact_bytes": 40, "losses": [2.0, 1.0]}
    (tmp_path / "full.json").write_text(json.dumps({**record, "model_dtype": "bfloat16", "master_dtype": "float32"}))
    (tmp_path / "old.json").write_text(json.dumps(record))
    arms = ("base", "full", "old")
    summary = eval_summary({m: {"gsm8k": tmp_path / "eval.parquet"} for m in arms},
                           {m: tmp_path / f"{m}.json" for m in arms[1:]}, 0.95)
    assert list(summary.columns[-3:]) == ["final_loss", "model_dtype", "master_dtype"]
    assert summary[["model_dtype", "master_dtype"]].values.tolist() == [["", ""], ["bfloat16", "float32"], ["", ""]]


def test_grad_scale_multiplies_the_head_gradients_only(tiny_dir, tmp_path):
    """After one step AdamW's exp_avg is (1 - beta1) * grad: with grad_scale 2.5 (and no clipping) it is 2.5x
    larger for the head deltas and unchanged for the MLP deltas."""
    states = []
    for scale in (None, 2.5):
        run = ft.prepare(fresh(tiny_dir), {"method": "precise", "heads": ["L1H0"], "mlp_layers": [2],
                                           "grad_scale": scale})
        ft.train(run, EXAMPLES, {**FAST, "max_steps": 1, "max_grad_norm": None}, checkpoint_dir=tmp_path / str(scale),
                 progress=False)
        states.append(torch.load(tmp_path / str(scale) / "step-00000001" / "optimizer.pt", weights_only=True)["state"])
    assert list(run.params) == ["L1_q_proj", "L1_o_proj", "L2_gate_proj", "L2_up_proj", "L2_down_proj"]
    for i, factor in enumerate([2.5, 2.5, 1.0, 1.0, 1.0]):
        torch.testing.assert_close(states[1][i]["exp_avg"], factor * states[0][i]["exp_avg"])


def test_grad_scale_and_config_errors(tiny_dir):
    lm = fresh(tiny_dir)
    assert ft.resolve_grad_scale("heads_ratio", lm, 2) == 3 * 4 / 2  # all 12 heads over the 2 trained
    assert ft.resolve_grad_scale(None, lm, 2) == 1.0
    run = ft.prepare(lm, {"method": "precise", "heads": ["L0H0"], "mlp_layers": [1], "grad_scale": 2.5})
    assert run.grad_scale == 2.5 and run.scaled == ["L0_q_proj", "L0_o_proj"]  # not the MLP deltas
    with pytest.raises(ValueError, match=r"finetune\.heads\[0\]: L3H0 is not a head"):
        ft.prepare(lm, {"method": "precise", "heads": ["L3H0"]})
    with pytest.raises(ValueError, match=r"finetune\.heads: only methods"):
        methods.parse_method({"method": "full", "heads": ["L0H0"]})
    with pytest.raises(ValueError, match=r"finetune\.heads: method 'random_heads' needs"):
        methods.parse_method({"method": "random_heads"})
    with pytest.raises(ValueError, match=r"finetune\.heads: method 'uniform_heads' needs"):
        methods.parse_method({"method": "uniform_heads"})
    with pytest.raises(ValueError,
                       match=r"finetune\.method: expected one of \['precise', 'precise_mlp', .*'random_heads'"):
        methods.parse_method({"method": "random"})
    with pytest.raises(ValueError, match=r"finetune\.heads\[1\]: expected a head"):
        methods.parse_method({"method": "precise", "heads": ["L0H0", "head 3"]})
    with pytest.raises(ValueError, match=r"finetune: unknown key"):
        methods.parse_method({"method": "precise", "heads": ["L0H0"], "head": 1})
    with pytest.raises(ValueError, match="exactly one of epochs or max_steps"):
        methods.TrainConfig.from_dict({"epochs": 1, "max_steps": 3})
    with pytest.raises(ValueError, match=r"finetune\.train\.schedule"):
        methods.TrainConfig.from_dict({"epochs": 1, "schedule": "step"})


def test_select_nodes_draws_what_each_method_name_says():
    """precise: the top heads and MLPs; random_heads: layer-matched (the study's seed per draw);
    uniform_heads: uniform among the others (seed + draw: draw 0 is the run's seed); the same for the
    recipe and the study."""
    from arithmech.interp.nodes import layer_matched_heads, random_heads

    ranked = [(2, 1), (0, 3), (2, 0), (1, 1), (0, 0), (1, 0)]
    kw = {"heads": 2, "mlps": 1, "n_layers": 3, "n_heads": 4, "seed": 7}
    assert methods.select_nodes("precise", ranked, [2, 0], **kw) == ([(2, 1), (0, 3)], [2])
    assert methods.select_nodes("precise_mlp", ranked, [2, 0], **kw) == ([(2, 1), (0, 3)], [2])
    for draw in (0, 1, 2):
        derived = int(np.random.SeedSequence([7, 11, draw]).generate_state(1)[0])
        assert methods.select_nodes("random_heads", ranked, [2, 0], draw=draw, **kw) == (
            layer_matched_heads([(2, 1), (0, 3)], 4, seed=derived), [])
        assert methods.select_nodes("uniform_heads", ranked, [2, 0], draw=draw, **kw) == (
            random_heads(3, 4, 2, seed=7 + draw, exclude=[(2, 1), (0, 3)]), [])
    layers = [sorted(h[0] for h in methods.select_nodes("random_heads", ranked, [], draw=d, **kw)[0])
              for d in range(5)]
    assert all(x == [0, 2] for x in layers)  # the top heads' layers
    with pytest.raises(ValueError, match=r"config key 'study\.heads': 9 heads asked for, the model has 6"):
        methods.select_nodes("precise", ranked, [], **(kw | {"heads": 9}), section="study")
    with pytest.raises(ValueError, match="selects no heads"):
        methods.select_nodes("full", ranked, [], **kw)
    assert set(methods.METHODS) == set(methods.HEAD_METHODS) | {"full", "lora"}
    assert "precise_mlp" not in methods.RECIPE_METHODS


def test_epoch_order_and_lr_schedule():
    a, b = ft.epoch_order(0, 0, 10), ft.epoch_order(0, 1, 10)
    assert sorted(a) == list(range(10)) and list(a) != list(b) and list(a) == list(ft.epoch_order(0, 0, 10))
    assert [ft.lr_factor(s, 6, 2, "linear") for s in range(6)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    assert ft.lr_factor(2, 6, 2, "cosine") == 1.0 and ft.lr_factor(5, 6, 0, "constant") == 1.0


@pytest.mark.parametrize("delta_dtype, want", [("model", torch.bfloat16), ("float32", torch.float32)])
def test_bfloat16_model_trains_only_its_deltas(tiny_dir, tmp_path, delta_dtype, want):
    """What a GPU run does (bf16 weights), on the CPU: frozen weights stay bit-identical, the deltas have the
    configured dtype and learn, and the saved file applied to a fresh bf16 model gives the trained logits."""
    lm = load_model(tiny_dir, device="cpu", dtype="bfloat16")
    base = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    run = ft.prepare(lm, {"method": "precise", "heads": [list(h) for h in HEADS], "delta_dtype": delta_dtype})
    stats = ft.train(run, EXAMPLES, {**FAST, "max_steps": 6}, progress=False)
    assert all(torch.isfinite(torch.tensor(stats.losses)))
    for name, p in lm.model.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, base[name]), name
    assert all(p.dtype == want and p.abs().sum() > 0 for p in run.params.values())
    trained = logits(lm.model, lm.tokenizer)
    path = deltas.save_trained(run, tmp_path / "deltas.safetensors")
    fresh_bf16 = load_model(tiny_dir, device="cpu", dtype="bfloat16")
    untrained = logits(fresh_bf16.model, fresh_bf16.tokenizer)
    assert (untrained.float() - trained.float()).abs().max() > 1.0  # far beyond the tolerance below
    applied = logits(deltas.apply_trained(fresh_bf16, path), fresh_bf16.tokenizer)
    assert applied.dtype == torch.bfloat16
    # folding W + delta rounds once in bf16 where the hooked model adds two bf16 products: bf16-sized error
    torch.testing.assert_close(applied.float(), trained.float(), atol=0.1, rtol=0.05)


def test_sgd_step_is_minus_lr_times_the_gradient(tiny_dir):
    """optimizer: sgd is Algorithm 2's update theta <- theta - lr * grad: after one step (no clipping, no
    warmup) every delta, which starts at 0, is exactly -lr times the gradient of the step's mean loss."""
    lr, method = 0.05, {"method": "precise", "heads": [list(h) for h in HEADS], "train_kv": True, "mlp_layers": [0]}
    config = {**FAST, "lr": lr, "batch_size": len(EXAMPLES), "max_steps": 1, "max_grad_norm": None,
              "optimizer": "sgd"}
    run = ft.prepare(fresh(tiny_dir), method)
    stats = ft.train(run, EXAMPLES, config, progress=False)
    assert stats.optimizer_state_bytes == 0  # plain SGD keeps no state
    ref = ft.prepare(fresh(tiny_dir), method)  # the same step's gradient by an explicit backward
    tok = ref.lm.tokenizer
    encoded = [ft.encode_example(tok, *EXAMPLES[i], 256) for i in ft.epoch_order(FAST["seed"], 0, len(EXAMPLES))]
    loss, n = ft.batch_loss(ref.model, ft.collate(encoded, tok.pad_token_id, "cpu"))
    grads = torch.autograd.grad(loss / n, list(ref.params.values()))
    assert stats.losses == [loss.item() / n]
    for (name, p), g in zip(run.params.items(), grads):
        assert g.abs().sum() > 0, name
        assert torch.equal(p.detach(), -lr * g), name


def test_unknown_optimizer_names_the_key():
    assert methods.TrainConfig.from_dict({"epochs": 1}).optimizer == "adamw"
    assert methods.TrainConfig.from_dict({"epochs": 1, "optimizer": "sgd"}).optimizer == "sgd"
    with pytest.raises(ValueError, match=r"finetune\.train\.optimizer: expected one of \['adamw', 'sgd'\], got 'adam'"):
        methods.TrainConfig.from_dict({"epochs": 1, "optimizer": "adam"})


def test_killed_and_resumed_sgd_run_equals_uninterrupted(tiny_dir, tmp_path):
    config = {**FAST, "max_steps": 5, "checkpoint_every": 2, "optimizer": "sgd", "weight_decay": 0.1,
              "warmup_steps": 1, "schedule": "cosine"}
    whole, stats, _ = train_twice(tiny_dir, tmp_path, {"method": "precise", "heads": ["L1H0", "L2H3"],
                                                       "train_kv": True}, config, stop_at_step=3)
    assert stats.resumed_from_step == 3 and stats.steps == 5
    assert whole.optimizer_state_bytes == stats.optimizer_state_bytes == 0
    with pytest.raises(ValueError, match=r"finetune\.train\.optimizer='sgd'"):  # the optimizer may not change
        ft.train(ft.prepare(fresh(tiny_dir), {"method": "precise", "heads": ["L1H0", "L2H3"], "train_kv": True}),
                 EXAMPLES, {**config, "optimizer": "adamw"}, checkpoint_dir=tmp_path / "checkpoint", progress=False)


def chatml_tokenizer():
    """The tiny tokenizer with ChatML turns whose end, <|im_end|>, is the eos token (as in SmolLM2-Instruct)."""
    from arithmech.model.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


def test_eos_is_appended_only_when_the_target_does_not_end_with_it(tiny_lm):
    tok = tiny_lm.tokenizer
    eos, prompt = tok.eos_token_id, "23 minus 7 is equal to "
    p_ids = tok(prompt)["input_ids"]

    def target_ids(target):
        return tok(target, add_special_tokens=False)["input_ids"]

    ids, labels = ft.encode_example(tok, prompt, "16.", 64)  # a plain target: eos appended
    assert ids == p_ids + target_ids("16.") + [eos] and labels[len(p_ids):] == target_ids("16.") + [eos]
    for target in ("16.<|endoftext|>", "16.<|endoftext|>\n", "16.<|endoftext|> \n"):  # ends with eos: kept as is
        ids, labels = ft.encode_example(tok, prompt, target, 64)
        assert ids == p_ids + target_ids(target) and labels[len(p_ids):] == target_ids(target), target
        assert ids.count(eos) == 1
    ids, _ = ft.encode_example(tok, prompt, "16.<|endoftext|>17", 64)  # eos inside, not at the end
    assert ids == p_ids + target_ids("16.<|endoftext|>17") + [eos]
    # eos=False: the target alone (the few-shot arithmetic format never shows an eos after "16.")
    ids, labels = ft.encode_example(tok, prompt, "16.", 64, eos=False)
    assert ids == p_ids + target_ids("16.") and labels == [-100] * len(p_ids) + target_ids("16.")
    with pytest.raises(ValueError, match="max_length"):
        ft.encode_example(tok, prompt, "16.", len(target_ids("16.")))  # with eos it does not fit
    assert len(ft.encode_example(tok, prompt, "16.", len(target_ids("16.")), eos=False)[0]) == len(target_ids("16."))


def test_chat_target_ending_its_turn_gets_no_second_eos():
    tok = chatml_tokenizer()
    prompt, target = formatting.math_example("2+2?", "The answer is 4.", (), "chat", tok)
    assert target == "The answer is 4.<|im_end|>\n"
    ids, labels = ft.encode_example(tok, prompt, target, 128)
    p_ids = tok(prompt)["input_ids"]
    assert tok.convert_ids_to_tokens(ids[-2:]) == ["<|im_end|>", "Ċ"]  # the turn's end, no eos after its "\n"
    assert ids == tok(prompt + target)["input_ids"] and labels == [-100] * len(p_ids) + ids[len(p_ids):]
    assert ids[len(p_ids):].count(tok.eos_token_id) == 1  # (the user turn in the prompt ends with one too)
    assert ft.encode_example(tok, prompt, target, 128, eos=False) == (ids, labels)  # the eos is the target's
    ids, _ = ft.encode_example(tok, prompt, "The answer is 4.", 128)  # a plain target still gets one
    assert ids[-1] == tok.eos_token_id and tok.decode(ids[-2:]) == ".<|im_end|>"


def test_train_without_eos_learns_only_the_target(tiny_dir, tmp_path):
    """append_eos=False: the first step's loss is over the target tokens alone, and a checkpoint written with
    eos does not resume a run without it."""
    examples = [("23 minus 7 is equal to ", "16."), ("3 plus 4 is equal to ", "7.")]
    config = {**FAST, "batch_size": 2, "max_steps": 1}
    run = ft.prepare(fresh(tiny_dir), {"method": "precise", "heads": ["L1H0"]})
    tok = run.lm.tokenizer
    losses = {}
    for eos in (True, False):
        encoded = [ft.encode_example(tok, *examples[i], 64, eos=eos) for i in ft.epoch_order(0, 0, 2)]
        with torch.no_grad():
            loss, n = ft.batch_loss(run.model, ft.collate(encoded, tok.pad_token_id, "cpu"))
        losses[eos] = loss.item() / n
    assert losses[True] != losses[False]
    ft.train(run, examples, config, checkpoint_dir=tmp_path, append_eos=True, progress=False)
    stats = ft.train(ft.prepare(fresh(tiny_dir), {"method": "precise", "heads": ["L1H0"]}), examples, config,
                     append_eos=False, progress=False)
    assert stats.losses == pytest.approx([losses[False]], rel=1e-6)
    with pytest.raises(ValueError, match="append_eos"):
        ft.train(ft.prepare(fresh(tiny_dir), {"method": "precise", "heads": ["L1H0"]}), examples,
                 {**config, "max_steps": 2}, checkpoint_dir=tmp_path, append_eos=False, progress=False)


@pytest.mark.parametrize("train_kv", [False, True])
def test_train_kv_reaches_every_query_head_of_the_kv_group(tiny_dir, train_kv):
    """Tiny GQA model: 4 query heads, 2 key/value heads, so heads 0 and 1 read K/V head 0. Training head 0 of
    layer 1 with train_kv changes the output z of head 1 (unselected) through the shared K/V rows; without
    train_kv head 1's q rows and every k/v row stay put, and so does its z. Heads 2 and 3 (K/V head 1) never
    change."""
    lm = fresh(tiny_dir)
    assert (lm.n_heads, lm.n_kv_heads) == (4, 2)
    prefix = "model.layers.1.self_attn"
    base = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    z = {}
    lm.model.get_submodule(f"{prefix}.o_proj").register_forward_pre_hook(
        lambda module, args: z.__setitem__("z", args[0].detach().clone()))
    logits(lm.model, lm.tokenizer)
    before = z["z"]
    run = ft.prepare(lm, {"method": "precise", "heads": ["L1H0"], "train_kv": train_kv})
    ft.train(run, EXAMPLES, {**FAST, "max_steps": 4}, progress=False)
    logits(lm.model, lm.tokenizer)
    after = z["z"]
    q = run.deltas.effective_weight(f"{prefix}.q_proj")
    assert not torch.equal(q[q_rows(0)], base[f"{prefix}.q_proj.weight"][q_rows(0)])
    for head in (1, 2, 3):
        assert torch.equal(q[q_rows(head)], base[f"{prefix}.q_proj.weight"][q_rows(head)]), head
    for proj in ("k_proj", "v_proj"):
        w, w0 = run.deltas.effective_weight(f"{prefix}.{proj}"), base[f"{prefix}.{proj}.weight"]
        assert torch.equal(w[q_rows(0)], w0[q_rows(0)]) != train_kv, proj  # K/V head 0: trained iff train_kv
        assert torch.equal(w[q_rows(1)], w0[q_rows(1)]), proj  # K/V head 1: never
    assert not torch.equal(after[..., q_rows(0)], before[..., q_rows(0)])  # the trained head itself
    assert torch.equal(after[..., q_rows(1)], before[..., q_rows(1)]) != train_kv  # its K/V group partner
    if train_kv:  # visibly, not by rounding
        assert (after[..., q_rows(1)] - before[..., q_rows(1)]).abs().max() > 1e-3
    for head in (2, 3):  # the other K/V group: untouched either way
        assert torch.equal(after[..., q_rows(head)], before[..., q_rows(head)]), head


def test_a_nan_loss_stops_training_at_its_step(tiny_dir, tmp_path, monkeypatch):
    """The loss turns NaN at the third optimizer step (a stand-in for an overflow): training stops there, naming the
    step, before the optimizer applies it or a checkpoint is written; before, it went on with NaN weights."""
    calls = []
    real = ft.batch_loss

    def nan_from_step_3(model, batch, **kw):
        loss, n = real(model, batch, **kw)
        calls.append(1)
        return (loss * float("nan") if len(calls) > 2 else loss), n  # one micro-batch a step (batch_size 2)

    monkeypatch.setattr(ft, "batch_loss", nan_from_step_3)
    run = ft.prepare(fresh(tiny_dir), {"method": "precise", "heads": [list(h) for h in HEADS]})
    with pytest.raises(FloatingPointError, match=r"the loss of optimizer step 3 \(of 5\) is nan, not finite"):
        ft.train(run, EXAMPLES, {**FAST, "max_steps": 5, "checkpoint_every": 1}, checkpoint_dir=tmp_path,
                 progress=False)
    assert all(torch.isfinite(p).all() for p in run.params.values())
    assert ft.latest_checkpoint(tmp_path).name == "step-00000002"  # the last good step's
