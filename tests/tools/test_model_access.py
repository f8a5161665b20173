"""Gated and large Hub models: the model cache directory (`run.model_cache`), the token (huggingface_hub's own:
HF_TOKEN or `hf auth login`), the revision, and the check before any job is queued (`tools.model_access`).

The Hub is out of reach from this machine, so the tests that need its answers talk to a stand-in: a function
that answers huggingface_hub's requests as the Hub does (status codes and the `X-Error-Code` headers its
`hf_raise_for_status` turns into GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError or a 401
HfHubHTTPError), plugged in as huggingface_hub's HTTP transport (in this process) or served on 127.0.0.1 as
HF_ENDPOINT (for a snakemake run). huggingface_hub's own code runs unchanged on both sides of it. The model
cache and offline mode are real: a cache laid out as huggingface_hub lays it out, read by snapshot_download."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import httpx2
import pytest
import yaml
from huggingface_hub import constants, set_client_factory
from huggingface_hub.utils._http import default_client_factory, hf_request_event_hook

from arithmech import hub_lock
from arithmech.model import hub
from arithmech.model.loading import ModelSourceError, load_model, prepare_model
from arithmech.model.tiny import build_tiny_model
from arithmech.tools.model_access import ModelAccessError, check_models, download_needs
from helpers import ROOT

MARKER = "hf_MARKERtoken0123456789"  # stands for a real token: it must never reach an output, log or message
SHA = "0123456789abcdef0123456789abcdef01234567"  # the commit the stand-in's `main` points at
GATED, MISSING, OPEN = "meta-llama/Llama-2-7b-hf", "org/no-such-model", "mistralai/Mistral-7B-v0.1"
DATA = "cais/mmlu"  # an open Hub data set
OTHER = "fedcba9876543210fedcba9876543210fedcba98"  # a commit the stand-in's `main` pointed at before


def hub_answer(method: str, path: str, authorization: str | None) -> tuple[int, dict, bytes]:
    """The Hub's answer (status, headers, body) to a request of huggingface_hub, for three repositories: GATED
    (public metadata, files behind a licence nobody here accepted), OPEN, and anything else (not found). A
    token "bad" is invalid; revisions other than main and SHA do not exist."""
    token = authorization.removeprefix("Bearer ") if authorization else None
    if path == "/api/agent-harnesses":  # huggingface_hub's user-agent registry, fetched once a day
        return 200, {}, json.dumps({"standardEnvVars": [], "harnesses": {}}).encode()

    def error(status: int, code: str | None, message: str) -> tuple[int, dict, bytes]:
        headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {})}
        return status, headers, json.dumps({"error": message}).encode()

    if token == "bad":
        return error(401, None, "Invalid credentials in Authorization header")
    repo = next((r for r in (GATED, OPEN, DATA) if f"/{r}/" in path + "/"), None)
    if repo is None:
        return error(401 if token is None else 404, "RepoNotFound", "Repository not found")
    if "/revision/" in path and path.rsplit("/", 1)[1] not in ("main", SHA):
        return error(404, "RevisionNotFound", "Invalid rev id")
    if path.endswith("/auth-check") or "/resolve/" in path:
        if repo == GATED:  # no token: 401; a token whose account has not accepted the licence: 403
            return error(401 if token is None else 403, "GatedRepo",
                         f"Access to model {repo} is restricted. You must have access to it and be authenticated.")
        return 200, {}, b"{}"
    if "/tree/" in path:
        return 200, {}, json.dumps([{"type": "file", "path": "config.json", "size": 2, "oid": "ab" * 20}]).encode()
    return 200, {}, json.dumps({"id": repo, "sha": SHA, "siblings": [{"rfilename": "config.json"}]}).encode()


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    """No HF_TOKEN and no token stored by `hf auth login`: huggingface_hub's files (that token, the registry of
    user agents it caches) are under tmp_path."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf-home" / ".agent_harnesses.json"))


@pytest.fixture
def stand_in_hub(no_token):
    """huggingface_hub's requests in this process go to `hub_answer`; returns the requests about repositories it
    saw: (method, path, Authorization header)."""
    seen = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path != "/api/agent-harnesses":
            seen.append((request.method, request.url.path, request.headers.get("authorization")))
        status, headers, body = hub_answer(request.method, request.url.path, request.headers.get("authorization"))
        return httpx2.Response(status, headers=headers, content=body)

    set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(handle), follow_redirects=True,
                                             event_hooks={"request": [hf_request_event_hook]}))
    yield seen
    set_client_factory(default_client_factory)


def run_config(*models: str, model_cache) -> dict:
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["models"]["open"] = {"source": {"hub": OPEN}}
    config["models"]["missing"] = {"source": {"hub": MISSING}}
    config["run"].update(models=list(models), model_cache=str(model_cache))
    return config


def check_message(config, workdir) -> str:
    with pytest.raises(ModelAccessError) as err:
        check_models(config, workdir=workdir)
    return str(err.value)


def hub_cache(cache: Path, repo: str, **tiny) -> Path:
    """A model cache holding `repo` at SHA (its `main`), laid out as snapshot_download leaves it, with a tiny
    model's files as the snapshot."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(SHA)
    build_tiny_model(folder / "snapshots" / SHA, n_layers=2, **tiny)
    return folder / "snapshots" / SHA


# ---------------------------------------------------------------------------------------------------
# The Hub's refusals: one message naming the model, the repository and what to do


def test_gated_model_without_a_token_names_the_licence_and_the_token(stand_in_hub, tmp_path):
    """Stand-in Hub (the Hub is out of reach here): a gated repository asked without a token answers 401
    GatedRepo; the one error names the model, its config key, the licence page and both ways to give a token."""
    message = check_message(run_config("llama2-7b", model_cache=tmp_path / "cache"), tmp_path)
    assert "model 'llama2-7b' (config key 'models.llama2-7b.source')" in message
    assert f"'{GATED}' is gated: accept its licence at https://huggingface.co/{GATED}" in message
    assert "set HF_TOKEN or run `hf auth login`" in message
    assert message.count("\n  ") == 1  # one problem, one line
    assert [path for _, path, _ in stand_in_hub] == [f"/api/models/{GATED}/revision/main",  # config.yaml's revision
                                                     f"/api/models/{GATED}/auth-check"]


def test_gated_model_with_a_token_not_yet_let_in(stand_in_hub, tmp_path, monkeypatch):
    """Stand-in Hub (out of reach here): with HF_TOKEN set, the Hub gets it (huggingface_hub's own resolution)
    and answers 403 GatedRepo; the message says to accept the licence with that account, never the token."""
    monkeypatch.setenv("HF_TOKEN", MARKER)
    message = check_message(run_config("llama2-7b", model_cache=tmp_path / "cache"), tmp_path)
    assert f"accept its licence at https://huggingface.co/{GATED}" in message and "that account's" in message
    assert MARKER not in message
    assert {auth for _, _, auth in stand_in_hub} == {f"Bearer {MARKER}"}


def test_the_token_of_hf_auth_login_is_used(stand_in_hub, tmp_path):
    """Stand-in Hub (out of reach here): no HF_TOKEN, but the file `hf auth login` writes: the Hub gets it."""
    token_file = Path(constants.HF_TOKEN_PATH)
    token_file.parent.mkdir(parents=True)
    token_file.write_text(MARKER)
    check_models(run_config("open", model_cache=tmp_path / "cache"), workdir=tmp_path)  # no problem
    assert {auth for _, _, auth in stand_in_hub} == {f"Bearer {MARKER}"}


def test_missing_repository_bad_token_and_bad_revision(stand_in_hub, tmp_path, monkeypatch):
    """Stand-in Hub (out of reach here): 401 RepoNotFound without a token, 404 RevisionNotFound for a revision
    that does not exist, 401 for an invalid token; each its own line of one error."""
    config = run_config("missing", "open", model_cache=tmp_path / "cache")
    config["models"]["open"]["source"]["revision"] = "v9"
    message = check_message(config, tmp_path)
    assert f"model 'missing' (config key 'models.missing.source'): '{MISSING}' was not found" in message
    assert "no token is set" in message and "set HF_TOKEN or run `hf auth login`" in message
    assert f"model 'open' (config key 'models.open.source'): '{OPEN}' has no revision 'v9'" in message
    monkeypatch.setenv("HF_TOKEN", "bad")
    message = check_message(run_config("open", model_cache=tmp_path / "cache"), tmp_path)
    assert f"the Hub refused the token for '{OPEN}' (401)" in message and "HF_TOKEN" in message


def test_unreachable_hub_says_so(no_token, tmp_path, monkeypatch):
    """HF_HUB_OFFLINE (huggingface_hub's real offline mode): no request leaves, and the error says the Hub cannot
    be reached and what to do instead."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    message = check_message(run_config("llama2-7b", model_cache=tmp_path / "cache"), tmp_path)
    assert "model 'llama2-7b'" in message and "the Hub cannot be reached (OfflineModeIsEnabled" in message
    assert "unset HF_HUB_OFFLINE" in message and "{path: /dir/with/config.json}" in message


def test_prepare_model_gives_the_same_message(stand_in_hub, tmp_path):
    """Stand-in Hub (out of reach here): prepare_model, run later as a job, downloads with snapshot_download:
    the metadata is public, the file download answers 401 GatedRepo; its error is the check's, and nothing is
    left behind."""
    with pytest.raises(ModelSourceError) as err:
        prepare_model({"hub": GATED}, tmp_path / "model", model_cache=str(tmp_path / "cache"), model="llama2-7b")
    message = str(err.value)
    assert message.startswith(f"could not download '{GATED}' (revision main) for model 'llama2-7b': ")
    assert message.endswith(hub.hub_problem(err.value.__cause__, GATED, None))
    assert "accept its licence" in message
    assert any("/resolve/" in path for _, path, _ in stand_in_hub)  # it got as far as the weights
    assert not (tmp_path / "model").exists()


# ---------------------------------------------------------------------------------------------------
# The model cache directory: created, writable, room for the weights; no network needed


def test_cache_directory_that_cannot_be_written(stand_in_hub, tmp_path):
    """A cache under a regular file cannot be created (root included); the error names run.model_cache."""
    (tmp_path / "file").write_text("x")
    message = check_message(run_config("open", model_cache=tmp_path / "file" / "cache"), tmp_path)
    assert f"the model cache directory {tmp_path / 'file' / 'cache'} (config key 'run.model_cache') cannot be " \
           "created or written" in message
    assert "set run.model_cache (or HF_HOME)" in message
    with pytest.raises(ModelSourceError, match="cannot be created or written"):
        prepare_model({"hub": OPEN}, tmp_path / "model", model_cache=str(tmp_path / "file" / "cache"))


def test_cache_check_needs_no_network(no_token, tmp_path, monkeypatch):
    """Offline, the cache's problem is still found, beside the Hub's."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "file").write_text("x")
    message = check_message(run_config("llama2-7b", model_cache=tmp_path / "file" / "cache"), tmp_path)
    assert "cannot be created or written" in message and "the Hub cannot be reached" in message


def test_cache_without_room(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert hub.cache_problem(tmp_path, "config key 'run.model_cache'", free // 2, "the weights") is None
    problem = hub.cache_problem(tmp_path, "config key 'run.model_cache'", free + 10**12, "the weights")
    assert f"has {free / 1e9:.1f} GB free, and the weights need {(free + 10**12) / 1e9:.1f} GB" in problem
    assert "set run.model_cache (or HF_HOME)" in problem


def test_download_needs_from_the_plans_shapes(tmp_path):
    """Parameters x 2 bytes (16-bit safetensors) for the models the plan knows, less what the cache holds
    (a sparse blob stands for a partial download); one repository counts once; unknown ones are left out."""
    sources = {"a": {"hub": GATED}, "b": {"hub": GATED, "revision": "main"}, "c": {"hub": "org/unknown"},
               "d": {"hub": OPEN}}
    assert download_needs(sources, tmp_path) == {GATED: 6738415616 * 2, OPEN: 7241732096 * 2}
    blobs = tmp_path / "models--meta-llama--Llama-2-7b-hf" / "blobs"
    blobs.mkdir(parents=True)
    with open(blobs / "partial.incomplete", "wb") as f:
        f.truncate(13_000_000_000)
    assert download_needs(sources, tmp_path)[GATED] == 6738415616 * 2 - 13_000_000_000


def test_the_paper_models_need_54_gb(stand_in_hub, tmp_path):
    """configs/paper-models.yaml's three models need 54.0 GB; a cache on /dev/shm (a small tmpfs here) says
    so before any download, beside the Hub's answers."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shutil.disk_usage(shm).free > 54e9:
        pytest.skip("needs /dev/shm with less than 54 GB free")
    cache = Path(os.path.join(shm, f"arithmech-test-{os.getpid()}"))
    try:
        message = check_message(run_config("llama2-7b", "llama2-13b", "mistral-7b", model_cache=cache), tmp_path)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    assert "models llama2-7b, llama2-13b, mistral-7b: the model cache directory" in message
    assert "meta-llama/Llama-2-13b-hf 26.0 GB, meta-llama/Llama-2-7b-hf 13.5 GB, mistralai/Mistral-7B-v0.1 " \
           "14.5 GB" in message and "need 54.0 GB" in message


# ---------------------------------------------------------------------------------------------------
# What needs no check: prepared models, models complete in the cache, non-Hub sources


def test_nothing_to_download_asks_nothing(stand_in_hub, tmp_path):
    """A model already prepared, a snapshot already complete in the cache (no token needed then) and a local or
    tiny source: no request to the Hub, and no error."""
    config = run_config("llama2-7b", "open", "smollm2-135m", model_cache=tmp_path / "cache")
    (tmp_path / "results" / "llama2-7b" / "model").mkdir(parents=True)
    (tmp_path / "results" / "llama2-7b" / "model" / "source.json").write_text("{}")
    hub_cache(tmp_path / "cache", OPEN)
    check_models(config, workdir=tmp_path)
    assert stand_in_hub == []


# ---------------------------------------------------------------------------------------------------
# The revision: the resolved commit is recorded


def test_hub_source_records_the_resolved_commit(no_token, tmp_path, monkeypatch):
    """snapshot_download, offline, on a real cache layout: `revision: main` resolves to the commit `main` points
    at, which source.json records beside the source as given; the model loads from the cache."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snapshot = hub_cache(tmp_path / "cache", "org/tiny")
    record = prepare_model({"hub": "org/tiny", "revision": "main"}, tmp_path / "model",
                           model_cache=str(tmp_path / "cache"), model="tiny")
    assert record["revision"] == SHA and record["source"] == {"hub": "org/tiny", "revision": "main"}
    assert record["load_from"] == str(snapshot.resolve())
    assert json.loads((tmp_path / "model" / "source.json").read_text())["revision"] == SHA
    assert load_model(tmp_path / "model", device="cpu").n_layers == 2
    by_commit = prepare_model({"hub": "org/tiny", "revision": SHA}, tmp_path / "model2",
                              model_cache=str(tmp_path / "cache"))
    assert by_commit["revision"] == SHA and by_commit["sha256"] == record["sha256"]


def test_a_moved_revision_stops_prepare_model_naming_both_commits(no_token, tmp_path, monkeypatch):
    """Offline, on a real cache layout: the first download of org/tiny@main pins its commit in the lock file; when
    `main` has moved on (the cache's ref, as a later download leaves it), preparing it again stops before loading
    anything, naming both commits and the lock; once the user moves the lock away, the new commit is taken and
    pinned. Before, nothing was pinned and the new weights were used silently."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cache, lock = tmp_path / "cache", tmp_path / "hub.lock.yaml"
    snapshot = hub_cache(cache, "org/tiny")
    prepare_model({"hub": "org/tiny"}, tmp_path / "model", model_cache=str(cache), model="tiny", lock=lock)
    assert hub_lock.read_lock(lock) == {"models": {"org/tiny@main": SHA}}
    (snapshot.parent.parent / "refs" / "main").write_text(OTHER)
    shutil.copytree(snapshot, snapshot.parent / OTHER)
    with pytest.raises(ModelSourceError) as err:
        prepare_model({"hub": "org/tiny"}, tmp_path / "again", model_cache=str(cache), model="tiny", lock=lock)
    assert f"Hub model 'org/tiny' at revision 'main' is now commit {OTHER}, but {lock} pinned commit {SHA}" \
        in str(err.value) and str(err.value).startswith("could not download 'org/tiny' (revision main) for model")
    assert f"delete {lock} (or its line 'org/tiny@main')" in str(err.value)
    assert not (tmp_path / "again").exists()
    lock.rename(tmp_path / "old.lock.yaml")  # the user accepts the new commit
    record = prepare_model({"hub": "org/tiny"}, tmp_path / "again", model_cache=str(cache), model="tiny", lock=lock)
    assert record["revision"] == OTHER and hub_lock.read_lock(lock) == {"models": {"org/tiny@main": OTHER}}
    by_commit = {"hub": "org/tiny", "revision": SHA}  # the old commit given as the revision: pinned as itself
    assert prepare_model(by_commit, tmp_path / "old", model_cache=str(cache), lock=lock)["revision"] == SHA


def test_the_lock_is_checked_against_the_hubs_answer_before_any_download(stand_in_hub, tmp_path):
    """Stand-in Hub (out of reach here): `main` of the open model resolves to SHA on the Hub, the lock pinned
    OTHER: prepare_model stops naming both, and no file was asked for."""
    lock = tmp_path / "hub.lock.yaml"
    lock.write_text(yaml.safe_dump({"models": {f"{OPEN}@main": OTHER}}))
    with pytest.raises(ModelSourceError) as err:
        prepare_model({"hub": OPEN}, tmp_path / "model", model_cache=str(tmp_path / "cache"), model="open", lock=lock)
    assert f"is now commit {SHA}, but {lock} pinned commit {OTHER}" in str(err.value)
    assert [path for _, path, _ in stand_in_hub] == [f"/api/models/{OPEN}/revision/main"]


def test_a_hub_data_set_records_its_commit_and_is_checked_against_the_lock(stand_in_hub, tmp_path, monkeypatch):
    """Stand-in Hub (out of reach here) for the revision, a local table for the download: fetch resolves `main`
    to its commit, downloads by that commit, records it in the file's provenance and pins it in the lock; a lock
    that pinned another commit stops the fetch naming both, and the fetched file stays as it was."""
    import datasets

    from arithmech.data.eval_sets import fetch
    from arithmech.io import read_parquet_meta

    asked = []

    def load_dataset(path, name=None, split=None, revision=None, cache_dir=None):
        asked.append((path, revision))
        return datasets.Dataset.from_dict({"question": ["What is 2 + 3?"], "choices": [["4", "5"]], "answer": [1]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    out, lock = tmp_path / "results" / "data" / "mmlu.parquet", tmp_path / "hub.lock.yaml"
    fetch("mmlu", {"path": DATA, "name": "all", "split": "test"}, out, lock)
    assert asked == [(DATA, SHA)] and hub_lock.read_lock(lock) == {"datasets": {f"{DATA}@main": SHA}}
    meta = read_parquet_meta(out)
    assert (meta["revision"], meta["hub"]) == (SHA, {"path": DATA, "name": "all", "split": "test"})
    lock.write_text(yaml.safe_dump({"datasets": {f"{DATA}@main": OTHER}}))
    before = out.read_bytes()
    with pytest.raises(RuntimeError, match=f"Hub data set '{DATA}' at revision 'main' is now commit {SHA}, but "
                                           f"{lock} pinned commit {OTHER}"):
        fetch("mmlu", {"path": DATA, "name": "all", "split": "test"}, out, lock)
    assert len(asked) == 1 and out.read_bytes() == before


def test_model_cache_default_is_huggingface_hubs(monkeypatch, tmp_path):
    """null: huggingface_hub's own cache (HF_HUB_CACHE, from HF_HOME); a config value wins, ~ and $VARS
    expanded."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert hub.cache_dir(None) == tmp_path / "hf-home" / "hub"
    assert hub.cache_origin(None).startswith("$HF_HOME")
    monkeypatch.setenv("ARITHMECH_SCRATCH", str(tmp_path / "scratch"))
    assert hub.cache_dir("$ARITHMECH_SCRATCH/hf") == tmp_path / "scratch" / "hf"
    assert hub.cache_origin("$ARITHMECH_SCRATCH/hf") == "config key 'run.model_cache'"


# ---------------------------------------------------------------------------------------------------
# Through the workflow


class HubHandler(http.server.BaseHTTPRequestHandler):
    """`hub_answer` served over HTTP, for a snakemake run pointed at it with HF_ENDPOINT."""

    seen: list = []

    def do_GET(self):
        self.seen.append((self.command, self.path.split("?")[0], self.headers.get("Authorization")))
        status, headers, body = hub_answer(self.command, self.path.split("?")[0], self.headers.get("Authorization"))
        self.send_response(status)
        for key, value in {**headers, "Content-Type": "application/json", "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def snakemake(workdir: Path, config: dict, *targets: str, env: dict) -> subprocess.CompletedProcess:
    shutil.copy2(ROOT / "config.yaml", workdir / "config.yaml")  # the Snakefile's configfile, in the workdir
    (workdir / "run.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONHASHSEED": "0", "HF_HOME": str(workdir / "hf-home"), **env}  # no stored token
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        env.setdefault(name, "")
    cmd = [sys.executable, "-m", "snakemake", *targets, "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--cores", "1", "--configfile", str(workdir / "run.yaml")]
    return subprocess.run(cmd, capture_output=True, text=True, env={k: v for k, v in env.items() if v}, cwd=workdir,
                          timeout=600)


@pytest.mark.slow
def test_workflow_stops_before_any_job_for_a_gated_model(tmp_path):
    """Stand-in Hub on 127.0.0.1 (the real Hub is out of reach here), HF_TOKEN set: the run ends at its start
    with the one error, no job runs, and the token is nowhere in what it printed."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = {"run": {"models": ["llama2-7b"], "model_cache": str(tmp_path / "cache")}}
        proc = snakemake(tmp_path, config, env={"HF_TOKEN": MARKER,
                                                "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}"})
    finally:
        server.shutdown()
    assert proc.returncode != 0
    assert "ModelAccessError" in proc.stderr and f"accept its licence at https://huggingface.co/{GATED}" in proc.stderr
    assert "model 'llama2-7b' (config key 'models.llama2-7b.source')" in proc.stderr
    assert not (tmp_path / "results").exists()  # no job ran
    assert (f"/api/models/{GATED}/auth-check", f"Bearer {MARKER}") in {(p, a) for _, p, a in HubHandler.seen}
    assert MARKER not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_workflow_downloads_into_the_model_cache_and_writes_no_token(tmp_path):
    """The prepare_model rule with HF_TOKEN set to a marker: a Hub source found offline in `run.model_cache`
    (the real snapshot_download on a real cache layout) and the tiny source. source.json points into the cache
    with the resolved commit, and no file the run wrote (results, logs, .snakemake) holds the marker."""
    work = tmp_path / "work"
    work.mkdir()
    snapshot = hub_cache(tmp_path / "cache", "org/tiny", seed=1)
    config = {"run": {"models": ["hubtiny", "tiny"], "model_cache": str(tmp_path / "cache")},
              "models": {"hubtiny": {"source": {"hub": "org/tiny"}},
                         "tiny": {"source": {"tiny": {"seed": 0, "n_layers": 2}}}}}
    proc = snakemake(work, config, "results/hubtiny/model", "results/tiny/model",
                     env={"HF_TOKEN": MARKER, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((work / "results" / "hubtiny" / "model" / "source.json").read_text())
    assert record["load_from"] == str(snapshot.resolve()) and record["revision"] == SHA
    written = [p for p in work.rglob("*") if p.is_file() and p.name not in ("run.yaml", "config.yaml")]
    assert not (work / "hf-home" / "hub").exists()  # the download went to run.model_cache, not HF_HOME's cache
    assert any(p.name == "prepare_model.log" for p in written) and len(written) > 5
    assert [p for p in written if MARKER.encode() in p.read_bytes()] == []
    assert MARKER not in proc.stdout + proc.stderr
