"""arithmech.tools.hub_token: an exported Hugging Face token kept from the jobs sbatch submits, found by
huggingface_hub's own lookup on the submitting host (the whole run through the real Slurm:
tests/workflow/test_slurm.py)."""

import os
import stat

import huggingface_hub
from huggingface_hub import constants

from arithmech.tools import hub_token

MARKER = "hf_arithmechMarkerNotARealToken0123"


def test_an_exported_token_moves_to_a_private_file_huggingface_hub_reads(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", MARKER)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", MARKER)
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", constants.HF_TOKEN_PATH)  # restored after the test
    note = hub_token.keep_from_jobs()
    assert "kept out of the jobs' environment" in note
    assert not any(name in os.environ for name in hub_token.TOKEN_VARS)
    path = os.environ["HF_TOKEN_PATH"]
    assert (stat.S_IMODE(os.stat(path).st_mode) == 0o600
            and stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700)
    assert MARKER not in "".join(f"{k}={v}" for k, v in os.environ.items())  # what sbatch --export=ALL would pass
    assert huggingface_hub.get_token() == MARKER  # the download rules' lookup still finds it


def test_no_exported_token_changes_nothing():
    environ = {"PATH": "/bin", "HF_HOME": "/x"}
    assert hub_token.keep_from_jobs(environ) is None and environ == {"PATH": "/bin", "HF_HOME": "/x"}


def test_a_cluster_job_is_offline_without_a_token():
    environ = {"PATH": "/bin", "HF_TOKEN_PATH": "/tmp/x/token", "HF_TOKEN": MARKER, "HUGGING_FACE_HUB_TOKEN": MARKER}
    hub_token.offline_job(environ)
    assert environ == {"PATH": "/bin", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
