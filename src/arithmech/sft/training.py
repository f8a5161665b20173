"""The fine-tuning loop: a Llama-family model trained on (prompt, target) pairs by precise SFT of the key
heads (Zhang et al., ICML 2024), the same on random heads, full fine-tuning or LoRA, resumable from
checkpoints (`arithmech.sft.checkpoints`).

Methods (`methods.Method`, or a config dict through `methods.parse_method`):
  precise        train only the selected query heads' slices: for head h of layer l, the rows
                 h*hd:(h+1)*hd of q_proj.weight (what the head reads) and the columns h*hd:(h+1)*hd of
                 o_proj.weight (what it writes), as delta parameters (`arithmech.sft.deltas`). Optionally
                 (`train_kv`) the rows of k_proj/v_proj of the key/value head g = h // (n_heads // n_kv_heads)
                 it reads; with grouped-query attention that head is shared by its group, so it is trained
                 once however many of its query heads are selected, and the change reaches every query head
                 of the group (selected or not). Optionally (`mlp_layers`) the whole gate/up/down weights of
                 key MLP layers.
  random_heads   the same with a head list the caller drew at random (the baseline).
  full           every parameter.
  lora           peft LoRA adapters (r, alpha, dropout, target_modules), merged for evaluation.

The optimizer (`TrainConfig.optimizer`: AdamW, or plain SGD, which keeps no state) holds state for the
trained parameters only. Weight decay pulls head deltas towards 0, i.e. towards the base weights.

Precision: every method trains float32 tensors, whatever the model's dtype, so that no arm loses small updates
that another keeps (a bf16 weight drops any update below ~1/256 of its value). The head methods train float32
deltas (`Method.delta_dtype`), peft keeps LoRA factors in float32, and full fine-tuning of a bf16/fp16 model
trains float32 master copies of the weights (`MasterWeights`) while the model computes in its own dtype.
On a float32 model (the CPU default) the model's own parameters are trained, as before.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from arithmech.data.arithmetic import continuation_ids
from arithmech.io import config_hash
from arithmech.model.loading import LoadedModel
from arithmech.sft import distributed
from arithmech.sft.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from arithmech.sft.deltas import HeadDeltas
from arithmech.sft.methods import HEAD_METHODS, Method, TrainConfig, parse_method

IGNORE_INDEX = -100  # label of positions that carry no loss (prompt, padding)


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based) of `total`."""
    if step < warmup:
        return (step + 1) / warmup  # the first step already moves (lr/warmup), unlike a ramp from 0
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(config: TrainConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """The configured optimizer over `params` (its lr is reset every step by the schedule)."""
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=0, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


# ---------------------------------------------------------------------------------------------------
# Data


def ends_with_eos(tokenizer, ids: Sequence[int]) -> bool:
    """Whether the last token of `ids` that is not whitespace only is the tokenizer's eos token: a chat
    target ends its turn with it (SmolLM2-Instruct: "<|im_end|>", its eos) and the template often adds a
    "\n" after it."""
    for i in reversed(ids):
        if i == tokenizer.eos_token_id:
            return True
        if tokenizer.decode([i]).strip():
            return False
    return False


def encode_example(tokenizer, prompt: str, target: str, max_length: int,
                   eos: bool = True) -> tuple[list[int], list[int]]:
    """Token ids and labels of one example: prompt ids (with the tokenizer's special tokens, e.g. BOS), then
    target ids (without), then eos. Labels are the ids on the target and eos, IGNORE_INDEX on the prompt.

    eos: append the eos token, unless the target already ends with it (`ends_with_eos`: the last token
    that is not whitespace only is eos, as in a chat turn "...<|im_end|>\n"; the target's ids are then
    kept as they are). eos=False appends none: the model learns the target and nothing after it (e.g. a
    few-shot answer "16." that the prompt format never ends with eos).
    Too long: the prompt is cut from the left (its start, BOS included, goes) so the target stays whole;
    a target (with its eos) longer than max_length alone is an error. The target ids are those that follow
    the prompt in the whole text's tokenization (`arithmetic.continuation_ids`: no SentencePiece word-start
    token of its own)."""
    if eos and tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token; the target must end with one (or train with "
                         "append_eos=False)")
    prompt_ids, target_ids = continuation_ids(tokenizer, prompt, target)
    prompt_ids, target_ids = list(prompt_ids), list(target_ids)
    if eos and not ends_with_eos(tokenizer, target_ids):
        target_ids.append(tokenizer.eos_token_id)
    if not target_ids:
        raise ValueError(f"target {target!r} has no tokens to train on")
    if len(target_ids) > max_length:
        raise ValueError(f"target {target!r} is {len(target_ids)} tokens{' with eos' if eos else ''}, longer "
                         f"than max_length={max_length} (finetune.train.max_length)")
    keep = max_length - len(target_ids)
    # max(0, ...): a prompt that fits stays whole (a negative start would keep only its last keep - len tokens)
    prompt_ids = prompt_ids[max(0, len(prompt_ids) - keep):] if keep else []
    return prompt_ids + target_ids, [IGNORE_INDEX] * len(prompt_ids) + target_ids


def collate(encoded: Sequence[tuple[list[int], list[int]]], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask, labels [batch, seq] (labels IGNORE_INDEX on padding)."""
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, (x, y) in enumerate(encoded):
        ids[i, :len(x)] = torch.tensor(x)
        labels[i, :len(y)] = torch.tensor(y)
        mask[i, :len(x)] = 1
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def batch_loss(model: nn.Module, batch: dict[str, torch.Tensor], *,
               shared_prefix: bool = True) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over the labelled positions (fp32) and their number.

    Position i predicts label i+1. Logits are computed only where a label follows (`logits_to_keep` as a
    boolean [batch, seq] mask): the prompt is most of the tokens and the vocabulary projection is costly.

    shared_prefix: when every row starts with the same tokens that carry no loss (the study's few-shot
    examples: about 26 of an item's 38 tokens), run them once (`prefix_loss`); the loss and gradients are
    the whole forward's up to float reassociation. `common_prefix` says when it applies; otherwise, or with
    shared_prefix=False (the reference), every row runs whole (`plain_loss`)."""
    if shared_prefix:
        length = common_prefix(model, batch)
        if length:
            return prefix_loss(model, batch, length)
    return plain_loss(model, batch)


def plain_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """`batch_loss` with every row's whole sequence in one forward."""
    labels = batch["labels"]
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    targets = labels[:, 1:][keep[:, :-1]]
    # The mask indexes the final hidden states: on a model spread over devices they are on the final norm's
    # (the last) device, not on the input's, where the batch is.
    hidden_device = model.get_decoder().norm.weight.device
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False,
                   logits_to_keep=keep.to(hidden_device)).logits  # [n_kept, vocab] (or [1, n_kept, vocab])
    loss = F.cross_entropy(logits.reshape(len(targets), -1).float(), targets.to(logits.device), reduction="sum")
    return loss, len(targets)


MIN_SHARED_PREFIX = 2  # shorter common prefixes (BOS alone) run whole: a second forward would cost more


def common_prefix(model: nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """The number P of leading positions that `prefix_loss` can run once for every row: the longest prefix
    that all rows share (same ids, none padding) with no label on positions 1..P-1 (so no loss is predicted
    inside it but the first label after it, at P), shorter than the batch. 0 where the shared path does not
    apply: P < MIN_SHARED_PREFIX, a single row, or a model whose forward the split would change or break:
    dropout active (one mask for the prefix instead of one per row), activation checkpointing (no cache in
    training), parameters on several devices (`load_model`'s spread: untested there)."""
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    rows, width = ids.shape
    if rows < 2 or width <= MIN_SHARED_PREFIX:
        return 0
    same = (ids == ids[:1]).all(0) & (mask == 1).all(0)
    same[1:] &= (labels[:, 1:] == IGNORE_INDEX).all(0)  # a label inside the prefix ends it there
    length = int(same.long().cumprod(0).sum())
    if not MIN_SHARED_PREFIX <= length < width:
        return 0
    if model.training and (getattr(model.config, "attention_dropout", 0.0) > 0 or any(
            isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())):
        return 0
    if getattr(model, "is_activation_checkpointing", False) or len({p.device for p in model.parameters()}) > 1:
        return 0
    return length


def prefix_loss(model: nn.Module, batch: dict[str, torch.Tensor], length: int) -> tuple[torch.Tensor, int]:
    """`batch_loss` with the first `length` positions, the same in every row (`common_prefix`), run once.

    The prefix runs as one row with gradients (the trained parameters change its keys and values); its last
    position's logits predict every row's label at `length`. Its cache, repeated over the rows (Hugging
    Face's `batch_repeat_interleave`, differentiable, so each row's gradient flows back into the one prefix),
    is the past of one forward over the rest of every row at positions length.. with the whole attention mask.
    Not `intervention.kvcache.repeated_cache`: it deep-copies the layers, which tensors in an autograd graph
    refuse, and writes its buffers in place."""
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    rows, width = ids.shape
    out = model(input_ids=ids[:1, :length], use_cache=True, logits_to_keep=1)
    first = labels[:, length] != IGNORE_INDEX  # the rows whose label right after the prefix counts
    loss = F.cross_entropy(out.logits[0, -1:].float().expand(int(first.sum()), -1), labels[first, length],
                           reduction="sum")
    cache = out.past_key_values
    cache.batch_repeat_interleave(rows)
    keep = torch.zeros((rows, width - length), dtype=torch.bool, device=labels.device)
    keep[:, :-1] = labels[:, length + 1:] != IGNORE_INDEX
    targets = labels[:, length + 1:][keep[:, :-1]]
    positions = torch.arange(length, width, device=ids.device).expand(rows, -1)
    logits = model(input_ids=ids[:, length:], attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=keep).logits
    loss = loss + F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets, reduction="sum")
    return loss, int(first.sum()) + len(targets)


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The example order of one epoch: a function of (seed, epoch) alone, so a resumed run needs no state."""
    return np.random.default_rng([seed, epoch]).permutation(n)


# ---------------------------------------------------------------------------------------------------
# Preparing a model


class MasterWeights:
    """Float32 master copies of a bf16/fp16 model's parameters, for full fine-tuning (mixed precision with
    master weights, Micikevicius et al., ICLR 2018): the optimizer updates the float32 copies, and the model
    keeps its dtype, computes in it and receives the rounded copies after every step. Gradients are computed
    in the model's dtype and summed over micro-batches in float32.

    Chosen over autocast on float32 parameters because the forward is then exactly the bf16 model's, as for
    the head methods, evaluation during training sees the model in its dtype, and the trained model is saved
    as it is. FSDP2's fully_shard with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32) does the
    same (float32 parameters held by the optimizer, bf16 compute, float32 gradient reduction) and would
    replace this class."""

    def __init__(self, model: nn.Module):
        # (the model's parameter, its float32 master: always a copy), by name; tied weights appear once.
        self.pairs = {name: (p, nn.Parameter(p.detach().to(torch.float32, copy=True)))
                      for name, p in model.named_parameters()}

    @property
    def params(self) -> dict[str, nn.Parameter]:
        """The float32 masters, by the model's parameter names: what the optimizer trains."""
        return {name: master for name, (_, master) in self.pairs.items()}

    def accumulate_grads(self) -> None:
        """Add the model's gradients (its dtype) to the masters' (float32) and clear the model's."""
        for p, master in self.pairs.values():
            if p.grad is not None:
                grad = p.grad.float()
                master.grad = grad if master.grad is None else master.grad.add_(grad)
                p.grad = None

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Round the masters into the model's parameters (after a step, or after a checkpoint restored them)."""
        for p, master in self.pairs.values():
            p.copy_(master)


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: how stats.json and the tables name a dtype."""
    return str(dtype).removeprefix("torch.")


@dataclass
class FineTune:
    """A model made ready for training by `prepare`.

    params: exactly the trained tensors, by name (the deltas', the adapters', all the model's, or for full
    fine-tuning of a bf16/fp16 model their float32 masters; sharded over several processes, FSDP2's float32
    shards).  model: the module to call (lm.model, or the peft wrapper for lora).  deltas: the HeadDeltas
    (precise, random_heads).  grad_scale: the resolved factor on the head deltas' gradients (1.0: none).
    master: the float32 master weights (full on a bf16/fp16 model).
    """

    lm: LoadedModel
    method: Method
    model: nn.Module
    params: dict[str, nn.Parameter]
    grad_scale: float = 1.0
    deltas: HeadDeltas | None = None
    scaled: list[str] = field(default_factory=list)  # names in params that grad_scale applies to
    master: MasterWeights | None = None
    sharded: bool = False  # full fine-tuning over several processes: FSDP2 shards (`distributed.shard_model`)
    loaded_dtype: torch.dtype | None = None  # the model's dtype as loaded, when sharding made its weights float32

    @property
    def n_trainable(self) -> int:
        """Trained elements: delta elements for the head methods (not the sizes of the matrices they sit in)."""
        return sum(p.numel() for p in self.params.values())

    @property
    def master_dtype(self) -> torch.dtype:
        """The dtype the optimizer updates (that of every trained tensor)."""
        dtypes = {p.dtype for p in self.params.values()}
        if len(dtypes) != 1:
            raise ValueError(f"the trained tensors of {self.method.name} mix dtypes {sorted(map(str, dtypes))}")
        return dtypes.pop()

    def merged_model(self) -> nn.Module:
        """The trained model as a plain HF model, for evaluation in this process: the deltas are folded into
        the base weights (in place; afterwards the base is the trained model), LoRA is merged and unloaded."""
        if self.deltas is not None:
            self.deltas.fold()
            self.deltas = None
        elif self.method.name == "lora":
            self.model = self.model.merge_and_unload()
            self.lm.model = self.model
        self.lm.model.eval()
        self.lm.model.requires_grad_(False)
        return self.lm.model


def resolve_grad_scale(grad_scale: float | str | None, lm: LoadedModel, n_selected: int) -> float:
    """The factor on the head deltas' gradients: None -> 1 (the default: no multiplier); "heads_ratio" ->
    H / h with H = n_layers * n_heads (all query heads of the model) and h = n_selected (the trained ones);
    a number -> itself.

    An optional gradient multiplier, off unless configured: with "heads_ratio" the h trained heads' updates
    are scaled up by H/h. It is applied after gradient clipping, so clipping does not undo it, and not to
    MLP deltas. With SGD it multiplies the head deltas' step (the same as an lr H/h times larger for them).
    AdamW is invariant to a constant gradient factor (m scales by c, sqrt(v) by c) except through eps: with
    AdamW the factor mostly makes eps relatively smaller. Scale lr to change the step size itself."""
    if grad_scale is None:
        return 1.0
    if grad_scale == "heads_ratio":
        return lm.n_layers * lm.n_heads / n_selected
    return float(grad_scale)


def prepare(lm: LoadedModel, method: Method | dict, seed: int = 0) -> FineTune:
    """Make `lm` trainable by `method` (in place: hooks, adapters or requires_grad on `lm.model`).

    precise/random_heads: zero deltas on the selected heads (and MLP layers), hooks attached; no base weight
    requires grad. full: every parameter requires grad; on a bf16/fp16 model the optimizer trains float32
    masters of them (`MasterWeights`); under a process group of several ranks the model is sharded with FSDP2
    instead (`distributed.shard_model`: float32 shards, compute in the model's dtype). lora: peft adapters
    injected into lm.model, initialised with `seed` (the caller's RNG is untouched). Prepare a loaded model
    once."""
    method = parse_method(method) if isinstance(method, dict) else method
    if method.name in HEAD_METHODS:
        for i, (layer, head) in enumerate(method.heads):
            if not (0 <= layer < lm.n_layers and 0 <= head < lm.n_heads):
                raise ValueError(f"finetune.heads[{i}]: L{layer}H{head} is not a head of this model "
                                 f"({lm.n_layers} layers x {lm.n_heads} heads)")
        for i, layer in enumerate(method.mlp_layers):
            if not 0 <= layer < lm.n_layers:
                raise ValueError(f"finetune.mlp_layers[{i}]: layer {layer} is not in 0..{lm.n_layers - 1}")
        dtype = torch.float32 if method.delta_dtype == "float32" else None
        deltas = HeadDeltas(lm, method.heads, train_kv=method.train_kv, mlp_layers=method.mlp_layers,
                            dtype=dtype).attach()
        params = dict(deltas.deltas.items())
        scale = resolve_grad_scale(method.grad_scale, lm, len(method.heads))
        return FineTune(lm, method, lm.model, params, scale, deltas, deltas.head_keys)
    if method.name == "full":
        lm.model.requires_grad_(True)
        if distributed.world()[1] > 1:
            loaded = lm.dtype
            distributed.shard_model(lm.model, loaded)
            return FineTune(lm, method, lm.model, dict(lm.model.named_parameters()), sharded=True, loaded_dtype=loaded)
        if lm.dtype == torch.float32:
            return FineTune(lm, method, lm.model, dict(lm.model.named_parameters()))
        master = MasterWeights(lm.model)
        return FineTune(lm, method, lm.model, master.params, master=master)
    from peft import LoraConfig, get_peft_model

    cfg = method.lora
    config = LoraConfig(r=cfg["r"], lora_alpha=cfg["alpha"], lora_dropout=cfg["dropout"],
                        target_modules=list(cfg["target_modules"]), bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if lm.device.type == "cuda" else []):
        torch.manual_seed(seed)
        try:
            # autocast_adapter_dtype: the factors are float32 on a bf16/fp16 base (peft's default, made explicit)
            peft_model = get_peft_model(lm.model, config, autocast_adapter_dtype=True)
        except ValueError as err:
            raise ValueError(f"finetune.lora.target_modules {cfg['target_modules']}: {err}") from err
    params = {n: p for n, p in peft_model.named_parameters() if p.requires_grad}
    return FineTune(lm, method, peft_model, params)


# ---------------------------------------------------------------------------------------------------
# Training


@dataclass
class TrainStats:
    """What a training run measured. Lists have one entry per optimizer step of the whole run, resumed
    steps included (from the checkpoint).

    model_dtype: the dtype of the model's weights (its compute).  master_dtype: the dtype the optimizer updates
    (the deltas', the LoRA factors', the weights' or their float32 masters').
    losses: mean cross-entropy per target token of each step.  step_times_s: wall time of each step
    (forwards, backwards, optimizer).  peak_memory_bytes: on CUDA torch.cuda.max_memory_allocated during
    this call, summed over the GPUs (a model spread over several: an upper bound); on CPU the peak resident
    set size of the whole PROCESS over its lifetime (getrusage), which includes the model, the data and
    anything the process did before; trained over several processes (one GPU each), the maximum over the ranks.
    optimizer_state_bytes: the tensors in optimizer.state (AdamW: exp_avg, exp_avg_sq, step; SGD without
    momentum: none, 0 bytes; sharded: the whole state, all shards)."""

    method: str
    n_trainable: int
    model_dtype: str
    master_dtype: str
    optimizer_state_bytes: int
    steps: int
    total_steps: int
    losses: list[float]
    step_times_s: list[float]
    peak_memory_bytes: int
    peak_memory_kind: str
    resumed_from_step: int | None = None
    evaluations: list[dict] = field(default_factory=list)
    world_size: int = 1  # processes that trained (`arithmech.sft.distributed`); peak memory is their maximum

    def to_dict(self) -> dict:
        return asdict(self)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state tensors (sharded ones, DTensors, count their whole size)."""
    return sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
               if torch.is_tensor(t))


def _peak_memory(device: torch.device) -> tuple[int, str]:
    """On CUDA, the sum over every visible GPU of its peak allocated memory: a model spread over several GPUs
    (`load_model` with more than one visible) holds its weights, activations and optimizer state on all of
    them, and the sum is what the run needed in all, comparable with a run on one GPU (an upper bound: the
    GPUs' peaks need not fall at the same moment). A visible GPU that holds nothing adds nothing. Each GPU's own
    peak is in the job's usage record (`arithmech.jobs.gpu_peaks_mb`)."""
    if device.type == "cuda":
        peaks = [torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())]
        return sum(peaks), "cuda_max_memory_allocated" if len(peaks) == 1 else "cuda_max_memory_allocated_sum"
    # ru_maxrss is in kilobytes on Linux (bytes on macOS).
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024, "process_peak_rss"


def train(ft: FineTune, examples: Sequence[tuple[str, str]], config: TrainConfig | dict, *,
          checkpoint_dir: str | Path | None = None, stop_at_step: int | None = None,
          progress: bool = True, append_eos: bool = True,
          evaluate: Callable[[int], dict] | None = None, evaluate_every: int | None = None,
          shared_prefix: bool = True) -> TrainStats:
    """Train `ft` on (prompt, target) pairs with the configured optimizer (AdamW or SGD) over its trained
    parameters only.

    Loss: cross-entropy on the target tokens and eos (`encode_example`; append_eos=False: no eos is
    appended, and a target that ends with eos keeps it either way), averaged over all target tokens
    of an optimizer step (so grad_accumulation x batch_size is exactly one large batch). Examples are
    shuffled per epoch (`epoch_order`); the last step of an epoch may be smaller. Dropout follows the model
    config (train mode during the call, eval mode after) and lora.dropout; its RNG is seeded with `seed`
    (the caller's RNG is untouched).

    checkpoint_dir: every `checkpoint_every` steps and at the end of the call a checkpoint is written there
    (`save_checkpoint`); a call that finds one resumes from it, and ends with the same parameters as an
    uninterrupted run. stop_at_step: end the call after this many optimizer steps in all (resumed ones
    included), without changing the schedule, as if the job were killed there (or to split a long run over
    time-limited jobs).

    evaluate, evaluate_every: after every `evaluate_every`-th optimizer step (and after the last one)
    `evaluate(step)` is called with the model in eval mode and no gradients, and the dict it returns is kept
    in `TrainStats.evaluations` (and in checkpoints, so a resumed run keeps the earlier ones): learning
    curves without saving a model per point. It must not use the torch RNG's state for anything that
    matters (greedy decoding does not), since the training RNG continues after it.

    shared_prefix: run the prefix that a micro-batch's rows share once (`batch_loss`); False runs every row
    whole (the reference). A model sharded with FSDP2 always runs rows whole: there the split gave the same
    loss and gradients (2 CPU ranks, gloo, 2026-11-26), but it gathers every layer twice per micro-batch and
    is untested on GPUs.
    """
    config = TrainConfig.from_dict(config) if isinstance(config, dict) else config._checked("finetune.train")
    lm, device = ft.lm, ft.lm.device
    tokenizer = lm.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for i, ex in enumerate(examples):
        if not (isinstance(ex, (tuple, list)) and len(ex) == 2 and all(isinstance(s, str) for s in ex)):
            raise ValueError(f"examples[{i}]: expected a (prompt, target) pair of strings, got {ex!r}")
    if not examples:
        raise ValueError("examples: nothing to train on (empty list)")
    encoded = [encode_example(tokenizer, p, t, config.max_length, eos=append_eos) for p, t in examples]
    per_step = config.batch_size * config.grad_accumulation
    steps_per_epoch = math.ceil(len(encoded) / per_step)
    total = config.max_steps or config.epochs * steps_per_epoch
    stop = total if stop_at_step is None else min(total, stop_at_step)

    params = list(ft.params.values())
    scaled = [ft.params[n] for n in ft.scaled] if ft.grad_scale != 1.0 else []
    optimizer = make_optimizer(config, params)
    fingerprint = {"config": asdict(config), "method": ft.method.describe(),
                   "data": config_hash([list(ex) for ex in examples]), "append_eos": append_eos,
                   "n_trainable": ft.n_trainable}
    history = {"losses": [], "step_times_s": []}
    start, resumed = 0, None
    rank, world = distributed.world()
    checkpoint = latest_checkpoint(checkpoint_dir) if checkpoint_dir is not None else None
    # every GPU: a model spread over several computes and draws dropout on each
    cuda_devices = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
    for index in cuda_devices:
        torch.cuda.reset_peak_memory_stats(index)
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(distributed.rank_seed(config.seed, rank))
        if checkpoint is not None:
            start, history = load_checkpoint(checkpoint, ft, optimizer, fingerprint)
            resumed = start
            if ft.master is not None:
                ft.master.copy_to_model()
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        bar = tqdm(total=total, initial=start, desc=f"finetune {ft.method.name}", file=sys.stderr,
                   disable=not progress or rank > 0, dynamic_ncols=True)
        saved_at = start
        ft.model.train()
        try:
            for step in range(start, stop):
                t0 = time.perf_counter()
                epoch, position = divmod(step, steps_per_epoch)
                chosen = epoch_order(config.seed, epoch, len(encoded))[position * per_step:(position + 1) * per_step]
                step_examples = [encoded[i] for i in chosen]
                # Position 0 predicts nothing (`batch_loss` shifts), so its label never counts.
                n_tokens = max(1, sum(sum(y != IGNORE_INDEX for y in labels[1:]) for _, labels in step_examples))
                optimizer.zero_grad(set_to_none=True)
                loss_sum = 0.0
                for part, weight in rank_batches(step_examples, config.batch_size, rank, world, ft.sharded):
                    batch = collate(part, pad_id, device)
                    loss, _ = batch_loss(ft.model, batch, shared_prefix=shared_prefix and not ft.sharded)
                    (loss * weight / n_tokens).backward()
                    if ft.master is not None:
                        ft.master.accumulate_grads()
                    loss_sum += loss.item() if weight else 0.0
                if world > 1:
                    loss_sum = distributed.all_reduce_sum(loss_sum)
                if not math.isfinite(loss_sum):  # the same sum on every rank: all stop here together
                    raise FloatingPointError(
                        f"finetune {ft.method.name}: the loss of optimizer step {step + 1} (of {total}) is {loss_sum}, "
                        "not finite; the step was not taken. Lower the learning rate (finetune.lr / study.lr_grid), "
                        "set max_grad_norm, or train in float32 (compute.dtype)")
                if world > 1 and not ft.sharded:  # FSDP2 reduced the shards' gradients in the backward
                    distributed.all_reduce_grads(params)
                if config.max_grad_norm is not None:  # after the reduction: the norm of the whole gradient
                    torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                for p in scaled:  # after clipping, so the clip does not undo the factor
                    if p.grad is not None:
                        p.grad.mul_(ft.grad_scale)
                for group in optimizer.param_groups:
                    group["lr"] = config.lr * lr_factor(step, total, config.warmup_steps, config.schedule)
                optimizer.step()
                if ft.master is not None:
                    ft.master.copy_to_model()
                sync()
                history["losses"].append(loss_sum / n_tokens)
                history["step_times_s"].append(time.perf_counter() - t0)
                bar.update(1)
                bar.set_postfix(loss=f"{history['losses'][-1]:.4f}")
                if evaluate is not None and ((step + 1) % (evaluate_every or total) == 0 or step + 1 == total):
                    ft.model.eval()
                    with torch.no_grad():
                        history.setdefault("evaluations", []).append({"step": step + 1, **evaluate(step + 1)})
                    ft.model.train()
                if checkpoint_dir is not None and config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
                    save_checkpoint(checkpoint_dir, ft, optimizer, step=step + 1, steps_per_epoch=steps_per_epoch,
                                    fingerprint=fingerprint, history=history)
                    saved_at = step + 1
        finally:
            bar.close()
            ft.model.eval()
        done = max(start, stop)  # a checkpoint past stop_at_step stays where it is
        if checkpoint_dir is not None and done > saved_at:
            save_checkpoint(checkpoint_dir, ft, optimizer, step=done, steps_per_epoch=steps_per_epoch,
                            fingerprint=fingerprint, history=history)
    peak, kind = _peak_memory(device)
    return TrainStats(ft.method.name, ft.n_trainable, dtype_name(ft.loaded_dtype or lm.dtype),
                      dtype_name(ft.master_dtype), optimizer_state_bytes(optimizer), done,
                      total, history["losses"], history["step_times_s"], distributed.all_reduce_max(peak),
                      kind if world == 1 else f"{kind}_max_over_ranks", resumed, history.get("evaluations", []), world)


def rank_batches(step_examples: list, batch_size: int, rank: int, world: int,
                 sharded: bool) -> list[tuple[list, int]]:
    """The micro-batches this rank computes of one optimizer step, each with the factor on its summed loss.

    One process: the step's micro-batches of batch_size, factor 1. Several: each of those micro-batches is split
    over the ranks (rank r takes its examples r, r+G, ...), so a rank's activations and work are 1/G of one
    process's; the loss stays divided by the step's global token count, so the ranks' gradients sum to the
    one-process gradient. Sharded (FSDP2) models average gradients over the G ranks, hence the factor G; and
    every rank must run as many forwards and backwards as the others (each is collective), so a rank with no
    share of a micro-batch repeats its first example with factor 0."""
    parts = []
    for j in range(0, len(step_examples), batch_size):
        whole = step_examples[j:j + batch_size]
        mine = whole[rank::world]
        if mine:
            parts.append((mine, world if sharded else 1))
        elif sharded:
            parts.append((whole[:1], 0))
    return parts


def finetune_examples(lm, data: dict, seed: int) -> list[tuple[str, str]]:
    """(prompt, target) pairs from GSM8K train: the question in the configured style, the worked solution
    ending "The answer is N." as the target (zero-shot: the model learns the format, not from examples)."""
    from arithmech.data.datasets import load_gsm8k, subsample
    from arithmech.data.formatting import math_prompts

    train = subsample(load_gsm8k(data["file"]), data["n"], seed)
    frame = math_prompts(train, (), data["style"], lm.tokenizer)
    return list(zip(frame["prompt"], frame["target"]))


def example_tokens(tokenizer, examples: list[tuple[str, str]]) -> list[int]:
    """Tokens of each (prompt, target) example as training encodes it: prompt, target, BOS and EOS."""
    def n_tokens(text):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return [n_tokens(p) + n_tokens(t) + 2 for p, t in examples]


def fitting_examples(tokenizer, examples: list[tuple[str, str]], max_length: int) -> list[tuple[str, str]]:
    """The examples whose prompt, target and eos fit in `max_length` tokens (no truncated question)."""
    fit = [e for e, n in zip(examples, example_tokens(tokenizer, examples)) if n <= max_length]
    print(f"{len(fit)} of {len(examples)} training examples fit in max_length={max_length} tokens")
    if not fit:
        raise ValueError(f"config key 'finetune.train.max_length': no training example fits in {max_length} tokens")
    return fit
