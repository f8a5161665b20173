"""The cost plan (`arithmech.tools.plan`, `make plan`): every rule has a cost entry, the job counts are the
workflow's own, the FLOP and parameter formulas hold on hand-checked cases, memory grows with the batch,
and the command prints its totals and names what it cannot read."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from arithmech.interp.protocol import transfer_sets
from arithmech.model.tiny import FAMILIES
from arithmech.tools.plan import PlanError, load_config, main, plan
from arithmech.tools.plan.costmodel import (
    Model,
    Throughput,
    decode_flops,
    expected_longest,
    forward_flops,
    head_method_params,
    lora_params,
    training,
)
from arithmech.tools.plan.dryrun import Job, checkpoint_jobs
from arithmech.tools.plan.interp_rules import set_bytes, transfer_targets
from arithmech.tools.plan.jobcost import Setting
from arithmech.tools.plan.planner import RULE_COSTS, add_job, cost_of, load_models, rule_row
from arithmech.tools.plan.sft_rules import finetune_lengths
from arithmech.tools.plan.shapes import SHAPES, Shape, model_shape, shape_from_config_json, tiny_shape
from arithmech.tools.plan.tokens import TokenCounter
from helpers import ROOT, copy_project

PAPER = ["configs/paper.yaml", "configs/llama2-7b.yaml"]


def workflow_rules() -> dict[str, str]:
    """Every rule and checkpoint of the Snakefile and workflow/rules/*.smk, with the file that defines it."""
    found = {}
    for path in [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]:
        for name in re.findall(r"^(?:rule|checkpoint) (\w+):", path.read_text(), flags=re.M):
            found[name] = str(path.relative_to(ROOT))
    return found


def test_every_rule_has_a_cost_entry():
    rules = workflow_rules()
    assert len(rules) >= 20
    missing = [
        f"rule '{name}' ({where}) has no entry in RULE_COSTS (src/arithmech/tools/plan/planner.py). Add "
        f"`\"{name}\": cpu_rule,` if its jobs run no model (tables, figures, summaries), or write `def {name}(s: "
        f"Setting, m: Model, job: Job) -> Cost` in interp_rules.py or sft_rules.py (its FLOPs, memory reads and "
        f"peak memory from the config) and add `\"{name}\": {name},`; then list it in docs/plan.md"
        for name, where in rules.items() if name not in RULE_COSTS
    ]
    stale = [f"RULE_COSTS has '{name}', which is no rule of the workflow any more: remove it"
             for name in RULE_COSTS if name not in rules]
    assert not missing + stale, "\n".join(missing + stale)


def test_docs_list_every_rule():
    text = (ROOT / "docs" / "plan.md").read_text()
    absent = [name for name in RULE_COSTS if f"`{name}`" not in text]
    assert not absent, f"docs/plan.md does not describe the rules {absent}"


def dry_run_counts(config_files: list[str], tmp_path: Path) -> dict[str, int]:
    """Jobs per rule of `snakemake --dry-run --quiet rules` in an empty working directory, read here without
    the plan's code."""
    shutil.copy2(ROOT / "config.yaml", tmp_path / "config.yaml")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "-n",
           "--cores", "1", "--quiet", "rules"]
    if config_files:
        cmd += ["--configfile", *(str(ROOT / f) for f in config_files)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = (proc.stdout + proc.stderr).split("Job stats:", 1)[1].split("total", 1)[0]
    return {name: int(count) for name, count in re.findall(r"^(\w+)\s+(\d+)\s*$", table, flags=re.M)
            if name != "job"}


@pytest.fixture(scope="module")
def reports():
    """The plan of the default config and of the paper's, computed once for the tests below."""
    return {key: plan([str(ROOT / f) for f in files], root=ROOT, workdir=ROOT / "tests")
            for key, files in (("default", []), ("paper", PAPER))}


@pytest.mark.parametrize("key,files", [("default", []), ("paper", PAPER)])
def test_job_counts_are_the_dry_runs(key, files, reports, tmp_path):
    planned: dict[str, int] = {}
    for row in reports[key]["rules"]:
        planned[row["rule"]] = planned.get(row["rule"], 0) + row["jobs"]
    assert planned == dry_run_counts(files, tmp_path)
    assert reports[key]["totals"]["jobs"] == sum(planned.values())


def test_readme_gives_the_paper_plans_totals(reports):
    """README's plan block (jobs, GPU jobs, GPU hours, peak memory) and docs/plan.md's whole plan are what `make
    docs` writes from this plan: a change to the planner, the workflow or configs/paper.yaml that moves a number
    fails here until `make docs` is run."""
    from arithmech.tools.docs_results import PLAN_CONFIGS, PLAN_MARKERS, PLAN_OUTPUT_MARKERS, plan_output, plan_text

    assert PAPER == PLAN_CONFIGS
    for page, markers, expected in (("README.md", PLAN_MARKERS, plan_text(reports["paper"])),
                                    ("docs/plan.md", PLAN_OUTPUT_MARKERS, plan_output(reports["paper"]))):
        text = (ROOT / page).read_text()
        assert text.split(markers[0] + "\n")[1].split(markers[1])[0] == expected, f"{page}: run make docs"


def test_paper_plan_is_plausible(reports):
    """LLaMA2-7B under configs/paper.yaml: GPU rules cost hours, CPU rules none; full fine-tuning needs more
    than one 80 GB GPU (float32 weights, gradients and AdamW state: 16 bytes a parameter, 108 GB, with FSDP2)
    and gets the 3 GPUs of its `finetune` block, where each rank holds a third of that and of the activations;
    precise SFT trains 32 heads with K/V rows plus 2 MLPs."""
    report = reports["paper"]
    rows = {row["rule"]: row for row in report["rules"]}
    assert rows["aggregate_effects"]["kind"] == "cpu" and rows["aggregate_effects"]["gpu_hours"] == 0
    assert rows["prepare_model"]["kind"] == "local"
    assert all(rows[r]["gpu_hours"] > 0 for r in ("build_pairs", "knockout", "finetune", "evaluate"))
    # full fine-tuning sharded over config.yaml's `finetune` block of 3 GPUs: each rank's peak (float32 masters,
    # gradients and moments, 16 bytes a parameter over 3, plus its share of the activations) fits one 80 GB GPU
    assert 16 * 6.74 / 3 < rows["finetune"]["gpu_gb"] <= 80
    assert report["warnings"] == []
    total = sum(row["gpu_hours"] for row in report["rules"])
    assert report["totals"]["gpu_hours"] == pytest.approx(total)
    assert 1 < total < 50
    # the study runs there, its format chosen by measurement (train_format: auto): every one of its rules is
    # planned, and its full fine-tuning of short arithmetic items fits one 80 GB GPU
    assert all(rows[r]["jobs"] >= 1 for r in ("study_format", "study_items", "study_train", "study_select",
                                              "study_evaluate", "study_summary"))
    assert rows["study_format"]["gpu_hours"] > 0 and rows["study_train"]["gpu_gb"] <= 3 * 80  # its finetune block


def test_training_on_several_gpus_divides_memory_and_time_a_spread_only_memory():
    """A training job with G GPUs runs G ranks (FSDP2 for full fine-tuning, data parallel otherwise): its work is
    divided over them and its peak is one rank's, each rank holding 1/G of the float32 state and of every
    micro-batch; an evaluation job with G GPUs spreads one model over them (device_map): its peak is the
    whole model's and its time is not divided."""
    setting, model = llama_setting(PAPER, 16)
    full = Job("finetune", (("model", "llama2-7b"), ("method", "full")))
    costs = {}
    for gpus in (1, 2, 4):
        model.resources["finetune"] = {"gpus": gpus}
        costs[gpus] = cost_of(setting, full)
    assert [c.ranks for c in costs.values()] == [1, 2, 4]
    assert costs[1].work.flops == costs[2].work.flops == costs[4].work.flops  # the same steps, split
    n = 6.74e9
    # 1 GPU: bf16 weights and gradients, float32 masters, gradients and moments (MasterWeights): 20 bytes a
    # parameter; G ranks: 16 bytes a parameter over G, two gathered layers and 1/G of the activations
    assert costs[1].gpu_bytes > 20 * n
    assert 16 * n / 2 < costs[2].gpu_bytes < costs[1].gpu_bytes / 2 + 4e9
    assert 16 * n / 4 < costs[4].gpu_bytes < costs[2].gpu_bytes
    precise = Job("finetune", (("model", "llama2-7b"), ("method", "precise")))
    model.resources["finetune"] = {"gpus": 1}
    one = cost_of(setting, precise)
    model.resources["finetune"] = {"gpus": 4}
    four = cost_of(setting, precise)
    assert four.ranks == 4 and model.weight_bytes < four.gpu_bytes < one.gpu_bytes  # replicated weights
    # the planner: GPU hours of a training job stay those of one GPU; a spread job's grow with its GPUs
    evaluate = Job("evaluate", (("model", "llama2-7b"), ("method", "base"), ("dataset", "gsm8k")))
    rows = {}
    for gpus in (1, 4):
        model.resources["finetune"] = model.resources["evaluate"] = {"gpus": gpus}
        for job in (full, evaluate):
            row = rule_row(("llama2-7b", job.rule), cost_of(setting, job))
            add_job(row, job=job, cost=cost_of(setting, job), model=model, throughput=Throughput())
            rows[job.rule, gpus] = row
    # the start-up is paid once per job, on every GPU
    startup = Throughput().startup_s / 3600
    train_1, train_4 = rows["finetune", 1]["gpu_hours"], rows["finetune", 4]["gpu_hours"]
    assert train_4 - 4 * startup == pytest.approx(train_1 - startup)  # 4 GPUs for a quarter of the time
    assert rows["evaluate", 4]["gpu_hours"] == pytest.approx(4 * rows["evaluate", 1]["gpu_hours"])
    assert any("exceeds 1 x 80 GB" in w for w in rows["finetune", 1]["warnings"])
    assert not any("GPU memory" in w for w in rows["finetune", 4]["warnings"])


def test_total_mode_adds_one_patch_layer_job_per_layer():
    config = {"patching": {"mode": "total"}}
    shapes = {"m": SHAPES["meta-llama/Llama-2-7b-hf"]}
    jobs = [Job("aggregate_effects", (("model", "m"), ("task", "addition")))]
    added = checkpoint_jobs(jobs, config, shapes)
    assert [job.get("layer") for job in added] == [str(i) for i in range(32)]
    assert all(job.added and job.rule == "patch_layer" for job in added)
    assert checkpoint_jobs(jobs, {"patching": {"mode": "direct"}}, shapes) == []
    # grouped (the SLURM profile's identify group): the per-layer jobs read every operator's cache, so they join
    # the model's identify group jobs (one a operator before the checkpoint) into one
    jobs = [Job("build_pairs", (("model", "m"), ("task", t)), group=f"identify#{i}") for i, t in enumerate("ab")]
    added = checkpoint_jobs(jobs, config, shapes, {"patch_layer": "identify", "build_pairs": "identify"})
    assert {job.group for job in jobs + added} == {"identify#m"}


def test_groups_lower_the_allocations_and_weight_loads_follow_the_model_jobs(reports):
    """The paper's plan for LLaMA2-7B: every GPU job goes through sbatch (the CPU jobs run on the login node);
    the SLURM profile's groups put the identify stage (4 + 4 + 1 jobs) in one allocation, the discovery (4 + 1 + 1)
    in one, the knockout and analysis jobs (4 each) in one each; every process of a job loads the
    weights once (3 ranks for fine-tuning, the base model beside a study model)."""
    report = reports["paper"]
    rows = {row["rule"]: row for row in report["rules"] if row["model"] == "llama2-7b"}
    total = report["totals"]
    assert total["submitted"] == total["gpu_jobs"] == 99
    allocations = {rule: rows[rule]["allocations"] for rule in ("build_pairs", "cache_activations",
                                                                 "patch_all_layers", "discover", "discover_shared",
                                                                 "discover_union", "knockout", "analyze",
                                                                 "evaluate")}
    assert allocations == {"build_pairs": 1, "cache_activations": 0, "patch_all_layers": 0, "discover": 1,
                           "discover_shared": 0, "discover_union": 0, "knockout": 1, "analyze": 1,
                           "evaluate": 40}
    assert total["allocations"] == 99 - (9 - 1) - (6 - 1) - 2 * (4 - 1) == 80
    assert total["queue_hours"] == pytest.approx(80 * Throughput().queue_wait_min / 60)
    loads = {rule: rows[rule]["weight_loads"] for rule in ("build_pairs", "evaluate", "finetune", "study_train",
                                                           "study_evaluate")}
    assert loads == {"build_pairs": 4, "evaluate": 40, "finetune": 4 * 3, "study_train": 18 * 3,
                     "study_evaluate": 1 + 10 * 2}
    assert total["weight_loads"] == sum(row["weight_loads"] for row in report["rules"])
    weights = 6_738_415_616 * 2
    assert total["load_hours"] == pytest.approx(total["weight_loads"] * weights / 1e9 / 3600)


def test_without_the_profiles_groups_every_job_is_its_own_allocation(tmp_path):
    """The same plan from a checkout whose SLURM profile groups nothing: one allocation per GPU job."""
    (tmp_path / "checkout").mkdir()
    root = copy_project(tmp_path / "checkout")
    shutil.copy2(ROOT / "config.yaml", root / "config.yaml")
    profile = root / "workflow/profiles/slurm/config.yaml"
    settings = yaml.safe_load(profile.read_text())
    for key in ("groups", "group-components"):
        settings.pop(key)
    profile.write_text(yaml.safe_dump(settings))
    report = plan([str(ROOT / f) for f in PAPER], root=root, workdir=ROOT / "tests")
    assert report["totals"]["allocations"] == report["totals"]["submitted"] == 99
    assert all(row["group"] == "" for row in report["rules"])


def test_a_run_asks_for_the_plans_requests_and_refuses_them_for_another_configuration(tmp_path, capsys):
    """`--requests FILE` writes the plan's estimates; a run whose slurm.requests names it asks each model job for
    them with headroom (cluster.planned_request), at most the config's values; with another configuration the
    file is refused, naming the key (a note in a dry run; the run's onstart check stops it)."""
    from arithmech.tools import cluster

    requests = tmp_path / "requests.json"
    assert main([str(TINY), "--root", str(ROOT), "--requests", str(requests)]) == 0
    written = json.loads(requests.read_text())
    estimate = written["estimates"]["tiny"]["knockout"]
    expected = cluster.job_resources(load_config([str(TINY)], root=ROOT)["models"]["tiny"]["resources"], "knockout",
                                     cluster.planned_request(estimate["host_bytes"], estimate["seconds"]))

    def knockout_resources(*overlay: str) -> tuple[dict, str]:
        work = tmp_path / "work"
        work.mkdir(exist_ok=True)
        shutil.copy2(ROOT / "config.yaml", work / "config.yaml")
        (work / "mine.yaml").write_text("\n".join(overlay) + "\n")
        cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(work),
               "--executor", "slurm", "--jobs", "2", "--dry-run", "--configfile", str(TINY), str(work / "mine.yaml")]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work, timeout=300)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-3000:]
        block = log.split("\nrule knockout:", 1)[1]
        line = next(ln for ln in block.splitlines() if ln.strip().startswith("resources:"))
        return dict(item.split("=", 1) for item in line.split(":", 1)[1].strip().split(", ")), log

    used, log = knockout_resources(f"slurm: {{requests: {requests}}}")
    assert (int(used["mem_mb"]), int(used["runtime"])) == (expected["mem_mb"], expected["runtime"]), log[-2000:]
    assert "note: slurm.requests" not in log
    stale, log = knockout_resources(f"slurm: {{requests: {requests}}}", "seed: 7")
    assert f"note: slurm.requests={requests} was planned for another configuration" in log
    tiny = load_config([str(TINY)], root=ROOT)["models"]["tiny"]["resources"]
    assert (int(stale["mem_mb"]), int(stale["runtime"])) == (tiny["mem_mb"], tiny["runtime"])
    # a run (not a dry run) with the stale file stops in its onstart check, before any job
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(work), "--cores",
           "1", "--configfile", str(TINY), str(work / "mine.yaml")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Stopped before any job was queued" in log, log[-3000:]
    assert f"slurm.requests={requests} was planned for another configuration" in log.split("Stopped before", 1)[1]
    assert not (work / "results").exists()


SMALL = Shape(n_layers=2, n_heads=2, n_kv_heads=1, head_dim=4, d_model=8, d_ff=16, vocab=10)


def test_parameter_counts():
    # one layer: q, o 8 x 8 each; k, v 8 x 4 each; gate, up, down 8 x 16 each; two norms of 8
    assert SMALL.layer_params == 2 * 64 + 2 * 32 + 3 * 128 + 2 * 8 == 592
    assert SMALL.body_params == 1184
    assert SMALL.n_params == 1184 + 2 * 10 * 8 + 8  # embedding and unembedding, final norm
    published = {"meta-llama/Llama-2-7b-hf": 6_738_415_616, "meta-llama/Llama-2-13b-hf": 13_015_864_320,
                 "mistralai/Mistral-7B-v0.1": 7_241_732_096, "HuggingFaceTB/SmolLM2-135M-Instruct": 134_515_008,
                 # counted on the dequantised weights of the shipped GGUF (Gemma 3's 4 norms a layer, q/k norms, tied)
                 "google/gemma-3-270m": 268_098_176}
    assert {key: shape.n_params for key, shape in SHAPES.items()} == published


def test_the_gemma_config_plans_from_the_shipped_shapes(tmp_path):
    """configs/gemma3-270m.yaml's `parts` source is planned with Gemma 3 270M's published sizes (found through its
    first part's package), before anything is installed or prepared."""
    import yaml

    source = yaml.safe_load((ROOT / "configs/gemma3-270m.yaml").read_text())["models"]["gemma3-270m"]["source"]
    shape, tokenizer = model_shape("gemma3-270m", source, workdir=tmp_path)
    assert shape == replace(SHAPES["google/gemma-3-270m"], source=shape.source) and tokenizer is None
    assert (shape.layer_norms, shape.qk_norm, shape.tied) == (4, True, True)


def test_flop_formula_by_hand():
    # 3 new tokens, no cache, the answer's logits once: 2 N per token, 4 L d_attn per (query, key) pair with
    # 1 + 2 + 3 = 6 causal pairs, 2 d V for the logits
    assert forward_flops(SMALL, new=3, past=0, logits=1) == 2 * 1184 * 3 + 4 * 2 * 8 * 6 + 2 * 8 * 10 == 7648
    # 2 greedy steps after 5 positions: one token on 5, then on 6 cached positions
    step = lambda past: 2 * 1184 + 4 * 2 * 8 * (past + 1) + 2 * 8 * 10  # noqa: E731
    assert decode_flops(SMALL, steps=2, context=5) == step(5) + step(6) == 5888
    model = Model(name="small", shape=SMALL, tokens=TokenCounter(), resources={}, dtype_bytes=2)
    full = training(model, sequences=4, seq=3, logits=1, trained=SMALL.n_params, full=True, steps=1, batch=4,
                      optimizer="adamw")
    assert full.flops == 3 * 4 * 7648 + 16 * 1352  # forward and backward (6N), AdamW's update
    heads = training(model, sequences=4, seq=3, logits=1, trained=64, full=False, steps=1, batch=4,
                       optimizer="sgd")
    assert heads.flops == 2 * 4 * 7648 + 6 * 64 * 4 * 3 + 2 * 64
    assert full.reads == 3 * model.weight_bytes  # one micro-batch: forward and backward read the weights


def test_trained_parameters_of_precise_sft():
    shape = SHAPES["meta-llama/Llama-2-7b-hf"]
    per_head = 2 * 4096 * 128  # W_Q rows and W_O columns
    assert head_method_params(shape, heads=32, mlps=0, train_kv=False) == 32 * per_head
    assert head_method_params(shape, heads=32, mlps=2, train_kv=True) == 64 * per_head + 2 * 3 * 4096 * 11008
    assert lora_params(shape, {"r": 8, "target_modules": ["q_proj", "v_proj"]}) == 32 * 8 * 4 * 4096


def test_expected_longest_of_a_batch():
    # batches of 2 from [1, 2, 3]: {1, 2} -> 2, {1, 3} -> 3, {2, 3} -> 3
    assert expected_longest([3, 1, 2], 2) == pytest.approx(8 / 3)
    assert expected_longest([5, 7], 4) == 7


def test_token_estimate_without_a_tokenizer():
    # "9 plus 9 is equal to ": 19 other characters -> 6 tokens, 2 digits, and the BOS token
    assert TokenCounter().count("9 plus 9 is equal to ") == 6 + 2 + 1
    assert TokenCounter().count(" 18", special=False) == 1 + 2


# A ChatML-like template with a default system message, as SmolLM2's: tokens once a prompt and tokens a message
CHAT_TEMPLATE = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                 "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_the_chat_style_costs_what_the_tokenizers_template_renders(tmp_path):
    """With a chat template beside the tokenizer, the plan's chat tokens (once a prompt, per message) come from the
    template as the stages render it (`data.formatting.math_prompt`), and predict the real prompts' tokens for other
    questions and shot counts (exactly with this tokenizer, which merges no token across a message's edge); without
    one, the estimate (5 a message) stays."""
    from transformers import AutoTokenizer

    from arithmech.data.formatting import math_prompt
    from arithmech.model.tiny import build_tiny_model

    directory = build_tiny_model(tmp_path / "model")
    assert TokenCounter(directory / "tokenizer.json").chat.source.startswith("estimated")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    counter = TokenCounter(directory / "tokenizer.json")
    chat = counter.chat
    assert chat.source.startswith("measured") and chat.fixed > 5 and chat.per_message > 5  # far off the estimate
    shots = [("What is 2 times 4?", "The answer is 8."), ("Tom has 3 apples and eats one. How many are left?",
                                                          "He has 3 - 1 = 2 left. The answer is 2.")]
    for question in ("What is 9 minus 6?", "A box holds 12 eggs. How many eggs are in 4 boxes?"):
        for n in range(len(shots) + 1):
            real = counter.count(math_prompt(question, shots[:n], "chat", tokenizer), special=False)
            contents = sum(counter.count(t, special=False) for q, a in shots[:n] for t in (q, a))
            planned = chat.tokens(2 * n + 1) + counter.count(question, special=False) + contents
            assert planned == real, (question, n)


def llama_setting(config_files: list[str], batch: int) -> tuple[Setting, Model]:
    config = load_config([str(ROOT / f) for f in config_files], root=ROOT)
    config = copy.deepcopy(config)
    config["compute"]["batch_size"] = batch
    config["evaluation"]["batch_size"] = batch
    config["finetune"]["train"]["batch_size"] = batch
    config["study"]["train"]["batch_size"] = batch
    models = load_models(config, workdir=ROOT / "tests")
    return Setting(config, root=ROOT, models=models), models["llama2-7b"]


GPU_JOBS = {
    "paper": [Job("build_pairs", (("task", "addition"),)), Job("cache_activations", (("task", "division"),)),
              Job("patch_all_layers"), Job("patch_layer", (("layer", "3"),)),
              Job("knockout", (("task", "addition"),)), Job("transfer"), Job("analyze", (("task", "addition"),)),
              *[Job("finetune", (("method", m),)) for m in ("precise", "random_heads", "full", "lora")],
              *[Job("evaluate", (("method", "base"), ("dataset", d)))
                for d in ("gsm8k", "svamp", "mmlu", "qa_wikidata", "wikitext")]],
    "study": [Job("study_train", (("arm", a), ("run", "lr0"))) for a in ("precise", "precise_mlp", "full", "lora")]
    + [Job("study_evaluate", (("arm", "precise"), ("run", "chosen"))),
       Job("study_evaluate", (("arm", "base"), ("run", "base")))],
}


@pytest.mark.parametrize("key,files", [("paper", PAPER), ("study", ["configs/llama2-7b.yaml"])])
def test_memory_grows_with_the_batch(key, files):
    batches = [1, 4, 16, 64, 512]  # beyond 256 texts a batch, knockout and transfer run more rows at once
    peaks = {}
    for batch in batches:
        setting, model = llama_setting(files, batch)
        for job in GPU_JOBS[key]:
            job = Job(job.rule, (("model", "llama2-7b"), *job.wildcards))
            peaks.setdefault(job.label, []).append(cost_of(setting, job).gpu_bytes)
    for label, values in peaks.items():
        assert values == sorted(values), f"{label}: peak GPU memory by batch {batches}: {values}"
        assert values[0] >= model.weight_bytes
    grown = [label for label, values in peaks.items() if values[-1] > values[0]]
    assert len(grown) >= len(peaks) - 1  # all but perplexity (one window at a time) grow


@pytest.mark.parametrize("family", FAMILIES)
def test_shapes_from_a_local_directory_and_its_tokenizer(tiny_family, family):
    """The parameter count from config.json is the model's, on every family (Gemma 3: four norms a layer, q/k
    norms, tied embeddings, a width other than n_heads * head_dim)."""
    tiny_dir, tiny_lm = tiny_family(family)
    shape, tokenizer = model_shape("mine", {"path": str(tiny_dir)}, workdir=ROOT / "tests")
    assert shape.n_params == sum(p.numel() for p in tiny_lm.model.parameters())
    assert (shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.head_dim) == (3, 4, 2, 8)
    counter = TokenCounter(tokenizer)
    text = "3 plus 5 is equal to "
    assert counter.count(text) == len(tiny_lm.tokenizer(text)["input_ids"])
    assert "tokenizer.json" in counter.method


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_shape_is_the_tiny_models(tiny_family, family):
    """The tiny source's shape, read from `tiny.build_tiny_model`'s defaults, is the shape of the model it builds."""
    built = shape_from_config_json(tiny_family(family)[0] / "config.json")
    assert replace(tiny_shape({"family": family}), source="") == replace(built, source="")
    assert tiny_shape({"n_layers": 5}).n_layers == 5


def test_a_config_json_of_another_architecture_is_named(tmp_path):
    config = {"model_type": "gpt2", "num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8,
              "intermediate_size": 16, "vocab_size": 10}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PlanError, match=r"config.json: architecture 'gpt2' is not supported"):
        shape_from_config_json(tmp_path / "config.json")


def test_unknown_hub_model_names_the_model():
    with pytest.raises(PlanError, match=r"model 'mine'.*org/unknown.*local Hugging Face directory"):
        model_shape("mine", {"hub": "org/unknown"}, workdir=ROOT / "tests")


def test_cli_names_an_unknown_config_file(capsys):
    assert main(["configs/no-such.yaml", "--root", str(ROOT)]) == 2
    assert "config file 'configs/no-such.yaml' not found" in capsys.readouterr().err


def test_cli_names_an_unknown_model(tmp_path, capsys):
    (tmp_path / "models.yaml").write_text("run: {models: [nope]}\n")
    assert main([str(tmp_path / "models.yaml"), "--root", str(ROOT)]) == 2
    assert "unknown model name 'nope'" in capsys.readouterr().err


def test_cli_prints_the_table_and_totals(reports, capsys):
    assert main([*(str(ROOT / f) for f in PAPER), "--root", str(ROOT)]) == 0
    out = capsys.readouterr().out
    total = reports["paper"]["totals"]
    assert f"total: {total['jobs']} jobs, {total['gpu_jobs']} on a GPU, {total['gpu_hours']:.2f} GPU hours" in out
    assert re.search(r"^finetune\s+4\s+[\d.]+\s+[\d.]+\s+[\d.]+", out, flags=re.M)
    assert "llama2-7b: 32 layers x 32 heads" in out


def test_cli_json(capsys):
    assert main(["--json", "--root", str(ROOT)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"config_files", "config_digest", "throughput", "models", "rules", "totals", "warnings"}
    assert report["models"]["smollm2-135m"]["dtype_bytes"] == 2
    assert report["totals"]["jobs"] == sum(row["jobs"] for row in report["rules"])


def test_a_rule_without_entry_is_warned_about_not_counted():
    setting = Setting({}, root=ROOT, models={})
    cost = cost_of(setting, Job("new_rule", (("model", "m"),)))
    assert cost.unknown and not cost.gpu
    row = rule_row(("m", "new_rule"), cost)
    assert row["kind"] == "unknown" and "new_rule" in row["warnings"][0]


def test_transfer_memory_follows_its_longest_prompt_and_copies_per_forward():
    setting, model = llama_setting(PAPER, 32)
    job = Job("transfer", (("model", "llama2-7b"),))
    targets = transfer_targets(setting, model)
    assert len(targets) == len(transfer_sets(setting.config["run"]["tasks"]))  # the job's own list of sets
    svamp = targets[-2]  # the prompts the job builds: the longest sets the memory
    assert svamp["longest"] > svamp["prompt"] and svamp["texts"] == setting.config["transfer"]["svamp"]["n"]
    peak = cost_of(setting, job).gpu_bytes
    assert peak >= model.weight_bytes + set_bytes(model, batch=32, prompt=svamp["longest"], tail=1,
                                                    steps=svamp["steps"])
    setting.config["transfer"]["copies_per_forward"] = 64  # fewer rows at once: less memory
    assert cost_of(setting, job).gpu_bytes < peak


def test_finetune_counts_only_the_examples_the_job_keeps():
    """The finetune job drops a GSM8K example longer than max_length (`sft.training.fitting_examples`):
    the plan counts the same examples, so fewer steps and a shorter longest sequence, and fails as the job
    would when none fits, naming the key."""
    setting, model = llama_setting(PAPER, 16)
    job = Job("finetune", (("model", "llama2-7b"), ("method", "full")))
    lengths = finetune_lengths(setting, model)
    assert max(n for n, _ in lengths) <= setting.config["finetune"]["train"]["max_length"]
    cut = sorted(n for n, _ in lengths)[len(lengths) // 2]  # half the examples no longer fit
    short = copy.deepcopy(setting.config)
    short["finetune"]["train"]["max_length"] = cut
    kept = finetune_lengths(Setting(short, root=ROOT, models=setting.models), model)
    assert len(kept) == sum(n <= cut for n, _ in lengths) < len(lengths)
    assert max(n for n, _ in kept) <= cut
    shorter = Setting(short, root=ROOT, models=setting.models)
    assert cost_of(shorter, job).gpu_bytes < cost_of(setting, job).gpu_bytes
    short["finetune"]["train"]["max_length"] = 8
    with pytest.raises(PlanError, match=r"'finetune.train.max_length': no training example .* fits in 8 tokens"):
        finetune_lengths(Setting(short, root=ROOT, models=setting.models), model)


# The plan against a finished run (`--compare`, arithmech.tools.plan.measured): a results tree written here by
# the writers the workflow uses, Snakemake's benchmark records and the jobs' own records (arithmech.jobs).

TINY = ROOT / "tests/config/tiny.yaml"


@pytest.fixture(scope="module")
def tiny_plan():
    """The plan of the smoke configuration (model `tiny`), computed once."""
    return plan([str(TINY)], root=ROOT, workdir=ROOT / "tests")


def write_benchmark(path: Path, *runs: tuple[float, float | None]) -> None:
    """A benchmark TSV as Snakemake writes it, one row per (seconds, max_rss MiB or None: not sampled)."""
    from snakemake.benchmark import BenchmarkRecord, write_benchmark_records

    records = []
    for seconds, rss in runs:
        record = BenchmarkRecord(running_time=seconds, max_rss=rss, max_vms=2 * (rss or 0), max_uss=rss,
                                 max_pss=rss, io_in=0.1, io_out=0.05, cpu_usage=seconds, cpu_time=seconds)
        record.data_collected, record.process_gone = rss is not None, rss is None
        records.append(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_benchmark_records(records, str(path), False)


def write_record(log: Path, rule: str, wildcards: dict, *, ok: bool = True, gpu: dict | None = None) -> Path:
    """A job's own record as `arithmech.jobs.write_usage` writes it next to `log`; `gpu`: the peaks a CUDA job
    records (this machine has none, so they are set in the written file)."""
    from snakemake.iocontainers import InputFiles, Log, OutputFiles, Params, ResourceList, Snakemake, Wildcards

    from arithmech.jobs import write_usage

    log.parent.mkdir(parents=True, exist_ok=True)
    smk = Snakemake(InputFiles(), OutputFiles(), Params(), Wildcards(fromdict=wildcards), 1, ResourceList(),
                    Log([str(log)]), {}, rule, 0)  # the object a rule script gets
    write_usage(smk, 1.0, ok, 1)
    path = log.with_name(log.stem + ".usage.json")
    if gpu is not None:
        record = json.loads(path.read_text())
        assert record["gpu_peak_mb"] is None  # what a job without CUDA writes
        path.write_text(json.dumps(record | {"gpu_peak_mb": gpu}))
    return path


def finished_run(results: Path) -> Path:
    """results/: build_pairs (2 jobs on CUDA, one on 2 GPUs; one job's run not sampled), knockout (1 of 2 jobs
    measured, run twice: `repeat`; the other's attempt failed), aggregate_effects on the CPU, a rule and a model
    the plan does not have."""
    tiny = results / "tiny"
    write_benchmark(tiny / "benchmarks/build_pairs/addition.tsv", (10.0, 500.0))
    write_benchmark(tiny / "benchmarks/build_pairs/division.tsv", (30.0, None))
    write_record(tiny / "logs/build_pairs/addition.log", "build_pairs", {"model": "tiny", "task": "addition"},
                 gpu={"cuda:0": 800.0, "cuda:1": 1200.0})
    write_record(tiny / "logs/build_pairs/division.log", "build_pairs", {"model": "tiny", "task": "division"},
                 gpu={"cuda:0": 600.0})
    write_benchmark(tiny / "benchmarks/knockout/addition.tsv", (40.0, 700.0), (20.0, 900.0))
    write_record(tiny / "logs/knockout/addition.log", "knockout", {"model": "tiny", "task": "addition"},
                 gpu={"cuda:0": 2000.0})
    write_record(tiny / "logs/knockout/division.log", "knockout", {"model": "tiny", "task": "division"},
                 ok=False, gpu={"cuda:0": 9000.0})  # ran out of memory: its peak is no finished job's peak
    write_benchmark(tiny / "benchmarks/aggregate_effects/addition.tsv", (3.0, 300.0))
    write_record(tiny / "logs/aggregate_effects/addition.log", "aggregate_effects",
                 {"model": "tiny", "task": "addition"})
    write_benchmark(tiny / "benchmarks/new_rule.tsv", (1.0, 100.0))
    write_benchmark(results / "other/benchmarks/build_pairs/addition.tsv", (5.0, 50.0))
    return results


def test_comparison_numbers(tiny_plan, tmp_path):
    from arithmech.tools.plan.measured import compare, measure

    results = finished_run(tmp_path / "results")
    comparison = compare(tiny_plan, measure(results), results=results)
    rows = {(row["model"], row["rule"]): row for row in comparison["rows"]}
    planned = {row["rule"]: row for row in tiny_plan["rules"] if row["model"] == "tiny"}
    mib = 2**20 / 1e9

    pairs = rows["tiny", "build_pairs"]
    plan_s = planned["build_pairs"]["gpu_hours_per_job"] * 3600  # tiny.yaml: 1 GPU a job
    assert (pairs["jobs_planned"], pairs["jobs_measured"], pairs["job_records"], pairs["failed"]) == (2, 2, 2, 0)
    assert (pairs["longest_s"], pairs["mean_s"], pairs["longest_job"]) == (30.0, 20.0, "build_pairs/division")
    assert pairs["planned_wall_s"] == pytest.approx(plan_s) and pairs["measured_on"] == "cuda"
    assert pairs["wall_ratio"] == pytest.approx(30.0 / plan_s)
    assert pairs["gpu_gb"] == pytest.approx(1200 * mib)  # the larger device of the larger job
    assert pairs["gpu_ratio"] == pytest.approx(1200 * mib / planned["build_pairs"]["gpu_gb"])
    assert pairs["host_gb"] == pytest.approx(500 * mib)  # the run that was not sampled ("NA") counts no memory
    assert pairs["host_ratio"] == pytest.approx(500 * mib / planned["build_pairs"]["host_gb"])

    knockout = rows["tiny", "knockout"]
    assert (knockout["jobs_planned"], knockout["jobs_measured"], knockout["job_records"], knockout["failed"]) == \
        (2, 1, 2, 1)
    assert knockout["longest_s"] == knockout["mean_s"] == 30.0  # the mean of the job's two runs
    assert knockout["host_gb"] == pytest.approx(900 * mib)
    assert knockout["gpu_gb"] == pytest.approx(2000 * mib)  # the failed attempt's 9000 left out

    cpu = rows["tiny", "aggregate_effects"]
    assert cpu["measured_on"] == "cpu" and cpu["longest_s"] == 3.0 and cpu["gpu_gb"] is None
    assert cpu["planned_wall_s"] is cpu["wall_ratio"] is cpu["host_ratio"] is None  # the plan estimates no CPU job

    assert comparison["not_planned"] == ["other/build_pairs", "tiny/new_rule"]
    measured_rules = {"build_pairs", "knockout", "aggregate_effects"}
    assert comparison["not_measured"] == [f"tiny/{row['rule']}" for row in tiny_plan["rules"]
                                          if row["model"] == "tiny" and row["rule"] not in measured_rules]
    assert "all" not in {row["rule"] for row in comparison["rows"]}  # the target runs nothing: never measured
    assert comparison["failed"] == {"tiny/knockout": 1}
    assert (comparison["jobs_measured"], comparison["job_records"], comparison["cuda_records"]) == (6, 5, 3)


def test_a_cpu_run_sets_no_time_against_the_plan(tiny_plan, tmp_path):
    from arithmech.tools.plan.cli import render_comparison
    from arithmech.tools.plan.measured import compare, measure

    tiny = tmp_path / "results/tiny"
    write_benchmark(tiny / "benchmarks/build_pairs/addition.tsv", (10.0, 500.0))
    write_record(tiny / "logs/build_pairs/addition.log", "build_pairs", {"model": "tiny", "task": "addition"})
    comparison = compare(tiny_plan, measure(tmp_path / "results"), results="results")
    row = next(row for row in comparison["rows"] if row["rule"] == "build_pairs")
    assert row["measured_on"] == "cpu" and row["wall_ratio"] is None and row["gpu_ratio"] is None
    assert row["host_ratio"] == pytest.approx(500 * 2**20 / 1e9 / row["planned_host_gb"])
    text = render_comparison(comparison)
    assert "No job recorded CUDA: a CPU run" in text
    line = next(line for line in text.splitlines() if line.startswith("build_pairs "))
    assert line.split()[1:6] == ["2/1", _plan_value(row["planned_wall_s"]), "10.0", "10.0", "cpu"]
    assert line.split()[7] == "n/a"
    (tmp_path / "empty").mkdir()
    nothing = compare(tiny_plan, measure(tmp_path / "empty"), results="empty")
    assert "Nothing measured" in render_comparison(nothing) and "No job recorded CUDA" not in render_comparison(nothing)
    assert len(nothing["not_measured"]) == len(nothing["rows"]) == len(tiny_plan["rules"]) - 1  # all but `all`


def _plan_value(seconds: float) -> str:
    return f"{seconds:.1f}" if 10 <= seconds < 1000 else (f"{seconds:.2f}" if seconds < 10 else f"{seconds:.0f}")


@pytest.mark.parametrize("text,message", [
    ("s\th:m:s\n", r"expected a Snakemake benchmark TSV.* found 1 line"),
    ("s\th:m:s\tmax_rss\n12.5\t0:00:12\n", r", line 2: 2 fields, expected 3"),
    ("s\th:m:s\tmax_rss\nslow\t0:00:12\t100\n", r", line 2: column s is 'slow', expected a number"),
])
def test_a_malformed_benchmark_names_the_file(tmp_path, capsys, text, message):
    bad = tmp_path / "results/tiny/benchmarks/knockout/addition.tsv"
    bad.parent.mkdir(parents=True)
    bad.write_text(text)
    # the results are read before the plan's dry run: a bad file fails at once
    assert main([str(TINY), "--root", str(ROOT), "--compare", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert f"benchmark file '{bad}'" in err and re.search(message, err), err


def test_a_malformed_job_record_and_a_missing_directory_are_named(tmp_path, capsys):
    bad = tmp_path / "results/tiny/logs/knockout/addition.usage.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"rule": "knockout"}')
    assert main([str(TINY), "--root", str(ROOT), "--compare", str(tmp_path / "results")]) == 2
    assert f"job record '{bad}': expected a JSON object with the keys rule, ok" in capsys.readouterr().err
    assert main([str(TINY), "--root", str(ROOT), "--compare", str(tmp_path / "nowhere")]) == 2
    assert f"--compare '{tmp_path / 'nowhere'}': no such directory" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_with_a_tiny_run(tmp_path, capsys):
    """The smoke configuration run up to one task's pairs (prepare_model, build_pairs) on this machine, then
    `--compare` on its results: the numbers are the run's own benchmark and job record."""
    shutil.copy2(ROOT / "config.yaml", tmp_path / "config.yaml")  # the Snakefile's `configfile:`
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
           "--configfile", str(TINY), "--cores", "2", "results/tiny/pairs/addition.parquet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert main([str(TINY), "--root", str(ROOT), "--compare", str(tmp_path / "results"), "--json"]) == 0
    comparison = json.loads(capsys.readouterr().out)["comparison"]
    rows = {row["rule"]: row for row in comparison["rows"]}
    tsv = (tmp_path / "results/tiny/benchmarks/build_pairs/addition.tsv").read_text().splitlines()
    bench = dict(zip(tsv[0].split("\t"), tsv[1].split("\t")))
    record = json.loads((tmp_path / "results/tiny/logs/build_pairs/addition.usage.json").read_text())
    pairs = rows["build_pairs"]
    assert record["rule"] == "build_pairs" and record["ok"] and record["gpu_peak_mb"] is None  # no CUDA here
    assert (pairs["jobs_planned"], pairs["jobs_measured"], pairs["job_records"]) == (2, 1, 1)
    assert pairs["longest_s"] == pairs["mean_s"] == float(bench["s"]) >= record["wall_s"]  # the whole job
    assert pairs["host_gb"] == pytest.approx(float(bench["max_rss"]) * 2**20 / 1e9)
    assert pairs["measured_on"] == "cpu" and pairs["wall_ratio"] is None and pairs["gpu_gb"] is None
    assert rows["prepare_model"]["jobs_measured"] == 1 and comparison["not_planned"] == []
    assert "tiny/knockout" in comparison["not_measured"] and "tiny/build_pairs" not in comparison["not_measured"]


def test_warnings_use_each_rules_own_resources(tmp_path):
    """A `finetune` block with 3 GPUs lifts full fine-tuning's GPU-memory warning (the same per-rule resources
    the cluster gets, arithmech.tools.cluster); a small `evaluate` block's runtime is warned about under its key."""
    overlay = tmp_path / "rule-resources.yaml"
    overlay.write_text(yaml.safe_dump({"models": {"llama2-7b": {"resources": {
        "gpus": 1, "mem_mb": 64000, "runtime": 120,
        "finetune": {"gpus": 3, "mem_mb": 128000}, "evaluate": {"runtime": 1}}}}}))
    report = plan([str(ROOT / f) for f in PAPER] + [str(overlay)], root=ROOT, workdir=ROOT / "tests")
    warnings = report["warnings"]
    assert not any("finetune[method=full]" in w and "GPU memory" in w for w in warnings)
    assert any(w.startswith("llama2-7b: evaluate[") and "models.llama2-7b.resources.evaluate.runtime" in w
               for w in warnings)
    assert not any("models.llama2-7b.resources.runtime" in w and "evaluate[" in w for w in warnings)
    one_gpu = tmp_path / "one-gpu.yaml"
    one_gpu.write_text(yaml.safe_dump({"models": {"llama2-7b": {"resources": {"finetune": {"gpus": 1}}}}}))
    report = plan([str(ROOT / f) for f in PAPER] + [str(one_gpu)], root=ROOT, workdir=ROOT / "tests")
    assert any("finetune[method=full]" in w and "exceeds 1 x 80 GB" in w for w in report["warnings"])


@pytest.mark.parametrize("cf_shots", ["zero_shot", "keep", "blank"])
def test_the_plans_prompt_lengths_are_the_stages_longest_prompts(tiny_dir, cf_shots):
    """The plan's prompt tokens are the prompt builder's own (`arithmetic.few_shot_prefixes`) at their longest: per
    template and operator word the longest reference and counterfactual prompt the identify stage builds, counted
    by the same tokenizer."""
    from transformers import AutoTokenizer

    from arithmech.data.arithmetic import TASKS, build_prompts
    from arithmech.tools.plan.workload import task_prompts

    prompts = {**yaml.safe_load((ROOT / "config.yaml").read_text())["prompts"], "counterfactual_shots": cf_shots}
    tokens = TokenCounter(Path(tiny_dir) / "tokenizer.json")
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    for task in TASKS:
        built = build_prompts(tokenizer, task, prompts, seed=0)
        built["ref"], built["cf"] = tokens.counts(list(built["prompt"])), tokens.counts(list(built["cf_prompt"]))
        longest = built.groupby(["template_id", "operator"])[["ref", "cf"]].max()
        planned = task_prompts(prompts, task, tokens)
        assert planned.ref_tokens == pytest.approx(longest["ref"].mean()), task
        assert planned.cf_tokens == pytest.approx(longest["cf"].mean()), task
        assert planned.cf_longest == built["cf"].max(), task


def test_the_transfers_number_formats_are_planned_at_the_longest_the_stage_draws():
    """`format_extremes` (read by the plan's transfer) against `format_prompts` (what the transfer job scores): no
    drawn operand or answer is longer, and each length is reached."""
    from arithmech.data.arithmetic import FORMATS, TASKS, format_extremes, format_prompts

    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    for fmt in FORMATS:
        for task in TASKS:
            drawn = format_prompts(task, fmt, cfg["transfer"]["formats"][fmt], cfg["prompts"], n=400, seed=0)
            longest = [len(text) for text in format_extremes(task, fmt, cfg["transfer"]["formats"][fmt])]
            assert [drawn[c].str.len().max() for c in ("a", "b", "answer")] == longest, (fmt, task)


def test_a_model_without_gpus_is_planned_in_cpu_hours(tmp_path, capsys):
    """`gpus: 0` (the default model on CPU nodes): its jobs are planned at the CPU node's throughput, in CPU hours,
    and no GPU hours; the same jobs as on a GPU, each longer."""
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text("models:\n  smollm2-135m:\n    resources: {gpus: 0, mem_mb: 3000, runtime: 30}\n")
    assert main([str(cpu), "--root", str(ROOT), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main(["--root", str(ROOT), "--json"]) == 0
    on_gpu = {row["rule"]: row for row in json.loads(capsys.readouterr().out)["rules"]}
    model_rows = [row for row in report["rules"] if row["kind"] == "gpu"]
    assert model_rows and all(row["on_cpu"] and row["gpu_hours"] == 0 for row in model_rows)
    for row in model_rows:
        assert row["jobs"] == on_gpu[row["rule"]]["jobs"] and row["cpu_hours"] > on_gpu[row["rule"]]["gpu_hours"]
    total = report["totals"]
    assert (total["gpu_jobs"], total["gpu_hours"]) == (0, 0)
    assert total["cpu_hours"] == pytest.approx(sum(row["cpu_hours"] for row in model_rows))
    assert main([str(cpu), "--root", str(ROOT)]) == 0
    out = capsys.readouterr().out
    on_cpu = f"{total['cpu_model_jobs']} model jobs on a CPU node (gpus: 0), {total['cpu_hours']:.2f} CPU job hours"
    assert on_cpu in out
    assert re.search(r"^knockout\s+\d+\s+\d+\s+[\d.]+ CPU\s+[\d.]+ CPU", out, flags=re.M), out
    assert "resources per job: CPU, 3000 MB, 30 min" in out



@pytest.mark.parametrize("operand_pairs", [100, 25])
def test_the_discover_plans_draws_are_the_stages(operand_pairs):
    """`interp_rules.discover_draws` counts the pairs `stages.discover` prunes on, chooses the target on and scores,
    on a pairs table of three templates per operand pair: the same draws where max_samples bounds the pruning draw
    (100 operand pairs), else each within one operand pair's prompts (25: the stage holds out and selects whole
    operand pairs, at most a third of them held out)."""
    import pandas as pd

    from arithmech.stages.discover import _scored_pairs, _selection_pairs
    from arithmech.tools.plan.interp_rules import discover_draws
    from arithmech.tools.plan.workload import TaskPrompts

    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())["circuit"]["discover"]
    splits = (("identification", operand_pairs, 7), ("validation", operand_pairs // 2, 8))
    pairs = pd.DataFrame([{"a": a, "b": b, "template_id": t, "split": split}
                          for split, n, b in splits for a in range(n) for t in range(3)])
    pairs["sample_id"] = range(len(pairs))
    ident, val = _scored_pairs(pairs, cfg, 0, "pairs")
    select = _selection_pairs(pairs, ident, cfg["selection_samples"], 0, "pairs")
    p = TaskPrompts(candidates=len(pairs), identification=3 * operand_pairs, validation=3 * (operand_pairs // 2),
                    ref_tokens=50, cf_tokens=50, cf_longest=50, answer_steps=3, templates=3)
    n_id, n_sel, n_val = discover_draws(cfg, p)
    stage = (len(ident), len(select), len(val))
    if len(ident) == cfg["max_samples"]:
        assert (n_id, n_sel, n_val) == stage
    else:
        assert all(abs(planned - drawn) < 3 for planned, drawn in zip((n_id, n_sel, n_val), stage)), stage
