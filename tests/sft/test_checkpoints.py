"""Checkpoints that cannot be planted: a resume reads only what this user alone could have written (a resume unpickles
DCP's metadata), and model copies and checkpoints are written so, whatever the umask. A planted `latest` (an
absolute path, `../`, a symlink), a checkpoint another user owns, and one that its group or others may write are
each refused with a message naming the file; `ARITHMECH_GROUP_WRITABLE=1` keeps the group's write bit."""

from __future__ import annotations

import os
import pwd
import shutil
import stat

import pytest

from arithmech.io import GROUP_WRITABLE_ENV, write_parquet
from arithmech.model.loading import load_model, prepare_model
from arithmech.sft import checkpoints
from arithmech.sft import training as ft

EXAMPLES = [(f"{a} plus {b} is equal to ", str(a + b)) for a, b in [(1, 2), (3, 4), (2, 2), (4, 1)]]
CONFIG = {"lr": 3e-2, "batch_size": 2, "max_grad_norm": 1.0, "seed": 0, "max_steps": 2, "checkpoint_every": 1}
SPEC = {"method": "precise", "heads": ["L1H0"]}


@pytest.fixture
def umask_002():
    """A project directory's umask: files group-writable."""
    old = os.umask(0o002)
    yield
    os.umask(old)


def train(tiny_dir, checkpoint_dir, max_steps=2):
    run = ft.prepare(load_model(tiny_dir, device="cpu"), SPEC)
    return ft.train(run, EXAMPLES, {**CONFIG, "max_steps": max_steps}, checkpoint_dir=checkpoint_dir, progress=False)


@pytest.fixture(scope="module")
def written(tiny_dir, tmp_path_factory):
    """A checkpoint directory as a run stopped after step 2 leaves it (written under umask 002)."""
    old = os.umask(0o002)
    try:
        ckpt = tmp_path_factory.mktemp("written") / "ckpt"
        train(tiny_dir, ckpt)
    finally:
        os.umask(old)
    return ckpt


@pytest.fixture
def ckpt(written, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(written, copy, symlinks=True)
    return copy


def modes(root):
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")]}


def test_checkpoints_are_writable_by_their_owner_alone(written):
    assert sorted(p.name for p in written.iterdir()) == ["latest", "step-00000002"]
    assert {name: mode & 0o022 for name, mode in modes(written).items()} == dict.fromkeys(modes(written), 0)
    assert checkpoints.latest_checkpoint(written) == written / "step-00000002"


def test_outputs_follow_the_umask_but_model_copies_do_not(tmp_path, umask_002):
    write_parquet(__import__("pandas").DataFrame({"a": [1]}), tmp_path / "table.parquet")
    assert stat.S_IMODE((tmp_path / "table.parquet").stat().st_mode) == 0o664  # a result: the user's umask
    prepare_model({"tiny": {}}, tmp_path / "model")
    assert {name: mode & 0o022 for name, mode in modes(tmp_path / "model").items()} == dict.fromkeys(
        modes(tmp_path / "model"), 0)


def test_group_writable_when_asked(tiny_dir, tmp_path, umask_002, monkeypatch):
    monkeypatch.setenv(GROUP_WRITABLE_ENV, "1")
    train(tiny_dir, tmp_path / "ckpt", max_steps=1)
    step = tmp_path / "ckpt" / "step-00000001"
    assert stat.S_IMODE(step.stat().st_mode) == 0o775 and stat.S_IMODE((step / "trainer.json").stat().st_mode) == 0o664
    assert checkpoints.latest_checkpoint(tmp_path / "ckpt") == step  # and resumed from


@pytest.mark.parametrize("planted", ["absolute", "parent", "symlink", "not_a_step"])
def test_a_planted_latest_is_refused(ckpt, tmp_path, planted):
    """`latest` may only name one of the directory's own step-NNNNNNNN entries: another user's copy of a checkpoint
    (absolute, `../`, or a symlink that names it) is never resumed from."""
    elsewhere = tmp_path / "elsewhere" / "step-00000009"
    shutil.copytree(ckpt / "step-00000002", elsewhere)
    name = {"absolute": str(elsewhere), "parent": "../elsewhere/step-00000009", "symlink": "step-00000009",
            "not_a_step": "latest"}[planted]
    if planted == "symlink":
        (ckpt / "step-00000009").symlink_to(elsewhere)
    (ckpt / "latest").write_text(name + "\n")
    why = f"{ckpt / 'step-00000009'} is a symlink" if planted == "symlink" else f"names {name!r}"
    with pytest.raises(checkpoints.UnsafeCheckpoint, match="refusing to resume from checkpoint directory") as err:
        checkpoints.latest_checkpoint(ckpt)
    assert why in str(err.value)


@pytest.mark.parametrize("where", ["directory", "latest", "step", "file"])
@pytest.mark.parametrize("bits", [0o020, 0o002])
def test_a_checkpoint_others_may_write_is_refused(ckpt, where, bits):
    path = {"directory": ckpt, "latest": ckpt / "latest", "step": ckpt / "step-00000002",
            "file": ckpt / "step-00000002" / "trainer.json"}[where]
    path.chmod(stat.S_IMODE(path.stat().st_mode) | bits)
    with pytest.raises(checkpoints.UnsafeCheckpoint) as err:
        checkpoints.latest_checkpoint(ckpt)
    who = "its group" if bits == 0o020 else "others"
    assert f"{path} is writable by {who}" in str(err.value) and "delete the directory" in str(err.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file to another user: needs root")
@pytest.mark.parametrize("where", ["directory", "step", "file"])
def test_a_checkpoint_another_user_owns_is_refused(ckpt, where):
    path = {"directory": ckpt, "step": ckpt / "step-00000002", "file": ckpt / "step-00000002" / "optimizer.pt"}[where]
    os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(checkpoints.UnsafeCheckpoint, match=f"{path}.* is owned by uid"):
        checkpoints.latest_checkpoint(ckpt)


def test_a_resume_stops_on_a_planted_checkpoint(tiny_dir, ckpt):
    """Through training: the run stops before loading anything, naming the checkpoint directory."""
    ckpt.chmod(0o777)
    with pytest.raises(checkpoints.UnsafeCheckpoint, match=f"checkpoint directory {ckpt}"):
        train(tiny_dir, ckpt, max_steps=3)
