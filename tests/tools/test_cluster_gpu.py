"""A job on a real GPU (`arithmech.jobs.job`): its record holds the GPU's peak memory, and a real CUDA out-of-memory
error leaves the mark a cluster retry reads (arithmech.tools.cluster) with what to change. Needs CUDA; runs without
the suite's conftest (`pytest --noconftest -m gpu tests/tools/test_cluster_gpu.py`) on a machine that has torch but
not the workflow's other packages."""

import json
from types import SimpleNamespace

import pytest
import torch

from arithmech import jobs
from arithmech.tools import cluster

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


class Named(dict):
    """What a rule script's snakemake.params / wildcards / resources offer: items by key and by attribute."""

    __getattr__ = dict.__getitem__


def _smk(tmp_path, name):
    log = tmp_path / f"{name}.log"
    return SimpleNamespace(log=[str(log)], rule="evaluate", threads=1,
                           wildcards=Named(model="tiny", method="base", dataset="gsm8k"),
                           params=Named(seed=0, evaluation={"batch_size": 16}, compute={"batch_size": 64}),
                           resources=Named(batch_split=1)), log


def test_the_job_record_holds_the_gpus_peak_memory(tmp_path):
    torch.cuda.reset_peak_memory_stats()
    smk, log = _smk(tmp_path, "peak")
    with jobs.job(smk):
        block = torch.ones(256, 2**20, device="cuda")  # 1 GiB of float32
        del block
    usage = json.loads(log.with_name("peak.usage.json").read_text())
    assert usage["ok"] is True
    assert 1024 <= usage["gpu_peak_mb"]["cuda:0"] < 1100
    print("record:", usage)


def test_a_real_cuda_out_of_memory_is_marked_for_the_retry(tmp_path):
    smk, log = _smk(tmp_path, "oom")
    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(torch.OutOfMemoryError):
        with jobs.job(smk):
            torch.empty(2 * free, dtype=torch.uint8, device="cuda")  # twice what is free: refused at once
    assert cluster.gpu_oom_logged(log)
    text = log.read_text()
    assert "models.tiny.resources.gpus" in text and "evaluation.batch_size" in text
    assert json.loads(log.with_name("oom.usage.json").read_text())["ok"] is False
    print(text.splitlines()[-1])
