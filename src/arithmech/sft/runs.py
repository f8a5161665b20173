"""A fine-tuning run as a job sees it: train and save it (`train_and_save`, the one training entry point of
the GSM8K recipe and of the study), and load what a run trained for evaluation (`load_finetuned`)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from arithmech.io import atomic_dir, config_hash, write_parquet
from arithmech.model.loading import LoadedModel, load_stage_model, stage_meta

TRAINED_FILE = "trained.safetensors"  # the head methods: the deltas
ADAPTER_DIR = "adapter"  # lora: a PEFT adapter directory (PeftModel.from_pretrained loads it)
FULL_DIR = "model"  # full: a whole HF model directory
STATS_FILE = "stats.json"


def train_and_save(lm: LoadedModel, *, spec: dict, train_cfg: dict, examples: list[tuple[str, str]], settings: dict,
                   run_name: str, checkpoint_root, out_dir, model_dir, stage: str, meta_params: dict, record: dict,
                   append_eos: bool = True, evaluate=None, evaluate_every: int | None = None,
                   final_tables: Callable[..., dict[str, pd.DataFrame]] | None = None,
                   ) -> tuple:
    """The one training entry point, of the GSM8K recipe (`finetune`) and of the study (`study_train`): train
    `lm` by the method `spec` (`methods.parse_method`) with `train_cfg` on (prompt, target) pairs,
    resumable from checkpoint_root/<run_name>-<hash of `settings`>, then save the run (`save_training_run`)
    with the Parquet tables `final_tables(stats)` returns, named by file. `append_eos`, `evaluate` and
    `evaluate_every` go to `training.train`. Provenance: `stage_meta(model_dir, stage, **meta_params,
    settings=settings)`. Returns (the `training.TrainStats`, the stats record, the final tables).

    Under a process group of several ranks (`sft.distributed.run_on_gpus`) every rank trains its share and
    rank 0 alone writes (a sharded model is gathered for it first); every rank gets the record."""
    from arithmech.sft import distributed
    from arithmech.sft.training import prepare, train

    checkpoints = Path(checkpoint_root) / f"{run_name}-{config_hash(settings)[:12]}"
    ft = prepare(lm, spec, train_cfg["seed"])
    start = time.perf_counter()
    stats = train(ft, examples, train_cfg, checkpoint_dir=checkpoints, append_eos=append_eos, evaluate=evaluate,
                  evaluate_every=evaluate_every)
    wall = time.perf_counter() - start
    tables = final_tables(stats) if final_tables is not None else {}
    device = str(ft.lm.device)  # where it trained (rank 0's GPU), before a sharded model is gathered on the CPU
    if ft.sharded:  # every rank sends its shards; rank 0 saves a plain model in the dtype it was loaded in
        state = distributed.full_state_dict(ft.model)
        if distributed.is_main():
            ft.model = ft.lm.model = distributed.unsharded_copy(ft.model, state, ft.loaded_dtype)
    if distributed.is_main():  # several processes: rank 0 alone writes, and tells the others what
        meta = stage_meta(model_dir, stage, **meta_params, settings=settings)
        record = save_training_run(ft=ft, stats=stats, wall_s=wall, out_dir=out_dir, checkpoints=checkpoints,
                                   meta=meta, record=record, tables=tables, device=device)
    return stats, distributed.broadcast(record), tables


def save_training_run(*, ft, stats, wall_s: float, out_dir, checkpoints, meta: dict, record: dict,
                      tables: dict[str, pd.DataFrame], device: str | None = None) -> dict:
    """Write a finished training run into `out_dir` atomically (`io.atomic_dir`): what was trained
    (`trained.safetensors`, `adapter/` for lora, `model/` for full: `trained_name`), `tables` (Parquet, by file
    name) and `stats.json` (the TrainStats, with the precision it trained in: model_dtype and master_dtype;
    `record`, wall time, mean step time, artifact bytes, provenance, model size, device and dtype). Then remove
    the run's checkpoints: a rerun starts afresh. Returns the stats record."""
    from arithmech.sft.deltas import save_trained

    with atomic_dir(out_dir, protect=True) as tmp:  # a model copy that later jobs load: writable by this user alone
        save_trained(ft, tmp / trained_name(ft.method.name), {"provenance": meta})
        for name, table in tables.items():
            write_parquet(table, tmp / name, meta)
        full = {**stats.to_dict(), **record, "wall_s_this_run": wall_s,
                "mean_step_s": float(np.mean(stats.step_times_s)) if stats.step_times_s else float("nan"),
                "artifact_bytes": _tree_bytes(tmp), "provenance": meta,
                "n_parameters": ft.lm.describe()["n_parameters"], "device": device or str(ft.lm.device),
                "dtype": str(ft.lm.dtype)}
        (tmp / STATS_FILE).write_text(json.dumps(full, indent=2) + "\n")
    shutil.rmtree(checkpoints, ignore_errors=True)
    return full


def trained_name(method: str) -> str:
    """Where a run of `method` saves what it trained, in its run directory."""
    return {"full": FULL_DIR, "lora": ADAPTER_DIR}.get(method, TRAINED_FILE)


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def load_finetuned(model_dir, finetune_dir, compute: dict) -> LoadedModel:
    """The base model (finetune_dir None) or a fine-tuned one, ready for evaluation (no training hooks)."""
    from arithmech.sft.deltas import load_trained

    if finetune_dir is None:
        return load_stage_model(model_dir, compute)
    trained = next((Path(finetune_dir) / name for name in (FULL_DIR, ADAPTER_DIR, TRAINED_FILE)
                    if (Path(finetune_dir) / name).exists()), None)
    if trained is None:
        raise FileNotFoundError(f"{finetune_dir} holds none of {FULL_DIR}/, {ADAPTER_DIR}/, {TRAINED_FILE}: "
                                "re-run the rule that trained it (finetune or study_train)")
    return load_trained(model_dir, trained, device=compute["device"], dtype=compute["dtype"])
