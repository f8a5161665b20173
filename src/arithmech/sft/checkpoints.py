"""Training checkpoints: a resumable run's trained tensors, optimizer and RNG states, written atomically
every few steps and read back by a resumed run, which then ends as an uninterrupted run would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from arithmech.io import atomic_dir, atomic_path, write_json

# Training-config fields a resumed run may change: how long it runs and how often it checkpoints.
RESUMABLE_CHANGES = ("epochs", "max_steps", "checkpoint_every")


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in `checkpoint_dir` (named by its `latest` file), or None."""
    checkpoint_dir = Path(checkpoint_dir)
    pointer = checkpoint_dir / "latest"
    if pointer.is_file() and (checkpoint_dir / pointer.read_text().strip()).is_dir():
        return checkpoint_dir / pointer.read_text().strip()
    # Killed between renaming a checkpoint into place and updating `latest`: the step-* dirs are complete.
    steps = sorted(checkpoint_dir.glob("step-*")) if checkpoint_dir.is_dir() else []
    return steps[-1] if steps else None


def save_checkpoint(checkpoint_dir: str | Path, ft, optimizer: torch.optim.Optimizer, *, step: int,
                    steps_per_epoch: int, fingerprint: dict, history: dict) -> Path:
    """Write checkpoint_dir/step-{step:08d}/ atomically (`io.atomic_dir`), then name it in
    checkpoint_dir/latest and remove older checkpoints. It holds:
      trainable.safetensors   the trained tensors (ft.params; `ft` a `training.FineTune`)
      optimizer.pt            the optimizer's state dict (AdamW moments; SGD: hyperparameters only)
      rng.pt                  the torch CPU (and CUDA) RNG states after `step` steps
      trainer.json            step, epoch and position in it, the lr schedule's position, the run's
                              fingerprint (config, method, data hash) and the loss/time history."""
    checkpoint_dir = Path(checkpoint_dir)
    name = f"step-{step:08d}"
    final = checkpoint_dir / name
    with atomic_dir(final) as tmp:  # the same step written again (a rerun) replaces it
        save_file({n: p.detach().contiguous().cpu() for n, p in ft.params.items()}, str(tmp / "trainable.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        rng = {"cpu": torch.get_rng_state()}
        if ft.lm.device.type == "cuda":  # every GPU's: a model spread over several draws dropout on each
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        epoch, position = divmod(step, steps_per_epoch)
        state = {"step": step, "epoch": epoch, "position_in_epoch": position, "steps_per_epoch": steps_per_epoch,
                 "scheduler": {"step": step, "lr": [g["lr"] for g in optimizer.param_groups]},
                 "fingerprint": fingerprint, "history": history}
        write_json(state, tmp / "trainer.json")
    with atomic_path(checkpoint_dir / "latest") as pointer:
        pointer.write_text(name + "\n")
    for old in checkpoint_dir.glob("step-*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, ft, optimizer: torch.optim.Optimizer, fingerprint: dict) -> tuple[int, dict]:
    """Restore the parameters of `ft` (a `training.FineTune`), the optimizer and the RNG from checkpoint `path`;
    return (step, history)."""
    state = json.loads((path / "trainer.json").read_text())
    saved = state["fingerprint"]
    for key in ("method", "data", "append_eos", "n_trainable"):
        if saved[key] != fingerprint[key]:
            raise ValueError(f"checkpoint {path} belongs to another run: its {key} is {saved[key]!r}, this run's "
                             f"is {fingerprint[key]!r}; use another checkpoint_dir or delete it")
    for key, value in fingerprint["config"].items():
        if key not in RESUMABLE_CHANGES and saved["config"].get(key) != value:
            raise ValueError(f"checkpoint {path} was written with finetune.train.{key}={saved['config'].get(key)!r}, "
                             f"this run has {value!r}; only {list(RESUMABLE_CHANGES)} may change on resume")
    tensors = load_file(str(path / "trainable.safetensors"))
    if set(tensors) != set(ft.params):
        raise ValueError(f"checkpoint {path} holds other parameters than this run trains")
    with torch.no_grad():
        for name, p in ft.params.items():
            p.copy_(tensors[name])
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=ft.lm.device, weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and ft.lm.device.type == "cuda":
        if isinstance(rng["cuda"], list):
            torch.cuda.set_rng_state_all(rng["cuda"])
        else:  # a checkpoint written with one GPU's state
            torch.cuda.set_rng_state(rng["cuda"], ft.lm.device)
    return state["step"], state["history"]
