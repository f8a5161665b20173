"""benchmarks/peer_speed.py: the helpers behind its printed ratio (each side's options handed to its own
process, median and spread, the agreement gate, which TransformerLens timings the ratio uses, the verdict),
and a smoke run of both sides on the tiny model where TransformerLens is installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import peer_speed  # noqa: E402


def logits(logit_o, logit_p):
    return {"logit_o": logit_o, "logit_p": logit_p}


def side_results(peer_full, sampled, ours=(2.0, 1.0, 3.0)):
    """An arithmech and a TransformerLens result as the side processes write them (3 samples x 2 nodes)."""
    base = logits([1.0, 2.0, 4.0], [[1.1, 0.9], [2.0, 2.2], [4.4, 3.6]])
    header = {"nodes": 2, "samples": 3, "warmup_s": 0.5}
    arithmech = {**header, "attention": "sdpa", "repeats_s": list(ours), "logits": base, "eager_logits": base}
    peer = {**header, "attention": "eager", "full_s": list(peer_full), "logits": base if peer_full else None,
            "sample_nodes": 1, "sampled": [{"fixed_s": 1.0, "nodes_s": s, "scaled_s": 1.0 + 2 * s} for s in sampled]}
    return arithmech, peer


def test_side_command_hands_the_options_to_the_side_process(tmp_path):
    args = peer_speed.parse_args(["--model-dir", str(tmp_path), "--samples", "4", "--repeats", "3",
                                  "--peer-full", "2", "--peer-nodes", "7"])
    command = peer_speed.side_command(args, "transformerlens", tmp_path / "t.json")
    assert command[:2] == [sys.executable, str(Path(peer_speed.__file__).resolve())]
    side = peer_speed.parse_args(command[2:])
    assert (side.side, side.out) == ("transformerlens", tmp_path / "t.json")
    assert all(getattr(side, name) == getattr(args, name) for name in peer_speed.SHARED)


def test_summary_and_every_repeat_printed():
    assert peer_speed.summary([5.0, 4.0, 6.0]) == {"median": 5.0, "min": 4.0, "max": 6.0, "spread": 0.4}
    assert peer_speed.describe_times([5.0, 4.0, 6.0]) == "5.00 4.00 6.00 s; median 5.00 s, spread 4.00-6.00 s (40.0%)"
    assert peer_speed.describe_times([396.26]) == "396.26 s"


def test_agreement_gate():
    arithmech, peer = side_results([100.0], [50.0])
    lines = peer_speed.check_agreement(arithmech, peer, 1e-5)
    assert "arithmech (eager) vs TransformerLens: 0.00e+00" in lines[1]
    peer["logits"] = logits([1.0, 2.0, 4.0], [[1.1, 0.9], [2.0, 2.2], [4.4, 3.7]])  # one effect off by 0.025
    with pytest.raises(SystemExit, match="disagree"):
        peer_speed.check_agreement(arithmech, peer, 1e-5)
    assert peer_speed.check_agreement(arithmech, peer, 0.03)
    peer["logits"] = None  # no complete run: nothing to compare
    with pytest.raises(SystemExit, match="no speed comparison"):
        peer_speed.check_agreement(arithmech, peer, 1.0)


def test_ratio_of_medians_and_target():
    # one complete run: the median of the sampled estimates (1 + 2 x nodes_s), the complete run beside it
    arithmech, peer = side_results([120.0], [40.0, 60.0, 50.0])
    assert peer_speed.peer_median(peer) == ("sampled estimates", 101.0)
    lines = peer_speed.timing_lines(arithmech, peer)
    assert "TransformerLens (sampled estimates) / arithmech: 101.00 / 2.00 s = 50.5x" in lines[-3]
    assert lines[-2].endswith("a complete run / arithmech median: 60.0x")
    assert lines[-1] == "target >= 50x: met"
    # three complete runs: their median
    arithmech, peer = side_results([90.0, 95.0, 80.0], [40.0, 60.0, 50.0])
    assert peer_speed.peer_median(peer) == ("complete runs", 90.0)
    lines = peer_speed.timing_lines(arithmech, peer)
    assert lines[-2].endswith("= 45.0x") and lines[-1] == "target >= 50x: NOT met"


def peer_pythonpath() -> str | None:
    """Where TransformerLens is importable from: this interpreter (""), `make peer-benchmark`'s .venv-peer/,
    or nowhere (None)."""
    if importlib.util.find_spec("transformer_lens") is not None:
        return ""
    return str(ROOT / ".venv-peer") if (ROOT / ".venv-peer" / "transformer_lens").is_dir() else None


@pytest.mark.slow
def test_smoke_run_on_the_tiny_model(tiny_dir):
    extra = peer_pythonpath()
    if extra is None:
        pytest.skip("TransformerLens is not installed (make peer-benchmark installs it into .venv-peer/)")
    path = os.pathsep.join(p for p in (extra, str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)
    # random tiny weights: small answer logits, relative effects up to ~5, so a looser tolerance
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peer_speed.py"), "--model-dir", str(tiny_dir), "--samples", "2",
         "--repeats", "3", "--peer-full", "1", "--peer-nodes", "3", "--tolerance", "1e-3"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": path},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "2 addition prompts" in out and "15 nodes; each side in its own process" in out
    assert out.index("arithmech (eager) vs TransformerLens") < out.index("3 repeats:")  # agreement first
    assert "complete runs (1):" in out and "sampled estimates (3;" in out
    assert "ratio of medians, TransformerLens (sampled estimates) / arithmech" in out
    assert "target >= 50x: " in out
