"""What test modules share and that is not a fixture (the fixtures are in conftest.py): the repository root, the
smoke configuration and a Snakemake runner on a copy of the project, a fresh checkout and a user's own profile, a
prepared model's folder, a tiny GGUF file, the stage tests' tiny prompts and model preparation, the findings tests'
example tables, the prompt config, a hook counter, the distributed tests' ranks and what `make docs` must do on a
results tree. Test modules import it as `helpers` (pytest puts tests/ on the path: pyproject.toml); no test module
imports another (tests/project/test_test_imports.py)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from snakemake.utils import update_config

from arithmech.sft import distributed

ROOT = Path(__file__).resolve().parents[1]  # tests/ -> the repository


TINY_CONFIG = ROOT / "tests/config/tiny.yaml"  # the runnable smoke configuration: every rule on a tiny model


def tiny_config(model_dir: Path | None = None) -> dict:
    """config.yaml with tests/config/tiny.yaml merged over it, as `snakemake --configfile` merges them; with
    `model_dir`, the tiny model is that directory instead of one built by prepare_model."""
    # In the order Snakemake 9 merges: the --configfile's keys first, then config.yaml's others, then the
    # --configfile's values again. Snakemake compares dict params in order, so another order re-runs jobs.
    tiny = yaml.safe_load(TINY_CONFIG.read_text())
    config = copy.deepcopy(tiny)
    update_config(config, yaml.safe_load((ROOT / "config.yaml").read_text()))
    update_config(config, tiny)
    if model_dir is not None:
        config["models"]["tiny"]["source"] = {"path": str(model_dir)}
    return config


PROJECT = ("Snakefile", "workflow", "envs", "src", "resources")  # what a checkout needs to run


def copy_project(dest: Path) -> Path:
    """The workflow as a user has it: a checkout (these files) whose results land inside it."""
    for name in PROJECT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run snakemake in `workdir`: from its own checkout (its Snakefile, and its src/ first on the Python
    path) where it is one, else the repository's Snakefile with `--directory workdir`."""
    env = {**os.environ, "PYTHONHASHSEED": "0", **(env or {})}
    if (workdir / "Snakefile").is_file():
        cmd = [sys.executable, "-m", "snakemake"]
        env["PYTHONPATH"] = os.pathsep.join([str(workdir / "src"), *filter(None, [env.get("PYTHONPATH")])])
    else:
        cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir)]
    # a guard against a hang only: the smoke run takes 7-15 min beside a second pytest worker, by machine
    # (docs/development.md)
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, cwd=workdir, timeout=3600)


def fresh_checkout(dest: Path) -> Path:
    """What a clone of this checkout holds (tracked and new, not ignored files), at `dest`."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        src, out = ROOT / name, dest / name
        if not (src.exists() or src.is_symlink()):
            continue  # deleted in the work tree, not yet committed
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            out.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, out)
    return dest


def user_profile(config_home: Path, text: str, name: str = "slurm") -> Path:
    folder = config_home / "snakemake" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(text)
    return folder


def prepared_model_dir(tiny_dir, tmp_path):
    """A prepared model's folder under tmp_path (its source.json, as prepare_model writes it) that loads `tiny_dir`."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "source.json").write_text(json.dumps({"source": {"path": str(tiny_dir)}, "load_from": str(tiny_dir)}))
    return model_dir


def tiny_gguf(path, arch: str, shapes=((8, 4), (4,))):
    """A GGUF file written with the gguf package's writer: architecture `arch`, a vocabulary (an array of strings
    and one of floats, as a real file has), float32 tensors of `shapes`."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_block_count(1)
    writer.add_token_list([f"t{i}" for i in range(300)])
    writer.add_token_scores([0.5] * 300)
    for i, shape in enumerate(shapes):
        writer.add_tensor(f"blk.0.w{i}.weight", np.ones(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# The stage tests' prompts and compute settings (prepare_tiny; tests/stages, tests/interp)
PROMPTS = {
    "operands": {"min": 1, "max": 4},
    "n_shots": 1,
    "shot_separator": ".\n",
    "templates": ["{a} {op} {b} is equal to ", "What is {a} {op} {b}? The answer is "],
    "operators": {"addition": ["plus"], "division": ["divided by"]},
    "null_words": ["nothing", "@"],
    "counterfactual_shots": "blank",
    "keep_only_correct": False,
    "splits": {"validation_share": 0.5, "max_samples": {"identification": 6, "validation": 6}},
}


COMPUTE = {"device": "cpu", "dtype": "float32", "batch_size": 5}


def prepare_tiny(root, family: str = "llama"):
    """The identify stage's first rules on a 2-layer tiny model of `family` in `root`: the prepared model, the
    division pairs and the cached activations."""
    from arithmech.model.tiny import build_tiny_model  # imported here: the ranks below import this module
    from arithmech.stages import identify

    src = build_tiny_model(root / "src", n_layers=2, family=family)
    identify.run_prepare_model(source={"path": str(src)}, out_dir=root / "model")
    identify.run_build_pairs(model_dir=root / "model", task="division", prompts=PROMPTS, compute=COMPUTE, seed=0,
                             out_pairs=root / "pairs.parquet", out_dropped=root / "dropped.parquet")
    identify.run_cache_activations(model_dir=root / "model", pairs_path=root / "pairs.parquet", compute=COMPUTE,
                                   out_path=root / "cache.safetensors")
    return root


def knockout_table():
    rows = [("top_heads", -1, k, acc, acc - 0.1) for k, acc in [(0, 1.0), (1, 0.8), (2, 0.3)]]
    rows += [("random_heads", s, k, acc, acc) for s, accs in [(0, [0.9, 0.7]), (1, [1.0, 0.9])]
             for k, acc in zip([1, 2], accs)]
    rows += [("random_layer_matched", s, 2, acc, acc) for s, acc in [(0, 0.6), (1, 0.4)]]
    rows.append(("key_mlps", -1, 1, 0.5, 0.5))
    end = pd.DataFrame(rows, columns=["curve", "seed", "k", "accuracy", "full_accuracy"]).assign(n=20, positions="end")
    every = end.assign(positions="all", n=8, accuracy=end["accuracy"] / 2)
    return pd.concat([end, every], ignore_index=True)


def study_tables():
    study = pd.DataFrame({
        "arm": ["base", "precise", "precise", "full"], "run": ["base", "chosen", "seed1", "chosen"],
        "accuracy": [0.2, 0.7, 0.6, 0.8], "accuracy_low": [0.1, 0.6, 0.5, 0.7], "accuracy_high": [0.3, 0.8, 0.7, 0.9],
        "kl_to_base": [0.0, 0.01, float("nan"), 0.002], "trainable_params": [0, 10, 10, 1179648],
    })
    comp = pd.DataFrame({
        "arm_a": ["precise", "precise", "full"], "arm_b": ["full", "full", "base"],
        "metric": ["accuracy", "kl_to_base", "accuracy"], "difference": [-0.1, 0.008, 0.6],
        "ci_low": [-0.2, 0.001, 0.5], "ci_high": [0.0, 0.01, 0.7], "p_value": [1.79e-58, 0.01, 0.001],
        "p_holm": [0.08, 0.03, 0.003], "test": "paired_cluster_bootstrap",
    })
    return study, comp


def write_figure(path):
    import matplotlib

    matplotlib.use("Agg")  # no screen
    import matplotlib.pyplot as plt

    plt.figure(figsize=(2, 1))
    plt.plot([0, 1])
    plt.savefig(path)
    plt.close()
    return path


# A prompt config of all four operators (the prompt_cfg fixture's)
PROMPT_CFG = {
    "operands": {"min": 1, "max": 4},
    "n_shots": 2,
    "shot_separator": ".\n",
    "templates": ["{a} {op} {b} is equal to ", "What is {a} {op} {b}? The answer is "],
    "operators": {
        "addition": ["plus"],
        "subtraction": ["minus"],
        "multiplication": ["times"],
        "division": ["divided by"],
    },
    "null_words": ["nothing", "@"],
}


def rank_correlation(x, y) -> float:
    """Spearman's rank correlation (Pearson's on average ranks)."""
    rx, ry = (pd.Series(np.asarray(v, dtype=float)).rank().to_numpy() for v in (x, y))
    return float(np.corrcoef(rx, ry)[0, 1])


def n_hooks(model: torch.nn.Module) -> int:
    """Hooks on the model (to check that a context manager removed its own), not counting the
    output-capturing hooks transformers installs on first use of output_hidden_states / output_attentions
    (once, for good) and `load_model`'s `contiguous_unembedding_input` (for good too)."""
    permanent = ("output_capturing_hook", "contiguous_unembedding_input")
    return sum(1 for m in model.modules() for d in (m._forward_hooks, m._forward_pre_hooks) for fn in d.values()
               if not any(name in getattr(fn, "__qualname__", "") for name in permanent))


# The distributed tests' ranks (tests/sft/test_distributed.py, and in a real Slurm job tests/workflow/
# test_slurm_cluster.py): each process unpickles `report_rank` from here.
def report_rank(out, seed):
    """A worker: write its rank, world size, node and a collective's result (the ranks' sum of 1: the world size)."""
    rank, world = distributed.world()
    total = distributed.all_reduce_sum(1.0)
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "world": world, "node": os.environ.get("SLURM_NODEID"), "local": os.environ.get("SLURM_LOCALID"),
        "sum": total, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}))
    print(f"hello from rank {rank} of {world}")


def srun_in_job(out: str) -> None:
    """Run in a real Slurm job as a multi-node job's process (tests/tools/test_cluster.py's 2 x 2 job shrunk
    to the test Slurm's one node): the multi-node rendezvous here (the secret store), the spec in a private
    directory in the shared `out`, 2 workers started with the srun command `run_on_gpus` uses across nodes
    (`multi_node_command`), nodes=1."""
    import pickle
    import subprocess
    import sys
    import tempfile

    ranks_dir = Path(tempfile.mkdtemp(dir=out))
    with distributed.rendezvous(ranks_dir, nodes=2):
        spec = ranks_dir / distributed.SPEC_FILE
        distributed.write_private(spec, pickle.dumps((report_rank, {"out": out, "seed": 0})))
        worker = distributed.worker_command(spec, world_size=2, backend="gloo", timeout_s=120)
        cmd = distributed.multi_node_command(worker, tmp=ranks_dir, job_id=distributed.slurm_job_id(), nodes=1,
                                             world_size=2, cpus_per_task=1)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        subprocess.run(cmd, env=env, timeout=180, check=True)


# `make docs` on a results tree (tests/tools/test_docs_results.py; the tiny run's in tests/workflow/test_workflow.py)
def scorecard_readme() -> str:
    """A README with the generated scorecard block's markers around a hand-typed table, and text on both sides."""
    from arithmech.tools.docs_results import BEGIN, END

    return f"""# arithmech

Some text a person wrote | with a pipe.

{BEGIN}
an old, hand-typed table: 54.7
{END}

More text after the block.
"""


def check_docs(results, model: str, tasks: list[str], tmp_path) -> str:
    """What `make docs` must do on any finished run (tests/workflow/test_workflow.py calls it on the tiny run): fill the
    block and leave README's other lines alone, write results.md with formatted numbers and its figures, and
    write the same bytes again on a second run. Returns results.md."""
    from arithmech.tools.docs_results import BEGIN, END, make_docs

    readme, out, figures = tmp_path / "README.md", tmp_path / "docs/results.md", tmp_path / "docs/figures"
    readme.write_text(scorecard_readme())
    make_docs(results_dir=results, model=model, tasks=tasks, readme=readme, out_md=out, figures_dir=figures)
    written = {p: p.read_bytes() for p in [readme, out, *figures.iterdir()]}
    make_docs(results_dir=results, model=model, tasks=tasks, readme=readme, out_md=out, figures_dir=figures)
    assert {p: p.read_bytes() for p in [readme, out, *figures.iterdir()]} == written
    text = readme.read_text()
    assert text.split(BEGIN)[0] == scorecard_readme().split(BEGIN)[0]
    assert text.split(END)[1] == scorecard_readme().split(END)[1]
    assert "54.7" not in text and "| Claim |" in text
    page = out.read_text()
    assert not re.search(r"\d\.\d+e-\d", page) and "%" in page  # shares in percent; only one-digit tiny nats ("2e-3")
    for link in re.findall(r"\]\((figures/[^)]+)\)", page):
        assert (out.parent / link).is_file(), link
    return page
