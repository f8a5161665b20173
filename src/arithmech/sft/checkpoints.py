"""Training checkpoints: a resumable run's trained tensors, optimizer and RNG states, written atomically
every few steps and read back by a resumed run, which then ends as an uninterrupted run would.

Trained over several processes (`arithmech.sft.distributed`): the head methods and LoRA hold the same trained
tensors and optimizer state on every rank, so rank 0 writes them as one process does (with every rank's RNG
state); full fine-tuning with FSDP2 is written by every rank, its own shards, with torch.distributed.checkpoint
(`sharded/`): gathering a 7B model's weights and AdamW moments on one host would need about 16 bytes a
parameter of host memory there, and DCP reshards on load, so a run may resume under another number of GPUs.

A resume trusts what it reads (DCP's `.metadata` is a pickle, and its byte items load with weights_only=False),
so it reads only what this user alone could have written: `latest` names one of the run's own step-NNNNNNNN
directories, and the checkpoint directory and everything in it belong to this user and are writable by no one
else (`io.tree_problem`; checkpoints are written so, `io.protected_bits`); anything else is refused, naming it."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from arithmech.io import atomic_dir, atomic_path, path_problem, protected_bits, tree_problem, write_json
from arithmech.sft import distributed

# Training-config fields a resumed run may change: how long it runs and how often it checkpoints.
RESUMABLE_CHANGES = ("epochs", "max_steps", "checkpoint_every")
SHARDED_DIR = "sharded"  # full fine-tuning over several processes: torch.distributed.checkpoint's files
LATEST_FILE = "latest"
STEP_NAME = re.compile(r"step-\d{8}")  # save_checkpoint's names: the only ones `latest` may hold


class UnsafeCheckpoint(PermissionError):
    """A checkpoint that someone other than this user could have written or redirected: never resumed from."""


def _refuse(checkpoint_dir: Path, why: str):
    raise UnsafeCheckpoint(f"refusing to resume from checkpoint directory {checkpoint_dir}: {why}. A checkpoint must "
                           "be this user's own and writable by no one else; delete the directory to start the run "
                           "afresh")


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in `checkpoint_dir` (named by its `latest` file), or None. Refused
    (`UnsafeCheckpoint`): a directory that is a symlink or another user's, a `latest` that names anything but one
    of the directory's own step-NNNNNNNN entries, and a checkpoint that another user owns or may write (module
    docstring)."""
    checkpoint_dir = Path(checkpoint_dir)
    if not os.path.lexists(checkpoint_dir):
        return None
    info = checkpoint_dir.lstat()
    if not stat.S_ISDIR(info.st_mode):
        _refuse(checkpoint_dir, "it is not a directory (a symlink or a file)")
    if info.st_uid != os.geteuid():
        _refuse(checkpoint_dir, f"it is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})")
    pointer = checkpoint_dir / LATEST_FILE
    steps = sorted(p for p in checkpoint_dir.iterdir() if STEP_NAME.fullmatch(p.name))
    if not steps and not os.path.lexists(pointer):
        return None  # nothing to resume: save_checkpoint makes the directory private before writing
    problem = path_problem(checkpoint_dir) or (path_problem(pointer) if os.path.lexists(pointer) else None)
    if problem:
        _refuse(checkpoint_dir, problem)
    chosen = steps[-1] if steps else None  # killed between renaming a step into place and updating `latest`
    if os.path.lexists(pointer):
        name = pointer.read_text().strip()
        if not STEP_NAME.fullmatch(name):
            _refuse(checkpoint_dir, f"its {LATEST_FILE} names {name!r}, not one of its own step-NNNNNNNN entries")
        if os.path.lexists(checkpoint_dir / name):
            chosen = checkpoint_dir / name
    if chosen is None:
        return None
    problem = tree_problem(chosen)  # what a resume reads: this user's alone
    if problem:
        _refuse(checkpoint_dir, problem)
    return chosen


def save_checkpoint(checkpoint_dir: str | Path, ft, optimizer: torch.optim.Optimizer, *, step: int,
                    steps_per_epoch: int, fingerprint: dict, history: dict) -> Path:
    """Write checkpoint_dir/step-{step:08d}/ atomically (`io.atomic_dir`), then name it in
    checkpoint_dir/latest and remove older checkpoints. It holds:
      trainable.safetensors   the trained tensors (ft.params; `ft` a `training.FineTune`)
      optimizer.pt            the optimizer's state dict (AdamW moments; SGD: hyperparameters only)
      sharded/                instead of the two above for a sharded (FSDP2) model: every rank's shards of
                              the model and optimizer state (torch.distributed.checkpoint)
      rng.pt                  the torch CPU (and CUDA) RNG states after `step` steps (several processes:
                              every rank's, under "ranks")
      trainer.json            step, epoch and position in it, the lr schedule's position, the run's
                              fingerprint (config, method, data hash) and the loss/time history."""
    checkpoint_dir = Path(checkpoint_dir)
    name = f"step-{step:08d}"
    final = checkpoint_dir / name
    rng = {"cpu": torch.get_rng_state()}
    if ft.lm.device.type == "cuda":  # every GPU's: a model spread over several draws dropout on each
        rng["cuda"] = torch.cuda.get_rng_state_all()
    world = distributed.world()[1]
    every_rank = gather_rng(rng) if world > 1 else None
    if not distributed.is_main():  # rank 0 writes; a sharded model's shards come from every rank
        if ft.sharded:
            save_shards(ft, optimizer, Path(distributed.broadcast(None)))
        distributed.barrier()
        return final
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir.chmod(stat.S_IMODE(checkpoint_dir.stat().st_mode) & ~protected_bits())  # as the resume wants it
    with atomic_dir(final, protect=True) as tmp:  # the same step written again (a rerun) replaces it
        if ft.sharded:
            save_shards(ft, optimizer, Path(distributed.broadcast(str(tmp))))
        else:
            save_file({n: p.detach().contiguous().cpu() for n, p in ft.params.items()},
                      str(tmp / "trainable.safetensors"))
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(rng if every_rank is None else {**rng, "ranks": every_rank}, tmp / "rng.pt")
        epoch, position = divmod(step, steps_per_epoch)
        state = {"step": step, "epoch": epoch, "position_in_epoch": position, "steps_per_epoch": steps_per_epoch,
                 "scheduler": {"step": step, "lr": [g["lr"] for g in optimizer.param_groups]},
                 "fingerprint": fingerprint, "history": history}
        if world > 1:
            state |= {"world_size": world, "sharded": ft.sharded}
        write_json(state, tmp / "trainer.json")
    with atomic_path(checkpoint_dir / LATEST_FILE, protect=True) as pointer:
        pointer.write_text(name + "\n")
    for old in checkpoint_dir.glob("step-*"):
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    distributed.barrier()
    return final


def gather_rng(rng: dict) -> list[dict]:
    """Every rank's RNG states (`rng`: "cpu", and "cuda" on a GPU), by rank, gathered as tensors."""
    cpu = distributed.gather_tensor(rng["cpu"])
    if "cuda" not in rng:
        return [{"cpu": c} for c in cpu]
    cuda = distributed.gather_tensor(torch.stack(rng["cuda"]))
    return [{"cpu": c, "cuda": list(g.unbind())} for c, g in zip(cpu, cuda)]


def sharded_state(ft, optimizer: torch.optim.Optimizer) -> dict:
    """A sharded model's and its optimizer's state, each rank its shards (what DCP writes and reads in place)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(ft.model, optimizer)
    return {"model": model_state, "optim": optim_state}


def save_shards(ft, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Every rank writes its shards into directory/sharded (collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(sharded_state(ft, optimizer), checkpoint_id=Path(directory) / SHARDED_DIR)


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
    if state.get("sharded", False) != ft.sharded:
        written = "sharded (FSDP2, several GPUs)" if state.get("sharded") else "by one process"
        raise ValueError(f"checkpoint {path} was written {written}, this run is "
                         f"{'sharded' if ft.sharded else 'one process'}: resume full fine-tuning with one GPU or with "
                         "several, as it was written, or delete the checkpoint")
    if ft.sharded:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        shards = sharded_state(ft, optimizer)
        dcp.load(shards, checkpoint_id=path / SHARDED_DIR)
        set_state_dict(ft.model, optimizer, model_state_dict=shards["model"], optim_state_dict=shards["optim"])
    else:
        tensors = load_file(str(path / "trainable.safetensors"))
        if set(tensors) != set(ft.params):
            raise ValueError(f"checkpoint {path} holds other parameters than this run trains")
        with torch.no_grad():
            for name, p in ft.params.items():
                p.copy_(tensors[name])
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=ft.lm.device, weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    rank, world = distributed.world()
    if world > 1:  # each rank its own state; written under another number of ranks, rank 0 takes the first's
        ranks = rng.get("ranks") or [rng]
        if len(ranks) != world and rank > 0:
            return state["step"], state["history"]  # keeps the stream `rank_seed` started
        rng = ranks[rank] if len(ranks) == world else ranks[0]
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and ft.lm.device.type == "cuda":
        if isinstance(rng["cuda"], list):
            torch.cuda.set_rng_state_all(rng["cuda"])
        else:  # a checkpoint written with one GPU's state
            torch.cuda.set_rng_state(rng["cuda"], ft.lm.device)
    return state["step"], state["history"]
