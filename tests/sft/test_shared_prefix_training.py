"""The training loss with the micro-batch's shared prefix run once (`training.prefix_loss`) against every row
run whole (`training.plain_loss`, the reference): the same loss and gradients for every method, in float32,
up to float reassociation, on the CPU and on a GPU (and in bfloat16 there, within bf16's rounding); the plain
path where the split does not apply; a whole training run that ends at the same parameters."""

from __future__ import annotations

import pytest
import torch

from arithmech.model.loading import load_model
from arithmech.sft import training as ft

SHOTS = "1 plus 2 is equal to 3.\n4 plus 1 is equal to 5.\n"  # the few-shot prefix every study item starts with
ITEMS = [(SHOTS + f"{a} plus {b} is equal to ", str(a + b)) for a, b in [(1, 1), (3, 4), (2, 2), (4, 4), (9, 3)]]
METHODS = {
    "precise": {"method": "precise", "heads": ["L0H1", "L1H0", "L2H3"], "mlp_layers": [1]},
    "precise_kv": {"method": "precise", "heads": ["L0H1", "L1H0", "L2H3"], "train_kv": True},
    "full": {"method": "full"},
    "lora": {"method": "lora", "lora": {"r": 4, "alpha": 8, "dropout": 0.0,
                                        "target_modules": ["q_proj", "v_proj", "o_proj"]}},
}
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu,
                                   pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")])


def prepared(tiny_dir, method: dict, perturb: bool = True, device: str = "cpu", dtype: str = "float32") -> ft.FineTune:
    """A fresh tiny model prepared for `method`, its trained tensors moved off their initial values (zero deltas,
    zero LoRA B) so that every term of the gradient is exercised."""
    run = ft.prepare(load_model(tiny_dir, device=device, dtype=dtype), method, seed=0)
    if perturb and method["method"] != "full":
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in run.params.values():
                p.add_(0.05 * torch.randn(p.shape, generator=gen).to(p.device, p.dtype))
    run.model.train()
    return run


def batch(run: ft.FineTune, items=ITEMS, eos: bool = True) -> dict[str, torch.Tensor]:
    tok = run.lm.tokenizer
    return ft.collate([ft.encode_example(tok, p, t, 128, eos=eos) for p, t in items], tok.pad_token_id,
                      run.lm.device)


def loss_and_grads(run: ft.FineTune, b: dict, shared: bool) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    for p in run.params.values():
        p.grad = None
    loss, n = ft.batch_loss(run.model, b, shared_prefix=shared)
    loss.backward()
    return loss.detach(), n, {name: p.grad.clone() for name, p in run.params.items() if p.grad is not None}


def forwards(model: torch.nn.Module, fn) -> int:
    """How many forwards of the decoder `fn()` runs."""
    calls = []
    handle = model.get_decoder().register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        fn()
    finally:
        handle.remove()
    return len(calls)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("name", METHODS)
def test_shared_prefix_loss_and_gradients_equal_the_whole_rows(tiny_dir, name, device):
    run = prepared(tiny_dir, METHODS[name], device=device)
    b = batch(run)
    length = ft.common_prefix(run.model, b)
    prompt_ids = ft.encode_example(run.lm.tokenizer, SHOTS, "1", 128)[0][:-2]  # the shots without "1" and eos
    assert length >= len(prompt_ids) > ft.MIN_SHARED_PREFIX
    assert b["attention_mask"].sum(1).unique().numel() > 1  # rows of several lengths: padding is exercised
    assert forwards(run.model, lambda: ft.batch_loss(run.model, b)) == 2
    plain, n_plain, g_plain = loss_and_grads(run, b, shared=False)
    shared, n_shared, g_shared = loss_and_grads(run, b, shared=True)
    print(f"{name}: prefix {length} of {b['input_ids'].shape[1]} positions, loss {plain.item():.6f} "
          f"vs {shared.item():.6f}, largest gradient difference "
          f"{max((g_plain[k] - g_shared[k]).abs().max().item() for k in g_plain):.2e}")
    assert n_shared == n_plain
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=0)
    assert set(g_shared) == set(g_plain) == {k for k, p in run.params.items() if p.requires_grad}
    for key in g_plain:
        torch.testing.assert_close(g_shared[key], g_plain[key], rtol=1e-4, atol=1e-4 * g_plain[key].abs().max().item(),
                                   msg=lambda m, key=key: f"{name} {key}: {m}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", ["precise", "precise_kv", "lora"])
def test_shared_prefix_in_bfloat16_on_cuda(tiny_dir, name):
    """A bf16 model with float32 trained tensors (the head methods' deltas and LoRA's factors, as on a GPU node):
    the two paths differ by bf16 rounding, which reassociation moves by a few of its units, so the check is on
    the loss and on each gradient's relative error."""
    run = prepared(tiny_dir, METHODS[name], device="cuda", dtype="bfloat16")
    b = batch(run)
    plain, n_plain, g_plain = loss_and_grads(run, b, shared=False)
    shared, n_shared, g_shared = loss_and_grads(run, b, shared=True)
    errors = {k: ((g_shared[k].float() - g_plain[k].float()).norm() / g_plain[k].float().norm()).item()
              for k in g_plain}
    print(f"{name} bf16: loss {plain.item():.5f} vs {shared.item():.5f}, largest relative gradient error "
          f"{max(errors.values()):.2e}")
    assert n_shared == n_plain and set(g_shared) == set(g_plain) and g_plain
    torch.testing.assert_close(shared.float(), plain.float(), rtol=2e-2, atol=0)
    assert max(errors.values()) < 5e-2, errors


def test_the_first_label_after_the_prefix_is_predicted_by_its_last_position(tiny_dir):
    """Same prompt, different targets: the prefix is the whole prompt and every row's first label is
    predicted from the one prefix forward; rows sharing a labelled token ("1" of 12 and 13) end the prefix
    before it."""
    run = prepared(tiny_dir, METHODS["precise_kv"])
    prompt = SHOTS + "6 plus 6 is equal to "
    b = batch(run, [(prompt, "12"), (prompt, "13"), (prompt, "7")], eos=False)
    n_prompt = len(ft.encode_example(run.lm.tokenizer, prompt, "12", 128, eos=False)[0]) - 2
    assert ft.common_prefix(run.model, b) == n_prompt
    assert (b["labels"][:, n_prompt] != ft.IGNORE_INDEX).all()
    plain, n_plain, g_plain = loss_and_grads(run, b, shared=False)
    shared, n_shared, g_shared = loss_and_grads(run, b, shared=True)
    assert n_shared == n_plain == 5
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=0)
    for key in g_plain:
        torch.testing.assert_close(g_shared[key], g_plain[key], rtol=1e-4, atol=1e-4 * g_plain[key].abs().max().item())


def test_without_a_usable_prefix_the_rows_run_whole(tiny_dir):
    """No common prefix, one row, or dropout on (one mask for the prefix would replace one per row): one
    forward, the plain loss bit for bit."""
    run = prepared(tiny_dir, METHODS["precise"])
    other = [(f"{a} plus {b} is equal to ", str(a + b)) for a, b in [(1, 2), (3, 4)]] + ITEMS[:2]
    for items in (other, ITEMS[:1]):
        b = batch(run, items)
        assert ft.common_prefix(run.model, b) == 0
        assert forwards(run.model, lambda: ft.batch_loss(run.model, b)) == 1
        assert torch.equal(ft.batch_loss(run.model, b)[0], ft.plain_loss(run.model, b)[0])
    dropped = prepared(tiny_dir, {**METHODS["lora"], "lora": {**METHODS["lora"]["lora"], "dropout": 0.1}})
    b = batch(dropped)
    assert ft.common_prefix(dropped.model, b) == 0
    dropped.model.eval()  # no dropout in eval mode: the prefix is shared again
    assert ft.common_prefix(dropped.model, b) > ft.MIN_SHARED_PREFIX


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("name", ["precise_kv", "lora"])
def test_a_training_run_ends_at_the_plain_runs_parameters(tiny_dir, name, device):
    items = [(SHOTS + f"{a} plus {b} is equal to ", str(a + b)) for a in range(1, 7) for b in (2, 5)]
    config = {"lr": 1e-2, "batch_size": 4, "max_steps": 6, "warmup_steps": 1, "seed": 0, "max_grad_norm": 1.0}
    ends = {}
    for shared in (False, True):
        run = prepared(tiny_dir, METHODS[name], perturb=False, device=device)
        stats = ft.train(run, items, config, progress=False, shared_prefix=shared)
        ends[shared] = ({k: p.detach().clone() for k, p in run.params.items()}, stats.losses)
    (plain, plain_losses), (shared, shared_losses) = ends[False], ends[True]
    torch.testing.assert_close(shared_losses, plain_losses, rtol=1e-5, atol=0)
    assert plain_losses[-1] < plain_losses[0]  # it trained
    for key in plain:
        torch.testing.assert_close(shared[key], plain[key], rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")


def test_a_prompt_that_fits_is_kept_whole(tiny_lm):
    """encode_example cut a prompt that fitted when max_length was between the prompt's length and twice it
    (a negative slice start kept only its last max_length - len(target) - len(prompt) tokens): the study's
    items (34 + 4 tokens, max_length 64) lost their first 8 tokens, and their common prefix with them."""
    tok = tiny_lm.tokenizer
    prompt, target = SHOTS + "3 plus 4 is equal to ", "7"
    whole, _ = ft.encode_example(tok, prompt, target, 512)
    for max_length in range(len(whole), 2 * len(whole) + 2):
        ids, labels = ft.encode_example(tok, prompt, target, max_length)
        assert ids == whole, max_length
    cut, labels = ft.encode_example(tok, prompt, target, len(whole) - 3)  # too long: the start goes
    assert cut == whole[3:] and labels[-2:] == whole[-2:]
