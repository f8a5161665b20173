"""Atomic writers: results are complete or absent, and readable by the group like any other file."""

import os
import shutil
from pathlib import Path

import pytest
import torch

import arithmech
from arithmech.io import atomic_path, source_digest, tree_digest, write_safetensors


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
