"""What several stages' entry points share: the prepared model's record and loading, provenance for a
stage's outputs, and saving and loading a training run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from ..io import config_hash, provenance
from ..models import SOURCE_FILE, LoadedModel, load_model


def model_record(model_dir: str | Path) -> dict:
    return json.loads((Path(model_dir) / SOURCE_FILE).read_text())


def stage_meta(model_dir, stage: str, **params) -> dict:
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
    return load_model(model_dir, device=compute["device"], dtype=compute["dtype"])


TRAINED_FILE = "trained.safetensors"  # precise, random_heads, lora: the deltas
FULL_DIR = "model"  # full: a whole HF model directory
STATS_FILE = "stats.json"


def save_training_run(*, ft, stats, wall_s: float, out_dir, checkpoints, meta: dict, record: dict,
                      write_extra=None) -> dict:
    """Write a finished training run into `out_dir` atomically (built in a temporary sibling, renamed into
    place): what was trained (`trained.safetensors`, or `model/` for full), whatever `write_extra(tmp_dir)`
    adds, and `stats.json` (the TrainStats, `record`, wall time, mean step time, artifact bytes, provenance,
    model size, device and dtype). Then remove the run's checkpoints: a rerun starts afresh. Returns the
    stats record."""
    from ..finetune import save_trained

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_trained(ft, tmp / (FULL_DIR if ft.method.name == "full" else TRAINED_FILE), {"provenance": meta})
    if write_extra is not None:
        write_extra(tmp)
    full = {**stats.to_dict(), **record, "wall_s_this_run": wall_s,
            "mean_step_s": float(np.mean(stats.step_times_s)) if stats.step_times_s else float("nan"),
            "artifact_bytes": _tree_bytes(tmp), "provenance": meta, "n_parameters": ft.lm.describe()["n_parameters"],
            "device": str(ft.lm.device), "dtype": str(ft.lm.dtype)}
    (tmp / STATS_FILE).write_text(json.dumps(full, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    shutil.rmtree(checkpoints, ignore_errors=True)
    return full


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def load_finetuned(model_dir, finetune_dir, compute: dict) -> LoadedModel:
    """The base model (finetune_dir None) or a fine-tuned one, ready for evaluation (no hooks)."""
    from ..finetune import load_trained

    if finetune_dir is None:
        return load_stage_model(model_dir, compute)
    finetune_dir = Path(finetune_dir)
    trained = finetune_dir / FULL_DIR if (finetune_dir / FULL_DIR).is_dir() else finetune_dir / TRAINED_FILE
    return load_trained(model_dir, trained, device=compute["device"], dtype=compute["dtype"])
