"""The Hugging Face token only where it is needed: the submitting host's download rules (docs/cluster.md).

The SLURM plugin submits with `sbatch --export=ALL`: every variable of the submitting process reaches every job,
its training ranks, and the accounting database where a site stores job environments. An exported `HF_TOKEN`
would go everywhere, though only `prepare_model` and `fetch_dataset` (local rules, on the submitting host) and
the check before the first job download anything. So:

- `keep_from_jobs(environ)`, in the submitting process while the workflow parses: an exported token is moved
  into a file only the user can read, in a fresh private directory (`tempfile.mkdtemp`: mode 0700, a name no one
  can guess), and `HF_TOKEN_PATH` names that file: huggingface_hub's own lookup finds it there for the local
  download rules, and sbatch passes no token. The directory is removed when the run ends. A token stored by
  `hf auth login` (a file in the user's home, never in the environment) is left as it is.
- `offline_job(environ)`, in a job's own Snakemake (a cluster job): nothing is downloaded there, so the Hub is
  switched off (`HF_HUB_OFFLINE`, `HF_DATASETS_OFFLINE`) and no token variable is left for the job's scripts.

Read by the Snakefile while it parses: standard library only.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
OFFLINE_VARS = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def keep_from_jobs(environ=os.environ) -> str | None:
    """Move an exported token out of `environ` into a private file named by `HF_TOKEN_PATH` (see the module).
    Returns a note, or None when no token was exported."""
    token = next((environ[name] for name in TOKEN_VARS if environ.get(name)), None)
    if token is None:
        return None
    folder = Path(tempfile.mkdtemp(prefix="arithmech-hub-"))  # 0700, unpredictable
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token)
    for name in TOKEN_VARS:
        environ.pop(name, None)
    environ["HF_TOKEN_PATH"] = str(path)
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:  # imported already: its file path was read at import
        hub.HF_TOKEN_PATH = str(path)
    return ("HF_TOKEN is kept out of the jobs' environment (sbatch --export=ALL would pass it to every job): only "
            "the download rules on this host read it, from a private file removed when the run ends")


def offline_job(environ=os.environ) -> None:
    """A cluster job's environment: the Hub off, no token variable (see the module)."""
    for name in (*TOKEN_VARS, "HF_TOKEN_PATH"):
        environ.pop(name, None)
    environ.update(OFFLINE_VARS)
