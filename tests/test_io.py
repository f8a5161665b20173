"""Atomic writers: results are complete or absent, and readable by the group like any other file."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import arithmech
import arithmech.io
from arithmech.io import atomic_dir, atomic_path, source_digest, tree_digest, write_safetensors


def test_safetensors_results_get_the_umask_mode(tmp_path):
    # safetensors replaces the temporary file it is given, which used to leave the result private (0600)
    write_safetensors({"a": torch.zeros(2)}, tmp_path / "x.safetensors", {"k": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(tmp_path / "x.safetensors").st_mode & 0o777 == 0o666 & ~mask


def test_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "out.txt") as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def _old_dir(tmp_path) -> Path:
    """A finished directory result: two files."""
    out = tmp_path / "run"
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("old a")
        (tmp / "b.txt").write_text("old b")
    return out


def _contents(path: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(path.iterdir())}


def test_atomic_dir_replaces_the_old_directory_whole(tmp_path):
    out = _old_dir(tmp_path)
    assert _contents(out) == {"a.txt": "old a", "b.txt": "old b"}
    with atomic_dir(out) as tmp:
        (tmp / "c.txt").write_text("new c")
    assert _contents(out) == {"c.txt": "new c"}  # no file of the old one is left
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no temporary sibling either
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask


def test_atomic_dir_failed_write_keeps_the_old_directory(tmp_path):
    out = _old_dir(tmp_path)
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("killed")
    assert _contents(out) == {"a.txt": "old a", "b.txt": "old b"}
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    with pytest.raises(RuntimeError):  # no old directory: nothing appears
        with atomic_dir(tmp_path / "new") as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("killed")
    assert not (tmp_path / "new").exists()


def test_atomic_dir_killed_between_the_renames_leaves_nothing_half_written(tmp_path, monkeypatch):
    """A kill after the old directory is moved aside and before the new one is in place: nothing at the
    path (the old one waits in a hidden sibling), and the next write cleans up."""
    out = _old_dir(tmp_path)
    real_replace, calls = os.replace, []

    def replace_then_die(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what a kill looks like between the two renames
        real_replace(src, dst)

    monkeypatch.setattr(arithmech.io.os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(out) as tmp:
            (tmp / "c.txt").write_text("new c")
    monkeypatch.undo()
    assert not out.exists()
    assert [_contents(old / "run") for old in tmp_path.glob(".run.old-*")] == [{"a.txt": "old a", "b.txt": "old b"}]
    with atomic_dir(out) as tmp:
        (tmp / "d.txt").write_text("d")
    assert _contents(out) == {"d.txt": "d"} and [p.name for p in tmp_path.iterdir()] == ["run"]


WRITER = """
import sys, time
from pathlib import Path
from arithmech.io import atomic_dir

with atomic_dir(Path(sys.argv[1])) as tmp:
    (tmp / "a.txt").write_text("new a")
    print("half written", flush=True)
    time.sleep(60)
    (tmp / "b.txt").write_text("new b")
"""


@pytest.mark.parametrize("existing", [True, False])
def test_atomic_dir_sigkilled_writer_leaves_the_old_directory_or_nothing(tmp_path, existing):
    out = _old_dir(tmp_path) if existing else tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(arithmech.__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "half written"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    if existing:
        assert _contents(out) == {"a.txt": "old a", "b.txt": "old b"}
    else:
        assert not out.exists()
    with atomic_dir(out) as tmp:  # the next write removes what the killed one left
        (tmp / "c.txt").write_text("c")
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_source_digest_follows_every_source_byte(tmp_path):
    copy = tmp_path / "arithmech"
    shutil.copytree(Path(arithmech.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert tree_digest(copy) == source_digest()
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "x.pyc").write_bytes(b"not source")
    assert tree_digest(copy) == source_digest()  # only *.py counts
    stages = copy / "stages" / "identify.py"  # a module of a subpackage counts too
    stages.write_text(stages.read_text() + "\n")
    assert tree_digest(copy) != source_digest()
