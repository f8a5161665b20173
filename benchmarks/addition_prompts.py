"""What the patching benchmarks share: the default model (prepared into a temporary folder when the
workflow has not prepared it yet) and a seeded draw of its addition prompts with counterfactual twins."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import yaml

from arithmech.data.arithmetic import build_prompts
from arithmech.model.loading import prepare_model

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "config.yaml").read_text())


def default_model_dir(model_dir: Path) -> Path:
    """`model_dir` if it holds a model (prepared by the workflow, or any Hugging Face directory), else the
    default model prepared now."""
    if (model_dir / "source.json").is_file() or (model_dir / "config.json").is_file():
        return model_dir
    model_dir = Path(tempfile.mkdtemp()) / "model"
    print(f"preparing the default model into {model_dir} ...")
    prepare_model(CONFIG["models"]["smollm2-135m"]["source"], model_dir)
    return model_dir


def addition_pairs(tokenizer, n: int) -> pd.DataFrame:
    """n addition pairs (prompt, cf_prompt, answer_token_id, n_tokens, ...) of the default prompt config."""
    return build_prompts(tokenizer, "addition", CONFIG["prompts"], seed=0).sample(n, random_state=0)
