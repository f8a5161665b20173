"""Atomic writers for files (Parquet, safetensors, JSON) and directories, and the provenance stamped into
every result.

Every writer writes to a temporary file or directory next to the target and renames it into place, so a
killed job never leaves a half-written result that a re-run would mistake for a finished one.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import html
import json
import os
import platform
import shutil
import stat
import tempfile
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

PROVENANCE_KEY = b"arithmech"
# Set to 1, model copies and checkpoints keep the group's write bit where the umask gives it (a team that shares them)
GROUP_WRITABLE_ENV = "ARITHMECH_GROUP_WRITABLE"
_VERSIONED = ("arithmech", "torch", "transformers", "numpy", "pandas", "pyarrow", "safetensors", "snakemake")


@contextmanager
def atomic_path(path: str | Path, protect: bool = False) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto `path` only if the block succeeds. With
    `protect` (model copies, checkpoints) the file is writable by its owner alone (`protected_bits`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    mode = 0o666 & ~_umask()  # mkstemp makes the file private; results are meant to be shared
    if protect:
        mode &= ~protected_bits()
    tmp.chmod(mode)
    try:
        yield tmp
        if tmp.exists():
            tmp.chmod(mode)  # writers that replace the file (safetensors) bring back a private mode
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path, protect: bool = False) -> Iterator[Path]:
    """Yield a new empty directory next to `path`; if the block succeeds it takes the place of `path` (a
    directory or nothing), else it is removed. With `protect` (model copies, checkpoints) the directory and
    everything written in it lose the write bits of `protected_bits` before it takes its place.

    A directory cannot be renamed onto a non-empty one, so an old `path` is first renamed aside, into a
    hidden `.{name}.old-*` sibling, and removed once the new one is in place. A kill at any point leaves at
    `path` the old directory, nothing (between the two renames; the old one is then in its hidden
    sibling), or the complete new one, never a half-written one. Hidden siblings that a killed write left
    are removed by the next write to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    name = glob.escape(path.name)
    for stale in [*path.parent.glob(f".{name}.tmp-*"), *path.parent.glob(f".{name}.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    tmp.chmod(0o777 & ~_umask() & ~(protected_bits() if protect else 0))  # mkdtemp's is private; results are shared
    try:
        yield tmp
        if protect:
            protect_tree(tmp)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def protected_bits() -> int:
    """The write bits that model copies and checkpoints never have, whatever the umask: the group's and others'
    (a group-writable results/ otherwise lets a group member swap the weights a later job loads or resumes
    from), or only others' where ARITHMECH_GROUP_WRITABLE=1 asks for group-writable ones."""
    return stat.S_IWOTH if os.environ.get(GROUP_WRITABLE_ENV) == "1" else stat.S_IWGRP | stat.S_IWOTH


def protect_tree(root: str | Path) -> None:
    """Clear `protected_bits` on `root` and on everything under it (symlinks are left alone, not followed)."""
    bits = protected_bits()
    for path in [Path(root), *Path(root).rglob("*")]:
        info = path.lstat()
        if not stat.S_ISLNK(info.st_mode) and info.st_mode & bits:
            path.chmod(stat.S_IMODE(info.st_mode) & ~bits)


def path_problem(path: str | Path) -> str | None:
    """Why `path` (a file or directory) could have been written by another user, or None: a symlink, another
    owner, or a write bit of `protected_bits`."""
    info = Path(path).lstat()
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symlink"
    if info.st_uid != os.geteuid():
        return f"{path} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
    if info.st_mode & protected_bits():
        who = "others" if info.st_mode & stat.S_IWOTH else "its group"
        return f"{path} is writable by {who} (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def tree_problem(root: str | Path) -> str | None:
    """`path_problem` of `root` or of the first thing under it that has one, or None. What a job trusts enough to
    unpickle (a checkpoint) passes this."""
    for path in [Path(root), *sorted(Path(root).rglob("*"))]:
        problem = path_problem(path)
        if problem:
            return problem
    return None


def package_versions() -> dict[str, str]:
    """Versions of Python and of the packages that shape the numbers."""
    versions = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


@functools.cache
def source_digest() -> str:
    """sha256 over the arithmech package's Python sources (relative path and content, in path order): which
    code produced a result, whether or not the workflow sits in a git checkout. A library change does not
    re-run finished jobs (Snakemake only watches rule scripts); compare this digest to see which results an
    edit left stale, and force those rules with `snakemake -R <rule>`."""
    return tree_digest(Path(__file__).resolve().parent)


def tree_digest(root: Path) -> str:
    """sha256 over the *.py files under `root`: relative path and content, in path order."""
    digest = hashlib.sha256()
    for path in sorted(Path(root).rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def config_hash(config: dict) -> str:
    """A short, order-independent hash of a (sub-)config."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def provenance(**extra) -> dict:
    """What to record next to a result: package versions, the library's source digest, and whatever the
    caller adds (model checksum and revision, config hash)."""
    return {"versions": package_versions(), "arithmech_source_sha256": source_digest(), **extra}


def write_parquet(df: pd.DataFrame, path: str | Path, meta: dict | None = None) -> None:
    """Write `df` atomically, with `meta` (JSON) in the file's schema metadata under b'arithmech'."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    if meta is not None:
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), PROVENANCE_KEY: json.dumps(meta, sort_keys=True, default=str)}
        )
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet_meta(path: str | Path) -> dict:
    """The provenance dictionary written by `write_parquet` ({} when absent)."""
    raw = (pq.read_schema(path).metadata or {}).get(PROVENANCE_KEY)
    return json.loads(raw) if raw else {}


def write_safetensors(tensors: dict, path: str | Path, meta: dict | None = None) -> None:
    """Write tensors atomically; `meta` is stored as one JSON string in the safetensors header."""
    from safetensors.torch import save_file  # torch only for the jobs that write tensors

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    header = {"arithmech": json.dumps(meta, sort_keys=True, default=str)} if meta is not None else None
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=header)


def write_html_table(df: pd.DataFrame, path: str | Path, title: str, float_format: str = "{:.4g}") -> None:
    """A standalone HTML page with one table (what the Snakemake report shows for a Parquet result)."""
    write_html_page([("", df, "")], path, title, float_format)


def write_html_page(sections: list[tuple[str, pd.DataFrame, str]], path: str | Path, title: str,
                    float_format: str = "{:.4g}") -> None:
    """A standalone HTML page: the title, then per section (heading, table, note) its heading, the table and
    the note below it (plain text; empty strings are left out)."""
    body = [f"<h2>{html.escape(title)}</h2>"]
    for heading, df, note in sections:
        if heading:
            body.append(f"<h3>{html.escape(heading)}</h3>")
        body.append(df.to_html(index=False, na_rep="", float_format=float_format.format, border=0))
        if note:
            body.append(f"<p>{html.escape(note)}</p>")
    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}p{max-width:60em}"
        "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
    with atomic_path(path) as tmp:
        tmp.write_text(page)


def write_json(obj, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
