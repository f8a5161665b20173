"""Atomic writers: results are complete or absent, and readable by the group like any other file."""

import os

import pytest
import torch

from arithmech.io import atomic_path, write_safetensors


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
