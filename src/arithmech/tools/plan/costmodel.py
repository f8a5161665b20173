"""The cost model: what a GPU delivers (`Throughput`), a model as the plan sees it (`Model`), the FLOPs and
memory reads of forwards, generation, scoring and training (`Work`), their peak GPU memory, and the
parameters each fine-tuning method trains. docs/plan.md has every formula.

    forward_flops(shape, new=3, past=0, logits=1)       # 2 N n + 4 L d_attn n (n + 1) / 2 + 2 d V
    generation(model, rows=100, prompt=40, steps=4, batch=16).flops
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from arithmech.intervention.batching import COPIES_PER_FORWARD
from arithmech.tools.plan.shapes import Shape
from arithmech.tools.plan.tokens import TokenCounter

# ---------------------------------------------------------------------------------------------------
# The GPU and the models


@dataclass(frozen=True)
class Throughput:
    """What a GPU is assumed to deliver: `tflops` (effective TFLOP/s, bf16), `bandwidth` (effective TB/s of
    GPU memory, the floor of memory-bound forwards), `startup_s` (seconds a GPU job spends starting and
    loading its model), `gpu_memory_gb` (GB of memory per GPU); and the cluster around it: `fs_gbs` (GB/s one
    job reads the weights at from the shared file system), `queue_wait_min` (minutes an allocation waits in the
    queue); a CPU node's `cpu_tflops` and `cpu_bandwidth`, for a model's jobs with `gpus: 0`."""

    tflops: float = 100.0
    bandwidth: float = 1.5
    startup_s: float = 60.0
    gpu_memory_gb: float = 80.0
    fs_gbs: float = 1.0  # a 10 GbE client's ~1.25 GB/s line rate; Whamcloud's "Why Use Lustre": over 1 GB/s end to end
    queue_wait_min: float = 5.0  # an assumption, not a measurement: your site's sacct (Start - Submit) says
    # A model job with `gpus: 0` on a CPU node (float32): a 2-core AVX2 node's peak is 2 x 32 FLOP/cycle x 3 GHz
    # = 0.19 TFLOP/s, about half of it effective; memory ~10 GB/s. Assumptions: `--compare` on a run says more.
    cpu_tflops: float = 0.1
    cpu_bandwidth: float = 0.01


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
                   copies: int = COPIES_PER_FORWARD, groups: int = 1) -> Work:
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
                   logits: float, dtype_bytes: int, optimizer: str, ranks: int = 1) -> float:
    """GPU memory of a training step: the weights; the trained parameters' gradients and optimizer state
    (full fine-tuning of a float32 model: a float32 gradient and AdamW's two moments; of a bf16/fp16 model
    (`sft.training.MasterWeights`): its gradient in the model's dtype, a float32 master copy with its float32
    gradient, and the moments in float32, 18 bytes a parameter beyond the weights; other methods: float32
    deltas or adapters with their float32 gradient and moments, 16 bytes a parameter); the activations kept
    for the backward of `batch` sequences of `seq` tokens (every layer: an upper bound); `logits` unembedded
    positions (`TRAIN_LOGIT_BYTES` each).

    `ranks` > 1 (one process per GPU, `sft.distributed`), one rank's peak: full fine-tuning is sharded with FSDP2,
    float32 weights, gradients and moments divided over the ranks, plus two decoder layers gathered in the compute
    dtype with their float32 gradient (the one computing, the one prefetched); other methods replicate the
    weights and their small trained state. `batch` and `logits` are then the rank's own micro-batch's."""
    moments = 2 if optimizer == "adamw" else 0
    kept = batch * seq * shape.n_layers * saved_activation_bytes(shape, dtype_bytes=dtype_bytes)
    if full and ranks > 1:
        gathered = 2 * trained / shape.n_layers * (dtype_bytes + 4)
        return trained * 4 * (2 + moments) / ranks + gathered + kept + logits * shape.vocab * TRAIN_LOGIT_BYTES
    if full and dtype_bytes >= 4:
        state = trained * 4 * (1 + moments)
    elif full:
        state = trained * (dtype_bytes + 4 + 4 + 4 * moments)
    else:
        state = trained * 4 * (2 + moments)
    return weights + state + kept + logits * shape.vocab * TRAIN_LOGIT_BYTES


# ---------------------------------------------------------------------------------------------------
# Trained parameters and training steps


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


def trained_params(shape: Shape, *, method: str, heads: int, mlps: int, train_kv: bool, lora: dict) -> tuple[int, bool]:
    """(trained parameters, whether every weight is trained) of a fine-tuning method: full, lora, or a head
    method (`heads` heads, `mlps` whole MLPs, K/V rows with `train_kv`)."""
    if method == "full":
        return shape.n_params, True
    if method == "lora":
        return lora_params(shape, lora), False
    return head_method_params(shape, heads=heads, mlps=mlps, train_kv=train_kv), False


def training_steps(train: dict, *, examples: int) -> tuple[int, int]:
    """(optimizer steps, sequences) of a training run: max_steps, or epochs x ceil(examples / per step);
    every step full (an upper bound)."""
    per_step = train["batch_size"] * train["grad_accumulation"]
    steps = train["max_steps"] or train["epochs"] * math.ceil(examples / per_step)
    return steps, steps * per_step


def rank_batch(train: dict, ranks: int) -> int:
    """Sequences of one rank's micro-batch when every micro-batch of batch_size is split over `ranks` processes
    (`sft.training.rank_batches`)."""
    return math.ceil(train["batch_size"] / ranks)


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

