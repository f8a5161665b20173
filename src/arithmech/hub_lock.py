"""The Hub revisions a working directory's runs downloaded, pinned in a lock file: `hub.lock.yaml` beside
`results/` (the directory Snakemake runs in), one commit for each Hub model and data set at the revision its
config names (`revision`, default `main`).

The first download of `org/name@main` records the commit `main` resolved to; every later download of it
(prepare_model or fetch_dataset re-run, a new results/ in the same directory) resolves `main` again, and stops,
naming both commits, when the Hub has moved it since. To take the new commit, move or delete the lock file (or
its line); to stay on the old one, give that commit as the config's `revision`. A commit hash pins the content
itself (a Git commit hashes the repository's files, large files by their sha256), so the commit is also the
download's checksum.

Torch-free; huggingface_hub is imported by the functions that ask the Hub.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

import yaml

from arithmech.io import atomic_path

LOCK_FILE = "hub.lock.yaml"  # relative to the working directory, as results/ is
KINDS = {"model": "models", "dataset": "datasets"}  # huggingface_hub's repo_type -> the lock's section
COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HEADER = """\
# Hub commits that this directory's arithmech runs downloaded, as `org/name@revision: commit`.
# A run stops when a revision now resolves to another commit: delete this file (or the line) to accept the new
# commit, or give the old commit as the config's `revision` to stay on it (docs/configuration.md).
"""


class HubRevisionError(RuntimeError):
    """The Hub's revision resolves to a commit other than the one the lock file pinned."""


def resolve_commit(repo_id: str, revision: str | None, repo_type: str, cache_dir: Path | None = None) -> str:
    """The commit `revision` (None: main) of Hub repository `repo_id` (`repo_type` "model" or "dataset") points
    at now: the revision itself when it is a commit; else the Hub's answer; else, for a model with the Hub out
    of reach or HF_HUB_OFFLINE set, what the model cache `cache_dir` last saw (its refs/<revision> file, as
    snapshot_download reads it offline). Errors are huggingface_hub's, for the caller to explain."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.file_download import repo_folder_name

    revision = revision or "main"
    if COMMIT.match(revision):
        return revision
    try:
        if constants.HF_HUB_OFFLINE:
            raise ConnectionError("HF_HUB_OFFLINE is set")
        return HfApi().repo_info(repo_id, revision=revision, repo_type=repo_type, timeout=30).sha
    except Exception:
        ref = (Path(cache_dir) / repo_folder_name(repo_id=repo_id, repo_type=repo_type) / "refs" / revision
               if cache_dir is not None else None)
        if ref is not None and ref.is_file():
            return ref.read_text().strip()
        raise


def check_pinned(lock_file: str | Path | None, repo_type: str, repo_id: str, revision: str | None,
                 commit: str) -> None:
    """Raise HubRevisionError naming both commits if `lock_file` pinned `repo_id@revision` (`repo_type` "model"
    or "dataset") to a commit other than `commit`. Nothing to check without a lock file (None: none kept)."""
    if lock_file is None:
        return
    key = f"{repo_id}@{revision or 'main'}"
    known = read_lock(lock_file).get(KINDS[repo_type], {}).get(key)
    if known is not None and known != commit:
        what = "data set" if repo_type == "dataset" else "model"
        raise HubRevisionError(
            f"Hub {what} '{repo_id}' at revision '{revision or 'main'}' is now commit {commit}, but {lock_file} "
            f"pinned commit {known} when it was first downloaded here: the repository changed upstream. To use "
            f"the new commit, delete {lock_file} (or its line '{key}'); to keep the old one, set the config's "
            f"revision to {known}")


def pin(lock_file: str | Path | None, repo_type: str, repo_id: str, revision: str | None, commit: str) -> None:
    """Record in `lock_file` that `repo_id@revision` was downloaded at `commit` (after `check_pinned`, again under
    the lock: concurrent local jobs take turns through an advisory lock on its folder; the file is written whole
    and renamed). None: no lock file is kept."""
    if lock_file is None:
        return
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(lock_file.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        check_pinned(lock_file, repo_type, repo_id, revision, commit)
        pinned = read_lock(lock_file)
        section = pinned.setdefault(KINDS[repo_type], {})
        if section.get(f"{repo_id}@{revision or 'main'}") != commit:
            section[f"{repo_id}@{revision or 'main'}"] = commit
            with atomic_path(lock_file) as tmp:
                tmp.write_text(_HEADER + yaml.safe_dump(pinned, sort_keys=True))
    finally:
        os.close(folder)  # releases the lock


def read_lock(lock_file: str | Path) -> dict[str, dict[str, str]]:
    """{"models" | "datasets": {"org/name@revision": commit}} of `lock_file` ({} when there is none)."""
    lock_file = Path(lock_file)
    if not lock_file.is_file():
        return {}
    data = yaml.safe_load(lock_file.read_text()) or {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise HubRevisionError(f"{lock_file}: expected sections models and datasets of 'org/name@revision: commit' "
                               "lines; repair or delete it")
    return data
