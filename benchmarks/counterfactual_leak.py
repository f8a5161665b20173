"""How much the counterfactual prompts still compute the answer (the leak), for each way of nulling the
few-shot lines (`prompts.counterfactual_shots`): keep their answers, blank them, or no few-shot lines.

The same seeded draw of candidate pairs per task for every option (the shots and operands do not depend on
the option); the reference prompts are checked once. Prints, per task and option, the counterfactual's
first-token and full-answer accuracy on the answer, over the pairs whose reference answer is fully correct
(the pairs the workflow keeps). The option with the least leak is the config default.

    .venv/bin/python benchmarks/counterfactual_leak.py [--n 120] [--out leak.csv]
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pandas as pd
from addition_prompts import CONFIG, ROOT, default_model_dir

from arithmech.data.arithmetic import COUNTERFACTUAL_SHOTS, build_prompts
from arithmech.intervention.generation import check_answers
from arithmech.model.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=120, help="candidate pairs per task (a seeded draw)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table as CSV")
    args = parser.parse_args()
    lm = load_model(default_model_dir(ROOT / "results/smollm2-135m/model"), device="cpu")
    rows = []
    for task in CONFIG["run"]["tasks"]:
        built = {}
        for option in COUNTERFACTUAL_SHOTS:
            cfg = copy.deepcopy(CONFIG["prompts"]) | {"counterfactual_shots": option}
            frame = build_prompts(lm.tokenizer, task, cfg, seed=CONFIG["seed"])
            built[option] = frame.sample(min(args.n, len(frame)), random_state=0)
        ref_frame = built["keep"]
        batch = CONFIG["compute"]["batch_size"]
        ref = check_answers(lm, list(ref_frame["prompt"]), ref_frame["answer"], ref_frame["answer_token_id"],
                            batch_size=batch)
        kept = ref["correct_full"].to_numpy()
        for option, frame in built.items():
            assert (frame["sample_id"].to_numpy() == ref_frame["sample_id"].to_numpy()).all()
            cf = check_answers(lm, list(frame["cf_prompt"]), frame["answer"], frame["answer_token_id"],
                               batch_size=batch)
            rows.append({
                "task": task, "counterfactual_shots": option, "n_candidates": len(frame),
                "n_ref_correct": int(kept.sum()),
                "leak_first_token": float(cf["correct_first_token"][kept].mean()),
                "leak_full": float(cf["correct_full"][kept].mean()),
            })
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    print(table.groupby("counterfactual_shots")[["leak_first_token", "leak_full"]].mean().to_string())
    if args.out:
        table.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
