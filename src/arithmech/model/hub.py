"""The Hugging Face Hub side of a model source (`{hub: org/name, revision: ...}`): where its download goes (the
model cache directory, config key `run.model_cache`), whether that directory can take it, and one message for
each way the Hub can refuse it (gated, not found, a bad token, out of reach), naming what to do.

The token is huggingface_hub's own: `HF_TOKEN`, else the one `hf auth login` stored. It is never read into the
config, passed on or written anywhere; only whether one is set goes into a message. Torch-free: the workflow
calls these checks when a run starts (`arithmech.tools.model_access`), before any job is queued.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

# What prepare_model downloads of a Hub repository: config, safetensors weights, tokenizer (not the .bin copies).
DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.model", "tokenizer*", "*.txt", "*.py"]
TOKEN_HINT = "set HF_TOKEN or run `hf auth login`"
HUB_TIMEOUT_S = 30  # for the first question to the Hub before a run


def cache_dir(model_cache: str | None) -> Path:
    """The directory Hub downloads go to (huggingface_hub's cache layout, `models--org--name/`): config key
    `run.model_cache`, else huggingface_hub's own choice ($HF_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub)."""
    if model_cache:
        return Path(os.path.expandvars(model_cache)).expanduser().resolve()
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cache_origin(model_cache: str | None) -> str:
    """Where `cache_dir` came from, as a user would change it."""
    if model_cache:
        return "config key 'run.model_cache'"
    for variable in ("HF_HUB_CACHE", "HF_HOME"):
        if os.environ.get(variable):
            return f"${variable}, as config key 'run.model_cache' is null"
    return "huggingface_hub's default under $HOME, as config key 'run.model_cache' is null and HF_HOME is not set"


def cache_problem(directory: Path, origin: str, needed_bytes: int = 0, needed_for: str = "") -> str | None:
    """What stops `directory` from taking a download of `needed_bytes` (0: not known), or None: it cannot be
    created, is not writable (checked by writing a file there, which also holds for root), or has too little
    free space. Needs no network."""
    fix = "set run.model_cache (or HF_HOME) to a writable directory on a shared file system the compute nodes see"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".arithmech-write-check-"):
            pass
    except OSError as err:
        return f"the model cache directory {directory} ({origin}) cannot be created or written ({err}): {fix}"
    free = shutil.disk_usage(directory).free
    if needed_bytes > free:
        return (f"the model cache directory {directory} ({origin}) has {free / 1e9:.1f} GB free, and {needed_for} "
                f"need {needed_bytes / 1e9:.1f} GB: free space there, or {fix}, with room")
    return None


def cached_bytes(directory: Path, repo_id: str) -> int:
    """Bytes of `repo_id` already in the model cache (its blobs, partial downloads included: they resume)."""
    from huggingface_hub.file_download import repo_folder_name

    blobs = directory / repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"
    return sum(p.stat().st_size for p in blobs.iterdir() if p.is_file()) if blobs.is_dir() else 0


def cached_snapshot(repo_id: str, revision: str | None, directory: Path) -> Path | None:
    """The snapshot of `repo_id` at `revision` already in the model cache (so no download, and no token, is
    needed), or None. Needs no network. Complete as far as huggingface_hub can tell: it checks the file list it
    cached with the download (a folder an older huggingface_hub left has none, and counts as complete)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=directory,
                                      allow_patterns=DOWNLOAD_PATTERNS, local_files_only=True))
    except Exception:  # not cached, or cached in part: a download is needed
        return None


def access_problem(repo_id: str, revision: str | None, directory: Path | None = None) -> str | None:
    """Why the Hub would refuse to give `repo_id` at `revision` with the token huggingface_hub finds, or None.
    Asks the Hub and downloads nothing: `model_info` (the repository and revision exist; a time limit, as a
    network that drops packets would otherwise hang the run's start), then `auth_check` (a gated repository's
    licence was accepted by the token's account)."""
    from huggingface_hub import auth_check, model_info

    try:
        model_info(repo_id, revision=revision, timeout=HUB_TIMEOUT_S)
        auth_check(repo_id)
    except Exception as err:
        return hub_problem(err, repo_id, revision, directory)
    return None


def hub_problem(err: BaseException, repo_id: str, revision: str | None, directory: Path | None = None) -> str:
    """What `err`, raised by a huggingface_hub call for `repo_id`, means and what to do about it. The Hub's
    own exception may sit under others (`__cause__`): the first one of huggingface_hub's HTTP errors counts."""
    import httpx2  # huggingface_hub's HTTP client (pinned in requirements.txt)
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    chain = [err]
    while chain[-1].__cause__ is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    http = next((e for e in chain if isinstance(e, HfHubHTTPError)), None)
    page = f"https://huggingface.co/{repo_id}"
    token = token_is_set()
    if isinstance(http, GatedRepoError):
        return (f"'{repo_id}' is gated: accept its licence at {page} while signed in, and "
                + (f"give your token: {TOKEN_HINT}" if not token else
                   "check that the token (HF_TOKEN or `hf auth login`) is that account's and may read gated "
                   "repositories"))
    if isinstance(http, RevisionNotFoundError):
        return f"'{repo_id}' has no revision {revision!r}: give a branch, tag or commit listed at {page}/commits/main"
    if isinstance(http, RepositoryNotFoundError):
        return (f"'{repo_id}' was not found, or it is private or gated and "
                + (f"no token is set: check the id at {page}, then {TOKEN_HINT}" if not token else
                   f"the token cannot read it: check the id at {page} and the token's access"))
    if http is not None and http.response is not None and http.response.status_code in (401, 403):
        status = http.response.status_code
        return (f"the Hub refused the token for '{repo_id}' ({status}): "
                + (f"{TOKEN_HINT}" if not token else "set HF_TOKEN to a valid token with read access, or run "
                   "`hf auth login` again"))
    if http is not None:
        status = http.response.status_code if http.response is not None else "an error"
        return f"the Hub answered {status} for '{repo_id}': try again later"
    space = next((e for e in chain if isinstance(e, OSError) and e.errno == errno.ENOSPC), None)
    cache = f"the model cache directory {directory}" if directory else "the model cache directory"
    if space is not None:
        return (f"{cache} ran out of space ({space}): free space there, or set run.model_cache (or HF_HOME) to a "
                "directory with room")
    if any(isinstance(e, HFValidationError) for e in chain):
        return f"'{repo_id}' is not a Hub id ({first_line(err)}): give it as org/name"
    offline = (httpx2.TransportError, ConnectionError, TimeoutError, LocalEntryNotFoundError)
    if any(isinstance(e, offline) for e in chain):
        part = "only in part" if any(isinstance(e, IncompleteSnapshotError) for e in chain) else "not"
        return (f"the Hub cannot be reached ({type(chain[-1]).__name__}: {first_line(chain[-1])}) and '{repo_id}' "
                f"is {part} in {cache}: run where the Hub can be reached (prepare_model runs on the submit host; "
                "unset HF_HUB_OFFLINE if set), or give a local copy as the model's source "
                "{path: /dir/with/config.json}")
    return f"'{repo_id}' could not be fetched ({type(err).__name__}: {first_line(err)})"


def token_is_set() -> bool:
    """Whether huggingface_hub finds a token (HF_TOKEN or `hf auth login`'s file); the token itself stays there."""
    from huggingface_hub import get_token

    try:
        return get_token() is not None
    except Exception:  # an OIDC exchange that fails: there is no usable token
        return False


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
