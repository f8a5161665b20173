"""A model spread over several devices (`load_model` with `device_map="auto"` when a job has several GPUs).

On the CPU: the refusal of a spread that offloads, and the paths that mix devices on a spread model (the
training loss's `logits_to_keep` mask, the captures' stacks, the decoder's cache rows) against independent
references on the unsplit model. With CUDA (marked `gpu`): the same paths on the tiny model split across
cuda:0 (embeddings and the first half of the layers) and the CPU (the rest, the final norm, the
unembedding) give the unsplit CPU model's results, in float32.

Runs without the suite's conftest (a GPU machine without snakemake):
`PYTHONPATH=src python3 -m pytest --noconftest -m gpu tests/intervention/test_device_spread.py`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arithmech.data.arithmetic import encode
from arithmech.interp.patching import collect
from arithmech.intervention.decoding import greedy_decode
from arithmech.intervention.hooks import capture, patch_end
from arithmech.intervention.kvcache import end_copies, prefix_cache
from arithmech.model.loading import LoadedModel, ModelSourceError, load_model, refuse_offload
from arithmech.model.tiny import build_tiny_model
from arithmech.sft import training as ft

N_LAYERS = 4  # an even split: layers 0-1 on cuda:0, 2-3 on the CPU
TEXTS = [
    "3 plus 4 is equal to ",
    "2 plus 2 is equal to 4.\n1 plus 3 is equal to ",
    "What is 4 minus 1? The answer is ",
    "1 times 3 is equal to 3.\n4 divided by 2 is equal to 2.\n2 times 2 is equal to ",
    "4 plus 1 is equal to ",
]
EXAMPLES = [(f"{a} plus {b} is equal to ", str(a + b)) for a, b in [(1, 2), (3, 4), (2, 2), (4, 1)]]
MAX_NEW = len(TEXTS) + 1


def stop_after_row_id(row: int, tokens: list[int]) -> bool:
    """Row r ends after r + 1 tokens: one row leaves the batch (and the cache) at every step."""
    return len(tokens) > row


needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
KINDS = ["cpu", pytest.param("split", marks=needs_cuda)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("spread") / "model", n_layers=N_LAYERS)


@pytest.fixture(scope="module")
def reference(model_dir) -> LoadedModel:
    """The unsplit float32 model on the CPU."""
    return load_model(model_dir, device="cpu", dtype="float32")


def split_model(model_dir) -> LoadedModel:
    """The tiny model with its embeddings and first half of the layers on cuda:0 and the rest, the final norm
    and the unembedding on the CPU: a model spread as `from_pretrained(device_map=...)` spreads it
    (accelerate's hooks move each block's inputs to its device; the KV cache is left where its layers put
    it), made by hand since `load_model` refuses a spread that leaves blocks on the CPU. main_device "cpu"
    makes the CPU blocks run on the CPU: with a GPU main device accelerate would offload them, keeping their
    weights on the CPU but running them on cuda:0."""
    from accelerate import dispatch_model

    lm = load_model(model_dir, device="cpu", dtype="float32")
    half = lm.n_layers // 2
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0,
                  **{f"model.layers.{i}": 0 if i < half else "cpu" for i in range(lm.n_layers)},
                  "model.norm": "cpu", "lm_head": "cpu"}
    dispatch_model(lm.model, device_map=device_map, main_device="cpu",
                   skip_keys=lm.model._skip_keys_device_placement)
    assert lm.device == torch.device("cuda", 0) and lm.o_proj(half).weight.device.type == "cpu"
    assert lm.final_norm.weight.device.type == "cpu" and lm.o_proj(0).weight.device.type == "cuda"
    return lm


def model(kind: str, model_dir) -> LoadedModel:
    return load_model(model_dir, device="cpu", dtype="float32") if kind == "cpu" else split_model(model_dir)


def decode(lm: LoadedModel, prefix: bool, stop=stop_after_row_id):
    """Greedy tokens [rows, MAX_NEW] and the logits of every step, from whole prompts or from a prefix cache
    of all but END (`RoomyLayer`s)."""
    enc = encode(lm.tokenizer, TEXTS, lm.device)
    steps = []

    def keep(step, rows, logits):
        steps.append((rows.clone(), logits.cpu()))

    if prefix:
        inputs = end_copies(enc, prefix_cache(lm, enc), copies=1, room=MAX_NEW)
    else:
        inputs = enc
    tokens = greedy_decode(lm, **inputs, max_new_tokens=MAX_NEW, stop=stop, on_logits=keep)
    return tokens, steps


# ---------------------------------------------------------------------------------------------------
# The offload refusal


def test_a_spread_that_offloads_is_refused_naming_the_resources_to_raise():
    spread = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1, "lm_head": 1}
    refuse_offload(spread, "some/model")  # every block on a GPU: loads
    for where in ("cpu", "disk"):
        offloaded = {**spread, "model.layers.1": where, "lm_head": where}
        with pytest.raises(ModelSourceError) as err:
            refuse_offload(offloaded, "some/model")
        message = str(err.value)
        for fragment in ("some/model", f"model.layers.1 ({where})", f"lm_head ({where})", "2 of its 5 blocks",
                         "models.<name>.resources.gpus", "`finetune`", "`evaluate`", "gpu_model"):
            assert fragment in message, (fragment, message)
    with pytest.raises(ModelSourceError, match=r"model.norm \(cpu\)"):
        refuse_offload({**spread, "model.norm": torch.device("cpu")}, "some/model")


# ---------------------------------------------------------------------------------------------------
# Greedy decoding: rows that end leave the cache, whose layers may sit on several devices


@pytest.mark.parametrize("prefix", [False, True], ids=["prompts", "prefix_cache"])
def test_rows_leaving_the_batch_keep_their_own_cache_rows(reference, prefix):
    """On the CPU: a batch whose rows end one per step decodes, row by row, what the whole batch decodes
    when no row ends early; a wrong cache row would continue another prompt."""
    early, _ = decode(reference, prefix)
    full, _ = decode(reference, prefix, stop=None)
    for r in range(len(TEXTS)):
        assert early[r, : r + 1].tolist() == full[r, : r + 1].tolist(), r
        assert (early[r, r + 1 :] == reference.tokenizer.pad_token_id).all(), r


@pytest.mark.parametrize("prefix", [False, True], ids=["prompts", "prefix_cache"])
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_decoding_on_a_split_model_matches_the_unsplit_one(model_dir, reference, kind, prefix):
    want_tokens, want_steps = decode(reference, prefix)
    # the tokens are compared exactly: no step may be a near tie that float32 rounding could flip
    margins = [logits.topk(2).values for _, logits in want_steps]
    assert min(float((m[:, 0] - m[:, 1]).min()) for m in margins) > 1e-4
    tokens, steps = decode(model(kind, model_dir), prefix)
    assert torch.equal(tokens, want_tokens)
    assert len(steps) == len(want_steps) == MAX_NEW - 1  # the last step's one row ends the batch early
    for (rows, logits), (want_rows, want_logits) in zip(steps, want_steps):
        assert torch.equal(rows, want_rows)
        torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------
# Captures: the layers' outputs come from several devices


@pytest.mark.parametrize("kind", KINDS)
def test_captures_are_stacked_on_the_input_device_in_layer_order(model_dir, kind):
    lm = model(kind, model_dir)
    enc = encode(lm.tokenizer, TEXTS, lm.device)
    with capture(lm, end_only=False) as cap:
        lm.model(**enc)
    assert cap.device == lm.device and cap.resid_final.device == lm.device
    for stacked, per_layer, axis in [(cap.stacked_heads(), cap.heads, -3), (cap.stacked_mlps(), cap.mlps, -2)]:
        assert stacked.device == lm.device and stacked.shape[axis] == lm.n_layers
        for layer in range(lm.n_layers):
            assert torch.equal(stacked.select(axis, layer), per_layer[layer].to(lm.device)), layer
    if kind == "split":  # the captures really came from two devices
        assert {cap.heads[layer].device.type for layer in range(lm.n_layers)} == {"cuda", "cpu"}


@pytest.mark.parametrize("kind", KINDS)
def test_patching_captures_on_a_split_model_match_the_unsplit_one(model_dir, reference, kind):
    """`collect` (END captures, per-group means over every position) and a patch at END of the
    last layer's heads and MLP with the values captured on other prompts."""
    answers = torch.arange(len(TEXTS)) + 5
    groups = [0, 1, 0, 1, 0]

    def run(lm):
        state, means = collect(lm, TEXTS, answers, batch_size=3, groups=groups)
        cf, _ = collect(lm, TEXTS[::-1], answers, batch_size=5)
        last, n = lm.n_layers - 1, len(TEXTS)
        heads = {last: (torch.ones(n, lm.n_heads, dtype=torch.bool), cf.heads[:, last])}
        mlps = {last: (torch.ones(n, dtype=torch.bool), cf.mlps[:, last])}
        enc = encode(lm.tokenizer, TEXTS, lm.device)
        with patch_end(lm, heads, mlps):
            patched = lm.model(**enc).logits[:, -1].float().cpu()
        return state, means, patched

    got, want = run(model(kind, model_dir)), run(reference)
    for name in ("heads", "mlps", "resid", "logits", "logprobs"):
        torch.testing.assert_close(getattr(got[0], name), getattr(want[0], name), atol=1e-5, rtol=1e-4)
    assert torch.equal(got[0].predicted, want[0].predicted)
    torch.testing.assert_close(got[1].heads, want[1].heads, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[1].mlps, want[1].mlps, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[2], want[2], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(want[2], reference.model(**encode(reference.tokenizer, TEXTS)).logits[:, -1])


# ---------------------------------------------------------------------------------------------------
# The training loss: its logits_to_keep mask indexes the last device's hidden states


def batch(lm: LoadedModel) -> dict[str, torch.Tensor]:
    encoded = [ft.encode_example(lm.tokenizer, p, t, max_length=64) for p, t in EXAMPLES]
    return ft.collate(encoded, lm.tokenizer.pad_token_id, lm.device)


def test_batch_loss_is_the_cross_entropy_of_the_full_logits(reference):
    b = batch(reference)
    loss, n = ft.batch_loss(reference.model, b)
    logits = reference.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1]
    labels = b["labels"][:, 1:]
    want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=ft.IGNORE_INDEX,
                           reduction="sum")
    assert n == int((labels != ft.IGNORE_INDEX).sum()) > 0
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_loss_and_its_gradients_on_a_split_model_match_the_unsplit_one(model_dir, reference, kind):
    """On this split the loss is checked, not the mask's device: the mask left on cuda:0 indexed the CPU's
    hidden states without an error (PyTorch accepts a CUDA boolean mask on a CPU tensor; H200, 2026-11-26).
    Between two GPUs it must be on the hidden states' device."""
    def loss_and_grads(lm):
        first, last = lm.model.get_input_embeddings().weight, lm.model.get_output_embeddings().weight
        for p in (first, last):
            p.requires_grad_(True)
        loss, n = ft.batch_loss(lm.model, batch(lm))
        loss.backward()
        return loss.detach().cpu(), n, first.grad.cpu(), last.grad.cpu()

    lm = model(kind, model_dir)
    got, want = loss_and_grads(lm), loss_and_grads(load_model(model_dir, device="cpu", dtype="float32"))
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    assert got[1] == want[1]
    torch.testing.assert_close(got[2], want[2], atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(got[3], want[3], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("method", [{"method": "full"},
                                    {"method": "lora", "lora": {"target_modules": ["q_proj", "v_proj", "lm_head"]}},
                                    {"method": "precise", "heads": [[0, 1], [3, 2]]}],
                         ids=["full", "lora", "precise"])
@pytest.mark.parametrize("kind", KINDS)
def test_training_on_a_split_model_matches_the_unsplit_one(model_dir, kind, method):
    """Two optimizer steps (AdamW, clipped gradients) of each kind of method; peak memory read on CUDA."""
    config = {"lr": 1e-2, "batch_size": 2, "max_grad_norm": 1.0, "seed": 0, "max_steps": 2}

    def losses(lm):
        stats = ft.train(ft.prepare(lm, method), EXAMPLES, config, progress=False)
        return stats

    got = losses(model(kind, model_dir))
    want = losses(load_model(model_dir, device="cpu", dtype="float32"))
    assert len(got.losses) == 2
    torch.testing.assert_close(torch.tensor(got.losses), torch.tensor(want.losses), atol=1e-5, rtol=1e-5)
    if kind == "split":
        assert got.peak_memory_kind.startswith("cuda_max_memory_allocated") and got.peak_memory_bytes > 0
